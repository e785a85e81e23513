//! batchinfer's model statements read: `CREATE [OR REPLACE] MODEL`, `ALTER MODEL` (versions
//! and aliases), `DROP MODEL`, `SHOW MODELS`, and their `OPTIONS`.

use super::*;

const CREATE: &str = "CREATE [OR REPLACE] MODEL name FROM 'path' [OPTIONS ('quantize' 'int8')], \
                      or CREATE [OR REPLACE] MODEL name OPTIONS ('endpoint' 'http://.../v1', \
                      'model' '...', ...) for an endpoint model";

/// Recognizes and reads a model statement; `None` (nothing consumed) when the next statement is
/// some other.
pub(super) fn model_statement(df: &mut DFParser<'_>) -> Result<Option<ModelStatement>> {
    let parser = &mut df.parser;
    let peek = |parser: &Parser<'_>, n: usize| parser.peek_nth_token(n).token;
    let statement = match keyword(&peek(parser, 0)) {
        Some(Keyword::CREATE) => {
            let or_replace = keyword(&peek(parser, 1)) == Some(Keyword::OR)
                && keyword(&peek(parser, 2)) == Some(Keyword::REPLACE);
            let at = if or_replace { 3 } else { 1 };
            if !is_word(&peek(parser, at), "MODEL") {
                return Ok(None);
            }
            advance(parser, at + 1);
            let name = identifier(parser, &format!("a model name: {CREATE}"))?;
            if parser.parse_keyword(Keyword::OPTIONS) {
                let options = option_list(df)?;
                return Ok(Some(ModelStatement::CreateEndpoint {
                    name,
                    or_replace,
                    options,
                }));
            }
            let parser = &mut df.parser;
            if !parser.parse_keyword(Keyword::FROM) {
                return Err(Error::Statement(format!(
                    "expected FROM after the model name: {CREATE}"
                )));
            }
            let Token::SingleQuotedString(source) = parser.next_token().token else {
                return Err(Error::Statement(format!(
                    "expected the model's path as a quoted string: {CREATE}"
                )));
            };
            let quantize = model_options(df)?;
            ModelStatement::Create {
                name,
                source,
                or_replace,
                quantize,
            }
        }
        Some(Keyword::SHOW | Keyword::CLEAR)
            if is_word(&peek(parser, 1), "LLM") && is_word(&peek(parser, 2), "CACHE") =>
        {
            let show = keyword(&peek(parser, 0)) == Some(Keyword::SHOW);
            advance(parser, 3);
            if show {
                ModelStatement::ShowCache
            } else {
                ModelStatement::ClearCache
            }
        }
        Some(Keyword::ALTER) if is_word(&peek(parser, 1), "MODEL") => {
            advance(parser, 2);
            let name = identifier(parser, &format!("a model name: {ALTER}"))?;
            alter_model(df, name)?
        }
        Some(Keyword::SHOW)
            if is_word(&peek(parser, 1), "MODEL") && is_word(&peek(parser, 2), "VERSIONS") =>
        {
            advance(parser, 3);
            let name = identifier(parser, "a model name: SHOW MODEL VERSIONS name")?;
            ModelStatement::ShowVersions { name }
        }
        Some(Keyword::SHOW) if is_word(&peek(parser, 1), "MODELS") => {
            advance(parser, 2);
            ModelStatement::Show
        }
        Some(Keyword::DESCRIBE | Keyword::DESC) if is_word(&peek(parser, 1), "MODEL") => {
            advance(parser, 2);
            let name = identifier(parser, "a model name: DESCRIBE MODEL name")?;
            ModelStatement::Describe { name }
        }
        Some(Keyword::DROP) if is_word(&peek(parser, 1), "MODEL") => {
            advance(parser, 2);
            let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = identifier(parser, "a model name: DROP MODEL [IF EXISTS] name")?;
            ModelStatement::Drop { name, if_exists }
        }
        _ => return Ok(None),
    };
    Ok(Some(statement))
}

/// ALTER MODEL's forms, for its errors.
pub(super) const ALTER: &str = "ALTER MODEL name ADD VERSION FROM 'path' | SET ALIAS alias TO VERSION n | \
                     DROP ALIAS alias | DROP VERSION n";

/// What follows `ALTER MODEL name`.
pub(super) fn alter_model(df: &mut DFParser<'_>, name: String) -> Result<ModelStatement> {
    let parser = &mut df.parser;
    let expected = |what: &str| Error::Statement(format!("expected {what}: {ALTER}"));
    let word = |parser: &mut Parser<'_>, w: &str| {
        let is = is_word(&parser.peek_token().token, w);
        if is {
            parser.next_token();
        }
        is
    };
    if parser.parse_keyword(Keyword::ADD) {
        if !word(parser, "VERSION") || !parser.parse_keyword(Keyword::FROM) {
            return Err(expected("ADD VERSION FROM 'path'"));
        }
        let Token::SingleQuotedString(source) = parser.next_token().token else {
            return Err(expected("the model's path as a quoted string"));
        };
        let quantize = model_options(df)?;
        return Ok(ModelStatement::AddVersion {
            name,
            source,
            quantize,
        });
    }
    let set = parser.parse_keyword(Keyword::SET);
    if !set && !parser.parse_keyword(Keyword::DROP) {
        return Err(expected("ADD, SET or DROP"));
    }
    if word(parser, "ALIAS") {
        let alias = alias_name(parser)?;
        if !set {
            return Ok(ModelStatement::DropAlias { name, alias });
        }
        if !parser.parse_keyword(Keyword::TO) || !word(parser, "VERSION") {
            return Err(expected("TO VERSION n"));
        }
        let version = version_of(parser)?;
        return Ok(ModelStatement::SetAlias {
            name,
            alias,
            version,
        });
    }
    if !set && word(parser, "VERSION") {
        let version = version_of(parser)?;
        return Ok(ModelStatement::DropVersion { name, version });
    }
    Err(expected(if set {
        "SET ALIAS"
    } else {
        "DROP ALIAS or DROP VERSION"
    }))
}

/// An alias as written (a word, lower-cased unless quoted), checked.
pub(super) fn alias_name(parser: &mut Parser<'_>) -> Result<String> {
    let alias = identifier(parser, &format!("an alias: {ALTER}"))?;
    crate::model::versions::check_alias(&alias)
        .map_err(|why| Error::Statement(format!("alias {alias:?} is not usable: {why}")))?;
    Ok(alias)
}

/// A version number as written.
pub(super) fn version_of(parser: &mut Parser<'_>) -> Result<u32> {
    match parser.next_token().token {
        Token::Number(digits, _) => crate::model::versions::version_number(&digits)
            .map_err(|why| Error::Statement(format!("version {digits}: {why}"))),
        other => Err(Error::Statement(format!(
            "expected a version number, not {other}: {ALTER}"
        ))),
    }
}

/// CREATE MODEL's `OPTIONS ('key' 'value', ...)`, if any: the quantization asked for.
pub(super) fn model_options(df: &mut DFParser<'_>) -> Result<Option<String>> {
    if !df.parser.parse_keyword(Keyword::OPTIONS) {
        return Ok(None);
    }
    let mut quantize = None;
    for (key, value) in option_list(df)? {
        match key.as_str() {
            "quantize" if value.eq_ignore_ascii_case(crate::quantize::INT8) => {
                quantize = Some(crate::quantize::INT8.to_string());
            }
            "quantize" => {
                return Err(Error::setting(
                    "quantize",
                    format!(
                        "quantize '{value}' is not supported: 'int8' (dynamic int8, weights per \
                     channel) is"
                    ),
                ));
            }
            _ => {
                return Err(Error::setting(
                    &key,
                    format!(
                        "unknown model option '{key}': CREATE MODEL ... FROM takes OPTIONS \
                         ('quantize' 'int8'); an endpoint model is CREATE MODEL name OPTIONS \
                         ('endpoint' ..., 'model' ...) without FROM"
                    ),
                ));
            }
        }
    }
    Ok(quantize)
}

/// `('key' 'value', ...)` after OPTIONS: keys lower-cased, each once. Keys and values are read
/// as DataFusion reads those of CREATE EXTERNAL TABLE.
pub(super) fn option_list(df: &mut DFParser<'_>) -> Result<BTreeMap<String, String>> {
    use datafusion::sql::sqlparser::ast::Value;
    let expected = || Error::Statement(format!("expected OPTIONS ('key' 'value', ...): {CREATE}"));
    df.parser
        .expect_token(&Token::LParen)
        .map_err(|_| expected())?;
    let mut options = BTreeMap::new();
    loop {
        let key = df.parse_option_key().map_err(|_| expected())?;
        let value = match df.parse_option_value().map_err(|_| expected())? {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s,
            other => other.to_string(),
        };
        if options.insert(key.to_ascii_lowercase(), value).is_some() {
            return Err(Error::setting(
                &key,
                format!("the option '{key}' is given twice"),
            ));
        }
        if df.parser.consume_token(&Token::RParen) {
            return Ok(options);
        }
        if !df.parser.consume_token(&Token::Comma) {
            return Err(expected());
        }
    }
}
