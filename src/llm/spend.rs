//! What a statement has spent on endpoint models in this process (tokens and money), held
//! against `batchinfer.max_llm_tokens` and `batchinfer.max_cost`: a statement that reaches
//! either stops. The spending is the statement's own ([`Ledger`]): it lasts as long as the
//! statement, whatever other statements or sessions run beside it.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::{LlmError, Usage};
use crate::config::BatchInferOptions;
use crate::statement_context::Ledger;

/// One statement's spending: what each model did for each part of it (a view refresh's unit;
/// "" for the rest).
#[derive(Debug, Default, Clone)]
struct Spent {
    by: BTreeMap<(String, String), Usage>,
}

impl Spent {
    fn total(&self) -> Usage {
        let mut total = Usage::default();
        for usage in self.by.values() {
            total.add(usage);
        }
        total
    }
}

/// Counts what `model` did (`done`: requests, retries, answers from the cache, tokens, cost)
/// for `part` of the statement whose ledger is `ledger`.
pub fn count(ledger: &Ledger, part: &str, model: &str, done: &Usage) {
    ledger
        .get::<Mutex<Spent>>()
        .lock()
        .by
        .entry((part.to_string(), model.to_string()))
        .or_default()
        .add(done);
}

/// What each endpoint model did for the statement whose ledger is `ledger`, by name: for its
/// part `part` only, or (None) for all of it.
pub fn usage(ledger: &Ledger, part: Option<&str>) -> BTreeMap<String, Usage> {
    let mut by_model: BTreeMap<String, Usage> = BTreeMap::new();
    for ((p, model), done) in &ledger.get::<Mutex<Spent>>().lock().by {
        if part.is_none_or(|part| part == p) {
            by_model.entry(model.clone()).or_default().add(done);
        }
    }
    by_model
}

/// `Err` once the statement has reached one of its budgets: what it spent, and which budget.
pub fn check(ledger: &Ledger, options: Option<&BatchInferOptions>) -> Result<(), LlmError> {
    let Some(options) = options else {
        return Ok(());
    };
    if options.max_llm_tokens.is_none() && options.max_cost.is_none() {
        return Ok(());
    }
    let s = ledger.get::<Mutex<Spent>>().lock().total();
    let tokens = s.prompt_tokens.saturating_add(s.completion_tokens);
    let reached = match (options.max_llm_tokens, options.max_cost) {
        (Some(max), _) if tokens >= max => format!("batchinfer.max_llm_tokens = '{max}'"),
        (_, Some(max)) if s.cost >= max => format!("batchinfer.max_cost = '{max}'"),
        _ => return Ok(()),
    };
    Err(LlmError::Budget(format!(
        "the statement reached {reached} and stopped: it spent {tokens} tokens ({} prompt, {} \
         completion) and {} in {} requests; requests in flight were cancelled and nothing was \
         committed",
        s.prompt_tokens,
        s.completion_tokens,
        money(s.cost),
        s.requests
    )))
}

/// `0.0123` as "$0.012300": prices per million tokens make small sums.
pub fn money(cost: f64) -> String {
    format!("${cost:.6}")
}
