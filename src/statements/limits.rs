//! What batchinfer refuses before it tries, so that no input can crash it or make it allocate
//! without bound: expressions nested deeper than the stack can plan ([`check_depth`]), and the
//! most values per row a table's lists may claim ([`MAX_LIST_VALUES_PER_ROW`], held by the
//! analyzer rule [`crate::rules::TableSchemaLimits`]).

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, DataType as SqlType, Expr, Query, Set, SetExpr, Statement as SqlStatement,
    TableFactor, Visitor,
};

use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{Error, Result};

/// The deepest nesting of expressions and subqueries a statement may have. DataFusion plans an
/// expression tree by recursion (and copies it, recursively, many times): `1+1+...+1` with
/// 10,000 terms is 10,000 levels deep, and overflows the stack past a few thousand levels.
pub const MAX_EXPRESSION_DEPTH: usize = 1_000;

/// The most values one row of a `FixedSizeList` column may hold (nested lists multiplied). A
/// Parquet file's schema can claim `FixedSizeList<Float32, 2147483647>` in a few hundred bytes,
/// and DataFusion allocates one such row for a NULL value while it plans a scan.
pub const MAX_LIST_VALUES_PER_ROW: i64 = 1 << 22;

/// Refuses a statement whose expressions nest deeper than [`MAX_EXPRESSION_DEPTH`], looking no
/// deeper than that itself.
pub fn check_depth(statement: &DFStatement) -> Result<()> {
    let mut depth = Depth {
        current: 0,
        deepest: 0,
        tables: 0,
    };
    match super::visit_sql(statement, &mut depth) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(Error::Statement(format!(
            "expression too deep: the statement nests expressions, subqueries, set operations or \
             types more than {MAX_EXPRESSION_DEPTH} levels deep, or reads more than \
             {MAX_EXPRESSION_DEPTH} tables (a chain of 'a + b + ...', 'x OR y OR ...', \
             'q UNION ALL r UNION ALL ...' or JOINs is one level per term); use IN (...) for long \
             lists of alternatives, a model for long sums, or a table for long unions"
        ))),
    }
}

/// Settings the engine sizes work by, and the most `SET` may give each (the command line's
/// bounds): a million partitions would plan a million streams.
const BOUNDED_SETTINGS: &[(&str, u64)] = &[
    ("datafusion.execution.target_partitions", 1024),
    ("datafusion.execution.planning_concurrency", 1024),
    ("datafusion.execution.meta_fetch_concurrency", 1024),
    ("datafusion.execution.minimum_parallel_output_files", 1024),
    ("datafusion.execution.batch_size", 1 << 24),
];

/// The deepest nesting of calls such as `CAST(...)` or `NOT (...)` accepted. sqlparser reads each
/// of these words first as its special form and, where that fails, again as a function call, so
/// a statement that fails to parse inside them is parsed again at every level: `2^depth` times.
pub const MAX_TWO_WAY_CALL_DEPTH: usize = 12;

/// The words sqlparser parses two ways when a `(` follows them.
const TWO_WAY_WORDS: &[Keyword] = &[
    Keyword::ARRAY,
    Keyword::CASE,
    Keyword::CAST,
    Keyword::CEIL,
    Keyword::CONVERT,
    Keyword::EXISTS,
    Keyword::EXTRACT,
    Keyword::FLOOR,
    Keyword::INTERVAL,
    Keyword::LAMBDA,
    Keyword::MAP,
    Keyword::MATCH,
    Keyword::NOT,
    Keyword::OVERLAY,
    Keyword::POSITION,
    Keyword::PRIOR,
    Keyword::SAFE_CAST,
    Keyword::STRUCT,
    Keyword::SUBSTR,
    Keyword::SUBSTRING,
    Keyword::TRIM,
    Keyword::TRY_CAST,
    Keyword::TRY_CONVERT,
];

/// Refuses a script whose calls of [`TWO_WAY_WORDS`] nest deeper than
/// [`MAX_TWO_WAY_CALL_DEPTH`], before the parser sees it (48 nested `CAST`s around a syntax error
/// would take it years). Text that does not tokenize is left to the parser to report.
pub fn check_two_way_calls(script: &str, dialect: &dyn Dialect) -> Result<()> {
    let Ok(tokens) = Tokenizer::new(dialect, script).tokenize() else {
        return Ok(());
    };
    let mut open: Vec<Option<Keyword>> = Vec::new();
    let (mut depth, mut previous) = (0usize, None);
    for token in tokens {
        match token {
            Token::Whitespace(_) => continue,
            Token::LParen | Token::LBracket => {
                let two_way = previous.filter(|k| TWO_WAY_WORDS.contains(k));
                if let Some(word) = two_way {
                    depth += 1;
                    if depth > MAX_TWO_WAY_CALL_DEPTH {
                        return Err(Error::Statement(format!(
                            "expression too deep: {word:?}(...) nested in {} calls of CAST, NOT, \
                             EXTRACT and the like (at most {MAX_TWO_WAY_CALL_DEPTH})",
                            depth - 1
                        )));
                    }
                }
                open.push(two_way);
            }
            Token::RParen | Token::RBracket if open.pop().flatten().is_some() => depth -= 1,
            _ => {}
        }
        previous = match &token {
            Token::Word(word) => Some(word.keyword),
            _ => None,
        };
    }
    Ok(())
}

/// Refuses `CREATE UNBOUNDED EXTERNAL TABLE`: an unbounded table is a stream (DataFusion reads
/// it until its writer stops, a FIFO forever, `/dev/zero` into all memory) and an INSERT appends to
/// its file in place, so a failed one would leave part of its rows. batchinfer reads tables whole
/// and writes only what it can commit whole.
pub fn check_unbounded(statement: &DFStatement) -> Result<()> {
    match statement {
        DFStatement::CreateExternalTable(table) if table.unbounded => {
            Err(Error::Statement(format!(
                "table '{}' cannot be UNBOUNDED: batchinfer reads tables as batches and writes only \
             what it can commit whole (an unbounded table is read until its writer stops, and \
             INSERT would append to its file in place); use CREATE EXTERNAL TABLE over a file or \
             a folder ending in '/'",
                table.name
            )))
        }
        DFStatement::Explain(explain) => check_unbounded(&explain.statement),
        _ => Ok(()),
    }
}

/// Refuses a number literal too large for any number type (`1e400`, a number of millions of
/// digits), which would be read as infinity without a word.
pub fn check_numbers(statement: &DFStatement) -> Result<()> {
    use datafusion::sql::sqlparser::ast::{Expr, Value, visit_expressions};
    let check = |expr: &Expr| match expr {
        Expr::Value(value) => match &value.value {
            Value::Number(text, _)
                if text
                    .replace('_', "")
                    .parse::<f64>()
                    .is_ok_and(f64::is_infinite) =>
            {
                let shown = if text.len() > 40 {
                    format!("{}... ({} characters)", &text[..20], text.len())
                } else {
                    text.clone()
                };
                std::ops::ControlFlow::Break(Error::Statement(format!(
                    "the number {shown} is larger than any number type holds (a double's largest \
                     is about 1.8e308); write a smaller one, or text in quotes"
                )))
            }
            _ => std::ops::ControlFlow::Continue(()),
        },
        _ => std::ops::ControlFlow::Continue(()),
    };
    let found = match statement {
        DFStatement::Statement(statement) => visit_expressions(statement.as_ref(), check),
        DFStatement::CopyTo(copy) => match &copy.source {
            datafusion::sql::parser::CopyToSource::Query(query) => {
                visit_expressions(query.as_ref(), check)
            }
            _ => std::ops::ControlFlow::Continue(()),
        },
        DFStatement::Explain(explain) => return check_numbers(&explain.statement),
        _ => std::ops::ControlFlow::Continue(()),
    };
    match found {
        std::ops::ControlFlow::Break(e) => Err(e),
        std::ops::ControlFlow::Continue(()) => Ok(()),
    }
}

/// Refuses `SET` of a setting in [`BOUNDED_SETTINGS`] to more than its bound.
pub fn check_setting(statement: &DFStatement) -> Result<()> {
    let DFStatement::Statement(statement) = statement else {
        return Ok(());
    };
    let SqlStatement::Set(Set::SingleAssignment {
        variable, values, ..
    }) = statement.as_ref()
    else {
        return Ok(());
    };
    // The name as DataFusion reads it: quotes taken off each part (`"batchinfer_statement".id`
    // and `"batchinfer_statement.id"` are `batchinfer_statement.id`).
    let name = variable
        .0
        .iter()
        .map(|part| match part.as_ident() {
            Some(ident) => ident.value.clone(),
            None => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
        .to_ascii_lowercase();
    if let Some(part) = name.strip_prefix(&format!("{}.", crate::statement_context::PREFIX)) {
        return Err(Error::setting(
            name.clone(),
            format!(
                "{name} cannot be SET: batchinfer sets the statement's {part} for each statement"
            ),
        ));
    }
    let Some((_, most)) = BOUNDED_SETTINGS.iter().find(|(key, _)| *key == name) else {
        return Ok(());
    };
    let value = values
        .iter()
        .map(|v| v.to_string().trim_matches('\'').to_string())
        .collect::<String>();
    match value.parse::<u64>() {
        Ok(n) if n > *most => Err(Error::setting(
            &name,
            format!("{name} must be at most {most}, not {n}"),
        )),
        // Anything else is DataFusion's to accept or refuse.
        _ => Ok(()),
    }
}

struct Depth {
    current: usize,
    deepest: usize,
    /// Tables, subqueries and CTE references read: a chain of JOINs or of CTEs each reading the
    /// one before nests as deep in the plan.
    tables: usize,
}

impl Depth {
    fn enter(&mut self) -> ControlFlow<()> {
        self.current += 1;
        self.deepest = self.deepest.max(self.current);
        if self.current > MAX_EXPRESSION_DEPTH {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn leave(&mut self) -> ControlFlow<()> {
        self.current -= 1;
        ControlFlow::Continue(())
    }
}

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        if let Expr::Cast { data_type, .. } = expr
            && self.current + type_depth(data_type) > MAX_EXPRESSION_DEPTH
        {
            return ControlFlow::Break(());
        }
        self.enter()
    }

    fn pre_visit_table_factor(&mut self, _: &TableFactor) -> ControlFlow<()> {
        self.tables += 1;
        if self.tables > MAX_EXPRESSION_DEPTH {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.leave()
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        // Set operations (`a UNION ALL b UNION ALL ...`) nest without passing through an
        // expression or a query; DataFusion plans them by recursion too.
        let mut operations = 0;
        let mut pending = vec![query.body.as_ref()];
        while let Some(set) = pending.pop() {
            if let SetExpr::SetOperation { left, right, .. } = set {
                operations += 1;
                if self.current + operations > MAX_EXPRESSION_DEPTH {
                    return ControlFlow::Break(());
                }
                pending.extend([left.as_ref(), right.as_ref()]);
            }
        }
        self.enter()
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        self.leave()
    }
}

/// How deep a type nests (`INT[][]` is 3), looking no deeper than [`MAX_EXPRESSION_DEPTH`].
fn type_depth(data_type: &SqlType) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(data_type, 1)];
    while let Some((data_type, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        if deepest > MAX_EXPRESSION_DEPTH {
            break;
        }
        match data_type {
            SqlType::Array(
                ArrayElemTypeDef::AngleBracket(inner)
                | ArrayElemTypeDef::SquareBracket(inner, _)
                | ArrayElemTypeDef::Parenthesis(inner),
            )
            | SqlType::Nullable(inner)
            | SqlType::LowCardinality(inner) => pending.push((inner, depth + 1)),
            SqlType::Map(key, value) => {
                pending.extend([(key.as_ref(), depth + 1), (value.as_ref(), depth + 1)])
            }
            SqlType::Struct(fields, _) | SqlType::Tuple(fields) => {
                pending.extend(fields.iter().map(|f| (&f.field_type, depth + 1)))
            }
            SqlType::Union(fields) => {
                pending.extend(fields.iter().map(|f| (&f.field_type, depth + 1)))
            }
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParser;

    fn depth_of(sql: &str) -> Result<()> {
        let statement = DFParser::parse_sql(sql).unwrap().pop_front().unwrap();
        let checked = check_depth(&statement);
        // A refused statement is too deep to drop on a small stack.
        std::mem::forget(statement);
        checked
    }

    #[test]
    fn deep_expressions_are_refused_and_ordinary_ones_pass() {
        let terms = |n: usize| vec!["1"; n].join("+");
        assert!(depth_of(&format!("SELECT {}", terms(500))).is_ok());
        let err = depth_of(&format!("SELECT {}", terms(MAX_EXPRESSION_DEPTH + 10)))
            .unwrap_err()
            .to_string();
        assert!(err.contains("expression too deep"), "{err}");
        let err = depth_of(&format!(
            "COPY (SELECT * FROM t WHERE {}) TO 'x.parquet'",
            (0..2000)
                .map(|i| format!("a = {i}"))
                .collect::<Vec<_>>()
                .join(" OR ")
        ))
        .unwrap_err();
        assert!(err.to_string().contains("expression too deep"));
        // Set operations count one level each, in a subquery too.
        let unions = |n: usize| vec!["SELECT 1 AS x"; n].join(" UNION ALL ");
        assert!(depth_of(&format!("SELECT count(*) FROM ({})", unions(500))).is_ok());
        let err = depth_of(&format!("SELECT count(*) FROM ({})", unions(5_000))).unwrap_err();
        assert!(err.to_string().contains("set operations"), "{err}");
        // A long IN list is wide, not deep.
        let list: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
        assert!(depth_of(&format!("SELECT 1 WHERE 5 IN ({})", list.join(","))).is_ok());
    }
}
