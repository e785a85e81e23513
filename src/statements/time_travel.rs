//! Time travel in a query: `FROM t VERSION AS OF 3` and `FROM t TIMESTAMP AS OF
//! '2026-12-03T10:00:00Z'` (Delta's and Databricks' words) read as the table `"t@v3"` and
//! `"t@2026-12-03T10:00:00Z"`, names that the session's schema opens as that version of the Delta
//! table `t` ([`crate::delta::At::of_name`]). DataFusion's dialects do not read these clauses; the
//! script's tokens are rewritten before it is parsed.

use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer, Word};

use crate::error::Result;

/// The tokens of `script` with each `name VERSION AS OF n` and `name TIMESTAMP AS OF 'time'`
/// made one quoted name, where it has any (None: the script as it is).
pub fn rewrite(script: &str, dialect: &dyn Dialect) -> Result<Option<Vec<TokenWithSpan>>> {
    // A script without the word `OF` after a space needs no second look.
    let says_of = script
        .as_bytes()
        .windows(3)
        .any(|w| w[0].is_ascii_whitespace() && w[1..].eq_ignore_ascii_case(b"OF"));
    if !says_of {
        return Ok(None);
    }
    let Ok(tokens) = Tokenizer::new(dialect, script).tokenize_with_location() else {
        // DataFusion's parser reports what is wrong with it.
        return Ok(None);
    };
    let mut out: Vec<TokenWithSpan> = Vec::with_capacity(tokens.len());
    let mut changed = false;
    let mut i = 0;
    while i < tokens.len() {
        if let Some((suffix, end)) = version_clause(&tokens, i)
            && let Some(name_at) = table_name(&out)
            && let Token::Word(word) = &out[name_at].token
        {
            let value = format!("{}@{suffix}", word.value);
            out[name_at].token = Token::Word(Word {
                value,
                quote_style: Some('"'),
                keyword: Keyword::NoKeyword,
            });
            out.truncate(name_at + 1);
            changed = true;
            i = end;
            continue;
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    Ok(changed.then_some(out))
}

/// The index of the table's name a clause follows: the last token of `before` that is not
/// space, where it is a word that is not a keyword (or is quoted).
fn table_name(before: &[TokenWithSpan]) -> Option<usize> {
    let at = before
        .iter()
        .rposition(|t| !matches!(t.token, Token::Whitespace(_)))?;
    match &before[at].token {
        Token::Word(w) if w.quote_style.is_some() || w.keyword == Keyword::NoKeyword => Some(at),
        _ => None,
    }
}

/// Where `tokens[at..]` starts `VERSION AS OF n` or `TIMESTAMP AS OF 'time'`: the name's suffix
/// it gives (`v3`, or the time), and the index after the clause.
fn version_clause(tokens: &[TokenWithSpan], at: usize) -> Option<(String, usize)> {
    let word = |i: usize, keyword: Keyword| {
        matches!(&tokens.get(i)?.token, Token::Word(w) if w.keyword == keyword && w.quote_style.is_none())
            .then_some(())
    };
    let after_space = |mut i: usize| {
        while matches!(tokens.get(i)?.token, Token::Whitespace(_)) {
            i += 1;
        }
        Some(i)
    };
    let kind = match &tokens.get(at)?.token {
        Token::Word(w) if w.quote_style.is_none() && w.keyword == Keyword::VERSION => "version",
        Token::Word(w) if w.quote_style.is_none() && w.keyword == Keyword::TIMESTAMP => "time",
        _ => return None,
    };
    let as_at = after_space(at + 1)?;
    word(as_at, Keyword::AS)?;
    let of_at = after_space(as_at + 1)?;
    word(of_at, Keyword::OF)?;
    let value_at = after_space(of_at + 1)?;
    let suffix = match (&tokens.get(value_at)?.token, kind) {
        (Token::Number(n, _), "version") if n.bytes().all(|b| b.is_ascii_digit()) => {
            format!("v{n}")
        }
        (Token::SingleQuotedString(time), "time") => time.clone(),
        _ => return None,
    };
    Some((suffix, value_at + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;

    fn rewritten(sql: &str) -> Option<String> {
        rewrite(sql, &GenericDialect {})
            .unwrap()
            .map(|tokens| tokens.iter().map(|t| t.token.to_string()).collect())
    }

    #[test]
    fn version_and_timestamp_clauses_become_names() {
        assert_eq!(
            rewritten("SELECT * FROM t VERSION AS OF 3 WHERE x = 1").as_deref(),
            Some("SELECT * FROM \"t@v3\" WHERE x = 1")
        );
        assert_eq!(
            rewritten("SELECT * FROM \"s\" TIMESTAMP AS OF '2026-12-03T10:00:00Z' AS a").as_deref(),
            Some("SELECT * FROM \"s@2026-12-03T10:00:00Z\" AS a")
        );
        assert_eq!(rewritten("SELECT CAST(x AS TIMESTAMP) AS of FROM t"), None);
        assert_eq!(rewritten("SELECT 1 AS version"), None);
        assert_eq!(rewritten("SELECT * FROM t VERSION AS OF -1"), None);
    }
}
