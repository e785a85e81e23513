//! Typed output: `generate('m', prompt, 'name VARCHAR, age INT, tags VARCHAR[]')` returns a
//! struct of those columns. The columns become a JSON schema sent with each request (OpenAI's
//! strict `json_schema`: every field required, `additionalProperties: false`, each value
//! nullable), which vLLM and llama.cpp enforce by grammar; the reply is checked against the
//! columns and decoded here all the same, since a server can stop enforcing a schema without
//! saying so.

use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::ScalarValue;
use datafusion::common::scalar::ScalarStructBuilder;
use datafusion::sql::sqlparser::ast::{ArrayElemTypeDef, DataType as SqlType};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;
use serde_json::{Value, json};

/// The types an output column may have, for messages.
const TYPES: &str = "VARCHAR, BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, REAL, DOUBLE, DATE, \
                     T[] (a list) and STRUCT<name T, ...>";

/// How deep the output's types may nest (lists and structs).
const MAX_DEPTH: usize = 32;

/// Whether the types of `text` nest deeper than [`MAX_DEPTH`], read from its brackets before
/// anything is parsed (a parse or a type that deep would take the stack).
fn too_deep(text: &str) -> bool {
    let (mut depth, mut lists) = (0usize, 0usize);
    for c in text.chars() {
        match c {
            '<' | '(' => {
                depth += 1;
                lists = 0;
            }
            '>' | ')' => {
                depth = depth.saturating_sub(1);
                lists = 0;
            }
            '[' => lists += 1,
            ',' => lists = 0,
            _ => {}
        }
        if depth + lists > MAX_DEPTH {
            return true;
        }
    }
    false
}

/// The columns `text` lists (`'name VARCHAR, age INT'`), as the fields of a struct.
/// An output schema that cannot be one, and why.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BadSchema {
    #[error("the output schema's types nest deeper than {MAX_DEPTH} lists and structs")]
    TooDeep,
    #[error(
        "the output schema must list columns as 'name TYPE, ...' with the types {TYPES}, as in \
         'name VARCHAR, age INT, tags VARCHAR[]': {0}"
    )]
    Syntax(String),
    #[error("column '{column}': {why}")]
    Column { column: String, why: Box<BadSchema> },
    #[error("the output schema names the column '{0}' twice")]
    ColumnTwice(String),
    #[error("a STRUCT's fields need names: STRUCT<name T, ...>")]
    UnnamedField,
    #[error("the STRUCT names the field '{0}' twice")]
    FieldTwice(String),
    #[error("a STRUCT needs at least one field")]
    NoFields,
    #[error("the type {0} is not taken; the types are {TYPES}")]
    Type(String),
}

/// The columns `text` lists (`'name VARCHAR, age INT'`), as the fields of a struct.
pub fn parse(text: &str) -> Result<Fields, BadSchema> {
    if too_deep(text) {
        return Err(BadSchema::TooDeep);
    }
    let syntax = |e: ParserError| BadSchema::Syntax(e.to_string());
    let mut parser = Parser::new(&GenericDialect {})
        .try_with_sql(text)
        .map_err(syntax)?;
    let mut fields: Vec<Field> = Vec::new();
    loop {
        let name = parser.parse_identifier().map_err(syntax)?.value;
        let sql_type = parser
            .parse_data_type()
            .map_err(|e| BadSchema::Syntax(format!("column '{name}': {e}")))?;
        let data_type = arrow_type(&sql_type).map_err(|why| BadSchema::Column {
            column: name.clone(),
            why: Box::new(why),
        })?;
        if fields.iter().any(|f| f.name() == &name) {
            return Err(BadSchema::ColumnTwice(name));
        }
        fields.push(Field::new(name, data_type, true));
        match parser.next_token().token {
            Token::Comma => continue,
            Token::EOF => break,
            other => return Err(BadSchema::Syntax(format!("unexpected '{other}'"))),
        }
    }
    Ok(Fields::from(fields))
}

fn arrow_type(sql: &SqlType) -> Result<DataType, BadSchema> {
    use SqlType as S;
    Ok(match sql {
        S::Varchar(_)
        | S::Char(_)
        | S::Character(_)
        | S::CharacterVarying(_)
        | S::CharVarying(_)
        | S::Nvarchar(_)
        | S::Text
        | S::String(_) => DataType::Utf8,
        S::Bool | S::Boolean => DataType::Boolean,
        S::TinyInt(_) => DataType::Int8,
        S::SmallInt(_) | S::Int2(_) => DataType::Int16,
        S::Int(_) | S::Integer(_) | S::Int4(_) | S::Int32 => DataType::Int32,
        S::BigInt(_) | S::Int8(_) | S::Int64 => DataType::Int64,
        S::Real | S::Float4 | S::Float32 => DataType::Float32,
        S::Double(_) | S::DoublePrecision | S::Float8 | S::Float64 | S::Float(_) => {
            DataType::Float64
        }
        S::Date => DataType::Date32,
        S::Array(
            ArrayElemTypeDef::AngleBracket(inner)
            | ArrayElemTypeDef::SquareBracket(inner, None)
            | ArrayElemTypeDef::Parenthesis(inner),
        ) => DataType::List(Arc::new(Field::new_list_field(arrow_type(inner)?, true))),
        S::Struct(fields, _) => {
            let mut out: Vec<Field> = Vec::new();
            for field in fields {
                let Some(name) = &field.field_name else {
                    return Err(BadSchema::UnnamedField);
                };
                if out.iter().any(|f| f.name() == &name.value) {
                    return Err(BadSchema::FieldTwice(name.value.clone()));
                }
                out.push(Field::new(
                    &name.value,
                    arrow_type(&field.field_type)?,
                    true,
                ));
            }
            if out.is_empty() {
                return Err(BadSchema::NoFields);
            }
            DataType::Struct(Fields::from(out))
        }
        other => return Err(BadSchema::Type(other.to_string())),
    })
}

/// The JSON schema of the struct `fields`, as OpenAI's strict mode wants it: every field
/// required, none other allowed, each value nullable.
pub fn json_schema(fields: &Fields) -> Value {
    object_schema(fields, false)
}

fn object_schema(fields: &Fields, nullable: bool) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|f| (f.name().clone(), value_schema(f.data_type(), true)))
        .collect();
    let required: Vec<&String> = fields.iter().map(|f| f.name()).collect();
    json!({
        "type": kind("object", nullable),
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

fn kind(name: &str, nullable: bool) -> Value {
    if nullable {
        json!([name, "null"])
    } else {
        json!(name)
    }
}

fn value_schema(data_type: &DataType, nullable: bool) -> Value {
    match data_type {
        DataType::Utf8 => json!({"type": kind("string", nullable)}),
        DataType::Boolean => json!({"type": kind("boolean", nullable)}),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            json!({"type": kind("integer", nullable)})
        }
        DataType::Float32 | DataType::Float64 => json!({"type": kind("number", nullable)}),
        DataType::Date32 => json!({"type": kind("string", nullable), "format": "date"}),
        DataType::List(item) => json!({
            "type": kind("array", nullable),
            "items": value_schema(item.data_type(), false),
        }),
        DataType::Struct(fields) => object_schema(fields, nullable),
        // `parse` makes no other type.
        _ => json!({}),
    }
}

/// The struct column of the replies: each row's reply text decoded into `fields`, or the reason
/// it cannot be (the row is NULL then). `None`: a row with no reply (a NULL prompt, a failed
/// request), NULL.
pub fn decode(
    fields: &Fields,
    replies: &[Option<&str>],
) -> datafusion::error::Result<(ArrayRef, Vec<(usize, String)>)> {
    let struct_type = DataType::Struct(fields.clone());
    let null = ScalarValue::try_from(&struct_type)?;
    let mut failed = Vec::new();
    let mut values = Vec::with_capacity(replies.len());
    for (row, reply) in replies.iter().enumerate() {
        let Some(text) = reply else {
            values.push(null.clone());
            continue;
        };
        let value = serde_json::from_str::<Value>(text)
            .map_err(|e| Mismatch::NotJson {
                error: e.to_string(),
                reply: excerpt(text),
            })
            .and_then(|json| match json {
                Value::Object(_) => scalar(&json, &struct_type, ""),
                other => Err(Mismatch::NotAnObject(excerpt(&other.to_string()))),
            });
        match value {
            Ok(value) => values.push(value),
            Err(why) => {
                failed.push((row, why.to_string()));
                values.push(null.clone());
            }
        }
    }
    if values.is_empty() {
        return Ok((
            datafusion::arrow::array::new_empty_array(&struct_type),
            failed,
        ));
    }
    Ok((ScalarValue::iter_to_array(values)?, failed))
}

/// At most 200 characters of `text`, for a message.
pub fn excerpt(text: &str) -> String {
    let mut out: String = text.chars().take(200).collect();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out
}

/// A reply that does not fit the output columns, and where (`tags[2]`, `address.city`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    #[error("the reply is not JSON ({error}): {reply}")]
    NotJson { error: String, reply: String },
    #[error("the reply is not a JSON object of the output columns: {0}")]
    NotAnObject(String),
    #[error("{}expected {expected}, got {got}", place(.at))]
    Expected {
        at: String,
        expected: &'static str,
        got: String,
    },
    #[error("{}{n} is out of the range of {data_type}", place(.at))]
    OutOfRange {
        at: String,
        n: i64,
        data_type: String,
    },
    #[error(
        "{}the field '{field}' is not an output column (the columns are {columns})",
        place(.at)
    )]
    NotAColumn {
        at: String,
        field: String,
        columns: String,
    },
    #[error("{}the type {data_type} is not an output type", place(.at))]
    Type { at: String, data_type: String },
    /// Arrow's refusal of a value made.
    #[error("{0}")]
    Arrow(String),
}

/// `'tags[2]': `, or nothing at the top.
fn place(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("'{at}': ")
    }
}

/// `value` as a scalar of `data_type`, or what does not fit, naming its place (`tags[2]`,
/// `address.city`).
fn scalar(value: &Value, data_type: &DataType, at: &str) -> Result<ScalarValue, Mismatch> {
    let wrong = |expected: &'static str| Mismatch::Expected {
        at: at.to_string(),
        expected,
        got: excerpt(&value.to_string()),
    };
    if value.is_null() {
        return ScalarValue::try_from(data_type).map_err(|e| Mismatch::Arrow(e.to_string()));
    }
    Ok(match data_type {
        DataType::Utf8 => ScalarValue::Utf8(Some(
            value.as_str().ok_or_else(|| wrong("a string"))?.to_string(),
        )),
        DataType::Boolean => {
            ScalarValue::Boolean(Some(value.as_bool().ok_or_else(|| wrong("true or false"))?))
        }
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            let n = value
                .as_i64()
                .or_else(|| {
                    value
                        .as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                        .map(|f| f as i64)
                })
                .ok_or_else(|| wrong("a whole number"))?;
            let out_of_range = || Mismatch::OutOfRange {
                at: at.to_string(),
                n,
                data_type: data_type.to_string(),
            };
            match data_type {
                DataType::Int8 => {
                    ScalarValue::Int8(Some(i8::try_from(n).map_err(|_| out_of_range())?))
                }
                DataType::Int16 => {
                    ScalarValue::Int16(Some(i16::try_from(n).map_err(|_| out_of_range())?))
                }
                DataType::Int32 => {
                    ScalarValue::Int32(Some(i32::try_from(n).map_err(|_| out_of_range())?))
                }
                _ => ScalarValue::Int64(Some(n)),
            }
        }
        DataType::Float32 => {
            ScalarValue::Float32(Some(value.as_f64().ok_or_else(|| wrong("a number"))? as f32))
        }
        DataType::Float64 => {
            ScalarValue::Float64(Some(value.as_f64().ok_or_else(|| wrong("a number"))?))
        }
        DataType::Date32 => {
            let text = value.as_str().ok_or_else(|| wrong("a date 'YYYY-MM-DD'"))?;
            let date = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .map_err(|_| wrong("a date 'YYYY-MM-DD'"))?;
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default();
            ScalarValue::Date32(Some((date - epoch).num_days() as i32))
        }
        DataType::List(item) => {
            let items = value.as_array().ok_or_else(|| wrong("a list"))?;
            let scalars = items
                .iter()
                .enumerate()
                .map(|(i, v)| scalar(v, item.data_type(), &format!("{at}[{}]", i + 1)))
                .collect::<Result<Vec<_>, _>>()?;
            ScalarValue::List(ScalarValue::new_list_nullable(&scalars, item.data_type()))
        }
        DataType::Struct(fields) => {
            let object = value.as_object().ok_or_else(|| wrong("an object"))?;
            if let Some(extra) = object.keys().find(|k| fields.find(k).is_none()) {
                return Err(Mismatch::NotAColumn {
                    at: at.to_string(),
                    field: extra.clone(),
                    columns: fields
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            let mut builder = ScalarStructBuilder::new();
            for field in fields.iter() {
                let inner = if at.is_empty() {
                    field.name().clone()
                } else {
                    format!("{at}.{}", field.name())
                };
                let value = scalar(
                    object.get(field.name()).unwrap_or(&Value::Null),
                    field.data_type(),
                    &inner,
                )?;
                builder = builder.with_scalar(field.as_ref().clone(), value);
            }
            builder
                .build()
                .map_err(|e| Mismatch::Arrow(e.to_string()))?
        }
        other => {
            return Err(Mismatch::Type {
                at: at.to_string(),
                data_type: other.to_string(),
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray};

    #[test]
    fn columns_are_parsed_and_refused() {
        let fields = parse("name VARCHAR, age INT, tags VARCHAR[], at STRUCT<city TEXT>").unwrap();
        assert_eq!(fields.len(), 4);
        assert_eq!(fields[1].data_type(), &DataType::Int32);
        assert!(matches!(fields[2].data_type(), DataType::List(_)));
        assert!(
            parse("name VARCHAR, name INT")
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
        assert!(
            parse("x INTERVAL")
                .unwrap_err()
                .to_string()
                .contains("not taken")
        );
        assert!(parse("").is_err());
        assert!(parse("a INT b INT").is_err());
        let deep = format!("a INT{}", "[]".repeat(5000));
        assert!(
            parse(&deep)
                .unwrap_err()
                .to_string()
                .contains("nest deeper")
        );
        let deep = format!("a {}INT{}", "STRUCT<b ".repeat(40), ">".repeat(40));
        assert!(
            parse(&deep)
                .unwrap_err()
                .to_string()
                .contains("nest deeper")
        );
        assert!(parse(&format!("a INT{}", "[]".repeat(8))).is_ok());
    }

    #[test]
    fn the_json_schema_is_strict() {
        let fields = parse("name VARCHAR, tags VARCHAR[]").unwrap();
        let schema = json_schema(&fields);
        assert_eq!(schema["additionalProperties"], json!(false));
        assert_eq!(schema["required"], json!(["name", "tags"]));
        assert_eq!(
            schema["properties"]["name"]["type"],
            json!(["string", "null"])
        );
        assert_eq!(
            schema["properties"]["tags"]["items"]["type"],
            json!("string")
        );
    }

    #[test]
    fn replies_are_decoded_or_failed_row_by_row() {
        let fields = parse("name VARCHAR, age INT, tags VARCHAR[]").unwrap();
        let replies = [
            Some(r#"{"name": "Ann", "age": 42, "tags": ["a", "b"]}"#),
            Some(r#"{"name": "Bo", "age": "old", "tags": []}"#),
            None,
            Some(r#"{"name": "Cy", "age": 7.0, "tags": null, "extra": 1}"#),
            Some(r#"{"name": "Di", "age": 3000000000, "tags": null}"#),
            Some(r#"{"name": "Ed", "#),
            Some(r#"{"name": null, "age": 1, "tags": ["x"]}"#),
        ];
        let (array, failed) = decode(&fields, &replies).unwrap();
        let rows: Vec<usize> = failed.iter().map(|(r, _)| *r).collect();
        assert_eq!(rows, vec![1, 3, 4, 5], "{failed:?}");
        assert!(
            failed[0].1.contains("'age': expected a whole number"),
            "{failed:?}"
        );
        assert!(failed[1].1.contains("'extra'"), "{failed:?}");
        assert!(failed[2].1.contains("out of the range"), "{failed:?}");
        assert!(failed[3].1.contains("not JSON"), "{failed:?}");
        let s = array.as_struct();
        assert_eq!(s.len(), 7);
        assert!(s.is_valid(0) && s.is_null(1) && s.is_null(2) && s.is_valid(6));
        let ages = s
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
        assert_eq!(ages.value(0), 42);
        assert!(s.column(0).is_null(6));
    }
}
