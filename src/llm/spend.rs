//! What each statement has spent on endpoint models in this process (tokens and money), held
//! against `batchinfer.max_llm_tokens` and `batchinfer.max_cost`: a statement that reaches
//! either stops.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::LlmError;
use crate::config::BatchInferOptions;

/// One statement's spending.
#[derive(Debug, Default, Clone, Copy)]
struct Spent {
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cost: f64,
}

/// Statements whose spending is kept (the oldest are forgotten past this).
const STATEMENTS: usize = 256;

static SPENT: Mutex<BTreeMap<String, Spent>> = Mutex::new(BTreeMap::new());

fn spent() -> std::sync::MutexGuard<'static, BTreeMap<String, Spent>> {
    SPENT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts a reply's tokens and cost against the statement `statement`.
pub fn charge(statement: &str, prompt_tokens: u64, completion_tokens: u64, cost: f64) {
    let mut all = spent();
    let s = all.entry(statement.to_string()).or_default();
    s.requests += 1;
    s.prompt_tokens = s.prompt_tokens.saturating_add(prompt_tokens);
    s.completion_tokens = s.completion_tokens.saturating_add(completion_tokens);
    s.cost += cost;
    while all.len() > STATEMENTS {
        all.pop_first();
    }
}

/// `Err` once the statement has reached one of its budgets: what it spent, and which budget.
pub fn check(statement: &str, options: Option<&BatchInferOptions>) -> Result<(), LlmError> {
    let Some(options) = options else {
        return Ok(());
    };
    if options.max_llm_tokens.is_none() && options.max_cost.is_none() {
        return Ok(());
    }
    let s = spent().get(statement).copied().unwrap_or_default();
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
