//! A client's statements, run in its session: a script's statements in order, a prepared one
//! once per row of its parameters, the settings that are the server's refused, and what a write
//! returns (its row count).

use std::sync::Arc;
use std::time::Instant;

use arrow_flight::error::FlightError;
use arrow_flight::sql::server::PeekableFlightDataStream;
use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::sql::parser::Statement as DFStatement;
use futures::{StreamExt, TryStreamExt};
use tonic::{Request, Status};

use super::params;
use super::replies::status;
use super::running::within;
use super::service::FlightSql;
use super::sessions::{ClientSession, Pending, Prepared};
use crate::config::{Change, SETTINGS};
use crate::error::{Error, Result};
use crate::statements::Statement;

/// The most rows of parameters bound at once, and their bytes.
const MAX_PARAMETER_ROWS: usize = 100_000;
const MAX_PARAMETER_BYTES: usize = 64 << 20;

impl FlightSql {
    /// Runs `statements` in `session`, in order (see the module's text), once a slot is free.
    pub(super) async fn run(
        &self,
        session: &Arc<ClientSession>,
        statements: Vec<Statement>,
    ) -> Result<Pending, Status> {
        if statements.is_empty() {
            return Err(Status::invalid_argument("no SQL statement was given"));
        }
        // Held here, not by the work: a statement past its deadline (or whose client left)
        // gives its place back at once, even while its thread is still busy planning.
        let _slot = self.slot().await?;
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let client = session.clone();
        let session = session.clone();
        let work = async move {
            let engine = session.engine().await?;
            let _turn = session.turn.lock().await;
            let last = statements.len() - 1;
            let mut result = None;
            for (i, statement) in statements.into_iter().enumerate() {
                refuse_server_settings(&statement)?;
                let query = statement.is_query();
                let writes = statement.writes().is_some();
                let df = engine.run(statement).await?;
                if query && i == last {
                    result = Some(Pending::Query {
                        df,
                        deadline,
                        statement: Box::new(engine.statement()),
                    });
                    break;
                }
                let schema = df.schema().inner().clone();
                if query {
                    // A query before the script's last statement: its rows are read to the end
                    // and dropped as they come, never kept.
                    let mut rows = df.execute_stream().await?;
                    while let Some(batch) = rows.next().await {
                        batch?;
                    }
                    result = Some(Pending::Done {
                        schema,
                        batches: Vec::new(),
                        held: None,
                    });
                    continue;
                }
                let batches = df.collect().await?;
                // What the server keeps until it is read counts against `--memory-limit`.
                let size = batches.iter().map(RecordBatch::get_array_memory_size).sum();
                let held = MemoryConsumer::new(format!("session {}'s result", session.number))
                    .register(&engine.context().runtime_env().memory_pool);
                held.try_grow(size)?;
                for warning in crate::runner::failed_rows(engine).await {
                    crate::say!("warning: session {}: {warning}", session.number);
                }
                result = Some(if writes && schema.fields().is_empty() {
                    // A write returns as many rows (of no columns) as it wrote.
                    count_result(batches.iter().map(|b| b.num_rows() as u64).sum())
                } else {
                    Pending::Done {
                        schema,
                        batches,
                        held: Some(held),
                    }
                });
            }
            result.ok_or_else(|| Error::Internal("a script ran no statement".to_string()))
        };
        within(deadline, self.timeout, work, &client).await
    }

    /// Parses `sql` in `session`'s dialect.
    pub(super) async fn parse(
        &self,
        session: &ClientSession,
        sql: &str,
    ) -> Result<Vec<Statement>, Status> {
        let engine = session.engine().await.map_err(status)?;
        engine.statements(sql).map_err(status)
    }

    /// The parameters a `DoPut` sends.
    pub(super) async fn parameters(
        &self,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<Vec<RecordBatch>, Status> {
        let mut stream = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
            request.into_inner().map_err(FlightError::from),
        );
        let (mut batches, mut rows, mut bytes) = (Vec::new(), 0, 0);
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|e| {
                Status::invalid_argument(format!("the parameters cannot be read: {e}"))
            })?;
            rows += batch.num_rows();
            bytes += batch.get_array_memory_size();
            if rows > MAX_PARAMETER_ROWS || bytes > MAX_PARAMETER_BYTES {
                return Err(Status::invalid_argument(format!(
                    "more parameters than are bound at once ({MAX_PARAMETER_ROWS} rows, \
                     {MAX_PARAMETER_BYTES} bytes): bind fewer, or load them as a table"
                )));
            }
            batches.push(batch);
        }
        Ok(batches)
    }

    /// Runs prepared statement `prepared` once per row of `parameters` (once where none is
    /// bound): the rows its runs wrote, all told.
    pub(super) async fn update_prepared(
        &self,
        session: &Arc<ClientSession>,
        prepared: &Prepared,
        parameters: &[RecordBatch],
    ) -> Result<i64, Status> {
        let rows: Vec<(&RecordBatch, usize)> = parameters
            .iter()
            .flat_map(|b| (0..b.num_rows()).map(move |r| (b, r)))
            .collect();
        if rows.is_empty() {
            let statement = bind_none(&prepared.statement)?;
            return update_count(self.run(session, vec![statement]).await?);
        }
        let mut written = 0;
        for (done, (batch, row)) in rows.into_iter().enumerate() {
            let statement = params::bind(&prepared.statement, batch, row).map_err(status)?;
            let ran = self.run(session, vec![statement]).await;
            match ran.and_then(update_count) {
                Ok(n) => written += n,
                Err(e) => {
                    return Err(Status::new(
                        e.code(),
                        format!(
                            "row {} of the parameters: {} (each row runs as a statement of its \
                             own: the {done} before it are done)",
                            done + 1,
                            e.message()
                        ),
                    ));
                }
            }
        }
        Ok(written)
    }
}

/// A write's result: its row count, as the column `count`.
fn count_result(rows: u64) -> Pending {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(UInt64Array::from(vec![rows]))],
    )
    .expect("one column of its type");
    Pending::Done {
        schema,
        batches: vec![batch],
        held: None,
    }
}

/// What an update returns: the rows a write wrote, 0 for other statements.
#[allow(clippy::result_large_err)]
pub(super) fn update_count(pending: Pending) -> Result<i64, Status> {
    match pending {
        Pending::Query { .. } => Err(Status::invalid_argument(
            "a query was sent as an update, which returns no rows: execute it as a query",
        )),
        Pending::Done {
            schema, batches, ..
        } => {
            let is_count = schema.fields().len() == 1 && schema.field(0).name() == "count";
            let count = batches.first().filter(|_| is_count).and_then(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .map(|a| a.value(0))
            });
            Ok(count.map_or(0, |c| i64::try_from(c).unwrap_or(i64::MAX)))
        }
    }
}

/// A prepared statement run with no parameters: refused where it has placeholders.
#[allow(clippy::result_large_err)]
pub(super) fn bind_none(statement: &Statement) -> Result<Statement, Status> {
    match params::count(statement) {
        0 => Ok(statement.clone()),
        n => Err(Status::invalid_argument(format!(
            "the statement has {n} placeholder(s), and no parameters were bound"
        ))),
    }
}

/// Refuses the `SET`s that are the server's, for every session: the settings declared so
/// ([`Change::NotUnderServe`]: where models run), and DataFusion's runtime
/// (`datafusion.runtime.*`: the memory limit and spill folder all sessions share).
fn refuse_server_settings(statement: &Statement) -> Result<()> {
    let Statement::Sql(sql) = statement else {
        return Ok(());
    };
    let DFStatement::Statement(s) = sql.as_ref() else {
        return Ok(());
    };
    if !matches!(
        s.as_ref(),
        datafusion::sql::sqlparser::ast::Statement::Set(_)
    ) {
        return Ok(());
    }
    let text = s.to_string().to_ascii_lowercase();
    for setting in SETTINGS
        .iter()
        .filter(|setting| setting.change == Change::NotUnderServe)
    {
        if text.contains(&setting.key()) {
            return Err(Error::setting(
                setting.key(),
                format!(
                    "this setting is the server's, for every session: start `batchinfer serve` \
                     with --{} to change it",
                    setting.name.replace('_', "-")
                ),
            ));
        }
    }
    if text.contains("datafusion.runtime.") {
        return Err(Error::setting(
            "datafusion.runtime.*",
            "the runtime (memory limit, spill folder) is the server's, shared by every \
             session: start `batchinfer serve` with --memory-limit to change it",
        ));
    }
    Ok(())
}
