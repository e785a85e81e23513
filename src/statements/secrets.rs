//! Secrets in statement text: which names hold one, and a statement's text with their values
//! blanked, for what is kept of statements outside a plan (the shell's history).

use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use super::byte_offset;

/// Whether an option or setting named `name` holds a secret (a key, token, password or
/// signature): its value is blanked wherever a statement is shown or kept.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["secret", "token", "pass", "key", "sig"]
        .iter()
        .any(|word| name.contains(word))
}

/// `text` with its secrets blanked as plans blank them: the value given after a name that says
/// it is a secret (`'aws.secret_access_key' '...'`, `password = '...'`) and the password and
/// query of every URL. For what is kept of statements outside a plan (the shell's history).
pub fn blank_secrets(text: &str, dialect: &dyn Dialect) -> String {
    let Ok(tokens) = Tokenizer::new(dialect, text).tokenize_with_location() else {
        return crate::storage::blank_passwords(text);
    };
    // The spans of the values to blank, in the text as written (its quoting kept).
    let mut secrets = Vec::new();
    let mut after = After::Other;
    for token in &tokens {
        let literal = match &token.token {
            Token::Whitespace(_) | Token::Eq => continue,
            Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("to") => {
                continue;
            }
            Token::SingleQuotedString(s)
            | Token::DoubleQuotedString(s)
            | Token::DollarQuotedString(datafusion::sql::sqlparser::ast::DollarQuotedString {
                value: s,
                ..
            })
            | Token::EscapedStringLiteral(s)
            | Token::NationalStringLiteral(s) => Some(s.as_str()),
            _ => None,
        };
        // After a secret's name: its value, a literal (a number too), or, after a quoted name
        // (an option's key, `'pass' "x"`), the word that follows unless it is a keyword
        // (`SELECT 'passage' FROM t` keeps its FROM).
        let word_value = |w: &datafusion::sql::sqlparser::tokenizer::Word| {
            w.quote_style.is_some() || w.keyword == Keyword::NoKeyword
        };
        let value = literal.is_some()
            || matches!(token.token, Token::Number(..))
            || (after == After::QuotedSecret
                && matches!(&token.token, Token::Word(w) if word_value(w)));
        if after != After::Other && value {
            let start = byte_offset(text, token.span.start.line, token.span.start.column);
            let end = byte_offset(text, token.span.end.line, token.span.end.column);
            secrets.push(start..end);
            after = After::Other;
            continue;
        }
        after = match (&token.token, literal) {
            (Token::Word(w), _) if is_secret_name(&w.value) => After::Secret,
            (_, Some(name)) if is_secret_name(name) => After::QuotedSecret,
            _ => After::Other,
        };
    }
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for span in secrets {
        if span.start < copied || span.end > text.len() {
            continue;
        }
        out.push_str(&text[copied..span.start]);
        out.push_str("'<redacted>'");
        copied = span.end;
    }
    out.push_str(&text[copied..]);
    crate::storage::blank_passwords(&out)
}

/// What the token before is, for [`blank_secrets`].
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// A word naming a secret (`password = ...`).
    Secret,
    /// A quoted name of a secret (`'pass' ...`, an option's key).
    QuotedSecret,
    Other,
}
