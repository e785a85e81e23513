//! `ai_reduce('model', 'instruction', list)`: an instruction (summarize, answer a question)
//! carried out over every text of a list however long it is, by map-reduce within the model's
//! context window; and `ai_agg('model', 'instruction', text)`, the same over a group's texts
//! (an aggregate, planned as `ai_reduce` over the group's `array_agg`:
//! [`crate::rules::ai_agg`]).
//!
//! ```sql
//! SELECT product, ai_agg('writer', 'Summarize the complaints', body) AS summary
//! FROM reviews GROUP BY product;
//! ```
//! The texts are put in as many prompts as the window needs (each prompt's tokens, estimated
//! at a token per three characters, plus `max_tokens` for its reply, within `context_window`);
//! each prompt is answered, and the answers are reduced again the same way until one prompt
//! holds them all. Every step is a request of `generate`'s machinery: cached, paced, retried,
//! counted against budgets. A list of no texts gives NULL and sends nothing.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::async_udf::AsyncScalarUDFImpl;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDFImpl, ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDFImpl, Signature, Volatility,
};
use serde_json::Value;

use super::generate::{Rows, ask_each, chat_model, settle};
use super::string_literal;
use crate::config::BatchInferOptions;
use crate::llm::DEFAULT_CONTEXT_WINDOW;
use crate::llm::client::{Call, Outcome};
use crate::llm::estimate::Estimates;
use crate::model::ModelRegistry;
use crate::statement_context::StatementContext;

const USAGE: &str = "ai_reduce takes an endpoint model's name, an instruction and a list of \
                     texts: ai_reduce('writer', 'Summarize', texts)";

/// Characters counted as a token when a prompt is fitted in the window (fewer than the four of
/// English prose on average, so that a prompt fits however its model counts).
const CHARS_A_TOKEN: usize = 3;

/// Tokens kept free in each prompt for the chat template and the separators.
const MARGIN: usize = 64;

/// Between the texts of a prompt.
const SEPARATOR: &str = "\n\n---\n\n";

/// The `ai_reduce` function over a [`ModelRegistry`]'s chat endpoint models.
#[derive(Debug)]
pub struct AiReduceUdf {
    signature: Signature,
    registry: Arc<ModelRegistry>,
}

super::same_registry_identity!(AiReduceUdf);

impl AiReduceUdf {
    pub fn new(registry: Arc<ModelRegistry>) -> Self {
        AiReduceUdf {
            signature: Signature::variadic_any(Volatility::Volatile),
            registry,
        }
    }
}

/// The prompt of one step: the instruction, then the texts.
fn prompt(instruction: &str, texts: &[String]) -> String {
    format!("{}\n\n{}", instruction.trim(), texts.join(SEPARATOR))
}

/// The texts in prompts that each fit `room` tokens: as many a prompt as fit, in order; a text
/// longer than a prompt alone is cut to fit. Answers (`answers`) are cut to half a prompt, so
/// that two always fit one and each level has at most half the prompts of the one before.
fn packed(texts: Vec<String>, room: usize, answers: bool) -> Vec<Vec<String>> {
    let fits = room * CHARS_A_TOKEN;
    let most = match answers {
        true => (fits / 2).saturating_sub(SEPARATOR.len()).max(1),
        false => fits.saturating_sub(SEPARATOR.len()).max(1),
    };
    let mut prompts: Vec<Vec<String>> = Vec::new();
    let mut used = 0;
    for mut text in texts {
        if text.len() > most {
            let mut end = most;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        let size = text.len() + SEPARATOR.len();
        match prompts.last_mut() {
            Some(last) if used + size <= fits => {
                last.push(text);
                used += size;
            }
            _ => {
                used = size;
                prompts.push(vec![text]);
            }
        }
    }
    prompts
}

/// One list's reduction: its steps' requests, level by level.
struct Reduction {
    texts: Vec<String>,
    /// Whether the texts are answers of an earlier level.
    answers: bool,
    /// The prompt that failed, and why, if one did.
    failed: Option<(String, String)>,
    answer: Option<String>,
}

impl ScalarUDFImpl for AiReduceUdf {
    fn name(&self) -> &str {
        "ai_reduce"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        if args.arg_fields.len() != 3 {
            return plan_err!("{USAGE}");
        }
        let Some(name) = string_literal(args.scalar_arguments[0]) else {
            return plan_err!("{USAGE}");
        };
        chat_model(&self.registry, &name, None, "ai_reduce")?;
        if string_literal(args.scalar_arguments[1]).is_none() {
            return plan_err!("{USAGE}");
        }
        let list = args.arg_fields[2].data_type();
        let texts = match list {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                f.data_type().clone()
            }
            DataType::Null => DataType::Utf8,
            other => {
                return plan_err!(
                    "ai_reduce: model '{name}': the texts must be a list, got {other}"
                );
            }
        };
        if !datafusion::arrow::compute::can_cast_types(&texts, &DataType::Utf8)
            || matches!(texts, DataType::Binary | DataType::LargeBinary)
        {
            return plan_err!(
                "ai_reduce: model '{name}': the list's values must be text, got {texts}"
            );
        }
        Ok(Arc::new(Field::new(self.name(), DataType::Utf8, true)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        exec_err!("ai_reduce runs asynchronously")
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for AiReduceUdf {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = |i: usize| match &args.args[i] {
            ColumnarValue::Scalar(value) => string_literal(Some(value)),
            _ => None,
        };
        let (Some(name), Some(instruction)) = (scalar(0), scalar(1)) else {
            return plan_err!("{USAGE}");
        };
        let model = chat_model(
            &self.registry,
            &name,
            Some(&args.config_options),
            "ai_reduce",
        )?;
        let window = model
            .endpoint
            .context_window
            .unwrap_or(DEFAULT_CONTEXT_WINDOW) as usize;
        let reply = model.endpoint.max_tokens as usize;
        let instruction_tokens = instruction.len() / CHARS_A_TOKEN + 1;
        let room = window.saturating_sub(reply + instruction_tokens + MARGIN);
        // Two answers must fit a prompt, or the answers would never be reduced to one.
        if room < 2 * (reply + SEPARATOR.len()) {
            return exec_err!(
                "ai_reduce: model '{name}': its context_window ({window} tokens) leaves no room \
                 for two replies of max_tokens ({reply}) beside the instruction: raise \
                 'context_window' or lower 'max_tokens'"
            );
        }
        let rows = args.number_rows;
        let lists = args.args[2].to_array(rows)?;
        let mut reductions: Vec<Option<Reduction>> = Vec::with_capacity(rows);
        for row in 0..rows {
            reductions.push(texts_of(&lists, row)?.map(|texts| Reduction {
                texts,
                answers: false,
                failed: None,
                answer: None,
            }));
        }
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let untagged = StatementContext::default();
        let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
        let call = Call::of(statement, session);
        let estimates = Estimates::of(statement);
        // Level by level, every list's prompts of a level asked at once.
        loop {
            let mut requests: Vec<Option<Value>> = Vec::new();
            let mut owners: Vec<(usize, bool)> = Vec::new();
            for (row, reduction) in reductions.iter_mut().enumerate() {
                let Some(r) = reduction else { continue };
                if r.answer.is_some() || r.failed.is_some() {
                    continue;
                }
                let prompts = packed(std::mem::take(&mut r.texts), room, r.answers);
                r.answers = true;
                let last = prompts.len() == 1;
                for texts in prompts {
                    let text = prompt(&instruction, &texts);
                    requests.push(Some(model.chat_request(&text, None)));
                    owners.push((row, last));
                }
            }
            if requests.is_empty() {
                break;
            }
            let outcomes: Vec<Option<Outcome>> = match &estimates {
                // Counted; an answer the cache holds is read (so that the next level's
                // prompts are those a run makes), the others as long as they may be.
                Some(estimates) => {
                    estimates.chat(&model, &call, &requests).await;
                    let mut kept = Vec::with_capacity(requests.len());
                    for body in requests.iter().flatten() {
                        kept.push(model.cached_reply(&call, body).await.map(Ok));
                    }
                    kept
                }
                None => ask_each(&model, &call, &requests, statement).await?,
            };
            for ((row, last), (outcome, request)) in
                owners.into_iter().zip(outcomes.into_iter().zip(&requests))
            {
                let Some(r) = reductions[row].as_mut() else {
                    continue;
                };
                let answer = match outcome {
                    // Unlike any other (each list's steps are its own requests).
                    None => Ok(format!("{row} {}", "x".repeat(reply * 4))),
                    Some(Ok(reply)) => match (&reply.refusal, &reply.content) {
                        (Some(refusal), _) => Err(format!("the model refused: {refusal}")),
                        (None, Some(text)) => Ok(text.clone()),
                        (None, None) => Err("the reply holds no text".to_string()),
                    },
                    Some(Err(why)) => Err(why.to_string()),
                };
                match answer {
                    Ok(text) if last && estimates.is_none() => r.answer = Some(text),
                    Ok(_) if last => r.answer = Some(String::new()),
                    Ok(text) => r.texts.push(text),
                    Err(why) => {
                        if r.failed.is_none() {
                            let sent = request.as_ref().and_then(|b| {
                                b["messages"]
                                    .as_array()
                                    .and_then(|m| m.last())
                                    .and_then(|m| m["content"].as_str())
                                    .map(str::to_string)
                            });
                            r.failed = Some((sent.unwrap_or_default(), why));
                        }
                    }
                }
            }
        }
        if estimates.is_some() {
            return Ok(ColumnarValue::Array(Arc::new(StringArray::new_null(rows))));
        }
        let mut failed: Vec<(usize, String)> = Vec::new();
        let mut prompts: Vec<Option<String>> = vec![None; rows];
        for (row, r) in reductions.iter().enumerate() {
            if let Some(Reduction {
                failed: Some((prompt, why)),
                ..
            }) = r
            {
                failed.push((row, why.clone()));
                prompts[row] = Some(prompt.clone());
            }
        }
        let prompts: ArrayRef = Arc::new(StringArray::from(prompts));
        let asked = reductions.iter().filter(|r| r.is_some()).count();
        let rows_of = Rows {
            prompts: &prompts,
            raw: vec![None; rows],
            failed: &failed,
            asked,
        };
        settle(&self.registry, &model, session, statement, rows_of)?;
        let answers: StringArray = reductions
            .iter()
            .map(|r| {
                r.as_ref()
                    .and_then(|r| r.failed.is_none().then(|| r.answer.clone()).flatten())
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(answers)))
    }
}

/// The texts of a row's list (NULL texts left out); None for a NULL list or one without text.
fn texts_of(lists: &ArrayRef, row: usize) -> Result<Option<Vec<String>>> {
    if lists.is_null(row) || lists.data_type() == &DataType::Null {
        return Ok(None);
    }
    let list = cast(lists, &DataType::new_list(DataType::Utf8, true))?;
    let values = list.as_list::<i32>().value(row);
    let values = cast(&values, &DataType::Utf8)?;
    let texts: Vec<String> = values
        .as_string::<i32>()
        .iter()
        .flatten()
        .map(str::to_string)
        .collect();
    Ok((!texts.is_empty()).then_some(texts))
}

/// `ai_agg('model', 'instruction', text)`: an aggregate that is never run as one, since its
/// model needs the statement (its budget, its cache); the planner makes it `ai_reduce` over the
/// group's texts ([`crate::rules::ai_agg`]).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct AiAggUdf {
    signature: Signature,
}

impl Default for AiAggUdf {
    fn default() -> Self {
        AiAggUdf {
            signature: Signature::variadic_any(Volatility::Volatile),
        }
    }
}

impl AggregateUDFImpl for AiAggUdf {
    fn name(&self) -> &str {
        "ai_agg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if arg_types.len() != 3 {
            return plan_err!(
                "ai_agg takes an endpoint model's name, an instruction and the texts: \
                 ai_agg('writer', 'Summarize the complaints', body)"
            );
        }
        Ok(DataType::Utf8)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(args.name, DataType::Utf8, true))])
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        exec_err!(
            "ai_agg is planned as ai_reduce over the group's texts: it is called only where \
             batchinfer plans the query"
        )
    }
}
