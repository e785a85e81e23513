//! Where a SQL statement goes, decided once ([`SqlRoute::of`]): batchinfer's own statements are
//! their own variants of [`crate::statements::Statement`], and [`super::Engine::run`] hands each
//! to the feature that runs it; a statement DataFusion parsed is routed here, by what it does,
//! with the parts its feature takes.

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    CreateTable, ObjectName, ObjectType, Statement as SQLStatement,
};

use crate::warehouse::Warehouse;

/// How a statement DataFusion parsed runs.
#[derive(Debug)]
pub(super) enum SqlRoute<'a> {
    /// COPY or INSERT, or EXPLAIN ANALYZE of one: its files appear whole when it succeeds, or
    /// not at all ([`crate::write`]).
    Write(DFStatement),
    /// CREATE TABLE ... AS, with a warehouse: a Delta table of the warehouse
    /// ([`crate::write`]).
    CreateTableAs(&'a Warehouse, Box<CreateTable>),
    /// DROP TABLE, with a warehouse: a warehouse table's files go with it ([`crate::catalog`]).
    DropTables(&'a Warehouse, Vec<ObjectName>, DFStatement),
    /// EXPLAIN ANALYZE of a statement that writes nothing: it runs, and its plan is shown with
    /// what each step did.
    ExplainAnalyze(DFStatement),
    /// Anything else: planned by DataFusion (the catalog's names resolved), DDL run at once, a
    /// query as its rows are read.
    Plan(DFStatement),
}

impl<'a> SqlRoute<'a> {
    /// The route of `statement`, in an engine with `warehouse` or without one.
    pub(super) fn of(statement: DFStatement, warehouse: Option<&'a Warehouse>) -> SqlRoute<'a> {
        let writes = |statement: &DFStatement| match statement {
            DFStatement::CopyTo(_) => true,
            DFStatement::Statement(s) => matches!(s.as_ref(), SQLStatement::Insert(_)),
            _ => false,
        };
        match statement {
            DFStatement::Explain(e) if e.options.analyze && writes(&e.statement) => {
                SqlRoute::Write(DFStatement::Explain(e))
            }
            DFStatement::Explain(e) if e.options.analyze => {
                SqlRoute::ExplainAnalyze(DFStatement::Explain(e))
            }
            s if writes(&s) => SqlRoute::Write(s),
            DFStatement::Statement(s) => {
                let dropped = match s.as_ref() {
                    SQLStatement::Drop {
                        object_type: ObjectType::Table,
                        names,
                        ..
                    } => Some(names.clone()),
                    _ => None,
                };
                match (warehouse, *s, dropped) {
                    (Some(warehouse), SQLStatement::CreateTable(ct), _) if ct.query.is_some() => {
                        SqlRoute::CreateTableAs(warehouse, Box::new(ct))
                    }
                    (Some(warehouse), s, Some(names)) => {
                        SqlRoute::DropTables(warehouse, names, DFStatement::Statement(Box::new(s)))
                    }
                    (_, s, _) => SqlRoute::Plan(DFStatement::Statement(Box::new(s))),
                }
            }
            s => SqlRoute::Plan(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::statements::{Statement, parse};

    /// The route of `sql` as a word, with a warehouse or without.
    fn route(sql: &str, warehouse: Option<&Warehouse>) -> &'static str {
        let dialect = datafusion::sql::sqlparser::dialect::GenericDialect {};
        let mut statements = parse(sql, &dialect).unwrap();
        let Statement::Sql(statement) = statements.remove(0) else {
            panic!("{sql} is DataFusion's");
        };
        match SqlRoute::of(*statement, warehouse) {
            SqlRoute::Write(_) => "write",
            SqlRoute::CreateTableAs(..) => "create table as",
            SqlRoute::DropTables(_, names, _) => {
                assert_eq!(names.len(), 2, "{sql}");
                "drop tables"
            }
            SqlRoute::ExplainAnalyze(_) => "explain analyze",
            SqlRoute::Plan(_) => "plan",
        }
    }

    #[test]
    fn each_statement_has_one_route() {
        let root = tempfile::tempdir().unwrap();
        let stores = Arc::new(crate::storage::StoreRegistry::new());
        let warehouse = Warehouse::new(root.path(), stores).unwrap();
        for (sql, with, without) in [
            ("COPY (SELECT 1) TO 'out.parquet'", "write", "write"),
            ("INSERT INTO t VALUES (1)", "write", "write"),
            ("EXPLAIN ANALYZE INSERT INTO t VALUES (1)", "write", "write"),
            (
                "EXPLAIN ANALYZE SELECT 1",
                "explain analyze",
                "explain analyze",
            ),
            ("EXPLAIN SELECT 1", "plan", "plan"),
            ("CREATE TABLE t AS SELECT 1", "create table as", "plan"),
            ("CREATE TABLE t (a INT)", "plan", "plan"),
            ("DROP TABLE t, u", "drop tables", "plan"),
            ("DROP VIEW v", "plan", "plan"),
            ("SELECT 1", "plan", "plan"),
        ] {
            assert_eq!(route(sql, Some(&warehouse)), with, "{sql}");
            assert_eq!(route(sql, None), without, "{sql}");
        }
    }
}
