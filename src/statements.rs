//! Splitting scripts into statements, and batchinfer's own statements about models:
//!
//! ```sql
//! CREATE [OR REPLACE] MODEL churn FROM 'models/churn.onnx';
//! CREATE MODEL minilm FROM 'models/all-MiniLM-L6-v2/';   -- a folder: model.onnx + tokenizer.json
//! SHOW MODELS;
//! DESCRIBE MODEL churn;
//! DROP MODEL [IF EXISTS] churn;
//! ```
//! Everything else is DataFusion SQL and goes to DataFusion's parser unchanged.

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Whitespace};

use crate::error::{Error, Result};

/// One statement of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// A statement about models, handled by batchinfer.
    Model(ModelStatement),
    /// Anything else: the statement's text, for DataFusion.
    Sql(String),
}

/// batchinfer's statements about models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelStatement {
    Create {
        name: String,
        source: String,
        or_replace: bool,
    },
    Show,
    Describe {
        name: String,
    },
    Drop {
        name: String,
        if_exists: bool,
    },
}

/// Splits a script at its top-level `;` (not those inside strings or comments) and recognizes
/// batchinfer's own statements. Empty statements are dropped.
pub fn split(script: &str) -> Result<Vec<Statement>> {
    let dialect = GenericDialect {};
    let tokens = Tokenizer::new(&dialect, script)
        .tokenize()
        .map_err(|e| Error::Usage(format!("SQL could not be read: {e}")))?;
    let mut statements = Vec::new();
    for chunk in tokens.split(|t| matches!(t, Token::SemiColon)) {
        let significant: Vec<&Token> = chunk
            .iter()
            .filter(|t| !matches!(t, Token::Whitespace(_)))
            .collect();
        if significant.is_empty() {
            continue;
        }
        match model_statement(&significant)? {
            Some(statement) => statements.push(Statement::Model(statement)),
            None => statements.push(Statement::Sql(text_of(chunk))),
        }
    }
    Ok(statements)
}

/// The text of a run of tokens, comments left out (a trailing `--` comment would swallow what
/// follows once statements are joined again).
fn text_of(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(|t| match t {
            Token::Whitespace(Whitespace::SingleLineComment { .. }) => "\n".to_string(),
            Token::Whitespace(Whitespace::MultiLineComment(_)) => " ".to_string(),
            t => t.to_string(),
        })
        .collect::<String>()
        .trim()
        .to_string()
}

fn keyword(t: &Token) -> Option<Keyword> {
    match t {
        Token::Word(w) if w.quote_style.is_none() => Some(w.keyword),
        _ => None,
    }
}

fn is_word(t: &Token, word: &str) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

fn identifier(t: Option<&&Token>, what: &str) -> Result<String> {
    match t {
        Some(Token::Word(w)) if w.quote_style.is_some() => Ok(w.value.clone()),
        Some(Token::Word(w)) => Ok(w.value.to_lowercase()),
        _ => Err(Error::Usage(format!("expected {what}"))),
    }
}

fn end(rest: &[&Token], usage: &str) -> Result<()> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(format!("unexpected '{}' in {usage}", rest[0])))
    }
}

const CREATE: &str = "CREATE [OR REPLACE] MODEL name FROM 'path'";

/// Recognizes a model statement; `None` when the tokens are some other statement.
fn model_statement(t: &[&Token]) -> Result<Option<ModelStatement>> {
    let Some(first) = t.first().and_then(|t| keyword(t)) else {
        return Ok(None);
    };
    match first {
        Keyword::CREATE => {
            let or_replace = t.len() > 2
                && keyword(t[1]) == Some(Keyword::OR)
                && keyword(t[2]) == Some(Keyword::REPLACE);
            let at = if or_replace { 3 } else { 1 };
            if !t.get(at).is_some_and(|w| is_word(w, "MODEL")) {
                return Ok(None);
            }
            let name = identifier(t.get(at + 1), &format!("a model name: {CREATE}"))?;
            if t.get(at + 2).and_then(|w| keyword(w)) != Some(Keyword::FROM) {
                return Err(Error::Usage(format!(
                    "expected FROM after the model name: {CREATE}"
                )));
            }
            let source = match t.get(at + 3) {
                Some(Token::SingleQuotedString(s)) => s.clone(),
                _ => {
                    return Err(Error::Usage(format!(
                        "expected the model's path as a quoted string: {CREATE}"
                    )));
                }
            };
            end(&t[at + 4..], CREATE)?;
            Ok(Some(ModelStatement::Create {
                name,
                source,
                or_replace,
            }))
        }
        Keyword::SHOW if t.get(1).is_some_and(|w| is_word(w, "MODELS")) => {
            end(&t[2..], "SHOW MODELS")?;
            Ok(Some(ModelStatement::Show))
        }
        Keyword::DESCRIBE | Keyword::DESC if t.get(1).is_some_and(|w| is_word(w, "MODEL")) => {
            let name = identifier(t.get(2), "a model name: DESCRIBE MODEL name")?;
            end(&t[3..], "DESCRIBE MODEL name")?;
            Ok(Some(ModelStatement::Describe { name }))
        }
        Keyword::DROP if t.get(1).is_some_and(|w| is_word(w, "MODEL")) => {
            let if_exists = t.len() > 3
                && keyword(t[2]) == Some(Keyword::IF)
                && keyword(t[3]) == Some(Keyword::EXISTS);
            let at = if if_exists { 4 } else { 2 };
            let name = identifier(t.get(at), "a model name: DROP MODEL [IF EXISTS] name")?;
            end(&t[at + 1..], "DROP MODEL [IF EXISTS] name")?;
            Ok(Some(ModelStatement::Drop { name, if_exists }))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_split_at_top_level_semicolons_only() {
        let script = "SELECT 'a;b' AS x; -- a comment; with a semicolon\nSELECT 2 /* ; */ ;;  ";
        let statements = split(script).unwrap();
        assert_eq!(
            statements,
            vec![
                Statement::Sql("SELECT 'a;b' AS x".into()),
                Statement::Sql("SELECT 2".into())
            ]
        );
    }

    #[test]
    fn model_statements_are_recognized() {
        let statements = split(
            "create model Churn from 'models/churn.onnx'; CREATE OR REPLACE MODEL \"MiniLM\" FROM 'm/';\
             SHOW MODELS; describe model churn; DROP MODEL IF EXISTS churn; DROP MODEL x",
        )
        .unwrap();
        assert_eq!(
            statements,
            vec![
                Statement::Model(ModelStatement::Create {
                    name: "churn".into(),
                    source: "models/churn.onnx".into(),
                    or_replace: false
                }),
                Statement::Model(ModelStatement::Create {
                    name: "MiniLM".into(),
                    source: "m/".into(),
                    or_replace: true
                }),
                Statement::Model(ModelStatement::Show),
                Statement::Model(ModelStatement::Describe {
                    name: "churn".into()
                }),
                Statement::Model(ModelStatement::Drop {
                    name: "churn".into(),
                    if_exists: true
                }),
                Statement::Model(ModelStatement::Drop {
                    name: "x".into(),
                    if_exists: false
                }),
            ]
        );
    }

    #[test]
    fn malformed_model_statements_say_what_is_expected() {
        let err = split("CREATE MODEL churn 'x.onnx'")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected FROM after the model name"), "{err}");
        let err = split("CREATE MODEL churn FROM x").unwrap_err().to_string();
        assert!(
            err.contains("expected the model's path as a quoted string"),
            "{err}"
        );
        // Other CREATE statements are DataFusion's.
        assert!(matches!(
            &split("CREATE TABLE t AS SELECT 1").unwrap()[0],
            Statement::Sql(_)
        ));
    }
}
