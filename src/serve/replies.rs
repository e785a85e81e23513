//! What the server sends back: a statement's `FlightInfo` (its result kept for the `DoGet` that
//! reads it), a catalog browser's call's `FlightInfo` and rows, rows as `DoGet` streams, the
//! session token where it is new, and an error as a gRPC status.

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::{Any, ProstMessageExt, TicketStatementQuery};
use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use futures::{Stream, TryStreamExt};
use prost::Message;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use super::service::FlightSql;
use super::sessions::{Access, ClientSession, Pending};
use crate::error::{Error, Kind, Result};
use crate::message::display_error;

impl FlightSql {
    /// The `FlightInfo` of `pending`, kept in `session` for a `DoGet`.
    #[allow(clippy::result_large_err)]
    pub(super) fn result_info(
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
    pub(super) fn stream(
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
    pub(super) fn metadata_info(
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
    pub(super) fn metadata_rows(
        &self,
        access: &Access,
        batch: Result<RecordBatch>,
    ) -> Result<Response<<Self as FlightService>::DoGetStream>, Status> {
        let batch = batch.map_err(status)?;
        let schema = batch.schema();
        Ok(self.stream(access, schema, futures::stream::iter([Ok(batch)])))
    }
}

/// A `FlightInfo` of `schema` whose one endpoint's ticket is `ticket`.
#[allow(clippy::result_large_err)]
pub(super) fn info(
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
pub(super) fn reply<T>(body: T, access: &Access) -> Response<T> {
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
pub(super) fn status(error: Error) -> Status {
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
