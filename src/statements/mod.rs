//! Parsing scripts: DataFusion's parser, wrapped (as DataFusion's custom-dialect example does) to
//! know batchinfer's own statements about models:
//!
//! ```sql
//! CREATE [OR REPLACE] MODEL churn FROM 'models/churn.onnx';
//! CREATE MODEL minilm FROM 'models/all-MiniLM-L6-v2/';   -- a folder: model.onnx + tokenizer.json
//! CREATE MODEL churn8 FROM 'models/churn.onnx' OPTIONS ('quantize' 'int8');
//! SHOW MODELS;
//! DESCRIBE MODEL churn;
//! DROP MODEL [IF EXISTS] churn;
//! ```
//! and materialized views ([`crate::view`]), in PostgreSQL's syntax:
//!
//! ```sql
//! CREATE [OR REPLACE] MATERIALIZED VIEW [IF NOT EXISTS] scores AS SELECT ...;
//! REFRESH MATERIALIZED VIEW scores;
//! SHOW MATERIALIZED VIEWS;
//! DROP MATERIALIZED VIEW [IF EXISTS] scores;
//! ```
//! and a Delta table's commits ([`crate::delta`]): `DESCRIBE HISTORY customers`.
//! Everything else is parsed by DataFusion's parser, in the session's dialect.

mod cost;
pub mod limits;
mod models;
mod secrets;
pub mod time_travel;

pub use cost::query_of;
use models::model_statement;

pub use secrets::{blank_secrets, is_secret_name};

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use datafusion::sql::parser::{CopyToSource, DFParser, DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    ObjectName, ObjectType, Query, Statement as SQLStatement, Visit, VisitMut, Visitor, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::Dialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{Error, Result};

/// One statement of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// A statement about models, handled by batchinfer.
    Model(ModelStatement),
    /// A statement about materialized views, handled by batchinfer.
    View(ViewStatement),
    /// `DESCRIBE HISTORY name`: a Delta table's commits ([`crate::delta`]'s tables).
    History(ObjectName),
    /// `VACUUM name [RETAIN n HOURS]`: the files a Delta table's versions no longer name
    /// deleted, once older than the retention.
    Vacuum {
        name: ObjectName,
        retain_hours: Option<u64>,
    },
    /// `OPTIMIZE name`: a Delta table's small files rewritten as fewer.
    Optimize(ObjectName),
    /// `EXPLAIN COST statement`: the statement's query, run as an estimate of what its endpoint
    /// models would be asked, sending nothing ([`crate::llm::estimate`]).
    ExplainCost(Box<DFStatement>),
    /// `EXPLAIN COST REFRESH MATERIALIZED VIEW name`: the view's next refresh, run as an
    /// estimate, sending nothing and writing nothing.
    ExplainCostRefresh(ObjectName),
    /// Anything else, as DataFusion's parser read it.
    Sql(Box<DFStatement>),
}

/// batchinfer's statements about models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelStatement {
    Create {
        name: String,
        source: String,
        or_replace: bool,
        /// `OPTIONS ('quantize' 'int8')`: the model quantized ([`crate::quantize`]).
        quantize: Option<String>,
    },
    /// `CREATE [OR REPLACE] MODEL name OPTIONS (...)` without FROM: an endpoint model
    /// ([`crate::llm`]); options keyed in lower case.
    CreateEndpoint {
        name: String,
        or_replace: bool,
        options: BTreeMap<String, String>,
    },
    Show,
    Describe {
        name: String,
    },
    Drop {
        name: String,
        if_exists: bool,
    },
    /// `ALTER MODEL name ADD VERSION FROM 'path' [OPTIONS (...)]`: a new version, the newest.
    AddVersion {
        name: String,
        source: String,
        quantize: Option<String>,
    },
    /// `ALTER MODEL name SET ALIAS alias TO VERSION n`.
    SetAlias {
        name: String,
        alias: String,
        version: u32,
    },
    /// `ALTER MODEL name DROP ALIAS alias`.
    DropAlias {
        name: String,
        alias: String,
    },
    /// `ALTER MODEL name DROP VERSION n`.
    DropVersion {
        name: String,
        version: u32,
    },
    /// `SHOW MODEL VERSIONS name`.
    ShowVersions {
        name: String,
    },
    /// `SHOW LLM CACHE`: the endpoint models' answers the warehouse keeps ([`crate::llm::cache`]).
    ShowCache,
    /// `CLEAR LLM CACHE`: every kept answer removed.
    ClearCache,
}

/// batchinfer's statements about materialized views.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewStatement {
    Create {
        name: ObjectName,
        query: Box<Query>,
        or_replace: bool,
        if_not_exists: bool,
    },
    Refresh {
        name: ObjectName,
    },
    Show,
    Drop {
        name: ObjectName,
        if_exists: bool,
    },
}

impl Statement {
    /// Whether it is a query (`SELECT`, `WITH`, `VALUES`): what it returns is computed as it is
    /// read, where other statements do their work when they run.
    pub fn is_query(&self) -> bool {
        use datafusion::sql::sqlparser::ast::Statement as SQL;
        matches!(self, Statement::Sql(statement)
            if matches!(statement.as_ref(), DFStatement::Statement(s) if matches!(s.as_ref(), SQL::Query(_))))
    }

    /// What the statement writes, when it writes (COPY's target, INSERT's and CREATE TABLE's
    /// table), for the summary of what it did.
    pub fn writes(&self) -> Option<String> {
        use datafusion::sql::sqlparser::ast::Statement as SQL;
        let statement = match self {
            Statement::Sql(statement) => statement,
            Statement::View(ViewStatement::Create { name, .. }) => return Some(name.to_string()),
            _ => return None,
        };
        match statement.as_ref() {
            DFStatement::CopyTo(copy) => Some(copy.target.clone()),
            DFStatement::Statement(s) => match s.as_ref() {
                SQL::Insert(insert) => Some(insert.table.to_string()),
                SQL::CreateTable(create) if create.query.is_some() => Some(create.name.to_string()),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The depth DataFusion's parser goes to (its `DEFAULT_RECURSION_LIMIT`), for a script whose
/// tokens were rewritten ([`time_travel`]).
const RECURSION_LIMIT: usize = 50;

/// The statements of a script, separated by `;` (empty ones dropped). A statement whose
/// expressions nest too deep is refused here ([`limits::check_depth`]).
pub fn parse(script: &str, dialect: &dyn Dialect) -> Result<Vec<Statement>> {
    limits::check_two_way_calls(script, dialect)?;
    let mut df = DFParserBuilder::new(script).with_dialect(dialect).build()?;
    if let Some(tokens) = time_travel::rewrite(script, dialect)? {
        df.parser = Parser::new(dialect)
            .with_recursion_limit(RECURSION_LIMIT)
            .with_tokens_with_locations(tokens);
    }
    let mut statements = Vec::new();
    loop {
        while df.parser.consume_token(&Token::SemiColon) {}
        if df.parser.peek_token().token == Token::EOF {
            return Ok(statements);
        }
        let explained = cost::explain_cost(&mut df)?;
        statements.push(match explained {
            Some(statement) => statement,
            None => match model_statement(&mut df)? {
                Some(statement) => Statement::Model(statement),
                None => match view_statement(&mut df.parser)? {
                    Some(statement) => Statement::View(statement),
                    None => match table_statement(&mut df.parser)? {
                        Some(statement) => statement,
                        None => view_or_sql(sql_statement(&mut df)?)?,
                    },
                },
            },
        });
        let next = df.parser.peek_token().token;
        if next != Token::SemiColon && next != Token::EOF {
            return Err(Error::Statement(format!(
                "expected the end of the statement (';'), found '{next}'"
            )));
        }
    }
}

/// Walks the SQL of a DataFusion statement with `visitor`: a statement, the query of a COPY, the
/// statement an EXPLAIN explains.
pub fn visit_sql<V: Visitor>(statement: &DFStatement, visitor: &mut V) -> ControlFlow<V::Break> {
    match statement {
        DFStatement::Statement(s) => s.visit(visitor),
        DFStatement::CopyTo(copy) => match &copy.source {
            CopyToSource::Query(query) => query.visit(visitor),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        DFStatement::Explain(explain) => visit_sql(&explain.statement, visitor),
        _ => ControlFlow::Continue(()),
    }
}

/// The string-literal arguments of each call of the table function `function` in `statement`,
/// its arguments `args` (`read_blob('photos/')`, `0..1`: `photos/`).
pub fn table_function_literals(
    statement: &DFStatement,
    function: &str,
    args: std::ops::Range<usize>,
) -> Vec<String> {
    use datafusion::sql::sqlparser::ast::{Expr, FunctionArg, FunctionArgExpr, TableFactor};

    struct Calls<'f> {
        function: &'f str,
        args: std::ops::Range<usize>,
        literals: Vec<String>,
    }
    impl Visitor for Calls<'_> {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
            if let TableFactor::Table {
                name,
                args: Some(args),
                ..
            } = factor
                && name.to_string().eq_ignore_ascii_case(self.function)
            {
                let wanted = self.args.clone();
                for arg in args.args.iter().skip(wanted.start).take(wanted.len()) {
                    if let FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(value))) = arg
                        && let Some(text) = value.clone().into_string()
                    {
                        self.literals.push(text);
                    }
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut calls = Calls {
        function,
        args,
        literals: Vec::new(),
    };
    let _ = visit_sql(statement, &mut calls);
    calls.literals
}

/// [`visit_sql`], changing what it visits.
pub fn visit_sql_mut<V: VisitorMut>(
    statement: &mut DFStatement,
    visitor: &mut V,
) -> ControlFlow<V::Break> {
    match statement {
        DFStatement::Statement(s) => s.visit(visitor),
        DFStatement::CopyTo(copy) => match &mut copy.source {
            CopyToSource::Query(query) => query.visit(visitor),
            CopyToSource::Relation(_) => ControlFlow::Continue(()),
        },
        DFStatement::Explain(explain) => visit_sql_mut(&mut explain.statement, visitor),
        _ => ControlFlow::Continue(()),
    }
}

/// DataFusion's statement, refused when it nests deeper than planning can go.
fn sql_statement(df: &mut DFParser<'_>) -> Result<DFStatement> {
    let statement = df.parse_statement()?;
    if let Err(e) = limits::check_depth(&statement) {
        // Dropping a tree that deep would overflow the stack as planning it would.
        std::mem::forget(statement);
        return Err(e);
    }
    limits::check_setting(&statement)?;
    limits::check_unbounded(&statement)?;
    limits::check_numbers(&statement)?;
    Ok(statement)
}

/// The length of the longest start of `text` that holds complete statements (up to and with a
/// `;` outside strings and comments): what can run while more of a script is still coming.
pub fn complete_prefix(text: &str, dialect: &dyn Dialect) -> usize {
    // An unfinished string or comment is not an error here: only more text is missing.
    let Ok(tokens) = Tokenizer::new(dialect, text).tokenize_with_location() else {
        return 0;
    };
    tokens
        .iter()
        .rev()
        .find(|t| t.token == Token::SemiColon)
        .map_or(0, |t| byte_offset(text, t.span.end.line, t.span.end.column))
}

/// Whether `text` is whitespace and comments only (no statement begun).
pub fn only_comments(text: &str, dialect: &dyn Dialect) -> bool {
    Tokenizer::new(dialect, text)
        .tokenize()
        .is_ok_and(|tokens| tokens.iter().all(|t| matches!(t, Token::Whitespace(_))))
}

/// The byte offset of a tokenizer location (1-based line and column, in characters).
fn byte_offset(text: &str, line: u64, column: u64) -> usize {
    let line_start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1) as usize)
        .map(str::len)
        .sum();
    let rest = &text[line_start..];
    line_start
        + rest
            .char_indices()
            .nth(column.saturating_sub(1) as usize)
            .map_or(rest.len(), |(i, _)| i)
}

fn is_word(token: &Token, word: &str) -> bool {
    matches!(token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

fn keyword(token: &Token) -> Option<Keyword> {
    match token {
        Token::Word(w) if w.quote_style.is_none() => Some(w.keyword),
        _ => None,
    }
}

/// Recognizes and reads the view statements DataFusion's parser does not know (REFRESH, SHOW).
fn view_statement(parser: &mut Parser<'_>) -> Result<Option<ViewStatement>> {
    let peek = |parser: &Parser<'_>, n: usize| parser.peek_nth_token(n).token;
    let views = is_word(&peek(parser, 2), "VIEW") || is_word(&peek(parser, 2), "VIEWS");
    if !is_word(&peek(parser, 1), "MATERIALIZED") || !views {
        return Ok(None);
    }
    if is_word(&peek(parser, 0), "REFRESH") && is_word(&peek(parser, 2), "VIEW") {
        advance(parser, 3);
        let name = parser.parse_object_name(false).map_err(|_| {
            Error::Statement("expected a view name: REFRESH MATERIALIZED VIEW name".into())
        })?;
        return Ok(Some(ViewStatement::Refresh { name }));
    }
    if keyword(&peek(parser, 0)) == Some(Keyword::SHOW) && is_word(&peek(parser, 2), "VIEWS") {
        advance(parser, 3);
        return Ok(Some(ViewStatement::Show));
    }
    Ok(None)
}

/// Recognizes and reads `DESCRIBE HISTORY name`, which DataFusion's parser does not know.
fn table_statement(parser: &mut Parser<'_>) -> Result<Option<Statement>> {
    let first = parser.peek_nth_token(0).token;
    let table_name = |parser: &mut Parser<'_>, syntax: &str| {
        parser
            .parse_object_name(false)
            .map_err(|_| Error::Statement(format!("expected a table name: {syntax}")))
    };
    if matches!(keyword(&first), Some(Keyword::DESCRIBE | Keyword::DESC))
        && is_word(&parser.peek_nth_token(1).token, "HISTORY")
    {
        advance(parser, 2);
        let name = table_name(parser, "DESCRIBE HISTORY name")?;
        return Ok(Some(Statement::History(name)));
    }
    if is_word(&first, "OPTIMIZE") {
        advance(parser, 1);
        let name = table_name(parser, "OPTIMIZE name")?;
        return Ok(Some(Statement::Optimize(name)));
    }
    if !is_word(&first, "VACUUM") {
        return Ok(None);
    }
    const VACUUM: &str = "VACUUM name [RETAIN n HOURS]";
    advance(parser, 1);
    let name = table_name(parser, VACUUM)?;
    let mut retain_hours = None;
    if is_word(&parser.peek_nth_token(0).token, "RETAIN") {
        advance(parser, 1);
        let hours = match parser.next_token().token {
            Token::Number(n, _) => n.parse::<u64>().ok(),
            _ => None,
        };
        if hours.is_none() || !is_word(&parser.next_token().token, "HOURS") {
            return Err(Error::Statement(format!(
                "expected a whole number of hours: {VACUUM}"
            )));
        }
        retain_hours = hours;
    }
    Ok(Some(Statement::Vacuum { name, retain_hours }))
}

/// CREATE and DROP MATERIALIZED VIEW, as DataFusion's parser reads them, as batchinfer's.
fn view_or_sql(statement: DFStatement) -> Result<Statement> {
    let DFStatement::Statement(sql) = &statement else {
        return Ok(Statement::Sql(Box::new(statement)));
    };
    match sql.as_ref() {
        SQLStatement::CreateView(view) if view.materialized => {
            if view.or_replace && view.if_not_exists {
                return Err(Error::Statement(
                    "CREATE OR REPLACE MATERIALIZED VIEW replaces, IF NOT EXISTS keeps: use one"
                        .into(),
                ));
            }
            if !view.columns.is_empty() || view.to.is_some() || view.temporary {
                return Err(Error::Statement(
                    "CREATE MATERIALIZED VIEW name AS query: name the columns in the query \
                     (SELECT x AS name)"
                        .into(),
                ));
            }
            Ok(Statement::View(ViewStatement::Create {
                name: view.name.clone(),
                query: view.query.clone(),
                or_replace: view.or_replace,
                if_not_exists: view.if_not_exists,
            }))
        }
        SQLStatement::Drop {
            object_type: ObjectType::MaterializedView,
            names,
            if_exists,
            ..
        } => match names.as_slice() {
            [name] => Ok(Statement::View(ViewStatement::Drop {
                name: name.clone(),
                if_exists: *if_exists,
            })),
            _ => Err(Error::Statement(
                "DROP MATERIALIZED VIEW drops one view at a time".into(),
            )),
        },
        _ => Ok(Statement::Sql(Box::new(statement))),
    }
}

/// The `OPTIONS` of a `CREATE EXTERNAL TABLE`, keys lower-cased and without the `format.`
/// prefix DataFusion's planner gives keys that have none.
pub fn external_table_options(
    create: &datafusion::logical_expr::CreateExternalTable,
) -> std::collections::BTreeMap<String, String> {
    create
        .options
        .iter()
        .map(|(key, value)| {
            let key = key.to_ascii_lowercase();
            let key = key.strip_prefix("format.").unwrap_or(&key).to_string();
            (key, value.clone())
        })
        .collect()
}

fn advance(parser: &mut Parser<'_>, tokens: usize) {
    for _ in 0..tokens {
        parser.next_token();
    }
}

/// A name as SQL normalizes it: lower case unless quoted.
fn identifier(parser: &mut Parser<'_>, what: &str) -> Result<String> {
    match parser.next_token().token {
        Token::Word(w) if w.quote_style.is_some() => Ok(w.value),
        Token::Word(w) => Ok(w.value.to_ascii_lowercase()),
        _ => Err(Error::Statement(format!("expected {what}"))),
    }
}

#[cfg(test)]
mod tests;
