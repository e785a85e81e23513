//! One endpoint model at run time: its HTTP client (rustls, the system's roots), the requests
//! at once (`max_concurrency`, one semaphore shared by every partition and statement of the
//! process), its pace, retries, the cache, identical requests of a statement sent once, and the
//! counts of what it did.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{OnceCell, Semaphore};

use super::cache::{self, Cache, Mode};
use super::output::excerpt;
use super::pace::{Pace, header_duration};
use super::{Endpoint, LlmError, spend};
use crate::config::BatchInferOptions;

/// A chat completion as the endpoint gave it.
#[derive(Debug)]
pub struct Reply {
    /// The text of the first choice.
    pub content: Option<String>,
    /// What the model said instead of answering (OpenAI's `refusal`).
    pub refusal: Option<String>,
    /// Why it stopped: `stop`, or `length` when `max_tokens` cut it.
    pub finish_reason: Option<String>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Whether the prompt's tokens are to be estimated (the server's reply had no usable
    /// `usage`).
    pub estimated: bool,
    /// The reply's body as sent, which the cache keeps.
    pub raw: String,
}

/// The most tokens one reply is counted for, whatever its `usage` says.
const MAX_TOKENS_A_REPLY: u64 = 1 << 40;

impl Reply {
    /// The reply in `raw`, a chat completion's body.
    pub fn parse(raw: String) -> Result<Reply, String> {
        let json: Value = serde_json::from_str(&raw).map_err(|_| {
            format!(
                "the endpoint's reply is not a chat completion: {}",
                excerpt(&raw)
            )
        })?;
        let choice = json
            .get("choices")
            .and_then(|c| c.get(0))
            .ok_or_else(|| format!("the endpoint's reply holds no choice: {}", excerpt(&raw)))?;
        let message = choice.get("message");
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        // A server that says nothing of its tokens is charged an estimate (a token per four
        // characters of the reply; the prompt's is added by the caller), so that budgets hold.
        let content = text(message.and_then(|m| m.get("content")));
        // A count that is not a whole number of tokens (negative, fractional, 1e300, text) is
        // no count: the estimate is charged, as for a reply without usage, never nothing.
        let usage = json.get("usage").filter(|u| u.is_object());
        let said = |key: &str| {
            usage
                .and_then(|u| u.get(key))
                .and_then(Value::as_u64)
                .map(|n| n.min(MAX_TOKENS_A_REPLY))
        };
        let (prompt, completion) = (said("prompt_tokens"), said("completion_tokens"));
        let completion_estimate = content.as_ref().map_or(0, |c| c.len() as u64 / 4 + 1);
        Ok(Reply {
            content,
            refusal: text(message.and_then(|m| m.get("refusal"))),
            finish_reason: text(choice.get("finish_reason")),
            prompt_tokens: prompt.unwrap_or(0),
            completion_tokens: completion.unwrap_or(completion_estimate),
            estimated: prompt.is_none(),
            raw,
        })
    }
}

impl Reply {
    /// The reply with the strings parsed out of it blanked of `key` too
    /// ([`crate::llm::redact`]).
    fn scrubbed(mut self, key: Option<&str>) -> Reply {
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return self;
        };
        let blank = |text: &mut Option<String>| {
            if let Some(t) = text.take() {
                *text = Some(super::redact::redact(t, key));
            }
        };
        blank(&mut self.content);
        blank(&mut self.refusal);
        self.raw = super::redact::redact(std::mem::take(&mut self.raw), key);
        self
    }
}

/// A row's answer: the reply, or why there is none (the row's error).
pub type Outcome = Result<Arc<Reply>, String>;

/// What the endpoint models of a process have done; see [`EndpointModel::usage`].
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Requests sent (each try counts).
    pub requests: u64,
    /// Of those, the tries again after a failure.
    pub retries: u64,
    /// Answers the cache gave, sending nothing.
    pub cache_hits: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// In dollars (or the unit the prices are in).
    pub cost: f64,
}

impl Usage {
    /// The work done since `before`.
    pub fn since(&self, before: &Usage) -> Usage {
        Usage {
            requests: self.requests.saturating_sub(before.requests),
            retries: self.retries.saturating_sub(before.retries),
            cache_hits: self.cache_hits.saturating_sub(before.cache_hits),
            prompt_tokens: self.prompt_tokens.saturating_sub(before.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(before.completion_tokens),
            cost: (self.cost - before.cost).max(0.0),
        }
    }

    pub fn add(&mut self, other: &Usage) {
        self.requests = self.requests.saturating_add(other.requests);
        self.retries = self.retries.saturating_add(other.retries);
        self.cache_hits = self.cache_hits.saturating_add(other.cache_hits);
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.cost += other.cost;
    }

    pub fn is_empty(&self) -> bool {
        self.requests == 0 && self.cache_hits == 0
    }

    fn cache_hit() -> Usage {
        Usage {
            cache_hits: 1,
            ..Usage::default()
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    retries: AtomicU64,
    cache_hits: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Billionths of the price unit.
    cost_nanos: AtomicU64,
}

/// What the statements at hand asked for, by statement and request (or text), so that a
/// statement asks for each once: `V` shares the answer while it is awaited and after; answered
/// ones are forgotten oldest first past [`MEMO_BYTES`] (the cache keeps them).
#[derive(Debug)]
struct Memo<V> {
    cells: HashMap<String, V>,
    answered: VecDeque<(String, usize)>,
    bytes: usize,
}

impl<V> Default for Memo<V> {
    fn default() -> Self {
        Memo {
            cells: HashMap::new(),
            answered: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<V> Memo<V> {
    /// `memo_key` answered with `size` bytes; the oldest answers let go past [`MEMO_BYTES`].
    fn remember(&mut self, memo_key: String, size: usize) {
        self.answered.push_back((memo_key, size));
        self.bytes += size;
        while self.bytes > MEMO_BYTES {
            let Some((old, size)) = self.answered.pop_front() else {
                break;
            };
            self.bytes -= size;
            self.cells.remove(&old);
        }
    }
}

const MEMO_BYTES: usize = 64 << 20;

/// The most texts one embeddings request carries.
const EMBED_BATCH: usize = 64;

/// The longest wait before a try again, whatever a server's Retry-After says.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// The largest reply body read: a server sending more is the row's error.
const MAX_REPLY: usize = 32 << 20;

/// What a statement's call asks of the model: the statement (for its budget and its requests
/// sent once), its options, and the cache's use.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub statement: &'a str,
    /// What the statement counts ([`spend`]).
    pub ledger: &'a crate::statement_context::Ledger,
    /// The part of the statement it belongs to (a view refresh's unit; "" for the rest), whose
    /// usage is counted apart.
    pub part: &'a str,
    pub options: Option<&'a BatchInferOptions>,
    pub cache: Mode,
}

impl<'a> Call<'a> {
    /// The call of `statement`'s query under its `options` (`batchinfer.cache` among them).
    pub fn of(
        statement: &'a crate::statement_context::StatementContext,
        options: Option<&'a BatchInferOptions>,
    ) -> Call<'a> {
        Call {
            statement: &statement.id,
            ledger: &statement.ledger,
            part: &statement.part,
            options,
            cache: options.map(|o| o.cache).unwrap_or_default(),
        }
    }
}

/// What a try of a request came to.
enum Verdict {
    /// A success's body.
    Body(String),
    /// Worth trying again (after at least the duration, when the server said one).
    Retry {
        why: String,
        after: Option<Duration>,
        slow_down: bool,
    },
    /// The row's error.
    Final(String),
}

/// An endpoint model, shared by every statement of the process.
#[derive(Debug)]
pub struct EndpointModel {
    pub name: String,
    pub endpoint: Endpoint,
    /// The definition's sha256 ([`Endpoint::sha256`]).
    pub sha256: String,
    http: reqwest::Client,
    permits: Semaphore,
    pace: Pace,
    cache: Option<Cache>,
    counters: Counters,
    memo: Mutex<Memo<Arc<OnceCell<Outcome>>>>,
    /// Embeddings of the statements at hand by text, asked for or answered.
    vectors: Mutex<Memo<Shared>>,
    /// Requests in flight by cache key, shared by the statements of the process that read the
    /// cache ([`EndpointModel::fetch`]).
    in_flight: Mutex<HashMap<String, Arc<OnceCell<String>>>>,
}

/// Why a request brought no answer to share: the row's error, or the statement's stop.
enum Unshared {
    Row(String),
    Stop(LlmError),
}

/// An embedding as a statement's batches share it: `None` while it is asked for.
type Shared = tokio::sync::watch::Sender<Option<Result<Vec<f32>, String>>>;

/// The texts one `embed` call asks for on its statement's behalf: answered as its requests
/// return; those left unanswered when it ends (stopped, failed) are answered with an error and
/// let go, so that no other batch waits for them.
struct Claims<'a> {
    model: &'a EndpointModel,
    /// (text, memo key)
    keys: Vec<(String, String)>,
}

impl Claims<'_> {
    fn answer(
        &self,
        batch: &[&str],
        vectors: &Result<Vec<Result<Vec<f32>, String>>, String>,
        dim: usize,
    ) {
        let mut memo = self.model.vector_memo();
        for (i, text) in batch.iter().enumerate() {
            let Some((_, memo_key)) = self.keys.iter().find(|(t, _)| t == text) else {
                continue;
            };
            let answer = match vectors {
                Ok(vectors) => vectors[i].clone(),
                Err(why) => Err(why.clone()),
            };
            if let Some(sender) = memo.cells.get(memo_key) {
                sender.send_replace(Some(answer));
            }
            memo.remember(memo_key.clone(), dim * 4 + 64);
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        let mut memo = self.model.vector_memo();
        for (_, memo_key) in &self.keys {
            let unanswered = memo
                .cells
                .get(memo_key)
                .is_some_and(|sender| sender.borrow().is_none());
            if unanswered && let Some(sender) = memo.cells.remove(memo_key) {
                sender.send_replace(Some(Err(
                    "the request for this text was not completed".into()
                )));
            }
        }
    }
}

impl EndpointModel {
    /// The model `name` of `endpoint`, keeping answers in `cache` (a warehouse's).
    pub fn new(name: &str, endpoint: Endpoint, cache: Option<Cache>) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| LlmError::Definition {
                model: name.to_string(),
                problem: format!("no HTTP client: {e}"),
            })?;
        Ok(EndpointModel {
            name: name.to_string(),
            sha256: endpoint.sha256(),
            permits: Semaphore::new(endpoint.max_concurrency),
            pace: Pace::new(endpoint.requests_per_minute, endpoint.tokens_per_minute),
            endpoint,
            http,
            cache,
            counters: Counters::default(),
            memo: Mutex::new(Memo::default()),
            vectors: Mutex::new(Memo::default()),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// Where its answers are kept (a URL), if they are.
    pub fn cache_location(&self) -> Option<String> {
        self.cache.as_ref().map(|c| c.location().to_string())
    }

    /// What this model has done since it was defined in this process.
    pub fn usage(&self) -> Usage {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Usage {
            requests: get(&c.requests),
            retries: get(&c.retries),
            cache_hits: get(&c.cache_hits),
            prompt_tokens: get(&c.prompt_tokens),
            completion_tokens: get(&c.completion_tokens),
            cost: get(&c.cost_nanos) as f64 / 1e9,
        }
    }

    /// Counts `done` as this model's, and the statement's of `call` ([`spend`]).
    fn count(&self, call: &Call<'_>, done: &Usage) {
        let c = &self.counters;
        c.requests.fetch_add(done.requests, Ordering::Relaxed);
        c.retries.fetch_add(done.retries, Ordering::Relaxed);
        c.cache_hits.fetch_add(done.cache_hits, Ordering::Relaxed);
        c.prompt_tokens
            .fetch_add(done.prompt_tokens, Ordering::Relaxed);
        c.completion_tokens
            .fetch_add(done.completion_tokens, Ordering::Relaxed);
        c.cost_nanos
            .fetch_add((done.cost * 1e9).round() as u64, Ordering::Relaxed);
        spend::count(call.ledger, call.part, &self.name, done);
    }

    /// The body of the chat request for `prompt`, with the JSON schema of a typed output.
    pub fn chat_request(&self, prompt: &str, schema: Option<&Value>) -> Value {
        let e = &self.endpoint;
        let mut messages = Vec::new();
        if let Some(system) = &e.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        let mut body = json!({
            "model": e.model,
            "messages": messages,
            "max_tokens": e.max_tokens,
        });
        if let Some(t) = e.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(seed) = e.seed {
            body["seed"] = json!(seed);
        }
        if let Some(schema) = schema {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema, "strict": true},
            });
        }
        body
    }

    /// The answer to `body` for the statement of `call`: from the statement's earlier identical
    /// request, from the cache, or sent. `Err`: the statement stops (its budget, no key).
    pub async fn ask(&self, call: &Call<'_>, body: &Value) -> Result<Outcome, LlmError> {
        let key = cache::key(&self.endpoint.endpoint, body);
        let memo_key = format!("{}/{key}", call.statement);
        let cell = {
            let mut memo = self.memo();
            // Requests that were never answered (their statement stopped) and that nobody
            // waits for are let go, so that a long-lived process does not keep them.
            if memo.cells.len() > 2 * memo.answered.len() + 10_000 {
                memo.cells
                    .retain(|_, cell| cell.initialized() || Arc::strong_count(cell) > 1);
            }
            memo.cells.entry(memo_key.clone()).or_default().clone()
        };
        let outcome = cell
            .get_or_try_init(|| async {
                let outcome = self.fetch(call, &key, body).await?;
                let size = outcome.as_ref().map_or(64, |r| r.raw.len() + 64);
                self.remember(memo_key, size);
                Ok::<_, LlmError>(outcome)
            })
            .await?;
        Ok(outcome.clone())
    }

    fn vector_memo(&self) -> parking_lot::MutexGuard<'_, Memo<Shared>> {
        self.vectors.lock()
    }

    fn memo(&self) -> parking_lot::MutexGuard<'_, Memo<Arc<OnceCell<Outcome>>>> {
        self.memo.lock()
    }

    fn remember(&self, memo_key: String, size: usize) {
        self.memo().remember(memo_key, size);
    }

    /// The key from the environment variable the definition names, read now.
    fn api_key(&self) -> Result<Option<String>, LlmError> {
        let Some(var) = &self.endpoint.api_key_env else {
            return Ok(None);
        };
        match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => Ok(Some(key.trim().to_string())),
            _ => Err(LlmError::Request {
                model: self.name.clone(),
                problem: format!(
                    "the environment variable {var} that 'api_key_env' names is not set in this \
                     process: set it to the endpoint's key (on a cluster, in each executor's \
                     environment)"
                ),
            }),
        }
    }

    async fn fetch(&self, call: &Call<'_>, key: &str, body: &Value) -> Result<Outcome, LlmError> {
        let cache = self.cache.as_ref().filter(|_| call.cache != Mode::Off);
        let api_key = self.api_key().ok().flatten();
        if let Some(cache) = cache
            && let Some(raw) = cache.get(key).await
            && let Ok(reply) = Reply::parse(raw)
        {
            self.count(call, &Usage::cache_hit());
            return Ok(Ok(Arc::new(reply.scrubbed(api_key.as_deref()))));
        }
        let prompt_chars: usize = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().map(|m| m.to_string().len()).sum());
        let reserve = (prompt_chars / 4 + self.endpoint.max_tokens as usize) as f64;
        // A server that says nothing of its tokens is charged an estimate, so budgets hold.
        let count = |raw: &str| match Reply::parse(raw.to_string()) {
            Ok(reply) if !reply.estimated => (reply.prompt_tokens, reply.completion_tokens),
            Ok(reply) => ((prompt_chars / 4 + 1) as u64, reply.completion_tokens),
            Err(_) => ((prompt_chars / 4 + 1) as u64, raw.len() as u64 / 4),
        };
        // Whether this call paid for the answer (else another statement's request, or another
        // process's, brought it: counted as an answer from the cache).
        let paid = std::sync::atomic::AtomicBool::new(false);
        // Whether this call asked (else it waited for another statement's asking).
        let asked = std::sync::atomic::AtomicBool::new(false);
        let ask = || async {
            asked.store(true, std::sync::atomic::Ordering::Relaxed);
            // Another process asking the same now: its answer is waited for.
            let claim = match cache.filter(|_| call.cache == Mode::On) {
                Some(cache) => match cache.claim(key).await {
                    cache::Claim::Answered(raw) => return Ok(raw),
                    cache::Claim::Mine(claim) => Some(claim),
                    cache::Claim::Unclaimed => None,
                },
                None => None,
            };
            paid.store(true, std::sync::atomic::Ordering::Relaxed);
            let raw = match self
                .request(call, "chat/completions", body, reserve, &count)
                .await
            {
                Ok(Ok(raw)) => raw,
                Ok(Err(why)) => return Err(Unshared::Row(why)),
                Err(e) => return Err(Unshared::Stop(e)),
            };
            if let Some(cache) = cache.filter(|_| call.cache == Mode::On) {
                cache.put_soon(key, raw.clone(), claim);
            }
            Ok(raw)
        };
        // The statements of this process that read the cache share a request in flight: one
        // that asks what another is asking waits for its answer.
        let answered = match cache {
            Some(_) => {
                let cell = self.in_flight(key);
                let answered = cell.get_or_try_init(ask).await.cloned();
                if asked.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut in_flight = self.in_flight.lock();
                    if in_flight.get(key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                        in_flight.remove(key);
                    }
                }
                answered
            }
            None => ask().await,
        };
        let raw = match answered {
            Ok(raw) => raw,
            Err(Unshared::Row(why)) => return Ok(Err(why)),
            Err(Unshared::Stop(e)) => return Err(e),
        };
        if paid.load(std::sync::atomic::Ordering::Relaxed) {
            // Past its budget, the statement stops now: this answer is kept in the cache, and
            // the requests in flight are cancelled.
            spend::check(call.ledger, call.options)?;
        } else {
            self.count(call, &Usage::cache_hit());
        }
        Ok(Reply::parse(raw).map(|reply| Arc::new(reply.scrubbed(api_key.as_deref()))))
    }

    /// The request `key` as the statements of this process share it while it is in flight.
    fn in_flight(&self, key: &str) -> Arc<OnceCell<String>> {
        let mut in_flight = self.in_flight.lock();
        // Requests whose statement stopped before an answer, and that nobody waits for.
        if in_flight.len() > 10_000 {
            in_flight.retain(|_, cell| Arc::strong_count(cell) > 1);
        }
        in_flight.entry(key.to_string()).or_default().clone()
    }

    /// The vectors of `texts` from an embedding endpoint (`/embeddings`), each of the
    /// definition's `dimensions`, or why a text has none: from the cache where it holds them,
    /// the others sent in requests of [`EMBED_BATCH`] texts, identical texts once.
    pub async fn embed(
        &self,
        call: &Call<'_>,
        texts: &[&str],
    ) -> Result<Vec<Result<Vec<f32>, String>>, LlmError> {
        let dim = self.endpoint.dimensions.unwrap_or(0);
        let cache = self.cache.as_ref().filter(|_| call.cache != Mode::Off);
        let key_of = |text: &str| {
            let request = json!({"model": self.endpoint.model, "input": text, "api": "embeddings"});
            cache::key(&self.endpoint.endpoint, &request)
        };
        let mut found: HashMap<&str, Result<Vec<f32>, String>> = HashMap::new();
        let mut missing: Vec<&str> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for &text in texts {
            if !seen.insert(text) {
                continue;
            }
            let cached = match cache {
                Some(cache) => cache.get(&key_of(text)).await,
                None => None,
            };
            match cached.and_then(|raw| serde_json::from_str::<Vec<f32>>(&raw).ok()) {
                Some(vector) if vector.len() == dim && vector.iter().all(|x| x.is_finite()) => {
                    self.count(call, &Usage::cache_hit());
                    found.insert(text, Ok(vector));
                }
                _ => missing.push(text),
            }
        }
        // A text another batch of the statement is asking for is waited for, not sent again.
        let mut waiting = Vec::new();
        let mut claims = Claims {
            model: self,
            keys: Vec::new(),
        };
        {
            let mut memo = self.vector_memo();
            missing.retain(|text| {
                let memo_key = format!("{}/{}", call.statement, key_of(text));
                match memo.cells.get(&memo_key) {
                    Some(sender) => {
                        waiting.push((*text, sender.subscribe()));
                        false
                    }
                    None => {
                        memo.cells
                            .insert(memo_key.clone(), tokio::sync::watch::channel(None).0);
                        claims.keys.push((text.to_string(), memo_key));
                        true
                    }
                }
            });
        }
        let claims = &claims;
        let batches = missing.chunks(EMBED_BATCH).map(|batch| async move {
            let body = json!({"model": self.endpoint.model, "input": batch});
            let chars: usize = batch.iter().map(|t| t.len()).sum();
            let count = |raw: &str| {
                let said = serde_json::from_str::<Value>(raw)
                    .ok()
                    .and_then(|v| v.get("usage")?.get("prompt_tokens")?.as_u64());
                (said.unwrap_or((chars / 4 + 1) as u64), 0)
            };
            let answered = self
                .request(call, "embeddings", &body, (chars / 4 + 1) as f64, &count)
                .await?;
            let vectors = answered.and_then(|raw| vectors_of(&raw, batch.len(), dim));
            claims.answer(batch, &vectors, dim);
            // Kept as each request is answered: a statement stopped by its budget keeps what
            // it paid for.
            if let (Some(cache), Ok(vectors)) = (cache.filter(|_| call.cache == Mode::On), &vectors)
            {
                for (text, vector) in batch.iter().zip(vectors) {
                    if let Ok(vector) = vector
                        && let Ok(json) = serde_json::to_string(vector)
                    {
                        cache.put_soon(&key_of(text), json, None);
                    }
                }
            }
            Ok::<_, LlmError>((batch, vectors))
        });
        for (batch, vectors) in futures::future::try_join_all(batches).await? {
            match vectors {
                Ok(vectors) => {
                    for (text, vector) in batch.iter().zip(vectors) {
                        found.insert(text, vector);
                    }
                }
                Err(why) => {
                    for text in batch {
                        found.insert(text, Err(why.clone()));
                    }
                }
            }
        }
        for (text, mut answer) in waiting {
            let vector = match answer.wait_for(Option::is_some).await {
                Ok(vector) => vector.clone().unwrap_or_else(|| Err("no answer".into())),
                Err(_) => Err("the request for this text was not completed".into()),
            };
            found.insert(text, vector);
        }
        spend::check(call.ledger, call.options)?;
        Ok(texts
            .iter()
            .map(|t| {
                found
                    .get(t)
                    .cloned()
                    .unwrap_or_else(|| Err("no answer".into()))
            })
            .collect())
    }

    /// `body` sent to `{endpoint}/{path}` until it is answered, past the model's requests at
    /// once and its pace (`reserve`: the tokens it may take), tried again as the failure says;
    /// the reply's body, its tokens (as `count` reads them) charged to the statement, or why
    /// there is none (the rows' error). `Err`: the statement stops (its budget, no key).
    async fn request(
        &self,
        call: &Call<'_>,
        path: &str,
        body: &Value,
        reserve: f64,
        count: &(dyn Fn(&str) -> (u64, u64) + Sync),
    ) -> Result<Result<String, String>, LlmError> {
        spend::check(call.ledger, call.options)?;
        let api_key = self.api_key()?;
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| LlmError::Call("the model's requests were closed".into()))?;
        let mut attempt: u32 = 0;
        loop {
            self.pace.take(reserve).await;
            spend::check(call.ledger, call.options)?;
            self.count(
                call,
                &Usage {
                    requests: 1,
                    ..Usage::default()
                },
            );
            let timeout = Duration::from_secs_f64(self.endpoint.timeout);
            let sent = self.send(path, body, api_key.as_deref());
            let in_flight = spend::sending(call.ledger);
            let verdict = match tokio::time::timeout(timeout, sent).await {
                Ok(verdict) => verdict,
                Err(_) => Verdict::Retry {
                    why: format!("no reply within {} s ('timeout')", self.endpoint.timeout),
                    after: None,
                    slow_down: false,
                },
            };
            drop(in_flight);
            match verdict {
                Verdict::Body(raw) => {
                    let (prompt, completion) = count(&raw);
                    let (prompt, completion) = (
                        prompt.min(MAX_TOKENS_A_REPLY),
                        completion.min(MAX_TOKENS_A_REPLY),
                    );
                    self.pace
                        .settle(reserve, prompt.saturating_add(completion) as f64);
                    let cost = (prompt as f64 * self.endpoint.input_price_per_million
                        + completion as f64 * self.endpoint.output_price_per_million)
                        / 1e6;
                    let done = Usage {
                        prompt_tokens: prompt,
                        completion_tokens: completion,
                        cost,
                        ..Usage::default()
                    };
                    self.count(call, &done);
                    return Ok(Ok(raw));
                }
                Verdict::Final(why) => return Ok(Err(scrub(why, api_key.as_deref()))),
                Verdict::Retry {
                    why,
                    after,
                    slow_down,
                } => {
                    if attempt >= self.endpoint.max_retries {
                        let tries = attempt + 1;
                        return Ok(Err(scrub(
                            format!(
                                "{why} (tried {tries} time{}; 'max_retries' is {})",
                                if tries == 1 { "" } else { "s" },
                                self.endpoint.max_retries
                            ),
                            api_key.as_deref(),
                        )));
                    }
                    attempt += 1;
                    self.count(
                        call,
                        &Usage {
                            retries: 1,
                            ..Usage::default()
                        },
                    );
                    // A server's Retry-After is honoured up to a minute a try.
                    let wait = backoff(attempt).max(after.unwrap_or_default().min(MAX_WAIT));
                    if slow_down {
                        // A rate limit is the model's, not the request's: every request of it
                        // waits.
                        self.pace.pause(wait);
                    }
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One try of `body` at `{endpoint}/{path}`.
    async fn send(&self, path: &str, body: &Value, api_key: Option<&str>) -> Verdict {
        let url = format!("{}/{path}", self.endpoint.endpoint);
        let mut request = self.http.post(&url).json(body);
        if let Some(key) = api_key {
            request = request.bearer_auth(key);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return transport(e),
        };
        let status = response.status();
        let headers = response.headers().clone();
        self.honour_rate_limits(&headers);
        let text = match read_capped(response).await {
            // A server that echoes the key gets it blanked before anything keeps or shows it.
            Ok(Some(text)) => scrub(text, api_key),
            Ok(None) => {
                return Verdict::Final(format!(
                    "the endpoint's reply ({status}) is larger than {} MiB",
                    MAX_REPLY >> 20
                ));
            }
            Err(e) => return transport(e),
        };
        if status.is_success() {
            return Verdict::Body(text);
        }
        let error = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").cloned());
        let said = error
            .as_ref()
            .and_then(|e| e.get("message").and_then(Value::as_str).or(e.as_str()))
            .map_or_else(|| excerpt(text.trim()), excerpt);
        let code = error
            .as_ref()
            .and_then(|e| e.get("code").or(e.get("type")))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let why = format!("the endpoint answered {status}: {said}");
        let retry_after = headers
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(header_duration);
        match status.as_u16() {
            429 if code == "insufficient_quota" => Verdict::Final(why),
            429 => Verdict::Retry {
                why,
                after: retry_after,
                slow_down: true,
            },
            408 | 409 | 425 | 500..=599 => Verdict::Retry {
                why,
                after: retry_after,
                slow_down: status.as_u16() == 503,
            },
            _ => Verdict::Final(why),
        }
    }

    /// A server that says its requests or tokens are used up until a reset holds every request
    /// of the model until then.
    fn honour_rate_limits(&self, headers: &reqwest::header::HeaderMap) {
        for kind in ["requests", "tokens"] {
            let get = |name: String| headers.get(name).and_then(|v| v.to_str().ok());
            let remaining = get(format!("x-ratelimit-remaining-{kind}"));
            if remaining.and_then(|r| r.trim().parse::<f64>().ok()) == Some(0.0)
                && let Some(reset) =
                    get(format!("x-ratelimit-reset-{kind}")).and_then(header_duration)
            {
                self.pace.pause(reset);
            }
        }
    }
}

/// The `count` vectors of `dim` values an embeddings reply holds, in the order of its inputs
/// (its `data[i].index`), or why it does not.
fn vectors_of(
    raw: &str,
    count: usize,
    dim: usize,
) -> Result<Vec<Result<Vec<f32>, String>>, String> {
    let not = |why: &str| format!("the endpoint's reply is not {why}: {}", excerpt(raw));
    let json: Value = serde_json::from_str(raw).map_err(|_| not("JSON"))?;
    let data = json
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| not("a list of embeddings"))?;
    let mut out: Vec<Result<Vec<f32>, String>> =
        vec![Err("the reply has no embedding for it".into()); count];
    for (i, item) in data.iter().enumerate() {
        let index = match item.get("index") {
            None => i,
            Some(index) => index
                .as_u64()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
                .ok_or_else(|| not("one embedding per input, each with its index"))?,
        };
        let Some(slot) = out.get_mut(index) else {
            return Err(not("one embedding per input"));
        };
        let values: Option<Vec<f32>> = item
            .get("embedding")
            .and_then(Value::as_array)
            .and_then(|v| v.iter().map(|x| x.as_f64().map(|x| x as f32)).collect());
        *slot = match values {
            Some(v) if v.iter().any(|x| !x.is_finite()) => Err(format!(
                "the endpoint's vector holds a value a float32 cannot hold: {}",
                excerpt(&item.to_string())
            )),
            Some(v) if v.len() == dim => Ok(v),
            Some(v) => Err(format!(
                "the endpoint's vector has {} values, and the model's 'dimensions' is {dim}",
                v.len()
            )),
            None => Err(not("a list of numbers")),
        };
    }
    Ok(out)
}

/// `text` without the key, should a server have echoed it: as it is, JSON-escaped (`\/`,
/// `\uXXXX`, any of its characters), URL-encoded (`%XX`), or in base64 (standard or URL-safe,
/// with or without padding).
pub fn scrub(text: String, api_key: Option<&str>) -> String {
    match api_key {
        Some(key) if !key.is_empty() => crate::llm::redact::redact(text, key),
        _ => text,
    }
}

/// The body of `response` as text, read up to [`MAX_REPLY`] bytes (`None` past that).
async fn read_capped(mut response: reqwest::Response) -> Result<Option<String>, reqwest::Error> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_REPLY as u64)
    {
        return Ok(None);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_REPLY {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(String::from_utf8_lossy(&body).into_owned()))
}

/// A request that did not reach the server or got no whole reply: tried again, except for one
/// that could not be built.
fn transport(e: reqwest::Error) -> Verdict {
    let why = format!("the request failed: {}", crate::message::with_causes(&e));
    if e.is_builder() {
        Verdict::Final(why)
    } else {
        Verdict::Retry {
            why,
            after: None,
            slow_down: false,
        }
    }
}

/// The wait before try `attempt` (1, 2, ...): half a second doubled each time up to 30 s, times
/// a random factor between 0.5 and 1 so that requests failed together do not come back
/// together.
fn backoff(attempt: u32) -> Duration {
    let base = (0.5 * 2f64.powi(attempt.saturating_sub(1).min(16) as i32)).min(30.0);
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let jitter = 0.5 + 0.5 * (random as f64 / u64::MAX as f64);
    Duration::from_secs_f64(base * jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embeddings_reply_is_read_by_its_indexes_or_refused() {
        let reply = |items: &str| format!(r#"{{"data": [{items}]}}"#);
        let two = reply(r#"{"index": 1, "embedding": [3, 4]}, {"index": 0, "embedding": [1, 2]}"#);
        let vectors = vectors_of(&two, 2, 2).unwrap();
        assert_eq!(vectors[0], Ok(vec![1.0, 2.0]));
        assert_eq!(vectors[1], Ok(vec![3.0, 4.0]));
        for index in ["2.0", "\"1\"", "-1", "1e30"] {
            let bad = reply(&format!(r#"{{"index": {index}, "embedding": [1, 2]}}"#));
            assert!(vectors_of(&bad, 2, 2).is_err(), "{index}");
        }
        let far = reply(r#"{"index": 7, "embedding": [1, 2]}"#);
        assert!(vectors_of(&far, 2, 2).is_err());
        let huge = reply(r#"{"index": 0, "embedding": [1e39, 2]}"#);
        let vectors = vectors_of(&huge, 1, 2).unwrap();
        assert!(
            vectors[0].as_ref().unwrap_err().contains("float32"),
            "{vectors:?}"
        );
        let short = reply(r#"{"index": 0, "embedding": [1]}"#);
        let vectors = vectors_of(&short, 1, 2).unwrap();
        assert!(
            vectors[0]
                .as_ref()
                .unwrap_err()
                .contains("'dimensions' is 2")
        );
    }
}
