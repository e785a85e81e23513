//! `ai_filter`, `ai_filter_score` and `ai_classify`: questions put to an endpoint model and
//! answered with probabilities, read from the log-probabilities of its reply's first token
//! ([`crate::llm::judge`]), never from generated text.
//!
//! ```sql
//! SELECT id FROM reviews WHERE ai_filter('judge', 'Is this review about shipping?', body);
//! SELECT id, ai_filter_score('judge', 'Is this review about shipping?', title, body) AS p FROM reviews;
//! SELECT id, ai_classify('judge', body, ['praise', 'complaint', 'question']) AS c FROM reviews;
//! SELECT id, ai_classify('judge', body, MAP {'spam': 'unsolicited advertising', 'ham': 'anything else'}) AS c FROM mail;
//! ```
//! Each row is one chat request of one token through `generate`'s machinery (the cache,
//! pacing, retries, budgets, `on_error` and rejects, usage and lineage): a row whose inputs
//! hold a NULL gives NULL and sends nothing.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Float64Array, StringArray, StructArray, new_null_array,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Fields};
use datafusion::common::{exec_err, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::async_udf::AsyncScalarUDFImpl;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use serde_json::Value;

use super::ai_cascade;
use super::generate::{Rows, ask_each, chat_model, is_text, settle};
use super::string_literal;
use crate::config::BatchInferOptions;
use crate::llm::client::{Call, Outcome, Unanswered};
use crate::llm::estimate::Estimates;
use crate::llm::judge::{self, Label};
use crate::model::ModelRegistry;
use crate::statement_context::StatementContext;

/// Which question a function asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Question {
    /// `ai_filter`: yes or no, as a BOOLEAN (yes when its probability is over one half).
    Filter,
    /// `ai_filter_score`: the probability of yes.
    FilterScore,
    /// `ai_classify`: the likeliest label and its probability.
    Classify,
}

/// One of the three functions over a [`ModelRegistry`]'s chat endpoint models.
#[derive(Debug)]
pub struct AiUdf {
    signature: Signature,
    registry: Arc<ModelRegistry>,
    question: Question,
}

impl PartialEq for AiUdf {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.registry, &other.registry) && self.question == other.question
    }
}
impl Eq for AiUdf {}
impl std::hash::Hash for AiUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.registry), state);
        self.question.hash(state);
    }
}

impl AiUdf {
    pub fn new(registry: Arc<ModelRegistry>, question: Question) -> Self {
        AiUdf {
            signature: Signature::variadic_any(Volatility::Volatile),
            registry,
            question,
        }
    }

    fn usage(&self) -> &'static str {
        match self.question {
            Question::Filter => {
                "ai_filter takes an endpoint model's name, a question and the columns it is \
                 about: ai_filter('judge', 'Is it about shipping?', body)"
            }
            Question::FilterScore => {
                "ai_filter_score takes an endpoint model's name, a question and the columns it \
                 is about: ai_filter_score('judge', 'Is it about shipping?', body)"
            }
            Question::Classify => {
                "ai_classify takes an endpoint model's name, a text and its labels: \
                 ai_classify('judge', body, ['praise', 'complaint']), or with what each means: \
                 ai_classify('judge', body, MAP {'spam': 'unsolicited advertising', 'ham': \
                 'anything else'})"
            }
        }
    }

    fn output(&self) -> DataType {
        match self.question {
            Question::Filter => DataType::Boolean,
            Question::FilterScore => DataType::Float64,
            Question::Classify => DataType::Struct(classified_fields()),
        }
    }
}

fn classified_fields() -> Fields {
    Fields::from(vec![
        Field::new("label", DataType::Utf8, true),
        Field::new("score", DataType::Float64, true),
    ])
}

/// Whether `t` can hold labels: a list of texts, or a map of texts to what they mean.
fn is_labels(t: &DataType) -> bool {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            is_text(f.data_type())
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) => kv.len() == 2 && kv.iter().all(|f| is_text(f.data_type())),
            _ => false,
        },
        DataType::Null => true,
        _ => false,
    }
}

impl ScalarUDFImpl for AiUdf {
    fn name(&self) -> &str {
        match self.question {
            Question::Filter => "ai_filter",
            Question::FilterScore => "ai_filter_score",
            Question::Classify => "ai_classify",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(self.output())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let n = args.arg_fields.len();
        let Some(name) = string_literal(args.scalar_arguments.first().copied().flatten()) else {
            return plan_err!("{}", self.usage());
        };
        chat_model(&self.registry, &name, None, self.name())?;
        match self.question {
            Question::Filter | Question::FilterScore => {
                if n < 3 || string_literal(args.scalar_arguments[1]).is_none() {
                    return plan_err!("{}", self.usage());
                }
                for field in &args.arg_fields[2..] {
                    let t = field.data_type();
                    if !(is_text(t) || t.is_numeric() || t.is_temporal() || *t == DataType::Boolean)
                    {
                        return plan_err!(
                            "{}: model '{name}': an input is {t}; the inputs are written into the \
                             prompt as text: give text, numbers, booleans or dates",
                            self.name()
                        );
                    }
                }
            }
            Question::Classify => {
                if n != 3 {
                    return plan_err!("{}", self.usage());
                }
                let text = args.arg_fields[1].data_type();
                if !is_text(text) {
                    return plan_err!(
                        "ai_classify: model '{name}': the text must be text, got {text}; make it \
                         one with CAST(... AS VARCHAR)"
                    );
                }
                let labels = args.arg_fields[2].data_type();
                if !is_labels(labels) {
                    return plan_err!(
                        "ai_classify: model '{name}': the labels must be a list of texts or a \
                         map of each label to what it means, got {labels}: {}",
                        self.usage()
                    );
                }
            }
        }
        Ok(Arc::new(Field::new(self.name(), self.output(), true)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        exec_err!("{} runs asynchronously", self.name())
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for AiUdf {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = |i: usize| match args.args.get(i) {
            Some(ColumnarValue::Scalar(value)) => string_literal(Some(value)),
            _ => None,
        };
        let Some(name) = scalar(0) else {
            return plan_err!("{}", self.usage());
        };
        let model = chat_model(
            &self.registry,
            &name,
            Some(&args.config_options),
            self.name(),
        )?;
        let rows = args.number_rows;
        let labels = match self.question {
            Question::Classify => labels_of(&args.args[2].to_array(rows)?, &name)?,
            _ => Vec::new(),
        };
        // Each row's prompt, and its text as a cascade's proxy reads it.
        let (prompts, texts): (Vec<Option<String>>, Vec<Option<String>>) = match self.question {
            Question::Filter | Question::FilterScore => {
                let Some(question) = scalar(1) else {
                    return plan_err!("{}", self.usage());
                };
                filter_inputs(&args, rows)?
                    .into_iter()
                    .map(|values| match values {
                        Some(values) => {
                            let values: Vec<&str> = values.iter().map(String::as_str).collect();
                            (
                                Some(judge::filter_prompt(&question, &values)),
                                Some(values.join("\n")),
                            )
                        }
                        None => (None, None),
                    })
                    .unzip()
            }
            Question::Classify => {
                let texts = cast(&args.args[1].to_array(rows)?, &DataType::Utf8)?;
                let texts = texts.as_string::<i32>();
                (0..rows)
                    .map(|row| match (texts.is_valid(row), &labels[row]) {
                        (true, Some(labels)) => (
                            Some(judge::classify_prompt(texts.value(row), labels)),
                            Some(texts.value(row).to_string()),
                        ),
                        _ => (None, None),
                    })
                    .unzip()
            }
        };
        let requests: Vec<Option<Value>> = prompts
            .iter()
            .map(|p| {
                p.as_ref()
                    .map(|p| judge::asking_for_probabilities(model.chat_request(p, None)))
            })
            .collect();
        let session = args.config_options.extensions.get::<BatchInferOptions>();
        let untagged = StatementContext::default();
        let statement = StatementContext::of(Some(&args.config_options)).unwrap_or(&untagged);
        let call = Call::of(statement, session);
        if let Some(estimates) = Estimates::of(statement) {
            // Counted, not sent: a filter keeps every row asked about, so that what a later
            // call is asked is counted at most.
            estimates.chat(&model, &call, &requests).await;
            let column: ArrayRef = match self.question {
                Question::Filter => Arc::new(
                    requests
                        .iter()
                        .map(|r| r.as_ref().map(|_| true))
                        .collect::<BooleanArray>(),
                ),
                _ => new_null_array(&self.output(), rows),
            };
            return Ok(ColumnarValue::Array(column));
        }
        let n_labels = |row: usize| labels.get(row).and_then(Option::as_ref).map_or(0, Vec::len);
        let probabilities_of = |row: usize, outcome: &Outcome| -> Result<Vec<f64>, Unanswered> {
            let reply = outcome.as_ref().map_err(Clone::clone)?;
            let tokens = judge::first_tokens(reply)?;
            match self.question {
                Question::Classify => judge::label_probabilities(&tokens, n_labels(row)),
                _ => judge::yes_probability(&tokens).map(|p| vec![p]),
            }
        };
        let cascade = match self.question {
            Question::FilterScore => None,
            _ => ai_cascade::proxy_of(&self.registry, &model, session, &args.config_options)?,
        };
        let anchors = match self.question {
            Question::Classify => same_labels(&labels),
            _ => scalar(1).map(|q| vec![q]),
        };
        let (outcomes, proxied) = match (cascade, anchors) {
            (Some(proxy), Some(anchors)) => {
                let columns = match self.question {
                    Question::Classify => vec![args.args[1].to_array(rows)?],
                    _ => args.args[2..]
                        .iter()
                        .map(|a| a.to_array(rows))
                        .collect::<Result<Vec<_>>>()?,
                };
                let batch = ai_cascade::Batch {
                    requests: &requests,
                    texts,
                    columns,
                    asks: asks(self.name(), &anchors, &args),
                    anchors,
                };
                let read = |row: usize, outcome: &Outcome| {
                    let p = probabilities_of(row, outcome).ok()?;
                    match self.question {
                        Question::Classify => likeliest(&p).map(|(i, _)| i),
                        _ => p.first().map(|yes| usize::from(is_yes(*yes))),
                    }
                };
                let answered = proxy
                    .answer(self.question, &model, &call, statement, batch, read)
                    .await?;
                (answered.outcomes, answered.proxied)
            }
            _ => (
                ask_each(&model, &call, &requests, statement).await?,
                vec![None; rows],
            ),
        };

        // Each row's probabilities, and why those without them have none.
        let mut failed: Vec<(usize, String)> = Vec::new();
        let mut raw: Vec<Option<&str>> = vec![None; rows];
        let mut probabilities: Vec<Option<Vec<f64>>> = vec![None; rows];
        for (row, outcome) in outcomes.iter().enumerate() {
            if let Some((answer, rate)) = proxied[row] {
                probabilities[row] = Some(proxy_probabilities(answer, rate, n_labels(row)));
                continue;
            }
            let Some(outcome) = outcome else { continue };
            if let Ok(reply) = outcome {
                raw[row] = Some(reply.content.as_deref().unwrap_or(reply.raw.as_str()));
            }
            match probabilities_of(row, outcome) {
                Ok(p) => probabilities[row] = Some(p),
                Err(why) => failed.push((row, why.to_string())),
            }
        }
        let prompts: ArrayRef = Arc::new(StringArray::from(prompts.clone()));
        let asked = outcomes.iter().filter(|o| o.is_some()).count();
        let settled = Rows {
            prompts: &prompts,
            raw,
            failed: &failed,
            asked,
        };
        settle(&self.registry, &model, session, statement, settled)?;
        let column: ArrayRef = match self.question {
            Question::Filter => Arc::new(
                probabilities
                    .iter()
                    .map(|p| p.as_ref().map(|p| is_yes(p[0])))
                    .collect::<BooleanArray>(),
            ),
            Question::FilterScore => Arc::new(
                probabilities
                    .iter()
                    .map(|p| p.as_ref().map(|p| p[0]))
                    .collect::<Float64Array>(),
            ),
            Question::Classify => classified(&probabilities, &labels)?,
        };
        Ok(ColumnarValue::Array(column))
    }
}

/// What a cascade's call asks, as its thresholds are kept by: the function, the question or
/// labels, and the inputs it is asked of (by their names in the query), so that the same
/// question of another column is a cascade of its own.
fn asks(function: &str, anchors: &[String], args: &ScalarFunctionArgs) -> String {
    let inputs = match function {
        "ai_classify" => &args.arg_fields[1..2],
        _ => args.arg_fields.get(2..).unwrap_or_default(),
    };
    let mut parts = vec![function.to_string()];
    parts.extend(anchors.iter().cloned());
    parts.push(String::new());
    parts.extend(inputs.iter().map(|f| f.name().clone()));
    parts.join("\u{0}")
}

/// The inputs of each row of `ai_filter` as text: None where one is NULL.
fn filter_inputs(args: &ScalarFunctionArgs, rows: usize) -> Result<Vec<Option<Vec<String>>>> {
    let mut inputs: Vec<ArrayRef> = Vec::new();
    for arg in &args.args[2..] {
        inputs.push(cast(&arg.to_array(rows)?, &DataType::Utf8)?);
    }
    Ok((0..rows)
        .map(|row| {
            let mut values = Vec::with_capacity(inputs.len());
            for column in &inputs {
                if column.is_null(row) {
                    return None;
                }
                values.push(column.as_string::<i32>().value(row).to_string());
            }
            Some(values)
        })
        .collect())
}

/// The labels' texts as a proxy compares rows with them ("name: what it means"), when every
/// row of the batch has the same labels (a cascade is for one question); None otherwise.
fn same_labels(labels: &[Option<Vec<Label>>]) -> Option<Vec<String>> {
    let mut present = labels.iter().flatten();
    let first = present.next()?;
    if present.any(|l| l != first) {
        return None;
    }
    Some(
        first
            .iter()
            .map(|l| match &l.description {
                Some(d) => format!("{}: {d}", l.name),
                None => l.name.clone(),
            })
            .collect(),
    )
}

/// The probabilities a row the proxy answered is given: its answer's the rate at which the
/// proxy's answers agreed with the model's on the sample, the rest shared by the others.
fn proxy_probabilities(answer: usize, rate: f64, labels: usize) -> Vec<f64> {
    if labels == 0 {
        // A yes-or-no question: the probability of yes.
        return vec![if answer == 1 { rate } else { 1.0 - rate }];
    }
    let rest = (1.0 - rate) / (labels.saturating_sub(1).max(1)) as f64;
    (0..labels)
        .map(|i| if i == answer { rate } else { rest })
        .collect()
}

/// Each row's labels (None where they are NULL), checked: one at least, at most
/// [`judge::MAX_LABELS`], none twice, none empty.
fn labels_of(column: &ArrayRef, model: &str) -> Result<Vec<Option<Vec<Label>>>> {
    let rows = column.len();
    let mut out = Vec::with_capacity(rows);
    let texts = |a: &ArrayRef| -> Result<ArrayRef> { Ok(cast(a, &DataType::Utf8)?) };
    for row in 0..rows {
        if column.is_null(row) {
            out.push(None);
            continue;
        }
        let labels: Vec<Label> = match column.data_type() {
            DataType::Map(_, _) => {
                let map = column.as_map();
                let entries = map.value(row);
                let (keys, values) = (texts(entries.column(0))?, texts(entries.column(1))?);
                let (keys, values) = (keys.as_string::<i32>(), values.as_string::<i32>());
                (0..keys.len())
                    .map(|i| Label {
                        name: keys.value(i).to_string(),
                        description: values
                            .is_valid(i)
                            .then(|| values.value(i).to_string())
                            .filter(|d| !d.trim().is_empty()),
                    })
                    .collect()
            }
            DataType::Null => {
                out.push(None);
                continue;
            }
            _ => {
                let list = cast(column, &DataType::new_list(DataType::Utf8, true))?;
                let values = texts(&list.as_list::<i32>().value(row))?;
                let values = values.as_string::<i32>();
                let mut labels = Vec::with_capacity(values.len());
                for i in 0..values.len() {
                    if values.is_null(i) {
                        return exec_err!(
                            "ai_classify: model '{model}': a label is NULL; give each label as text"
                        );
                    }
                    labels.push(Label {
                        name: values.value(i).to_string(),
                        description: None,
                    });
                }
                labels
            }
        };
        if labels.is_empty() || labels.len() > judge::MAX_LABELS {
            return exec_err!(
                "ai_classify: model '{model}': {} labels; give 1 to {}",
                labels.len(),
                judge::MAX_LABELS
            );
        }
        for (i, label) in labels.iter().enumerate() {
            if label.name.trim().is_empty() || label.name.contains('\n') {
                return exec_err!(
                    "ai_classify: model '{model}': the label {:?} is empty or spans lines",
                    label.name
                );
            }
            if labels[..i].iter().any(|l| l.name == label.name) {
                return exec_err!(
                    "ai_classify: model '{model}': the label {:?} is given twice",
                    label.name
                );
            }
        }
        out.push(Some(labels));
    }
    Ok(out)
}

/// Whether a probability of yes answers yes: over one half.
fn is_yes(p: f64) -> bool {
    p > 0.5
}

/// The likeliest of the labels' probabilities `p`: its index and probability.
fn likeliest(p: &[f64]) -> Option<(usize, f64)> {
    p.iter()
        .copied()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// Each row's likeliest label and its probability.
fn classified(
    probabilities: &[Option<Vec<f64>>],
    labels: &[Option<Vec<Label>>],
) -> Result<ArrayRef> {
    let mut names: Vec<Option<String>> = Vec::with_capacity(labels.len());
    let mut scores: Vec<Option<f64>> = Vec::with_capacity(labels.len());
    for (p, labels) in probabilities.iter().zip(labels) {
        let best = match (p, labels) {
            (Some(p), Some(labels)) => likeliest(p).map(|(i, s)| (labels[i].name.clone(), s)),
            _ => None,
        };
        names.push(best.as_ref().map(|b| b.0.clone()));
        scores.push(best.map(|b| b.1));
    }
    let nulls: Vec<bool> = names.iter().map(Option::is_some).collect();
    Ok(Arc::new(StructArray::try_new(
        classified_fields(),
        vec![
            Arc::new(StringArray::from(names)),
            Arc::new(Float64Array::from(scores)),
        ],
        Some(nulls.into()),
    )?))
}
