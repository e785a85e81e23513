//! `EXPLAIN COST statement`: the statement's query, to be run as an estimate of what its
//! endpoint models would be asked ([`crate::llm::estimate`]); and the query of a statement
//! whose cost `batchinfer.max_cost` checks before it runs.

use datafusion::sql::parser::{CopyToSource, DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{Query, SetExpr, Statement as SQLStatement};

use super::{Statement, is_word, sql_statement};
use crate::error::{Error, Result};

const USAGE: &str = "EXPLAIN COST takes a query, COPY, INSERT, CREATE TABLE ... AS or REFRESH \
                     MATERIALIZED VIEW: EXPLAIN COST SELECT generate('writer', body) FROM docs";

/// `EXPLAIN COST statement` at the parser's place, if it is one: the statement's query.
pub(super) fn explain_cost(df: &mut DFParser<'_>) -> Result<Option<Statement>> {
    let parser = &mut df.parser;
    if !(is_word(&parser.peek_nth_token(0).token, "EXPLAIN")
        && is_word(&parser.peek_nth_token(1).token, "COST"))
    {
        return Ok(None);
    }
    parser.next_token();
    parser.next_token();
    match super::view_statement(parser)? {
        Some(super::ViewStatement::Refresh { name }) => {
            return Ok(Some(Statement::ExplainCostRefresh(name)));
        }
        Some(_) => return Err(Error::Statement(USAGE.into())),
        None => {}
    }
    let statement = sql_statement(df).map_err(|e| Error::Statement(format!("{USAGE} ({e})")))?;
    match query_of(&statement) {
        Some(query) => Ok(Some(Statement::ExplainCost(Box::new(query)))),
        None => Err(Error::Statement(USAGE.into())),
    }
}

/// The query a statement reads what it writes or returns from: a query's own, a COPY's, an
/// INSERT's, a CREATE TABLE ... AS's; None for the rest.
pub fn query_of(statement: &DFStatement) -> Option<DFStatement> {
    // A `SELECT ... INTO t` read, not written.
    let query = |q: &Query| {
        let mut q = q.clone();
        if let SetExpr::Select(select) = q.body.as_mut() {
            select.into = None;
        }
        Some(DFStatement::Statement(Box::new(SQLStatement::Query(
            Box::new(q),
        ))))
    };
    match statement {
        DFStatement::CopyTo(copy) => match &copy.source {
            CopyToSource::Query(q) => query(q),
            CopyToSource::Relation(name) => {
                let sql = format!("SELECT * FROM {name}");
                DFParser::parse_sql(&sql).ok()?.pop_front()
            }
        },
        DFStatement::Explain(explain) if explain.options.analyze => query_of(&explain.statement),
        DFStatement::Statement(s) => match s.as_ref() {
            SQLStatement::Query(q) => query(q),
            SQLStatement::Insert(insert) => insert.source.as_deref().and_then(query),
            SQLStatement::CreateTable(create) => create.query.as_deref().and_then(query),
            _ => None,
        },
        _ => None,
    }
}
