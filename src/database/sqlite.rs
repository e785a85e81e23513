//! SQLite tables: a database file of this machine, embedded (no server).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::Constraints;
use datafusion::logical_expr::CreateExternalTable;
use datafusion_table_providers_common::sql::db_connection_pool::Mode;
use datafusion_table_providers_sqlite::pool::SqliteConnectionPoolFactory;
use datafusion_table_providers_sqlite::sql_table::SQLiteTable;
use datafusion_table_providers_sqlite::write::SqliteTableWriter;
use datafusion_table_providers_sqlite::{DynSqliteConnectionPool, Sqlite};

use super::{Database, table_reference, unknown_option};
use crate::error::{Error, Result};

/// How long a statement waits for another writer's lock on the file before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) async fn table(
    name: &str,
    create: &CreateExternalTable,
    options: BTreeMap<String, String>,
) -> Result<Arc<dyn TableProvider>> {
    let mut table = None;
    for (key, value) in options {
        match key.as_str() {
            "table" => table = Some(value),
            key => return Err(unknown_option(Database::Sqlite, key, &["table"])),
        }
    }
    let location = super::location(create)?;
    let path = crate::storage::local_path(location)?.ok_or_else(|| {
        Error::Usage(format!(
            "SQLite table '{name}': LOCATION '{}' is not a file of this machine (a SQLite \
             database is a local file)",
            crate::storage::blank_passwords(location)
        ))
    })?;
    // A regular file only: opening a FIFO would wait for a writer, and a missing file would be
    // created empty.
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => {
            return Err(Error::Usage(format!(
                "SQLite table '{name}': {} is not a regular file",
                path.display()
            )));
        }
        Err(e) => {
            return Err(Error::io(
                format!(
                    "SQLite table '{name}': opening the database {}",
                    path.display()
                ),
                e,
            ));
        }
    }
    if !create.schema.fields().is_empty() {
        return Err(Error::Usage(format!(
            "SQLite table '{name}': its columns are read from the database; create the table \
             there (sqlite3) and leave them out"
        )));
    }
    let reference = table_reference(table.as_deref().unwrap_or(""), name);
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::Usage(format!(
            "SQLite table '{name}' ({reference} in {}): {what}: {e}",
            path.display()
        ))
    };
    let schema = {
        let (path, table) = (path.clone(), reference.table().to_string());
        tokio::task::spawn_blocking(move || declared_schema(&path, &table))
            .await
            .map_err(|e| failed("reading the table's columns", &e))?
            .map_err(|e| failed("cannot read the table's columns", &e))?
    };
    if schema.fields().is_empty() {
        return Err(failed(
            "no such table",
            &format!("the database has no table '{}'", reference.table()),
        ));
    }
    let pool = SqliteConnectionPoolFactory::new(&path.to_string_lossy(), Mode::File, BUSY_TIMEOUT)
        .build()
        .await
        .map_err(|e| failed("cannot open the database", &e))?;
    let pool = Arc::new(pool);
    let dyn_pool: Arc<DynSqliteConnectionPool> = pool.clone();
    let read = Arc::new(SQLiteTable::new_with_schema(
        &dyn_pool,
        schema.clone(),
        reference.clone(),
    ));
    let sqlite = Sqlite::new(reference, schema, pool, Constraints::default());
    Ok(SqliteTableWriter::create(read, sqlite, None))
}

/// The columns of `table` as declared (`PRAGMA table_info`), as Arrow types by SQLite's rules
/// of type affinity: what the table is, whatever its rows hold (or if it holds none).
fn declared_schema(path: &std::path::Path, table: &str) -> rusqlite::Result<SchemaRef> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mut statement =
        conn.prepare("SELECT name, type, \"notnull\" FROM pragma_table_info(?1)")?;
    let fields = statement
        .query_map([table], |row| {
            let name: String = row.get(0)?;
            let declared: String = row.get(1)?;
            let not_null: bool = row.get(2)?;
            Ok(Field::new(name, affinity(&declared), !not_null))
        })?
        .collect::<rusqlite::Result<Vec<Field>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// The Arrow type of a declared SQLite column type (SQLite's rules of type affinity, section
/// 3.1 of its documentation on data types; booleans as they are usually declared, dates and
/// times as text).
fn affinity(declared: &str) -> DataType {
    let declared = declared.to_ascii_uppercase();
    if declared.contains("INT") {
        DataType::Int64
    } else if ["CHAR", "CLOB", "TEXT", "DATE", "TIME"]
        .iter()
        .any(|t| declared.contains(t))
    {
        // Dates and times as the text (ISO 8601) SQLite's date functions keep.
        DataType::Utf8
    } else if declared.contains("BLOB") || declared.is_empty() {
        DataType::Binary
    } else if declared.contains("BOOL") {
        DataType::Boolean
    } else {
        DataType::Float64
    }
}

#[cfg(test)]
#[test]
fn declared_types_take_sqlites_affinity() {
    for (declared, arrow) in [
        ("INTEGER", DataType::Int64),
        ("bigint", DataType::Int64),
        ("VARCHAR(20)", DataType::Utf8),
        ("text", DataType::Utf8),
        ("REAL", DataType::Float64),
        ("DOUBLE PRECISION", DataType::Float64),
        ("NUMERIC", DataType::Float64),
        ("BLOB", DataType::Binary),
        ("", DataType::Binary),
        ("BOOLEAN", DataType::Boolean),
        ("DATE", DataType::Utf8),
        ("TIMESTAMP", DataType::Utf8),
        ("DATETIME", DataType::Utf8),
    ] {
        assert_eq!(affinity(declared), arrow, "{declared}");
    }
}
