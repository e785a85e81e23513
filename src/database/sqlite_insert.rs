//! INSERT INTO a SQLite table: one transaction on a connection of its own, committed only once
//! every row of the statement is in it, and rolled back before the statement returns otherwise.
//!
//! The provider's own writer reads the input on a task it spawns and commits when that task
//! reaches the end of the input; a statement cancelled while its input still flows (a Ctrl-C
//! during a plain `INSERT ... SELECT`) drops the statement but not that task, which goes on to
//! commit every row. Here the rows go to one thread holding the transaction, and only the
//! statement itself, having read its whole input, sends the word to commit. A statement dropped
//! before that (cancelled) drops the channel: the thread rolls back, and the cancellation waits
//! for it ([`crate::storage::discards_done`]) before it says that nothing was kept.
//!
//! Values are bound as parameters of one prepared `INSERT`, never written into SQL: text keeps
//! every character (NUL included), infinities are SQLite's own, and NaN, which SQLite does not
//! store, becomes NULL as SQLite makes it. A row SQLite refuses is named by its number and its
//! values (texts cut short), not by printing its batch.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, SchemaRef};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;
use rusqlite::types::{ToSqlOutput, ValueRef};

use crate::statement_context::StatementContext;

/// How long a statement waits for another writer's lock on the file before it fails.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a SQLite table is and how a message names it.
#[derive(Debug, Clone)]
pub(super) struct SqliteTarget {
    /// The external table's name in batchinfer.
    pub name: String,
    /// The database file.
    pub path: PathBuf,
    /// The table's name in the database.
    pub table: String,
}

impl SqliteTarget {
    fn failed(&self, what: impl fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!(
            "SQLite table '{}' ({} in {}): {what}",
            self.name,
            self.table,
            self.path.display()
        ))
    }
}

/// The plan of an INSERT into the table at `target`, whose columns are `schema`.
pub(super) fn insert_into(
    target: &SqliteTarget,
    schema: SchemaRef,
    input: Arc<dyn ExecutionPlan>,
    insert_op: InsertOp,
) -> Result<Arc<dyn ExecutionPlan>> {
    let overwrite = match insert_op {
        InsertOp::Append => false,
        InsertOp::Overwrite => true,
        InsertOp::Replace => {
            return Err(
                target.failed("REPLACE INTO is not supported (INSERT INTO or INSERT OVERWRITE)")
            );
        }
    };
    let sink = SqliteSink {
        target: target.clone(),
        schema,
        overwrite,
    };
    Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
}

/// The rows of one INSERT, written in one transaction.
#[derive(Debug)]
struct SqliteSink {
    target: SqliteTarget,
    schema: SchemaRef,
    overwrite: bool,
}

/// What the statement sends the thread holding the transaction.
enum Message {
    Rows(RecordBatch),
    /// The whole input was read: commit.
    Commit,
}

/// The thread holding an INSERT's transaction. Dropped before it was told to commit (the
/// statement was cancelled), it closes the channel, so the thread rolls back, and leaves the
/// wait for that to [`crate::storage::discards_done`].
struct Writer {
    rows: Option<tokio::sync::mpsc::Sender<Message>>,
    thread: Option<tokio::task::JoinHandle<Result<u64>>>,
    /// The table, for the word a cancellation that came too late to stop the commit leaves.
    target: SqliteTarget,
    /// The ledger of the statement it writes for, where that word is left.
    ledger: crate::statement_context::Ledger,
}

impl Writer {
    /// The thread's own answer, once the channel is closed.
    async fn finish(&mut self) -> Result<u64> {
        self.rows = None;
        match self.thread.take() {
            Some(thread) => thread.await.map_err(|e| {
                DataFusionError::Execution(format!("the SQLite writer failed: {e}"))
            })?,
            None => Err(DataFusionError::Internal(
                "the SQLite writer was asked twice".into(),
            )),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.rows = None;
        if let Some(thread) = self.thread.take() {
            let table = format!("SQLite table '{}'", self.target.name);
            let ledger = self.ledger.clone();
            crate::storage::discard_in_background(async move {
                // The word to commit was sent before the cancellation: the rows may be in.
                if let Ok(Ok(rows)) = thread.await {
                    let what = format!("{rows} row(s) into {table}");
                    crate::storage::kept_despite_cancel(&ledger, what);
                }
            });
        }
    }
}

#[async_trait]
impl DataSink for SqliteSink {
    fn metrics(&self) -> Option<MetricsSet> {
        None
    }

    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> Result<u64> {
        let ledger = StatementContext::of(Some(context.session_config().options()))
            .map(|statement| statement.ledger.clone())
            .unwrap_or_default();
        let (sender, receiver) = tokio::sync::mpsc::channel(2);
        let (target, overwrite) = (self.target.clone(), self.overwrite);
        let thread = tokio::task::spawn_blocking(move || insert_rows(&target, overwrite, receiver));
        let mut writer = Writer {
            rows: Some(sender),
            thread: Some(thread),
            target: self.target.clone(),
            ledger,
        };
        while let Some(batch) = data.next().await {
            let batch = match batch {
                Ok(batch) => batch,
                Err(e) => {
                    // Rolled back before the statement reports its input's failure.
                    let _ = writer.finish().await;
                    return Err(e);
                }
            };
            let sent = match &writer.rows {
                Some(rows) => rows.send(Message::Rows(batch)).await.is_ok(),
                None => false,
            };
            if !sent {
                // The thread stopped: its error says why.
                return writer.finish().await;
            }
        }
        if let Some(rows) = &writer.rows
            && rows.send(Message::Commit).await.is_err()
        {
            return writer.finish().await;
        }
        writer.finish().await
    }
}

impl DisplayAs for SqliteSink {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SqliteInsert: {}", self.target.table)
    }
}

/// A SQL identifier, quoted.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The transaction: every row received, then commit at [`Message::Commit`]; rolled back (by
/// dropping it) at an error or when the channel closes first.
fn insert_rows(
    target: &SqliteTarget,
    overwrite: bool,
    mut receiver: tokio::sync::mpsc::Receiver<Message>,
) -> Result<u64> {
    let sqlite = |what: &str, e: rusqlite::Error| target.failed(format!("{what}: {e}"));
    let mut conn = rusqlite::Connection::open_with_flags(
        &target.path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sqlite("cannot open the database", e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sqlite("cannot open the database", e))?;
    let transaction = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(|e| sqlite("cannot begin a transaction", e))?;
    if overwrite {
        transaction
            .execute(&format!("DELETE FROM {}", quote(&target.table)), [])
            .map_err(|e| sqlite("cannot empty the table", e))?;
    }
    let mut written: u64 = 0;
    {
        let mut insert: Option<(Vec<String>, rusqlite::Statement)> = None;
        loop {
            let batch = match receiver.blocking_recv() {
                Some(Message::Rows(batch)) => batch,
                Some(Message::Commit) => break,
                // The statement was dropped: the transaction rolls back as it is dropped.
                None => return Err(DataFusionError::Execution("cancelled".into())),
            };
            if batch.num_rows() == 0 {
                continue;
            }
            let columns: Vec<String> = batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            if insert.as_ref().is_none_or(|(named, _)| *named != columns) {
                let sql = format!(
                    "INSERT INTO {} ({}) VALUES ({})",
                    quote(&target.table),
                    columns
                        .iter()
                        .map(|c| quote(c))
                        .collect::<Vec<_>>()
                        .join(", "),
                    (1..=columns.len())
                        .map(|i| format!("?{i}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                let statement = transaction
                    .prepare(&sql)
                    .map_err(|e| sqlite("cannot prepare the insert", e))?;
                insert = Some((columns, statement));
            }
            let Some((columns, statement)) = insert.as_mut() else {
                continue;
            };
            insert_batch(target, statement, columns, &batch, written)?;
            written += batch.num_rows() as u64;
        }
    }
    transaction
        .commit()
        .map_err(|e| sqlite("cannot commit", e))?;
    Ok(written)
}

/// One record batch's rows through the prepared insert; `before` rows of the statement came
/// first (for the number a refused row is given).
fn insert_batch(
    target: &SqliteTarget,
    statement: &mut rusqlite::Statement,
    columns: &[String],
    batch: &RecordBatch,
    before: u64,
) -> Result<()> {
    let arrays: Vec<SqliteColumn> = batch
        .columns()
        .iter()
        .zip(columns)
        .map(|(array, name)| SqliteColumn::of(array.as_ref(), name, target))
        .collect::<Result<_>>()?;
    for row in 0..batch.num_rows() {
        for (i, column) in arrays.iter().enumerate() {
            statement
                .raw_bind_parameter(i + 1, column.value(row))
                .map_err(|e| {
                    target.failed(format!(
                        "row {} of the insert, column '{}': {e}",
                        before + row as u64 + 1,
                        columns[i]
                    ))
                })?;
        }
        statement.raw_execute().map_err(|e| {
            let values: Vec<String> = arrays.iter().map(|c| c.shown(row)).collect();
            target.failed(format!(
                "row {} of the insert, ({}), was refused: {e}",
                before + row as u64 + 1,
                values.join(", ")
            ))
        })?;
    }
    Ok(())
}

/// One column of a batch as SQLite values: the types a SQLite table's columns are read as
/// (`sqlite::declared_schema`), to which DataFusion casts an INSERT's rows.
enum SqliteColumn<'a> {
    Integer(&'a dyn Array, &'a [i64]),
    Real(&'a dyn Array, &'a [f64]),
    Boolean(&'a datafusion::arrow::array::BooleanArray),
    Text(&'a datafusion::arrow::array::StringArray),
    Blob(&'a datafusion::arrow::array::BinaryArray),
}

impl<'a> SqliteColumn<'a> {
    fn of(array: &'a dyn Array, name: &str, target: &SqliteTarget) -> Result<SqliteColumn<'a>> {
        Ok(match array.data_type() {
            DataType::Int64 => {
                SqliteColumn::Integer(array, array.as_primitive::<Int64Type>().values())
            }
            DataType::Float64 => {
                SqliteColumn::Real(array, array.as_primitive::<Float64Type>().values())
            }
            DataType::Boolean => SqliteColumn::Boolean(array.as_boolean()),
            DataType::Utf8 => SqliteColumn::Text(array.as_string::<i32>()),
            DataType::Binary => SqliteColumn::Blob(array.as_binary::<i32>()),
            other => {
                return Err(target.failed(format!(
                    "column '{name}' is {other}, which a SQLite column is not read as (INTEGER, \
                     REAL, TEXT, BLOB, BOOLEAN)"
                )));
            }
        })
    }

    /// The value at `row` as a message shows it: a text cut at 32 characters, a blob by size.
    fn shown(&self, row: usize) -> String {
        match self.value(row) {
            ToSqlOutput::Borrowed(ValueRef::Null) => "NULL".into(),
            ToSqlOutput::Borrowed(ValueRef::Integer(i)) => i.to_string(),
            ToSqlOutput::Borrowed(ValueRef::Real(r)) => r.to_string(),
            ToSqlOutput::Borrowed(ValueRef::Text(t)) => {
                let text = String::from_utf8_lossy(t);
                match text.char_indices().nth(32) {
                    Some((end, _)) => format!("'{}…'", text[..end].escape_default()),
                    None => format!("'{}'", text.escape_default()),
                }
            }
            ToSqlOutput::Borrowed(ValueRef::Blob(b)) => format!("<{} bytes>", b.len()),
            _ => "?".into(),
        }
    }

    fn value(&self, row: usize) -> ToSqlOutput<'a> {
        let value = match self {
            SqliteColumn::Integer(array, values) => {
                (!array.is_null(row)).then(|| ValueRef::Integer(values[row]))
            }
            SqliteColumn::Real(array, values) => {
                (!array.is_null(row)).then(|| ValueRef::Real(values[row]))
            }
            SqliteColumn::Boolean(array) => {
                (!array.is_null(row)).then(|| ValueRef::Integer(array.value(row) as i64))
            }
            SqliteColumn::Text(array) => {
                (!array.is_null(row)).then(|| ValueRef::Text(array.value(row).as_bytes()))
            }
            SqliteColumn::Blob(array) => {
                (!array.is_null(row)).then(|| ValueRef::Blob(array.value(row)))
            }
        };
        ToSqlOutput::Borrowed(value.unwrap_or(ValueRef::Null))
    }
}
