//! Endpoint models: LLMs behind an OpenAI-compatible HTTP API (OpenAI, vLLM, llama.cpp's server,
//! Ollama), defined by `CREATE MODEL name OPTIONS ('endpoint' ..., 'model' ...)` and called by
//! `generate('name', prompt [, 'col TYPE, ...'])`, one request per row.
//!
//! - `mod.rs`: the feature's errors ([`LlmError`]); `definition.rs`: the definition
//!   ([`Endpoint`]): its options, checked, kept in the warehouse as JSON.
//! - `client.rs`: one endpoint model at run time ([`EndpointModel`]): its HTTP client, the
//!   requests at once (a semaphore shared by every partition and statement), retries, identical
//!   requests sent once, what it has done ([`Usage`]).
//! - `pace.rs`: `requests_per_minute` and `tokens_per_minute` as token buckets, and a pause of the
//!   whole model after a 429 or a server's rate-limit headers.
//! - `output.rs`: typed output: `'name VARCHAR, age INT'` as an Arrow struct, the JSON schema
//!   sent with each request, replies checked and decoded into the struct.
//! - `cache.rs`: every answer kept in the warehouse by the sha256 of its request, so that the
//!   same request is never paid twice.
//! - `estimate.rs`: what a statement would ask, counted without asking (`EXPLAIN COST`,
//!   `max_cost` checked before anything is sent).
//! - `judge.rs`: questions answered with probabilities (`ai_filter`, `ai_classify`): their
//!   prompts, and each answer's probability from the log-probabilities of the reply's first
//!   token.
//! - `calibration.rs`: what a server counts of prompts against their estimates, learned from
//!   its replies and kept beside the cache, to correct the estimates.
//! - `cascade.rs`: cascades: the thresholds on a local proxy model's scores, set on a sample
//!   of a statement's rows, past which the proxy answers `ai_filter` and `ai_classify` instead
//!   of the model.
//! - `batch/`: batch mode: requests submitted to the provider's Batch API (`api.rs`), their
//!   batches recorded in the warehouse (`kept.rs`) so that a killed process submits nothing
//!   twice, their answers put in the cache.
//! - `spend.rs`: what a statement has spent, against `batchinfer.max_llm_tokens` and
//!   `batchinfer.max_cost`.
//!
//! The key is read from the environment variable the definition names when requests are made,
//! and is kept nowhere.

pub mod batch;
pub mod cache;
pub mod calibration;
pub mod cascade;
pub mod client;
mod definition;
pub mod estimate;
pub mod judge;
pub mod output;
pub mod pace;
pub mod redact;
pub mod spend;

use crate::error::Error;

pub use client::{EndpointModel, Usage};
pub use definition::{
    DEFAULT_CONTEXT_WINDOW, DEFAULT_PROXY_SAMPLE, DEFAULT_TARGET, Endpoint, Kind, OPTIONS,
};

/// The feature's errors.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// A definition that cannot be used: an unknown option, a value of the wrong kind.
    #[error("model '{model}': {problem}")]
    Definition { model: String, problem: String },
    /// A statement's call that fails the statement: the endpoint refused every request
    /// (a wrong key, an unknown model), or stayed unreachable past its retries.
    #[error("model '{model}': {problem}")]
    Request { model: String, problem: String },
    /// `generate`'s arguments: not a model name, an output schema that cannot be read.
    #[error("{0}")]
    Call(String),
    /// A statement past `batchinfer.max_llm_tokens` or `batchinfer.max_cost`.
    #[error("{0}")]
    Budget(String),
}

impl From<LlmError> for Error {
    /// An endpoint model's error is a model's ([`crate::error::Kind::Model`]).
    fn from(error: LlmError) -> Self {
        Error::Feature {
            kind: crate::error::Kind::Model,
            error: Box::new(error),
        }
    }
}

/// `work`, ended at once by a stop signal the statement's `stop` sees (within 100 ms): the
/// requests it has in flight are dropped, and so cancelled; the answers it had are kept in the
/// cache before it returns.
pub async fn until_stopped<T>(
    work: impl std::future::Future<Output = Result<T, LlmError>>,
    stop: crate::stop::StopToken,
) -> crate::error::Result<T> {
    let stopped = async {
        loop {
            if let Err(e) = stop.check() {
                return e;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    let result = tokio::select! {
        done = work => done.map_err(crate::error::Error::from),
        e = stopped => Err(e),
    };
    // What was paid for is kept, whatever ended the work.
    cache::flush().await;
    result
}

/// `value` as JSON with every object's keys in order, whatever order it was built in: the text
/// a cache key and a definition's sha256 are taken of.
pub fn canonical(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        serde_json::to_string(k).unwrap_or_default(),
                        canonical(&map[k])
                    )
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}
