//! Tables in databases: PostgreSQL and SQLite tables as sources and sinks, through
//! datafusion-table-providers.
//!
//! ```sql
//! CREATE EXTERNAL TABLE customers STORED AS POSTGRES LOCATION 'public.customers'
//! OPTIONS ('host' 'localhost', 'port' '5432', 'db' 'shop', 'user' 'app', 'pass' '...');
//! CREATE EXTERNAL TABLE events STORED AS SQLITE LOCATION 'data/events.db' OPTIONS ('table' 'events');
//! INSERT INTO churn_scores SELECT id, predict('churn', city, age, spend).label FROM customers;
//! ```
//!
//! A table's columns are read from the database. Filters, projections and limits are sent to it
//! as SQL (the providers unparse DataFusion's expressions), so only the rows and columns a query
//! needs cross the connection. An `INSERT INTO` such a table runs in one transaction: a statement
//! that fails leaves the table as it was.
//!
//! The session creates these tables through its table factories ([`DatabaseFactory`], as
//! DataFusion creates any external table). The password is used to connect, then kept only by
//! the connection pool: the statement's text (in rejects, progress lines and messages) and an
//! EXPLAIN of it show it blanked, and no table definition or message carries it.

mod postgres;
mod rows;
mod sqlite;
mod sqlite_insert;

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::common::TableReference;
use datafusion::logical_expr::CreateExternalTable;

use crate::error::{Error, Result};

/// The kinds of database table batchinfer connects (`STORED AS ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    Postgres,
    Sqlite,
}

impl Database {
    /// The database a `STORED AS` names, if it names one.
    pub fn of(file_type: &str) -> Option<Database> {
        match file_type.to_ascii_uppercase().as_str() {
            "POSTGRES" | "POSTGRESQL" => Some(Database::Postgres),
            "SQLITE" => Some(Database::Sqlite),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Database::Postgres => "PostgreSQL",
            Database::Sqlite => "SQLite",
        }
    }
}

/// `STORED AS POSTGRES | POSTGRESQL | SQLITE`, among the session's table factories.
#[derive(Debug)]
pub struct DatabaseFactory(pub Database);

impl DatabaseFactory {
    /// The factories of the session, by the name `STORED AS` gives them.
    pub fn all() -> Vec<(&'static str, Arc<dyn TableProviderFactory>)> {
        vec![
            ("POSTGRES", Arc::new(DatabaseFactory(Database::Postgres))),
            ("POSTGRESQL", Arc::new(DatabaseFactory(Database::Postgres))),
            ("SQLITE", Arc::new(DatabaseFactory(Database::Sqlite))),
        ]
    }
}

#[async_trait]
impl TableProviderFactory for DatabaseFactory {
    async fn create(
        &self,
        _: &dyn Session,
        create: &CreateExternalTable,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        Ok(table(self.0, create).await?)
    }
}

/// The table provider of `CREATE EXTERNAL TABLE ... STORED AS POSTGRES | SQLITE`: connected,
/// its columns read from the database (or, for declared columns, the table created there).
pub async fn table(
    database: Database,
    create: &CreateExternalTable,
) -> Result<Arc<dyn TableProvider>> {
    let options = crate::statements::external_table_options(create);
    let name = create.name.to_string();
    let (inner, sqlite) = match database {
        Database::Postgres => (postgres::table(&name, create, options).await?, None),
        Database::Sqlite => {
            let (read, target) = sqlite::table(&name, create, options).await?;
            (read, Some(target))
        }
    };
    Ok(Arc::new(rows::DatabaseTable {
        inner,
        database,
        sqlite,
    }))
}

/// The one `LOCATION` of a table definition (empty where none is given).
fn location(create: &CreateExternalTable) -> Result<&str> {
    match create.locations.as_slice() {
        [] => Ok(""),
        [one] => Ok(one),
        _ => Err(Error::table(
            &create.name,
            format!(
                "table '{}' names {} locations: a database table has one",
                create.name,
                create.locations.len()
            ),
        )),
    }
}

/// The table a `LOCATION` names in the database (`schema.table` or `table`), else the external
/// table's own name.
fn table_reference(location: &str, name: &str) -> TableReference {
    match location.trim() {
        "" => TableReference::bare(name),
        location => TableReference::parse_str(location),
    }
}

/// `text` with every occurrence of each secret replaced, for a message quoting an error whose
/// text no one controls.
fn without(text: &str, secrets: &[&str]) -> String {
    let mut text = text.to_string();
    // A secret of a few characters would blank unrelated words (and so show what it is); the
    // errors quoted here do not carry the password, this only makes sure of it.
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret, "<redacted>");
    }
    text
}

/// An option no database of this kind takes.
fn unknown_option(database: Database, key: &str, known: &[&str]) -> Error {
    Error::setting(
        key,
        format!(
            "{} tables take no option '{key}' (they take {})",
            database.name(),
            known
                .iter()
                .map(|k| format!("'{k}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}
