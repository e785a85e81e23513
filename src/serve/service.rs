//! The Flight SQL protocol over the engine. A statement (`CommandStatementQuery`, or a prepared
//! one) runs when the client asks for its `FlightInfo`: every statement of it at once, except a
//! final query, which is planned then and runs as `DoGet` streams its rows. An update
//! (`CommandStatementUpdate`) runs and returns its row count. A client that cancels, times out or
//! disconnects drops its call, and with it the statement: what it wrote is discarded, as at
//! Ctrl-C. At most `--max-statements` run at once; the others wait for one to end.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

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
    Action, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use futures::Stream;
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status, Streaming};

use super::ServeOptions;
use super::auth::Credentials;
use super::metadata;
use super::params;
use super::replies::{reply, status};
use super::running::produced;
use super::sessions::{Access, ClientSession, Pending, Prepared, Sessions};
use super::statement::{bind_none, update_count};
use crate::engine::Engine;
use crate::error::Result;

/// How often sessions idle too long are ended.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The server's service (see the module's text).
pub struct FlightSql {
    pub(super) sessions: Arc<Sessions>,
    pub(super) credentials: Credentials,
    pub(super) slots: Arc<Semaphore>,
    pub(super) timeout: Option<Duration>,
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
    pub(super) fn access<T>(&self, request: &Request<T>, keep: bool) -> Result<Access, Status> {
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
    pub(super) async fn slot(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("the server is stopping"))
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

/// A handle sent to the client, read back.
#[allow(clippy::result_large_err)]
fn handle_of(bytes: &[u8], what: &str) -> Result<u64, Status> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_be_bytes)
        .map_err(|_| Status::invalid_argument(format!("not a {what} handle of this server")))
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
