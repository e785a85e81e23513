//! What a statement has spent on endpoint models in this process (tokens and money), held
//! against `batchinfer.max_llm_tokens` and `batchinfer.max_cost`: a statement that reaches
//! either stops. The spending is the statement's own ([`Ledger`]): it lasts as long as the
//! statement, whatever other statements or sessions run beside it.

use std::collections::BTreeMap;

use parking_lot::Mutex;

use super::{LlmError, Usage};
use crate::config::BatchInferOptions;
use crate::message::thousands;
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

/// The requests of a statement sent to an endpoint and not answered yet.
#[derive(Debug, Default)]
struct InFlight(std::sync::atomic::AtomicU64);

/// A request of a statement in flight, from its sending until it is dropped (answered, failed
/// or cancelled).
pub struct Sending(std::sync::Arc<InFlight>);

impl Drop for Sending {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Counts a request of the statement whose ledger is `ledger` as in flight while the guard
/// lives.
pub fn sending(ledger: &Ledger) -> Sending {
    let in_flight = ledger.get::<InFlight>();
    in_flight
        .0
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Sending(in_flight)
}

/// What a statement's requests in batches may still cost, reserved as they are submitted
/// ([`reserve`]).
#[derive(Debug, Default)]
struct Reserved(Mutex<(u64, f64)>);

/// A request's reservation, released when it is dropped (answered, and charged, or failed).
pub struct Reservation {
    reserved: Option<std::sync::Arc<Reserved>>,
    tokens: u64,
    cost: f64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(reserved) = &self.reserved {
            let mut r = reserved.0.lock();
            r.0 = r.0.saturating_sub(self.tokens);
            r.1 = (r.1 - self.cost).max(0.0);
        }
    }
}

/// Reserves `tokens` and `cost` (at most what a request about to be submitted in a batch takes)
/// against the statement's budgets: `Err` where what it spent, what its requests in batches
/// may still cost and this would pass one. Requests in a batch are paid whatever the statement
/// does next, so the budget holds before they are submitted.
pub fn reserve(
    ledger: &Ledger,
    options: Option<&BatchInferOptions>,
    tokens: u64,
    cost: f64,
) -> Result<Reservation, LlmError> {
    let Some(options) = options.filter(|o| o.max_llm_tokens.is_some() || o.max_cost.is_some())
    else {
        return Ok(Reservation {
            reserved: None,
            tokens: 0,
            cost: 0.0,
        });
    };
    let spent = ledger.get::<Mutex<Spent>>().lock().total();
    let reserved = ledger.get::<Reserved>();
    let mut r = reserved.0.lock();
    let would_tokens = spent
        .prompt_tokens
        .saturating_add(spent.completion_tokens)
        .saturating_add(r.0)
        .saturating_add(tokens);
    let would_cost = spent.cost + r.1 + cost;
    let past = match (options.max_llm_tokens, options.max_cost) {
        (Some(max), _) if would_tokens > max => format!("batchinfer.max_llm_tokens = '{max}'"),
        (_, Some(max)) if would_cost > max => format!("batchinfer.max_cost = '{max}'"),
        _ => {
            r.0 = r.0.saturating_add(tokens);
            r.1 += cost;
            drop(r);
            return Ok(Reservation {
                reserved: Some(reserved),
                tokens,
                cost,
            });
        }
    };
    Err(LlmError::Budget(format!(
        "the statement's next request would take it past {past}: it spent {} in {} requests, and \
         its requests in batches not answered yet may cost up to {} (each reply at max_tokens); \
         nothing more is submitted and nothing was committed",
        money(spent.cost),
        spent.requests,
        money(r.1)
    )))
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
    let in_flight = ledger
        .get::<InFlight>()
        .0
        .load(std::sync::atomic::Ordering::Relaxed);
    let cancelled = match in_flight {
        0 => "none was in flight".to_string(),
        1 => "1 of them was in flight and was cancelled, which the endpoint may still bill (its \
              reply never came, so its tokens are not counted here)"
            .to_string(),
        n => format!(
            "{n} of them were in flight and were cancelled, which the endpoint may still bill \
             (their replies never came, so their tokens are not counted here)"
        ),
    };
    Err(LlmError::Budget(format!(
        "the statement reached {reached} and stopped: it spent {tokens} tokens ({} prompt, {} \
         completion) and {} in {} requests sent; {cancelled}; nothing was committed",
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

impl Usage {
    /// "20 requests (2 retried), 5 answers from the cache, 1,234 prompt + 567 completion
    /// tokens, $0.001200".
    pub fn described(&self) -> String {
        let sent = self.requests - self.retries.min(self.requests);
        let mut line = format!(
            "{} request{}",
            thousands(sent),
            if sent == 1 { "" } else { "s" }
        );
        if self.retries > 0 {
            line.push_str(&format!(" ({} retried)", thousands(self.retries)));
        }
        if self.cache_hits > 0 {
            line.push_str(&format!(
                ", {} answer{} from the cache",
                thousands(self.cache_hits),
                if self.cache_hits == 1 { "" } else { "s" }
            ));
        }
        line.push_str(&format!(
            ", {} prompt + {} completion tokens, {}",
            thousands(self.prompt_tokens),
            thousands(self.completion_tokens),
            money(self.cost)
        ));
        if self.sample == 0 && self.proxy_answered > 0 {
            line.push_str(&format!(
                "; its proxy answered {} row{} (requests saved) by the thresholds its view kept",
                thousands(self.proxy_answered),
                if self.proxy_answered == 1 { "" } else { "s" },
            ));
        } else if self.sample > 0 {
            line.push_str(&format!(
                "; its proxy answered {} row{} (requests saved), sure of {} of a sample of {} \
                 and agreeing on {}",
                thousands(self.proxy_answered),
                if self.proxy_answered == 1 { "" } else { "s" },
                thousands(self.sample_sure),
                thousands(self.sample),
                thousands(self.sample_agreed),
            ));
        }
        line
    }
}
