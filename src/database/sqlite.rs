//! SQLite tables: a database file of this machine, embedded (no server).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::logical_expr::CreateExternalTable;
use datafusion_table_providers_common::sql::db_connection_pool::{
    DbConnectionPool, JoinPushDown, Mode,
};
use datafusion_table_providers_sqlite::DynSqliteConnectionPool;
use datafusion_table_providers_sqlite::pool::SqliteConnectionPool;
use datafusion_table_providers_sqlite::sql_table::SQLiteTable;

use super::sqlite_insert::{BUSY_TIMEOUT, SqliteTarget};
use super::{Database, table_reference, unknown_option};
use crate::error::{Error, Result};

pub(super) async fn table(
    name: &str,
    create: &CreateExternalTable,
    options: BTreeMap<String, String>,
) -> Result<(Arc<dyn TableProvider>, SqliteTarget)> {
    let mut table = None;
    for (key, value) in options {
        match key.as_str() {
            "table" => table = Some(value),
            key => return Err(unknown_option(Database::Sqlite, key, &["table"])),
        }
    }
    let path = database_file(name, create)?;
    if !create.schema.fields().is_empty() {
        return Err(Error::database(
            "SQLite",
            name,
            format!(
                "SQLite table '{name}': its columns are read from the database; create the table \
             there (sqlite3) and leave them out"
            ),
        ));
    }
    let reference = table_reference(table.as_deref().unwrap_or(""), name);
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::database(
            "SQLite",
            name,
            format!(
                "SQLite table '{name}' ({reference} in {}): {what}: {e}",
                path.display()
            ),
        )
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
    // The pool itself, not its factory's `build`, which would switch the file to WAL
    // journaling (for every program that uses it, leaving -wal and -shm files beside it) and set
    // other pragmas: a table definition changes nothing of the database.
    let file = path.to_string_lossy();
    let pool = SqliteConnectionPool::new(
        &file,
        Mode::File,
        JoinPushDown::AllowedFor(file.to_string()),
        Vec::new(),
        BUSY_TIMEOUT,
    )
    .await
    .map_err(|e| failed("cannot open the database", &e))?;
    let pool = Arc::new(pool);
    set_busy_timeout(&pool)
        .await
        .map_err(|e| failed("cannot open the database", &e))?;
    let dyn_pool: Arc<DynSqliteConnectionPool> = pool.clone();
    let read = Arc::new(SQLiteTable::new_with_schema(
        &dyn_pool,
        schema,
        reference.clone(),
    ));
    let target = SqliteTarget {
        name: name.to_string(),
        path,
        table: reference.table().to_string(),
    };
    Ok((read, target))
}

/// The database file a table's LOCATION names: a regular file of this machine (opening a FIFO
/// would wait for a writer, and a missing file would be created empty).
fn database_file(name: &str, create: &CreateExternalTable) -> Result<std::path::PathBuf> {
    let location = super::location(create)?;
    let path = crate::storage::local_path(location)?.ok_or_else(|| {
        Error::database(
            "SQLite",
            name,
            format!(
                "SQLite table '{name}': LOCATION '{}' is not a file of this machine (a SQLite \
             database is a local file)",
                crate::storage::blank_passwords(location)
            ),
        )
    })?;
    match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => {
            return Err(Error::database(
                "SQLite",
                name,
                format!(
                    "SQLite table '{name}': {} is not a regular file",
                    path.display()
                ),
            ));
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
    Ok(path)
}

/// How long the pool's connection waits for another writer's lock ([`BUSY_TIMEOUT`]).
async fn set_busy_timeout(
    pool: &SqliteConnectionPool,
) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut connection = pool.connect().await?;
    let sqlite = connection
        .as_any_mut()
        .downcast_mut::<datafusion_table_providers_sqlite::conn::SqliteConnection>()
        .ok_or("not a SQLite connection")?;
    sqlite
        .conn
        .call(|conn| conn.busy_timeout(BUSY_TIMEOUT))
        .await?;
    Ok(())
}

/// The columns of `table` as declared (`PRAGMA table_info`), as Arrow types by SQLite's rules
/// of type affinity (what the table is, whatever its rows hold, or if it holds none); a column
/// declared without a telling type by what its first rows hold.
fn declared_schema(
    path: &std::path::Path,
    table: &str,
) -> std::result::Result<SchemaRef, Box<dyn std::error::Error + Send + Sync>> {
    // Read-write where the file allows it (never created): a journal left by a writer that
    // died mid-transaction is rolled back by the first connection that can write, which a
    // read-only one cannot, and then could not read the table either.
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mut statement =
        conn.prepare("SELECT name, type, \"notnull\" FROM pragma_table_info(?1)")?;
    let declared = statement
        .query_map([table], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, bool>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut fields = Vec::with_capacity(declared.len());
    for (name, declared, not_null) in declared {
        let data_type = match affinity(&declared) {
            Some(data_type) => data_type,
            None => stored_type(&conn, table, &name)?,
        };
        fields.push(Field::new(name, data_type, !not_null));
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// How many rows [`stored_type`] looks at.
const SAMPLED: usize = 10_000;

/// The Arrow type of a column whose declared type does not say what it holds (none, or
/// NUMERIC affinity: `NUMERIC`, `DECIMAL`, `DATE`, `DATETIME`, ...): what its first rows hold.
/// Values of two kinds (integers and text) cannot be one Arrow column: an error naming them.
fn stored_type(
    conn: &rusqlite::Connection,
    table: &str,
    column: &str,
) -> std::result::Result<DataType, Box<dyn std::error::Error + Send + Sync>> {
    let quote = |name: &str| format!("\"{}\"", name.replace('"', "\"\""));
    let sql = format!(
        "SELECT DISTINCT typeof(c) FROM (SELECT {} AS c FROM {} LIMIT {SAMPLED})",
        quote(column),
        quote(table)
    );
    let mut statement = conn.prepare(&sql)?;
    let mut kinds = statement
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    kinds.retain(|k| k != "null");
    kinds.sort();
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    Ok(match kinds.as_slice() {
        [] | ["real"] | ["integer", "real"] => DataType::Float64,
        ["integer"] => DataType::Int64,
        ["text"] => DataType::Utf8,
        ["blob"] => DataType::Binary,
        kinds => {
            return Err(format!(
                "column '{column}' holds values of several kinds ({}), which one column cannot; \
                 read it through a SQLite view that casts it",
                kinds.join(", ")
            )
            .into());
        }
    })
}

/// The Arrow type of a declared SQLite column type (SQLite's rules of type affinity, section
/// 3.1 of its documentation on data types; booleans as they are usually declared), or `None`
/// where the declaration does not say (no type, or NUMERIC affinity).
fn affinity(declared: &str) -> Option<DataType> {
    let declared = declared.to_ascii_uppercase();
    Some(if declared.contains("INT") {
        DataType::Int64
    } else if ["CHAR", "CLOB", "TEXT"]
        .iter()
        .any(|t| declared.contains(t))
    {
        DataType::Utf8
    } else if declared.contains("BLOB") {
        DataType::Binary
    } else if ["REAL", "FLOA", "DOUB"]
        .iter()
        .any(|t| declared.contains(t))
    {
        DataType::Float64
    } else if declared.contains("BOOL") {
        DataType::Boolean
    } else {
        // No type, or NUMERIC affinity (NUMERIC, DECIMAL, DATE, DATETIME, ...): the values say.
        return None;
    })
}

#[cfg(test)]
#[test]
fn declared_types_take_sqlites_affinity() {
    for (declared, arrow) in [
        ("INTEGER", Some(DataType::Int64)),
        ("bigint", Some(DataType::Int64)),
        ("VARCHAR(20)", Some(DataType::Utf8)),
        ("text", Some(DataType::Utf8)),
        ("REAL", Some(DataType::Float64)),
        ("DOUBLE PRECISION", Some(DataType::Float64)),
        ("BLOB", Some(DataType::Binary)),
        ("BOOLEAN", Some(DataType::Boolean)),
        ("", None),
        ("NUMERIC", None),
        ("DATE", None),
        ("DATETIME", None),
    ] {
        assert_eq!(affinity(declared), arrow, "{declared}");
    }
}
