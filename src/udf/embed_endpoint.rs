//! `embed` of an embedding endpoint model ([`crate::llm`], `'kind' 'embedding'`): the texts of a
//! gathered batch sent to its `/embeddings` in requests of several texts, the vectors put back
//! in row order. `embed` is a synchronous function (its model files run on the calling
//! thread), so the requests are awaited here on the runtime the query runs on.

use std::sync::Arc;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs};

use super::embed::{spread, vector_column};
use crate::config::{BatchInferOptions, OnError};
use crate::error::Error;
use crate::llm::client::Call;
use crate::llm::{EndpointModel, Kind, LlmError};
use crate::rejects::{self, Rejecting};
use crate::statement_context::StatementContext;
use crate::storage::StoreRegistry;

/// The length of `model`'s vectors; an error for a chat model.
pub(super) fn dimensions(model: &EndpointModel) -> Result<usize> {
    match (model.endpoint.kind, model.endpoint.dimensions) {
        (Kind::Embedding, Some(dim)) => Ok(dim),
        _ => plan_err!(
            "model '{}' is a chat endpoint: embed takes a text model or an embedding endpoint \
             ('kind' 'embedding'); call this one with generate('{}', prompt)",
            model.name,
            model.name
        ),
    }
}

/// `embed(model, text)` over the batch of `args`.
pub(super) fn invoke(
    model: &EndpointModel,
    args: &ScalarFunctionArgs,
    stores: &StoreRegistry,
) -> Result<ColumnarValue> {
    let dim = dimensions(model)?;
    let rows = args.number_rows;
    let text_array = cast(&args.args[1].to_array(rows)?, &DataType::Utf8)?;
    let texts = text_array.as_string::<i32>();
    let present: Vec<&str> = texts.iter().flatten().collect();
    let session = args.config_options.extensions.get::<BatchInferOptions>();
    let untagged = StatementContext::default();
    let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
    let call = Call::of(statement, session);
    if let Some(estimates) = crate::llm::estimate::Estimates::of(statement) {
        block_on(estimates.embeddings(model, &call, &present))?;
        let none = datafusion::arrow::array::new_null_array(args.return_field.data_type(), rows);
        return Ok(ColumnarValue::Array(none));
    }
    let asked = crate::llm::until_stopped(model.embed(&call, &present), statement.stop());
    let outcomes = block_on(asked)??;
    let mut vectors = Vec::with_capacity(present.len() * dim);
    let mut failed = Vec::new();
    for (k, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(vector) => vectors.extend(vector),
            Err(why) => {
                vectors.extend(std::iter::repeat_n(0f32, dim));
                failed.push((k, why.to_string()));
            }
        }
    }
    let on_error = session.map_or(OnError::Fail, |o| o.on_error);
    if on_error == OnError::Fail
        && let Some((_, why)) = failed.first()
    {
        return Err(Error::from(LlmError::Request {
            model: model.name.clone(),
            problem: format!(
                "{why} (SET batchinfer.on_error = 'null' or 'reject' to go on without such rows)"
            ),
        })
        .into());
    }
    let (values, failed) = spread(texts, rows, dim, vectors, failed);
    if let Some(session) = session {
        if session.on_error == OnError::Reject {
            let rejecting = Rejecting {
                name: &model.name,
                sha256: &model.sha256,
            };
            let fields = [Arc::new(Field::new(
                args.arg_fields[1].name(),
                DataType::Utf8,
                true,
            ))];
            rejects::keep(
                stores,
                statement,
                rejecting,
                &fields,
                std::slice::from_ref(&text_array),
                &failed,
            )?;
        }
        rejects::count(session, statement, &model.name, present.len(), &failed)?;
    }
    Ok(ColumnarValue::Array(vector_column(
        texts, rows, dim, values, &failed,
    )?))
}

/// `future` awaited from this synchronous function: on the query's runtime (its worker thread
/// handed over meanwhile), or on a runtime of its own where the query's cannot block.
fn block_on<F>(future: F) -> Result<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            Ok(tokio::task::block_in_place(|| handle.block_on(future)))
        }
        _ => Ok(crate::storage::block_on_io(future)?),
    }
}
