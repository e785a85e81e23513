//! A statement checked against what its session may reach before it runs: a read-only session
//! runs no statement that writes, and every path a statement names to write, to define a table
//! over or to load a model from is within the session's folders and locations
//! ([`crate::storage::access`]); what the statement then reads or writes through the session's
//! stores is checked again there, file by file. Whatever confines a session, nothing but the
//! catalog's own statements writes into the warehouse's folders (`tables/`, `llm-cache/` ...).

use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement as SQLStatement;

use crate::config::{BatchInferOptions, OnError};
use crate::error::{Error, Result};
use crate::statements::{ModelStatement, Statement, ViewStatement, table_function_literals};
use crate::storage::access::{Access, Op};
use crate::warehouse::Warehouse;

/// What a statement is checked against: its session's confinement, options and context (for the
/// tables it names), and the warehouse.
pub struct Reach<'a> {
    pub access: &'a Access,
    pub options: &'a BatchInferOptions,
    pub ctx: &'a SessionContext,
    pub warehouse: Option<&'a Warehouse>,
}

/// Refuses `statement` where its session may not run it: one that writes in a read-only
/// session, one that names a path the session may not reach.
pub fn check_statement(statement: &Statement, reach: &Reach<'_>) -> Result<()> {
    let access = reach.access;
    if let Some(what) = writes(statement) {
        access.check_writes(what).map_err(refused)?;
    }
    // A write into the warehouse's folders is refused in every session, confined or not.
    if let Statement::Sql(sql) | Statement::ExplainCost(sql) = statement {
        check_sql(sql, reach)?;
    }
    if !access.confined() {
        return Ok(());
    }
    if let Statement::Model(
        ModelStatement::Create { source, .. } | ModelStatement::AddVersion { source, .. },
    ) = statement
    {
        check_path(access, source, Op::Read)?;
    }
    // An endpoint model's tokenizer is a local file it reads.
    if let Statement::Model(ModelStatement::CreateEndpoint { options, .. }) = statement
        && let Some(tokenizer) = options.get("tokenizer")
    {
        check_path(access, tokenizer.trim(), Op::Read)?;
    }
    // Where rejected rows would go (a SET, which may be the one that changes it, goes on).
    let options = reach.options;
    let setting = matches!(statement, Statement::Sql(sql)
        if matches!(sql.as_ref(), DFStatement::Statement(s) if matches!(s.as_ref(), SQLStatement::Set(_))));
    if !setting && options.on_error == OnError::Reject && !options.rejects.is_empty() {
        check_path(access, &options.rejects, Op::Write)?;
    }
    Ok(())
}

fn check_sql(statement: &DFStatement, reach: &Reach<'_>) -> Result<()> {
    let access = reach.access;
    if let DFStatement::CopyTo(copy) = statement {
        check_write_target(access, reach.warehouse, &copy.target)?;
    }
    if !access.confined() {
        return Ok(());
    }
    // The paths given to table functions (`read_blob('...')`), checked before the function
    // looks at them (so that whether a file outside exists is not told either).
    let named = crate::blob::FUNCTIONS
        .iter()
        .flat_map(|function| table_function_literals(statement, function, 0..1))
        .chain(table_function_literals(
            statement,
            "predict_table",
            1..usize::MAX,
        ));
    for path in named {
        check_path(access, &path, Op::Read)?;
    }
    match statement {
        DFStatement::CopyTo(_) => Ok(()),
        DFStatement::CreateExternalTable(table) => {
            // A database's location is where to connect, not a path.
            if table.file_type.eq_ignore_ascii_case("postgres") {
                return Ok(());
            }
            table
                .locations
                .iter()
                .try_for_each(|location| check_path(access, location, Op::Read))
        }
        DFStatement::Explain(explain) => check_sql(&explain.statement, reach),
        _ => {
            // A table named by its path (`FROM 'data/x.parquet'`), which DataFusion would only
            // call missing once the store refused it.
            let references = reach.ctx.state().resolve_table_references(statement)?;
            references
                .iter()
                .filter(|r| r.schema().is_none() && looks_like_a_path(r.table()))
                .try_for_each(|r| check_path(access, r.table(), Op::Read))
        }
    }
}

/// Whether a table's name is a path or a URL rather than a name.
fn looks_like_a_path(name: &str) -> bool {
    name.contains('/') || name.contains('.') || name.contains(':')
}

/// Refuses a write into `target` (a COPY's, an INSERT's folder) where the session may not
/// write, and into the warehouse's own folders in any session.
pub fn check_write_target(
    access: &Access,
    warehouse: Option<&Warehouse>,
    target: &str,
) -> Result<()> {
    let url = crate::storage::location_url(target)?;
    if let Some(folder) = warehouse.and_then(|w| w.own_folder_holding(&url)) {
        if folder == crate::llm::cache::SECRET {
            return Err(Error::Statement(format!(
                "writing '{target}' is refused: it is the warehouse's secret that signs the LLM \
                 cache ({folder}), which no statement writes"
            )));
        }
        return Err(Error::Statement(format!(
            "writing '{target}' is refused: it is in the warehouse's {folder}/ folder, whose \
             files only the warehouse's own statements write (CREATE TABLE, INSERT INTO a table, \
             CREATE MODEL ...)"
        )));
    }
    access.check(&url, Op::Write, false).map_err(refused)
}

/// [`check_write_target`] for an INSERT INTO `table`, whose files go into `folder`: a table of
/// the warehouse (a folder of Parquet files of its older layout) is the catalog's own to write.
pub fn check_insert_target(
    access: &Access,
    warehouse: Option<&Warehouse>,
    table: &datafusion::sql::sqlparser::ast::ObjectName,
    folder: &str,
) -> Result<()> {
    let own = warehouse
        .zip(crate::warehouse::table_name(table).ok())
        .and_then(|(warehouse, name)| warehouse.root().join(&format!("tables/{name}/")).ok());
    let url = crate::storage::location_url(folder)?;
    if own
        .is_some_and(|own| own.as_str().trim_end_matches('/') == url.as_str().trim_end_matches('/'))
    {
        return access.check(&url, Op::Write, true).map_err(refused);
    }
    check_write_target(access, warehouse, folder)
}

fn check_path(access: &Access, location: &str, op: Op) -> Result<()> {
    let url = crate::storage::location_url(location)?;
    access.check(&url, op, false).map_err(refused)
}

fn refused(e: crate::storage::access::Refused) -> Error {
    Error::Statement(e.0)
}

/// What `statement` is called when it writes (None: it only reads, or sets an option).
fn writes(statement: &Statement) -> Option<&'static str> {
    Some(match statement {
        Statement::Model(m) => match m {
            ModelStatement::Create { .. } | ModelStatement::CreateEndpoint { .. } => "CREATE MODEL",
            ModelStatement::Drop { .. } => "DROP MODEL",
            ModelStatement::AddVersion { .. }
            | ModelStatement::SetAlias { .. }
            | ModelStatement::DropAlias { .. }
            | ModelStatement::DropVersion { .. } => "ALTER MODEL",
            ModelStatement::ClearCache => "CLEAR LLM CACHE",
            ModelStatement::Show
            | ModelStatement::Describe { .. }
            | ModelStatement::ShowVersions { .. }
            | ModelStatement::ShowCache => return None,
        },
        Statement::View(v) => match v {
            ViewStatement::Create { .. } => "CREATE MATERIALIZED VIEW",
            ViewStatement::Refresh { .. } => "REFRESH MATERIALIZED VIEW",
            ViewStatement::Drop { .. } => "DROP MATERIALIZED VIEW",
            ViewStatement::Show => return None,
        },
        Statement::Vacuum { .. } => "VACUUM",
        Statement::Optimize(_) => "OPTIMIZE",
        Statement::History(_) | Statement::ExplainCost(_) | Statement::ExplainCostRefresh(_) => {
            return None;
        }
        Statement::Sql(sql) => return sql_writes(sql),
    })
}

fn sql_writes(statement: &DFStatement) -> Option<&'static str> {
    Some(match statement {
        DFStatement::CopyTo(_) => "COPY",
        DFStatement::CreateExternalTable(_) => "CREATE EXTERNAL TABLE",
        DFStatement::Explain(explain) => return sql_writes(&explain.statement),
        DFStatement::Statement(s) => match s.as_ref() {
            SQLStatement::Insert(_) => "INSERT",
            SQLStatement::Update { .. } => "UPDATE",
            SQLStatement::Delete(_) => "DELETE",
            SQLStatement::Merge { .. } => "MERGE",
            SQLStatement::Truncate { .. } => "TRUNCATE",
            SQLStatement::CreateTable(_) => "CREATE TABLE",
            SQLStatement::CreateView { .. } => "CREATE VIEW",
            SQLStatement::CreateSchema { .. } => "CREATE SCHEMA",
            SQLStatement::CreateDatabase { .. } => "CREATE DATABASE",
            SQLStatement::CreateFunction(_) => "CREATE FUNCTION",
            SQLStatement::CreateIndex(_) => "CREATE INDEX",
            SQLStatement::Drop { .. } | SQLStatement::DropFunction { .. } => "DROP",
            SQLStatement::AlterTable { .. } | SQLStatement::AlterView { .. } => "ALTER",
            _ => return None,
        },
        _ => return None,
    })
}
