//! `generate('model', prompt [, 'col TYPE, ...'])`: one chat request per row to an endpoint
//! model ([`crate::llm`]), the reply's text as VARCHAR, or decoded into a struct of the columns
//! given.
//!
//! ```sql
//! SELECT id, generate('writer', 'Summarize: ' || body) AS summary FROM docs;
//! SELECT id, generate('writer', 'Extract: ' || body, 'name VARCHAR, age INT') AS p FROM docs;
//! ```
//! DataFusion awaits an async function one record batch at a time per partition, so the
//! requests of a batch are sent together here, as many at once as the model's
//! `max_concurrency` lets every partition and statement of the process send. A NULL prompt
//! gives NULL and sends nothing. A row whose request fails (past its retries), or whose reply is
//! cut by `max_tokens`, refused, or does not fit the columns, is that row's error, under
//! `batchinfer.on_error` and `max_errors` as a model's errors are.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray, new_null_array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::{ScalarValue, exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::async_udf::AsyncScalarUDFImpl;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use serde_json::Value;

use super::string_literal;
use crate::config::{BatchInferOptions, OnError};
use crate::error::Error;
use crate::llm::client::{Call, Outcome, Unanswered};
use crate::llm::estimate::Estimates;
use crate::llm::{EndpointModel, Kind, LlmError, output};
use crate::model::ModelRegistry;
use crate::rejects::{self, Rejecting};
use crate::statement_context::StatementContext;

const USAGE: &str = "generate takes an endpoint model's name and a prompt, and optionally the \
                     output's columns: generate('writer', 'Summarize: ' || body) or \
                     generate('writer', prompt, 'name VARCHAR, age INT')";

/// The `generate` function over a [`ModelRegistry`]'s endpoint models.
#[derive(Debug)]
pub struct GenerateUdf {
    signature: Signature,
    registry: Arc<ModelRegistry>,
    /// `generate_details`: the reply with why it ended and its tokens, not the reply alone.
    details: bool,
}

impl PartialEq for GenerateUdf {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.registry, &other.registry) && self.details == other.details
    }
}
impl Eq for GenerateUdf {}
impl std::hash::Hash for GenerateUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.registry), state);
        self.details.hash(state);
    }
}

impl GenerateUdf {
    pub fn new(registry: Arc<ModelRegistry>) -> Self {
        GenerateUdf {
            // Any count, so that a wrong one is told how generate is called (below).
            signature: Signature::variadic_any(Volatility::Volatile),
            registry,
            details: false,
        }
    }

    /// `generate_details`: a struct of the reply (as `generate` gives it), `finish_reason`
    /// (`stop`, or `length` where `max_tokens` cut it), `prompt_tokens` and
    /// `completion_tokens`.
    pub fn details(registry: Arc<ModelRegistry>) -> Self {
        GenerateUdf {
            details: true,
            ..GenerateUdf::new(registry)
        }
    }

    fn model(
        &self,
        name: &str,
        config: Option<&datafusion::config::ConfigOptions>,
    ) -> Result<Arc<EndpointModel>> {
        chat_model(&self.registry, name, config, "generate")
    }
}

/// The chat model `name` that `function` calls, as the session's settings pick it.
pub(super) fn chat_model(
    registry: &ModelRegistry,
    name: &str,
    config: Option<&datafusion::config::ConfigOptions>,
    function: &str,
) -> Result<Arc<EndpointModel>> {
    let model = registry.resolve_endpoint(name, config)?;
    if model.endpoint.kind != Kind::Chat {
        return plan_err!(
            "model '{name}' is an embedding endpoint: {function} takes a chat model ('kind' \
             'chat')"
        );
    }
    Ok(model)
}

/// The output's columns, from the third argument's literal, if there is one.
fn output_fields(value: Option<Option<&ScalarValue>>) -> Result<Option<Fields>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let Some(text) = string_literal(value) else {
        return plan_err!(
            "generate: the third argument must be the output's columns as a string literal, as \
             in 'name VARCHAR, age INT, tags VARCHAR[]'"
        );
    };
    output::parse(&text)
        .map(Some)
        .map_err(|e| LlmError::Call(format!("generate: {e}")))
        .map_err(|e| Error::from(e).into())
}

/// Whether `t` is text (a NULL literal too), as prompts are.
pub(super) fn is_text(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => true,
        DataType::Dictionary(_, values) => is_text(values),
        _ => false,
    }
}

impl ScalarUDFImpl for GenerateUdf {
    fn name(&self) -> &str {
        if self.details {
            "generate_details"
        } else {
            "generate"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        exec_err!("generate: the result type is derived in return_field_from_args")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if !(2..=3).contains(&args.arg_fields.len()) {
            return plan_err!("{USAGE}");
        }
        let Some(name) = string_literal(args.scalar_arguments.first().copied().flatten()) else {
            return plan_err!("{USAGE}");
        };
        self.model(&name, None)?;
        let prompt = args.arg_fields[1].data_type();
        if !is_text(prompt) {
            return plan_err!(
                "generate: model '{name}': the prompt must be text, got {prompt}; build it with \
                 || and CAST(... AS VARCHAR)"
            );
        }
        let output = match output_fields(args.scalar_arguments.get(2).copied())? {
            Some(fields) => DataType::Struct(fields),
            None => DataType::Utf8,
        };
        let output = match self.details {
            true => DataType::Struct(details_fields(output)),
            false => output,
        };
        Ok(Arc::new(Field::new(self.name(), output, true)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        exec_err!("generate runs asynchronously")
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for GenerateUdf {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = match &args.args[0] {
            ColumnarValue::Scalar(value) => string_literal(Some(value)),
            _ => None,
        };
        let Some(name) = name else {
            return plan_err!("{USAGE}");
        };
        let model = self.model(&name, Some(&args.config_options))?;
        let fields = match args.args.get(2) {
            Some(ColumnarValue::Scalar(value)) => output_fields(Some(Some(value)))?,
            Some(_) => output_fields(Some(None))?,
            None => None,
        };
        let schema = fields.as_ref().map(output::json_schema);
        let rows = args.number_rows;
        let prompts = cast(&args.args[1].to_array(rows)?, &DataType::Utf8)?;
        let texts = prompts.as_string::<i32>();
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let untagged = StatementContext::default();
        let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
        let call = Call::of(statement, session);
        let requests: Vec<Option<Value>> = texts
            .iter()
            .map(|prompt| prompt.map(|p| model.chat_request(p, schema.as_ref())))
            .collect();
        if let Some(estimates) = Estimates::of(statement) {
            estimates.chat(&model, &call, &requests).await;
            let none = new_null_array(args.return_field.data_type(), rows);
            return Ok(ColumnarValue::Array(none));
        }
        let outcomes = ask_each(&model, &call, &requests, statement).await?;

        // The rows' texts, and why those without one have none.
        let mut failed: Vec<(usize, String)> = Vec::new();
        let mut answers: Vec<Option<&str>> = vec![None; rows];
        let mut raw: Vec<Option<&str>> = vec![None; rows];
        for (row, outcome) in outcomes.iter().enumerate() {
            let Some(outcome) = outcome else { continue };
            match outcome {
                Ok(reply) => {
                    raw[row] = Some(reply.content.as_deref().unwrap_or(reply.raw.as_str()));
                    match text_of(reply, model.endpoint.max_tokens, fields.is_some()) {
                        Ok(text) => answers[row] = Some(text),
                        Err(why) => failed.push((row, why.to_string())),
                    }
                }
                Err(why) => failed.push((row, why.to_string())),
            }
        }
        let column: ArrayRef = match &fields {
            None => Arc::new(StringArray::from(answers.clone())),
            Some(fields) => {
                let (column, mut invalid) = output::decode(fields, &answers)?;
                failed.append(&mut invalid);
                failed.sort_by_key(|(row, _)| *row);
                column
            }
        };
        let asked = texts.len() - texts.null_count();
        let rows = Rows {
            prompts: &prompts,
            raw,
            failed: &failed,
            asked,
        };
        settle(&self.registry, &model, session, statement, rows)?;
        // A failed row is NULL: it has no answer, or its answer did not decode.
        if !self.details {
            return Ok(ColumnarValue::Array(column));
        }
        let replies: Vec<Option<&crate::llm::client::Reply>> = outcomes
            .iter()
            .map(|o| o.as_ref().and_then(|o| o.as_ref().ok()).map(|r| r.as_ref()))
            .collect();
        Ok(ColumnarValue::Array(with_details(column, &replies)?))
    }
}

/// The text of a reply, or why it is the row's error: refused, empty, or (a `typed` reply) cut
/// by `max_tokens`. A plain text cut by `max_tokens` is the text so far, as the user bounded it.
fn text_of(
    reply: &crate::llm::client::Reply,
    max_tokens: u32,
    typed: bool,
) -> Result<&str, Unanswered> {
    if let Some(refusal) = &reply.refusal {
        return Err(Unanswered::Refused(output::excerpt(refusal)));
    }
    if typed && reply.finish_reason.as_deref() == Some("length") {
        return Err(Unanswered::Cut {
            max_tokens,
            text: output::excerpt(reply.content.as_deref().unwrap_or_default()),
        });
    }
    reply
        .content
        .as_deref()
        .ok_or_else(|| Unanswered::NoText(output::excerpt(&reply.raw)))
}

/// A batch's rows as their requests went: the prompts, the raw replies, the rows without an
/// answer and why, and how many were asked.
pub(super) struct Rows<'a> {
    pub prompts: &'a ArrayRef,
    pub raw: Vec<Option<&'a str>>,
    pub failed: &'a [(usize, String)],
    pub asked: usize,
}

/// The rows of a batch that have no answer, under `batchinfer.on_error` and `max_errors`:
/// the statement fails on the first (`'fail'`), or they are counted, and kept in the rejects
/// with their prompt and raw reply (`'reject'`).
pub(super) fn settle(
    registry: &ModelRegistry,
    model: &EndpointModel,
    session: Option<&BatchInferOptions>,
    statement: &StatementContext,
    rows: Rows<'_>,
) -> Result<()> {
    let name = &model.name;
    let failed = rows.failed;
    let on_error = session.map_or(OnError::Fail, |o| o.on_error);
    if on_error == OnError::Fail
        && let Some((row, why)) = failed.first()
    {
        return Err(Error::from(LlmError::Request {
            model: name.clone(),
            problem: format!(
                "row {row} of a batch: {why} (SET batchinfer.on_error = 'null' or 'reject' \
                 to go on without such rows)"
            ),
        })
        .into());
    }
    if let Some(session) = session {
        if session.on_error == OnError::Reject {
            // The prompt is the row's request, whatever expression made it: named `prompt`,
            // it is the key that joins a reject back to its row.
            let fields = [
                Arc::new(Field::new("prompt", DataType::Utf8, true)),
                Arc::new(Field::new("reply", DataType::Utf8, true)),
            ];
            let columns: [ArrayRef; 2] =
                [rows.prompts.clone(), Arc::new(StringArray::from(rows.raw))];
            let rejecting = Rejecting {
                name: &model.name,
                sha256: &model.sha256,
            };
            rejects::keep(
                registry.stores(),
                statement,
                rejecting,
                &fields,
                &columns,
                failed,
            )?;
        }
        rejects::count(session, statement, name, rows.asked, failed)?;
    }
    Ok(())
}

/// The fields of `generate_details`'s struct around a reply of type `reply`.
fn details_fields(reply: DataType) -> Fields {
    Fields::from(vec![
        Field::new("reply", reply, true),
        Field::new("finish_reason", DataType::Utf8, true),
        Field::new("prompt_tokens", DataType::UInt64, true),
        Field::new("completion_tokens", DataType::UInt64, true),
    ])
}

/// `column` (the replies) in `generate_details`'s struct, with what each row's reply said of
/// itself; a row the endpoint gave no reply (a NULL prompt, a failed request) is NULL whole.
fn with_details(
    column: ArrayRef,
    replies: &[Option<&crate::llm::client::Reply>],
) -> Result<ArrayRef> {
    use datafusion::arrow::array::{StructArray, UInt64Array};
    use datafusion::arrow::buffer::NullBuffer;
    let fields = details_fields(column.data_type().clone());
    let finish: StringArray = replies
        .iter()
        .map(|r| r.and_then(|r| r.finish_reason.as_deref()))
        .collect();
    let tokens = |f: fn(&crate::llm::client::Reply) -> u64| -> UInt64Array {
        replies.iter().map(|r| r.map(f)).collect()
    };
    let nulls = NullBuffer::from(replies.iter().map(Option::is_some).collect::<Vec<_>>());
    let columns: Vec<ArrayRef> = vec![
        column,
        Arc::new(finish),
        Arc::new(tokens(|r| r.prompt_tokens)),
        Arc::new(tokens(|r| r.completion_tokens)),
    ];
    Ok(Arc::new(StructArray::try_new(
        fields,
        columns,
        Some(nulls),
    )?))
}

/// The outcome of each request (None where there is none), all sent at once (the model lets
/// `max_concurrency` go); a stop signal or the statement's budget ends them all.
pub(super) async fn ask_each(
    model: &EndpointModel,
    call: &Call<'_>,
    requests: &[Option<Value>],
    statement: &StatementContext,
) -> Result<Vec<Option<Outcome>>> {
    let asks = requests.iter().map(|body| async move {
        match body {
            Some(body) => model.ask(call, body).await.map(Some),
            None => Ok(None),
        }
    });
    let all = futures::future::try_join_all(asks);
    Ok(crate::llm::until_stopped(all, statement.stop()).await?)
}
