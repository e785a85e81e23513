//! `ai_filter` and `ai_classify` through a cascade ([`crate::llm::cascade`]): the endpoint
//! model's proxy (its `'proxy'` option, or `SET batchinfer.llm_proxy`), a local model,
//! answers the rows it is sure of; the sample that sets its thresholds and the other rows are
//! sent. The proxy is a text model (its embeddings' similarity to the question or to each
//! label), or a classifier fed the call's columns as `predict` feeds them (its probability of
//! its last class, for `ai_filter` of a two-class model; its probabilities of its classes, in
//! the labels' order, for `ai_classify`).

use std::sync::Arc;

use datafusion::common::plan_err;
use datafusion::error::Result;
use futures::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::ai::Question;
use super::generate::ask_each;
use crate::config::BatchInferOptions;
use crate::llm::cascade::{Answer, Cascades, Says, Thresholds};
use crate::llm::client::{Call, Outcome};
use crate::llm::{DEFAULT_PROXY_SAMPLE, DEFAULT_TARGET, EndpointModel, Usage};
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::DataType;

use crate::model::embed::{EmbedOptions, embed_texts, embedding_dim};
use crate::model::score::{ScoreOptions, score};
use crate::model::{Model, ModelRegistry};
use crate::statement_context::StatementContext;
use crate::storage::StoreRegistry;
use crate::tensor::input::InputBinding;

/// The cache's entries read at once to find the rows it answers.
const CACHE_READS_AT_ONCE: usize = 32;

/// The proxy of a statement's calls of an endpoint model.
pub(super) struct Proxy {
    name: String,
    model: Arc<Model>,
    /// Whether it is a classifier (else a text model).
    classifier: bool,
    target: f64,
    sample: usize,
    stores: Arc<StoreRegistry>,
}

/// The proxy the calls of `endpoint` use under `options`: the setting's, else the model's own;
/// None for none (or 'none').
pub(super) fn proxy_of(
    registry: &ModelRegistry,
    endpoint: &EndpointModel,
    options: Option<&BatchInferOptions>,
    config: &datafusion::config::ConfigOptions,
) -> Result<Option<Proxy>> {
    let setting = options.and_then(|o| o.llm_proxy.clone());
    let Some(name) = setting.or_else(|| endpoint.endpoint.proxy.clone()) else {
        return Ok(None);
    };
    if name.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let refused = |why: String| -> Result<Option<Proxy>> {
        plan_err!(
            "model '{}': its proxy '{name}' {why}; a proxy is a local text model (a folder with \
             model.onnx and tokenizer.json) or classifier (an output of class probabilities), \
             or SET batchinfer.llm_proxy = 'none' sends every row",
            endpoint.name
        )
    };
    if registry.endpoint_if(&name, Some(config))?.is_some() {
        return refused("is an endpoint model".into());
    }
    let model = match registry.resolve(&name, super::device_of(Some(config)), Some(config)) {
        Ok(model) => model,
        Err(e) => return refused(format!("cannot be used: {e}")),
    };
    let classifier = model.text.is_none() && probabilities_field(&model).is_some();
    if !classifier && let Err(e) = embedding_dim(&model) {
        return refused(format!(
            "is neither a text model ({e}) nor a classifier (an output of class probabilities)"
        ));
    }
    let target = options
        .and_then(|o| o.llm_proxy_target)
        .or(endpoint.endpoint.target)
        .unwrap_or(DEFAULT_TARGET);
    let sample = endpoint
        .endpoint
        .proxy_sample
        .unwrap_or(DEFAULT_PROXY_SAMPLE) as usize;
    Ok(Some(Proxy {
        name,
        model,
        classifier,
        target,
        sample,
        stores: registry.stores().clone(),
    }))
}

/// A batch's rows as the cascade takes them.
pub(super) struct Batch<'a> {
    /// Each row's request (None: the row asks nothing).
    pub requests: &'a [Option<Value>],
    /// Each row's text as the proxy reads it.
    pub texts: Vec<Option<String>>,
    /// What the texts are compared with: the question, or each label's text.
    pub anchors: Vec<String>,
    /// What the question is: the cascade's name within the statement.
    pub asks: String,
    /// The call's columns a classifier is fed: `ai_filter`'s values, `ai_classify`'s text.
    pub columns: Vec<ArrayRef>,
}

/// What a batch's rows came to: the model's answers to those it was asked, and the proxy's
/// (its answer and the sample's agreement rate where it is sure) to the others.
pub(super) struct Answered {
    pub outcomes: Vec<Option<Outcome>>,
    pub proxied: Vec<Option<(Answer, f64)>>,
}

impl Proxy {
    /// Answers `batch`: the sample's rows (while it fills) and those the cache answers asked,
    /// the thresholds set once the sample is full, the rows the proxy is sure of answered by
    /// it, the rest asked. `read` is the model's answer to a row (None: it has none).
    pub(super) async fn answer(
        &self,
        question: Question,
        model: &EndpointModel,
        call: &Call<'_>,
        statement: &StatementContext,
        batch: Batch<'_>,
        read: impl Fn(usize, &Outcome) -> Option<Answer>,
    ) -> Result<Answered> {
        let rows = batch.requests.len();
        let says = self.says(question, &batch, statement).await?;
        // Rows the cache answers cost nothing: they are asked, never the proxy's.
        let keys: Vec<Option<String>> = batch
            .requests
            .iter()
            .map(|body| body.as_ref().map(|b| model.cache_key(b)))
            .collect();
        let reads = keys.clone().into_iter().map(|key| async move {
            match key {
                Some(key) => model.is_answered(call, &key).await,
                None => false,
            }
        });
        let cached: Vec<bool> = futures::stream::iter(reads)
            .buffered(CACHE_READS_AT_ONCE)
            .collect()
            .await;
        // The cascade: the model's definition, the question and what it is asked of, the
        // proxy's files, the target and the sample.
        let key = format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
            model.sha256,
            batch.asks,
            self.model.sha256,
            self.model.beside_sha256.as_deref().unwrap_or_default(),
            self.target,
            self.sample
        );
        let fit = statement.ledger.get::<Cascades>().fit(&key);
        let mut outcomes: Vec<Option<Outcome>> = vec![None; rows];
        let mut fit = fit.lock().await;
        // A view's refresh takes the thresholds its earlier refreshes set.
        let kept = self.kept(statement, &key);
        if fit.thresholds.is_none()
            && fit.observed.is_empty()
            && let Some(kept) = &kept
        {
            fit.thresholds = kept.read().await;
        }
        if fit.thresholds.is_none() {
            // The sample: the rows first by their request's key (the same rows again in a run
            // again), each distinct request once; the rows the cache answers are asked too
            // (they cost nothing), and count only where the key picks them.
            let need = self.sample.saturating_sub(fit.observed.len());
            let mut candidates: Vec<(&str, usize)> = (0..rows)
                .filter_map(|r| match (&keys[r], says[r]) {
                    (Some(key), Some(_)) if !fit.seen.contains(key) => Some((key.as_str(), r)),
                    _ => None,
                })
                .collect();
            candidates.sort();
            candidates.dedup_by_key(|c| c.0);
            let mut round: Vec<Option<Value>> = vec![None; rows];
            let mut observed_rows = Vec::new();
            for (key, row) in candidates.iter().take(need) {
                round[*row] = batch.requests[*row].clone();
                observed_rows.push(*row);
                fit.seen.insert(key.to_string());
            }
            for row in (0..rows).filter(|&r| cached[r]) {
                round[row] = batch.requests[row].clone();
            }
            let asked = ask_each(model, call, &round, statement).await?;
            for (row, outcome) in asked.into_iter().enumerate() {
                if outcome.is_some() {
                    outcomes[row] = outcome;
                }
            }
            for row in observed_rows {
                if let (Some(s), Some(outcome)) = (says[row], &outcomes[row])
                    && let Some(answer) = read(row, outcome)
                {
                    fit.observed.push((s, answer));
                }
            }
            if fit.observed.len() >= self.sample {
                let t = fit.set(self.target).clone();
                if let Some(kept) = &kept {
                    kept.write(&t).await;
                }
                let usage = Usage {
                    sample: t.sample,
                    sample_sure: t.sure,
                    sample_agreed: t.agreed,
                    ..Usage::default()
                };
                model.count(call, &usage);
            }
        }
        let thresholds = fit.thresholds.clone();
        drop(fit);

        let mut proxied: Vec<Option<(Answer, f64)>> = vec![None; rows];
        let mut round: Vec<Option<Value>> = vec![None; rows];
        for row in 0..rows {
            if batch.requests[row].is_none() || outcomes[row].is_some() {
                continue;
            }
            let sure = match (&thresholds, says[row]) {
                (Some(t), Some(s)) if !cached[row] => t.answer(s),
                _ => None,
            };
            match sure {
                Some(answer) => proxied[row] = Some(answer),
                None => round[row] = batch.requests[row].clone(),
            }
        }
        let asked = ask_each(model, call, &round, statement).await?;
        for (row, outcome) in asked.into_iter().enumerate() {
            if outcome.is_some() {
                outcomes[row] = outcome;
            }
        }
        let by_proxy = proxied.iter().flatten().count() as u64;
        if by_proxy > 0 {
            let usage = Usage {
                proxy_answered: by_proxy,
                ..Usage::default()
            };
            model.count(call, &usage);
        }
        Ok(Answered { outcomes, proxied })
    }

    /// Where a view's refresh keeps the thresholds of the cascade `key`, if it is one.
    fn kept(&self, statement: &StatementContext, key: &str) -> Option<Kept> {
        if statement.keeps.is_empty() {
            return None;
        }
        let folder = url::Url::parse(&statement.keeps).ok()?;
        let name = hex::encode(Sha256::digest(key.as_bytes()));
        let url = folder.join(&format!("{name}.json")).ok()?;
        let store = self.stores.store_for(&url).ok()?;
        let path = crate::storage::object_path(&url).ok()?;
        Some(Kept { store, path })
    }

    /// What the proxy says of each row with a text: its similarity to the question, or the
    /// likeliest label and its margin over the next.
    async fn says(
        &self,
        question: Question,
        batch: &Batch<'_>,
        statement: &StatementContext,
    ) -> Result<Vec<Option<Says>>> {
        if self.classifier {
            return self.classified(question, batch, statement).await;
        }
        let texts: Vec<String> = batch
            .anchors
            .iter()
            .cloned()
            .chain(batch.texts.iter().flatten().cloned())
            .collect();
        let model = self.model.clone();
        let options = EmbedOptions {
            stop: statement.stop(),
            ..EmbedOptions::default()
        };
        let dim = embedding_dim(&model)?;
        let name = self.name.clone();
        let vectors = tokio::task::spawn_blocking(move || {
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            embed_texts(&model, &texts, options)
        })
        .await
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
        .map_err(|e| crate::error::Error::Inference {
            model: name,
            first_row: 0,
            end_row: batch.texts.len(),
            message: format!("as the proxy of ai_filter or ai_classify: {e}"),
        })?;
        let vector = |i: usize| &vectors[i * dim..(i + 1) * dim];
        let anchors = batch.anchors.len();
        let mut next = anchors;
        let mut says = Vec::with_capacity(batch.texts.len());
        for text in &batch.texts {
            if text.is_none() {
                says.push(None);
                continue;
            }
            let v = vector(next);
            next += 1;
            let similarity: Vec<f64> = (0..anchors).map(|a| cosine(v, vector(a))).collect();
            says.push(Some(match question {
                Question::Classify => {
                    let mut order: Vec<usize> = (0..anchors).collect();
                    order.sort_by(|a, b| similarity[*b].total_cmp(&similarity[*a]));
                    let best = order[0];
                    let margin = order.get(1).map_or(f64::INFINITY, |second| {
                        similarity[best] - similarity[*second]
                    });
                    Says::Label {
                        label: best,
                        margin,
                    }
                }
                _ => Says::Score(similarity[0]),
            }));
        }
        Ok(says)
    }
}

impl Proxy {
    /// What a classifier says of each row asked about: the probability of its last class (a
    /// two-class model, for `ai_filter`), or the likeliest of its classes (as many as the
    /// labels, in their order, for `ai_classify`) and its margin over the next.
    async fn classified(
        &self,
        question: Question,
        batch: &Batch<'_>,
        statement: &StatementContext,
    ) -> Result<Vec<Option<Says>>> {
        let name = self.name.clone();
        let wrong = |why: String| -> datafusion::error::DataFusionError {
            crate::error::Error::Binding {
                model: name.clone(),
                message: format!("as the proxy of ai_filter or ai_classify: {why}"),
            }
            .into()
        };
        let types: Vec<DataType> = batch
            .columns
            .iter()
            .map(|c| c.data_type().clone())
            .collect();
        let binding = InputBinding::plan(&self.model.signature, &types).map_err(|e| {
            wrong(format!(
                "the call's columns must be the classifier's inputs, in their order: {e}"
            ))
        })?;
        let rows = batch.requests.len();
        let (model, columns) = (self.model.clone(), batch.columns.clone());
        let options = ScoreOptions {
            stop: statement.stop(),
            ..ScoreOptions::default()
        };
        let scored =
            tokio::task::spawn_blocking(move || score(&model, &binding, &columns, rows, options))
                .await
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))??;
        let probabilities = class_probabilities(&self.model, &scored.result)
            .ok_or_else(|| wrong("its output has no class probabilities".into()))?;
        let mut says = Vec::with_capacity(rows);
        for (row, p) in probabilities.into_iter().enumerate() {
            let Some(p) = p.filter(|_| batch.requests[row].is_some()) else {
                says.push(None);
                continue;
            };
            says.push(Some(match question {
                Question::Classify => {
                    if p.len() != batch.anchors.len() {
                        return Err(wrong(format!(
                            "it has {} classes, and the call {} labels: its classes are the \
                             labels, in their order",
                            p.len(),
                            batch.anchors.len()
                        )));
                    }
                    let mut order: Vec<usize> = (0..p.len()).collect();
                    order.sort_by(|a, b| p[*b].total_cmp(&p[*a]));
                    let best = order[0];
                    let margin = order
                        .get(1)
                        .map_or(f64::INFINITY, |second| p[best] - p[*second]);
                    Says::Label {
                        label: best,
                        margin,
                    }
                }
                _ => {
                    if p.len() != 2 {
                        return Err(wrong(format!(
                            "ai_filter's classifier has two classes, no and yes (its last), not \
                             {}",
                            p.len()
                        )));
                    }
                    Says::Score(p[1])
                }
            }));
        }
        Ok(says)
    }
}

/// The output of `model` that holds its class probabilities (a list of floats a row): the
/// one named `probabilities` (or its only list output), and where it is in what `predict`
/// returns (None: the output itself).
fn probabilities_field(model: &Model) -> Option<Option<String>> {
    let is_list = |t: &DataType| match t {
        DataType::FixedSizeList(f, _) | DataType::List(f) => f.data_type().is_floating(),
        _ => false,
    };
    match &model.signature.output_type {
        DataType::Struct(fields) => {
            let lists: Vec<_> = fields.iter().filter(|f| is_list(f.data_type())).collect();
            lists
                .iter()
                .find(|f| f.name() == "probabilities")
                .or(if lists.len() == 1 {
                    lists.first()
                } else {
                    None
                })
                .map(|f| Some(f.name().clone()))
        }
        t if is_list(t) => Some(None),
        _ => None,
    }
}

/// Each row's class probabilities in `result` (a model's output), None for a row it has none.
fn class_probabilities(model: &Model, result: &ArrayRef) -> Option<Vec<Option<Vec<f64>>>> {
    use datafusion::arrow::array::{Array, AsArray};
    let column = match probabilities_field(model)? {
        Some(name) => result.as_struct_opt()?.column_by_name(&name)?.clone(),
        None => result.clone(),
    };
    let values = |row: usize| -> Option<Vec<f64>> {
        if column.is_null(row) {
            return None;
        }
        let list = match column.data_type() {
            DataType::FixedSizeList(..) => column.as_fixed_size_list().value(row),
            _ => column.as_list::<i32>().value(row),
        };
        let list = datafusion::arrow::compute::cast(&list, &DataType::Float64).ok()?;
        let list = list.as_primitive::<datafusion::arrow::datatypes::Float64Type>();
        Some(list.iter().map(|v| v.unwrap_or(f64::NAN)).collect())
    };
    Some((0..result.len()).map(values).collect())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| *x as f64 * *x as f64).sum::<f64>().sqrt();
    let norms = norm(a) * norm(b);
    if norms > 0.0 { dot / norms } else { 0.0 }
}

/// The thresholds of a cascade kept with a view: set by one refresh, taken by the next.
struct Kept {
    store: Arc<dyn object_store::ObjectStore>,
    path: object_store::path::Path,
}

impl Kept {
    /// The thresholds kept, if any can be read and are ones a sample could set (others are set
    /// again).
    async fn read(&self) -> Option<Thresholds> {
        crate::storage::read_small_json(&self.store, &self.path, 64 << 10)
            .await
            .filter(Thresholds::usable)
    }

    /// Keeps `thresholds`; a store that refuses leaves the next refresh to set its own.
    async fn write(&self, thresholds: &Thresholds) {
        crate::storage::write_small_json(&self.store, &self.path, thresholds).await;
    }
}
