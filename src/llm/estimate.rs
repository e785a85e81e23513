//! What a statement would ask its endpoint models, counted without asking: `EXPLAIN COST`, and
//! `batchinfer.max_cost` checked before a statement sends anything.
//!
//! The statement runs as it would, reading what it reads, but each call of an endpoint model
//! (`generate`, `generate_details`, the `ai_*` operators, `embed` of an embedding endpoint) counts
//! its requests here instead of sending them, and returns no answer (NULL; `ai_filter` keeps
//! every row, so that what a later call is asked is counted at most). The count is each
//! model's: the rows that reach its calls, the requests it would send (a request the statement
//! asked already, the cache answers, or a recorded batch holds, is not sent), their tokens (estimated: a token per four
//! characters of the request's messages, corrected by what the server counted of the model's
//! earlier prompts ([`super::calibration`]); a reply at `max_tokens`, the most it may be), the cost at the model's prices, and the time its rate limits imply.
//! Local models (`predict`, `embed` of a model file) are not run: they return NULL.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use serde_json::Value;

use super::EndpointModel;
use super::client::Call;
use crate::statement_context::StatementContext;

/// A statement's counts while it runs as an estimate; kept in its ledger.
#[derive(Debug, Default)]
pub struct Estimates {
    on: AtomicBool,
    models: Mutex<BTreeMap<String, Counted>>,
    /// By model in batch mode: the requests its recorded batches hold (answered when they
    /// end, never sent again), read once.
    in_batches: tokio::sync::Mutex<BTreeMap<String, Arc<HashSet<String>>>>,
}

/// What one model would be asked.
#[derive(Debug, Default)]
struct Counted {
    /// Rows that reach its calls (a NULL input asks nothing).
    rows: u64,
    /// Requests it would send.
    requests: u64,
    /// Requests the cache (or the statement's same request) answers.
    answered: u64,
    prompt_tokens: u64,
    /// At most: each reply at `max_tokens`.
    completion_tokens: u64,
    input_price: f64,
    output_price: f64,
    /// The batch prices ([`crate::llm::batch`]), and whether the statement's requests go in
    /// batches.
    batch_prices: (f64, f64),
    batched: bool,
    requests_per_minute: Option<f64>,
    tokens_per_minute: Option<f64>,
    /// The requests counted, by cache key: the same one is sent once.
    seen: HashSet<String>,
    /// The requests the prompts' calibration has seen (0: a token per four characters).
    calibrated_on: u64,
    /// Whether the prompts are counted by the model's declared tokenizer.
    by_tokenizer: bool,
}

/// One model's estimate, as `EXPLAIN COST` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub model: String,
    pub rows: u64,
    pub requests: u64,
    pub cached: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// At the model's prices, every reply at `max_tokens`.
    pub cost: f64,
    /// The same at its batch prices (half its prices unless it sets them).
    pub batch_cost: f64,
    /// Whether the statement's requests go in batches (charged at the batch prices).
    pub batched: bool,
    /// What its `requests_per_minute` and `tokens_per_minute` imply; None without either.
    pub minutes: Option<f64>,
    /// The server's counts of earlier prompts the prompt tokens are corrected by (0: none,
    /// a token per four characters).
    pub calibrated_on: u64,
    /// Whether the prompts were counted by the model's declared tokenizer.
    pub by_tokenizer: bool,
}

impl Estimate {
    /// What it would be charged: at the batch prices where its requests go in batches.
    pub fn charged(&self) -> f64 {
        if self.batched {
            self.batch_cost
        } else {
            self.cost
        }
    }
}

impl Estimates {
    /// The estimate of `statement`, if it runs as one.
    pub fn of(statement: &StatementContext) -> Option<Arc<Estimates>> {
        let estimates = statement.ledger.get::<Estimates>();
        estimates.on.load(Ordering::Relaxed).then_some(estimates)
    }

    /// `statement` made to run as an estimate: nothing is sent, everything counted.
    pub fn start(statement: &StatementContext) -> Arc<Estimates> {
        let estimates = statement.ledger.get::<Estimates>();
        estimates.on.store(true, Ordering::Relaxed);
        estimates
    }

    fn counted<T>(&self, model: &EndpointModel, f: impl FnOnce(&mut Counted) -> T) -> T {
        let mut models = self.models.lock();
        let counted = models.entry(model.name.clone()).or_insert_with(|| {
            let e = &model.endpoint;
            Counted {
                input_price: e.input_price_per_million,
                output_price: e.output_price_per_million,
                batch_prices: e.batch_prices(),
                by_tokenizer: model.has_tokenizer(),
                requests_per_minute: e.requests_per_minute,
                tokens_per_minute: e.tokens_per_minute,
                ..Counted::default()
            }
        });
        f(counted)
    }

    /// The chat requests of a batch (None where a row asks nothing), counted.
    pub async fn chat(&self, model: &EndpointModel, call: &Call<'_>, requests: &[Option<Value>]) {
        let batched = model.batch_mode(call).unwrap_or(false);
        self.counted(model, |c| c.batched = batched);
        let in_batches = match batched {
            true => {
                let mut known = self.in_batches.lock().await;
                match known.get(&model.name) {
                    Some(keys) => keys.clone(),
                    None => {
                        let keys = Arc::new(model.recorded_batch_keys().await);
                        known.insert(model.name.clone(), keys.clone());
                        keys
                    }
                }
            }
            false => Arc::default(),
        };
        for body in requests.iter().flatten() {
            let key = model.cache_key(body);
            let first = self.counted(model, |c| {
                c.rows += 1;
                c.seen.insert(key.clone())
            });
            if !first {
                self.counted(model, |c| c.answered += 1);
                continue;
            }
            let cached = in_batches.contains(&key) || model.is_answered(call, &key).await;
            let estimated = model.prompt_estimate(body);
            let (prompt, calibrated_on) = model.calibrated_prompt_tokens(estimated).await;
            let completion = body["max_tokens"].as_u64().unwrap_or(0);
            self.counted(model, |c| {
                c.calibrated_on = c.calibrated_on.max(calibrated_on);
                if cached {
                    c.answered += 1;
                } else {
                    c.requests += 1;
                    c.prompt_tokens += prompt;
                    c.completion_tokens += completion;
                }
            });
        }
    }

    /// The texts of an `embed` batch, counted: a request per 64 texts not answered.
    pub async fn embeddings(&self, model: &EndpointModel, call: &Call<'_>, texts: &[&str]) {
        for text in texts {
            let key = model.embedding_key(text);
            let first = self.counted(model, |c| {
                c.rows += 1;
                c.seen.insert(key.clone())
            });
            if !first {
                self.counted(model, |c| c.answered += 1);
                continue;
            }
            let cached = model.is_answered(call, &key).await;
            self.counted(model, |c| {
                if cached {
                    c.answered += 1;
                } else {
                    // Requests of 64 texts each: one more each 64th text.
                    let sent = c.rows - c.answered;
                    if sent % super::client::EMBED_BATCH as u64 == 1 {
                        c.requests += 1;
                    }
                    c.prompt_tokens += text.len() as u64 / 4 + 1;
                }
            });
        }
    }

    /// Each model's estimate, by name.
    pub fn estimates(&self) -> Vec<Estimate> {
        self.models
            .lock()
            .iter()
            .map(|(name, c)| {
                let tokens = (c.prompt_tokens + c.completion_tokens) as f64;
                let by_requests = c.requests_per_minute.map(|r| c.requests as f64 / r);
                let by_tokens = c.tokens_per_minute.map(|t| tokens / t);
                Estimate {
                    model: name.clone(),
                    rows: c.rows,
                    requests: c.requests,
                    cached: c.answered,
                    prompt_tokens: c.prompt_tokens,
                    completion_tokens: c.completion_tokens,
                    cost: (c.prompt_tokens as f64 * c.input_price
                        + c.completion_tokens as f64 * c.output_price)
                        / 1e6,
                    batch_cost: (c.prompt_tokens as f64 * c.batch_prices.0
                        + c.completion_tokens as f64 * c.batch_prices.1)
                        / 1e6,
                    batched: c.batched,
                    minutes: match (by_requests, by_tokens) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    },
                    calibrated_on: c.calibrated_on,
                    by_tokenizer: c.by_tokenizer,
                }
            })
            .collect()
    }
}
