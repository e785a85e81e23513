//! The Flight SQL protocol over the engine. A statement (`CommandStatementQuery`, or a prepared
//! one) runs when the client asks for its `FlightInfo`: every statement of it at once, except a
//! final query, which is planned then and runs as `DoGet` streams its rows. An update
//! (`CommandStatementUpdate`) runs and returns its row count. A client that cancels, times out or
//! disconnects drops its call, and with it the statement: what it wrote is discarded, as at
//! Ctrl-C. At most `--max-statements` run at once; the others wait for one to end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionCancelQueryRequest, ActionCancelQueryResult, ActionClosePreparedStatementRequest,
    ActionCreatePreparedStatementRequest, ActionCreatePreparedStatementResult, Any, Command,
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetSqlInfo, CommandGetTableTypes,
    CommandGetTables, CommandPreparedStatementQuery, CommandPreparedStatementUpdate,
    CommandStatementQuery, CommandStatementUpdate, DoPutPreparedStatementResult, ProstMessageExt,
    SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    IpcMessage, SchemaAsIpc, Ticket,
};
use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::dataframe::DataFrame;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::sql::parser::Statement as DFStatement;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status, Streaming};

use super::ServeOptions;
use super::auth::Credentials;
use super::metadata;
use super::params;
use super::sessions::{Access, ClientSession, Pending, Prepared, Sessions};
use crate::engine::Engine;
use crate::error::{Error, Kind, Result};
use crate::message::display_error;
use crate::statement_context::StatementContext;
use crate::statements::Statement;

/// The most rows of parameters bound at once, and their bytes.
const MAX_PARAMETER_ROWS: usize = 100_000;
const MAX_PARAMETER_BYTES: usize = 64 << 20;

/// How often sessions idle too long are ended.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The server's service (see the module's text).
pub struct FlightSql {
    sessions: Arc<Sessions>,
    credentials: Credentials,
    slots: Arc<Semaphore>,
    timeout: Option<Duration>,
}

impl FlightSql {
    pub fn new(root: Arc<Engine>, options: &ServeOptions) -> Self {
        let sessions = Arc::new(Sessions::new(root, options.idle_timeout));
        let swept = Arc::downgrade(&sessions);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                match swept.upgrade() {
                    Some(sessions) => sessions.sweep(),
                    None => break,
                }
            }
        });
        FlightSql {
            sessions,
            credentials: options.credentials.clone(),
            slots: Arc::new(Semaphore::new(options.max_statements)),
            timeout: options.statement_timeout,
        }
    }

    /// What every call passes first, whatever it asks: a credential of the server's, or a
    /// session token it gave.
    pub fn gate(&self) -> Gate {
        Gate {
            sessions: self.sessions.clone(),
            credentials: self.credentials.clone(),
        }
    }

    /// Lets `request` in (see [`Sessions::access`]).
    #[allow(clippy::result_large_err)]
    fn access<T>(&self, request: &Request<T>, keep: bool) -> Result<Access, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or("?"));
        self.sessions.access(&self.credentials, header, keep)
    }

    /// Lets `request` in to a session it already has: what outlives the call (a prepared
    /// statement) is kept there.
    #[allow(clippy::result_large_err)]
    fn session_of<T>(&self, request: &Request<T>) -> Result<Arc<ClientSession>, Status> {
        let access = self.access(request, false)?;
        if access.issued.is_none() && !self.is_kept(&access) {
            return Err(Status::failed_precondition(
                "prepared statements belong to a session: make a call that opens one first \
                 (a handshake, or GetSqlInfo, as ADBC, JDBC and ODBC drivers do on connecting), \
                 and send the token it gives back",
            ));
        }
        Ok(access.session)
    }

    /// Whether `access`'s session is one of the server's (not made for one call).
    fn is_kept(&self, access: &Access) -> bool {
        // Held by the server, this call and nothing else, or more.
        Arc::strong_count(&access.session) > 1
    }

    /// A turn to run a statement: waits while `--max-statements` run.
    async fn slot(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("the server is stopping"))
    }

    /// Runs `statements` in `session`, in order (see the module's text), once a slot is free.
    async fn run(
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
    async fn parse(&self, session: &ClientSession, sql: &str) -> Result<Vec<Statement>, Status> {
        let engine = session.engine().await.map_err(status)?;
        engine.statements(sql).map_err(status)
    }

    /// The `FlightInfo` of `pending`, kept in `session` for a `DoGet`.
    #[allow(clippy::result_large_err)]
    fn result_info(
        &self,
        session: &ClientSession,
        pending: Pending,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo, Status> {
        let schema = pending.schema();
        let handle = session.keep_result(pending);
        let ticket = TicketStatementQuery {
            statement_handle: handle.to_be_bytes().to_vec().into(),
        };
        info(&schema, ticket.as_any().encode_to_vec(), descriptor)
    }

    /// Streams `batches` (of `schema`) as `DoGet` answers, with `access`'s token where new.
    fn stream(
        &self,
        access: &Access,
        schema: SchemaRef,
        batches: impl Stream<Item = std::result::Result<RecordBatch, FlightError>> + Send + 'static,
    ) -> Response<<Self as FlightService>::DoGetStream> {
        let encoded = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .build(batches)
            .map_err(Status::from);
        reply(Box::pin(encoded) as _, access)
    }

    /// A metadata command's `FlightInfo`: its ticket is the command.
    #[allow(clippy::result_large_err)]
    fn metadata_info(
        &self,
        request: Request<FlightDescriptor>,
        schema: &Schema,
        command: Any,
    ) -> Result<Response<FlightInfo>, Status> {
        let access = self.access(&request, true)?;
        let info = info(schema, command.encode_to_vec(), request.into_inner())?;
        Ok(reply(info, &access))
    }

    /// A metadata command's rows, streamed.
    #[allow(clippy::result_large_err)]
    fn metadata_rows(
        &self,
        access: &Access,
        batch: Result<RecordBatch>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let batch = batch.map_err(status)?;
        let schema = batch.schema();
        Ok(self.stream(access, schema, futures::stream::iter([Ok(batch)])))
    }

    /// The parameters a `DoPut` sends.
    async fn parameters(
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
    async fn update_prepared(
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

/// Runs `work` on the statements' runtime ([`statements_runtime`]) until `deadline`, its panics
/// made errors; past the deadline, or when the call is dropped (the client cancelled or left),
/// it is dropped, and what it wrote discarded.
async fn within<T: Send + 'static>(
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    work: impl Future<Output = Result<T>> + Send + 'static,
    session: &ClientSession,
) -> Result<T, Status> {
    let task = Aborted(statements_runtime().spawn(work));
    let done = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(done) => done,
            Err(_) => {
                crate::storage::discards_done().await;
                let statement = match session.engine().await {
                    Ok(engine) => engine.statement(),
                    Err(_) => StatementContext::default(),
                };
                return Err(timed_out(timeout, &statement));
            }
        },
        None => task.await,
    };
    match done {
        Ok(result) => result.map_err(status),
        Err(joined) if joined.is_panic() => Err(status(Error::Internal(
            crate::error::panic_message(&joined.into_panic()),
        ))),
        Err(_) => Err(Status::cancelled("the statement was cancelled")),
    }
}

/// The runtime statements run on, apart from the one that answers calls: a statement that
/// keeps a thread busy (planning does, without a pause) leaves the server answering, timing
/// out and cancelling. Its threads: one a statement, and the cores besides.
/// Per process: one server runs in a process.
static STATEMENTS: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

/// Makes the statements' runtime for `max_statements` at once.
pub fn start_statements_runtime(max_statements: usize) -> std::io::Result<()> {
    if STATEMENTS.get().is_some() {
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(max_statements + cores)
        .thread_name("batchinfer-statement")
        .enable_all()
        .build()?;
    let _ = STATEMENTS.set(runtime);
    Ok(())
}

fn statements_runtime() -> &'static tokio::runtime::Runtime {
    STATEMENTS
        .get()
        .expect("the statements' runtime is started with the server")
}

/// A statement's slot, shared: given back when the first holder is dropped.
struct Released(Arc<parking_lot::Mutex<Option<OwnedSemaphorePermit>>>);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.lock().take();
    }
}

/// A task on the statements' runtime, aborted when its caller drops it.
struct Aborted<T>(tokio::task::JoinHandle<T>);

impl<T> Future for Aborted<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Aborted<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Every call's first check (see [`FlightSql::gate`]).
#[derive(Clone)]
pub struct Gate {
    sessions: Arc<Sessions>,
    credentials: Credentials,
}

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or("?"));
        let peer = request.remote_addr().map(|a| a.ip());
        self.sessions.admits(&self.credentials, header, peer)?;
        Ok(request)
    }
}

/// The error of a statement that ran past `--statement-timeout`.
fn timed_out(timeout: Option<Duration>, statement: &StatementContext) -> Status {
    let limit = timeout.map_or_else(String::new, |t| {
        format!(" ({})", humantime::format_duration(t))
    });
    let kept = crate::storage::take_kept_despite_cancel(statement);
    let what = if kept.is_empty() {
        "nothing it wrote was kept".to_string()
    } else {
        format!("it was committing, and kept {}", kept.join(", "))
    };
    Status::deadline_exceeded(format!(
        "the statement ran past --statement-timeout{limit}: it was cancelled, and {what}"
    ))
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
fn update_count(pending: Pending) -> Result<i64, Status> {
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
fn bind_none(statement: &Statement) -> Result<Statement, Status> {
    match params::count(statement) {
        0 => Ok(statement.clone()),
        n => Err(Status::invalid_argument(format!(
            "the statement has {n} placeholder(s), and no parameters were bound"
        ))),
    }
}

/// Refuses the `SET`s that are the server's, for every session: where models run
/// (`batchinfer.device`), and DataFusion's runtime (`datafusion.runtime.*`: the memory limit
/// and spill folder all sessions share).
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
    if text.contains("batchinfer.device") {
        return Err(Error::setting(
            "batchinfer.device",
            "where models run is the server's, for every session: start `batchinfer serve` \
             with --device to change it",
        ));
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

/// A `FlightInfo` of `schema` whose one endpoint's ticket is `ticket`.
#[allow(clippy::result_large_err)]
fn info(
    schema: &Schema,
    ticket: Vec<u8>,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket::new(ticket));
    // Dictionaries are sent as their values (the encoder's default): so says the schema.
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Dictionary(_, values) => f.as_ref().clone().with_data_type(*values.clone()),
            _ => f.as_ref().clone(),
        })
        .collect();
    let schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    Ok(FlightInfo::new()
        .try_with_schema(&schema)
        .map_err(|e| Status::internal(format!("the result's columns cannot be sent: {e}")))?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor)
        .with_total_records(-1)
        .with_total_bytes(-1))
}

/// `body` as a reply, with the session token the call was given where it is new.
fn reply<T>(body: T, access: &Access) -> Response<T> {
    let mut response = Response::new(body);
    if let Some(token) = &access.issued
        && let Ok(value) = MetadataValue::try_from(format!("Bearer {token}"))
    {
        response.metadata_mut().insert("authorization", value);
    }
    response
}

/// An engine error as a gRPC status: its message as the command line says it, its code by its
/// kind ([`Kind`]).
fn status(error: Error) -> Status {
    let message = display_error(&error);
    if matches!(error, Error::Internal(_)) {
        return Status::internal(message);
    }
    match error.kind() {
        Kind::Model => Status::failed_precondition(message),
        Kind::Input | Kind::Other => Status::invalid_argument(message),
        Kind::Storage => Status::unavailable(message),
        Kind::Cancelled => Status::cancelled(message),
    }
}

/// A handle sent to the client, read back.
#[allow(clippy::result_large_err)]
fn handle_of(bytes: &[u8], what: &str) -> Result<u64, Status> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_be_bytes)
        .map_err(|_| Status::invalid_argument(format!("not a {what} handle of this server")))
}

/// A query's rows as they are produced, on the statements' runtime, until its deadline; the
/// slot it runs in and its session held meanwhile. Dropped (the client cancelled or left), it
/// stops; past the deadline it stops and frees its slot, whether or not the client reads.
fn produced(
    df: DataFrame,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    slot: OwnedSemaphorePermit,
    (session, statement): (Arc<ClientSession>, StatementContext),
) -> impl Stream<Item = std::result::Result<RecordBatch, FlightError>> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    // The slot is given back by whichever ends first: the work, or the stream the client reads.
    let slot = Released(Arc::new(parking_lot::Mutex::new(Some(slot))));
    let kept = Released(slot.0.clone());
    let told = statement.clone();
    let work = async move {
        let produce = async {
            let mut rows = match df.execute_stream().await {
                Ok(rows) => rows,
                Err(e) => {
                    let _ = sender.send(Err(status(Error::from(e)))).await;
                    return;
                }
            };
            while let Some(batch) = rows.next().await {
                let failed = batch.is_err();
                let batch = batch.map_err(|e| status(Error::from(e)));
                if sender.send(batch).await.is_err() || failed {
                    return;
                }
            }
            // Read to the end: the rows its models failed on, as the command line tells them.
            if let Ok(engine) = session.engine().await {
                for warning in crate::runner::failed_rows_of(engine, &statement).await {
                    crate::say!("warning: session {}: {warning}", session.number);
                }
            }
        };
        let finished = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), produce)
                .await
                .is_ok(),
            None => {
                produce.await;
                true
            }
        };
        drop(slot);
        drop(session);
        if !finished {
            crate::storage::discards_done().await;
            let _ = sender.send(Err(timed_out(timeout, &statement))).await;
        }
    };
    let task = Aborted(statements_runtime().spawn(work));
    // The deadline is kept here too: a statement busy on its thread (planning) cannot see it.
    let state = (receiver, Some((task, kept)));
    futures::stream::unfold(state, move |(mut receiver, held)| {
        let told = told.clone();
        async move {
            let held = held?;
            let item = match deadline {
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline.into(), receiver.recv()).await {
                        Ok(item) => item?,
                        Err(_) => return Some((Err(timed_out(timeout, &told)), (receiver, None))),
                    }
                }
                None => receiver.recv().await?,
            };
            Some((item, (receiver, Some(held))))
        }
    })
    .map_err(|e| FlightError::Tonic(Box::new(e)))
}

#[tonic::async_trait]
impl FlightSqlService for FlightSql {
    type FlightService = FlightSql;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> std::result::Result<
        Response<
            Pin<Box<dyn Stream<Item = std::result::Result<HandshakeResponse, Status>> + Send>>,
        >,
        Status,
    > {
        let access = self.access(&request, true)?;
        let payload = access.issued.clone().unwrap_or_default();
        let answer = HandshakeResponse {
            protocol_version: 0,
            payload: payload.into_bytes().into(),
        };
        let stream = futures::stream::iter([Ok(answer)]);
        Ok(reply(Box::pin(stream) as _, &access))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let access = self.access(&request, true)?;
        let statements = self.parse(&access.session, &query.query).await?;
        let pending = self.run(&access.session, statements).await?;
        let info = self.result_info(&access.session, pending, request.into_inner())?;
        Ok(reply(info, &access))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let session = self.session_of(&request)?;
        let handle = handle_of(&query.prepared_statement_handle, "prepared statement")?;
        let prepared = session
            .prepared(handle)
            .ok_or_else(|| Status::not_found("no such prepared statement (closed?)"))?;
        let rows: usize = prepared.parameters.iter().map(|b| b.num_rows()).sum();
        let statement = match rows {
            0 => bind_none(&prepared.statement)?,
            1 => {
                let batch = prepared
                    .parameters
                    .iter()
                    .find(|b| b.num_rows() == 1)
                    .expect("one row among them");
                params::bind(&prepared.statement, batch, 0).map_err(status)?
            }
            n => {
                return Err(Status::invalid_argument(format!(
                    "a query takes one row of parameters; {n} were bound"
                )));
            }
        };
        let pending = self.run(&session, vec![statement]).await?;
        let info = self.result_info(&session, pending, request.into_inner())?;
        Ok(Response::new(info))
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.metadata_info(request, &schema, query.as_any())
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.metadata_info(request, &schema, query.as_any())
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.metadata_info(request, &schema, query.as_any())
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.metadata_info(request, &schema, query.as_any())
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> std::result::Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(metadata::sql_info()).schema();
        self.metadata_info(request, &schema, query.as_any())
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let access = self.access(&request, true)?;
        let handle = handle_of(&ticket.statement_handle, "result")?;
        // A client that shows the server's own credential on each call (rather than the
        // session token it was given) is a new session each time: its result is found by the
        // ticket, which is unguessable.
        let pending = access.session.take_result(handle);
        let pending = match (pending, access.issued.is_some()) {
            (None, true) => self.sessions.take_result_of_any(handle),
            (pending, _) => pending,
        };
        let pending = pending.ok_or_else(|| {
            Status::not_found(
                "no such result: a result is read once, by the session that ran its statement",
            )
        })?;
        match pending {
            Pending::Done {
                schema,
                batches,
                held,
            } => {
                // The reservation lives as long as the stream that sends the batches.
                let rows = futures::stream::iter(batches.into_iter().map(move |batch| {
                    let _held = &held;
                    Ok(batch)
                }));
                Ok(self.stream(&access, schema, rows))
            }
            Pending::Query {
                df,
                deadline,
                statement,
            } => {
                let slot = self.slot().await?;
                let schema = df.schema().inner().clone();
                let session = access.session.clone();
                let rows = produced(df, deadline, self.timeout, slot, (session, *statement));
                Ok(self.stream(&access, schema, rows))
            }
        }
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let access = self.access(&request, true)?;
        let engine = access.session.engine().await.map_err(status)?;
        self.metadata_rows(&access, metadata::catalogs(engine, query))
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let access = self.access(&request, true)?;
        let engine = access.session.engine().await.map_err(status)?;
        self.metadata_rows(&access, metadata::schemas(engine, query))
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let access = self.access(&request, true)?;
        let engine = access.session.engine().await.map_err(status)?;
        let tables = metadata::tables(engine, query).await.map_err(status)?;
        self.metadata_rows(&access, Ok(tables))
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let access = self.access(&request, true)?;
        self.metadata_rows(&access, metadata::table_types(query))
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<Ticket>,
    ) -> std::result::Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let access = self.access(&request, true)?;
        let batch = query.into_builder(metadata::sql_info()).build();
        self.metadata_rows(&access, batch.map_err(metadata::built))
    }

    async fn do_put_statement_update(
        &self,
        ticket: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<i64, Status> {
        let session = self.access(&request, false)?.session;
        let statements = self.parse(&session, &ticket.query).await?;
        update_count(self.run(&session, statements).await?)
    }

    async fn do_put_prepared_statement_query(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<DoPutPreparedStatementResult, Status> {
        let session = self.session_of(&request)?;
        let handle = handle_of(&query.prepared_statement_handle, "prepared statement")?;
        let parameters = self.parameters(request).await?;
        if !session.bind(handle, parameters)? {
            return Err(Status::not_found("no such prepared statement (closed?)"));
        }
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(query.prepared_statement_handle),
        })
    }

    async fn do_put_prepared_statement_update(
        &self,
        query: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> std::result::Result<i64, Status> {
        let session = self.session_of(&request)?;
        let handle = handle_of(&query.prepared_statement_handle, "prepared statement")?;
        let prepared = session
            .prepared(handle)
            .ok_or_else(|| Status::not_found("no such prepared statement (closed?)"))?;
        let sent = self.parameters(request).await?;
        let parameters = if sent.iter().any(|b| b.num_rows() > 0) {
            sent
        } else {
            prepared.parameters.clone()
        };
        self.update_prepared(&session, &prepared, &parameters).await
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> std::result::Result<ActionCreatePreparedStatementResult, Status> {
        let session = self.session_of(&request)?;
        let mut statements = self.parse(&session, &query.query).await?;
        if statements.len() != 1 {
            return Err(Status::invalid_argument(format!(
                "a prepared statement is one statement; {} were given",
                statements.len()
            )));
        }
        let statement = statements.remove(0);
        let placeholders = params::count(&statement);
        // A query with no placeholders is planned to say its columns; others say theirs when run.
        let dataset = if placeholders == 0 && statement.is_query() {
            self.run(&session, vec![statement.clone()]).await?.schema()
        } else {
            Arc::new(Schema::empty())
        };
        let parameters = Schema::new(
            (1..=placeholders)
                .map(|i| Field::new(format!("${i}"), DataType::Null, true))
                .collect::<Vec<_>>(),
        );
        let handle = session.prepare(Prepared {
            statement,
            parameters: Vec::new(),
            bytes: query.query.len(),
        })?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.to_be_bytes().to_vec().into(),
            dataset_schema: schema_bytes(&dataset)?,
            parameter_schema: schema_bytes(&parameters)?,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> std::result::Result<(), Status> {
        let session = self.access(&request, false)?.session;
        if let Ok(handle) = handle_of(&query.prepared_statement_handle, "prepared statement") {
            session.close(handle);
        }
        Ok(())
    }

    async fn do_action_cancel_query(
        &self,
        query: ActionCancelQueryRequest,
        request: Request<Action>,
    ) -> std::result::Result<ActionCancelQueryResult, Status> {
        let session = self.access(&request, false)?.session;
        let info = FlightInfo::decode(query.info)
            .map_err(|e| Status::invalid_argument(format!("not a FlightInfo: {e}")))?;
        let mut cancelled = false;
        for endpoint in info.endpoint {
            let ticket = endpoint.ticket.map(|t| t.ticket).unwrap_or_default();
            if let Ok(Command::TicketStatementQuery(t)) = Any::decode(ticket)
                .map_err(|_| ())
                .and_then(|a| Command::try_from(a).map_err(|_| ()))
                && let Ok(handle) = handle_of(&t.statement_handle, "result")
            {
                cancelled |= session.take_result(handle).is_some();
            }
        }
        // Flight SQL's CancelResult: CANCELLED is 1, NOT_CANCELLABLE 3.
        Ok(ActionCancelQueryResult {
            result: if cancelled { 1 } else { 3 },
        })
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// `schema` as Flight sends one: an IPC message.
#[allow(clippy::result_large_err)]
fn schema_bytes(schema: &Schema) -> Result<prost::bytes::Bytes, Status> {
    let options = IpcWriteOptions::default();
    let message: std::result::Result<IpcMessage, _> = SchemaAsIpc::new(schema, &options).try_into();
    message
        .map(|m| m.0)
        .map_err(|e| Status::internal(format!("the columns cannot be sent: {e}")))
}
