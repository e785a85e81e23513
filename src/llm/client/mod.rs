//! One endpoint model at run time: its HTTP client (rustls, the system's roots), the requests
//! at once (`max_concurrency`, one semaphore shared by every partition and statement of the
//! process), its pace, retries, the cache, identical requests of a statement sent once, and the
//! counts of what it did.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{OnceCell, Semaphore};

use super::cache::{self, Cache, Mode};
use super::calibration::{self, Calibration};
use super::output::excerpt;
use super::pace::{Pace, header_duration};
use super::{Endpoint, LlmError, spend};
use crate::config::BatchInferOptions;

mod batched;
mod embeddings;
mod http;
mod reply;

use reply::{MAX_TOKENS_A_REPLY, read_capped};
pub use reply::{Outcome, Reply, Unanswered, scrub};

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
    /// Rows a cascade's proxy answered, sending nothing ([`crate::llm::cascade`]).
    pub proxy_answered: u64,
    /// Rows of cascades' samples (sent to set the thresholds), of them those the proxy was
    /// sure of by the thresholds set, and of those the ones where it agreed with the model.
    pub sample: u64,
    pub sample_sure: u64,
    pub sample_agreed: u64,
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
            proxy_answered: self.proxy_answered.saturating_sub(before.proxy_answered),
            sample: self.sample.saturating_sub(before.sample),
            sample_sure: self.sample_sure.saturating_sub(before.sample_sure),
            sample_agreed: self.sample_agreed.saturating_sub(before.sample_agreed),
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
        self.proxy_answered = self.proxy_answered.saturating_add(other.proxy_answered);
        self.sample = self.sample.saturating_add(other.sample);
        self.sample_sure = self.sample_sure.saturating_add(other.sample_sure);
        self.sample_agreed = self.sample_agreed.saturating_add(other.sample_agreed);
    }

    pub fn is_empty(&self) -> bool {
        self.requests == 0 && self.cache_hits == 0 && self.proxy_answered == 0
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
    proxy_answered: AtomicU64,
    sample: AtomicU64,
    sample_sure: AtomicU64,
    sample_agreed: AtomicU64,
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
pub(crate) const EMBED_BATCH: usize = 64;

/// The longest wait before a try again, whatever a server's Retry-After says.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// The largest reply body read: a server sending more is the row's error.
const MAX_REPLY: usize = 32 << 20;

/// The largest tokenizer.json read.
const MAX_TOKENIZER: u64 = 64 << 20;

/// The tokenizer.json at `path`, the 'tokenizer' of the model `name`.
fn read_tokenizer(name: &str, path: &str) -> Result<tokenizers::Tokenizer, LlmError> {
    let problem = |why: String| LlmError::Definition {
        model: name.to_string(),
        problem: format!("its 'tokenizer' {path} cannot be used: {why}"),
    };
    let bytes = crate::storage::read_capped(std::path::Path::new(path), MAX_TOKENIZER)
        .map_err(|e| problem(e.to_string()))?;
    tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| problem(format!("not a Hugging Face tokenizer.json ({e})")))
}

/// The prompt tokens of the chat request `body` before it is answered: a token per four
/// characters of its messages (as JSON), what pacing and budgets reserve and estimates count.
pub fn estimated_prompt_tokens(body: &Value) -> u64 {
    let chars: usize = body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().map(|m| m.to_string().len()).sum());
    (chars / 4) as u64
}

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
    /// Whether it runs on a cluster's executor (batch mode is refused there).
    pub on_cluster: bool,
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
            on_cluster: statement.executors > 0,
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
    /// What the server counted of this process's prompts against their estimates
    /// ([`crate::llm::calibration`]), and whether it is being kept.
    calibration: Arc<Mutex<Calibrating>>,
    /// The calibration the warehouse kept, read on first use.
    kept_calibration: Arc<OnceCell<Calibration>>,
    /// Its requests in the provider's batches ([`crate::llm::batch`]).
    batches: crate::llm::batch::Batches,
    /// The tokenizer its definition declares, read when it was made.
    tokenizer: Option<Arc<tokenizers::Tokenizer>>,
}

/// A model's calibration in this process: its pairs, those written, whether a write is under
/// way, and whether pairs came since that write took them.
#[derive(Debug, Default)]
struct Calibrating {
    pairs: Calibration,
    /// The pairs the warehouse's file has been given.
    written: Calibration,
    writing: bool,
    again: bool,
}

/// Why a request brought no answer to share: the row's error, or the statement's stop.
enum Unshared {
    Row(Unanswered),
    Stop(LlmError),
}

/// An embedding as a statement's batches share it: `None` while it is asked for.
type Shared = tokio::sync::watch::Sender<Option<Result<Vec<f32>, Unanswered>>>;

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
        vectors: &Result<Vec<Result<Vec<f32>, Unanswered>>, Unanswered>,
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
                sender.send_replace(Some(Err(Unanswered::NotCompleted)));
            }
        }
    }
}

impl EndpointModel {
    /// The model `name` of `endpoint`, keeping answers in `cache` (a warehouse's).
    pub fn new(name: &str, endpoint: Endpoint, cache: Option<Cache>) -> Result<Self, LlmError> {
        let tokenizer = match &endpoint.tokenizer {
            Some(path) => Some(Arc::new(read_tokenizer(name, path)?)),
            None => None,
        };
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
            calibration: Arc::default(),
            kept_calibration: Arc::default(),
            batches: Default::default(),
            tokenizer,
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
            proxy_answered: get(&c.proxy_answered),
            sample: get(&c.sample),
            sample_sure: get(&c.sample_sure),
            sample_agreed: get(&c.sample_agreed),
        }
    }

    /// Counts `done` as this model's, and the statement's of `call` ([`spend`]).
    pub(crate) fn count(&self, call: &Call<'_>, done: &Usage) {
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
        c.proxy_answered
            .fetch_add(done.proxy_answered, Ordering::Relaxed);
        c.sample.fetch_add(done.sample, Ordering::Relaxed);
        c.sample_sure.fetch_add(done.sample_sure, Ordering::Relaxed);
        c.sample_agreed
            .fetch_add(done.sample_agreed, Ordering::Relaxed);
        spend::count(call.ledger, call.part, &self.name, done);
    }

    /// Where the warehouse keeps this model's calibration, if it has a cache: apart for the
    /// counts of a declared tokenizer, which are another estimate.
    fn calibration_kept(&self) -> Option<calibration::Kept> {
        let model = match &self.tokenizer {
            Some(_) => format!("{}\u{0}tokenizer", self.endpoint.model),
            None => self.endpoint.model.clone(),
        };
        self.cache
            .as_ref()
            .map(|c| c.calibration(&self.endpoint.endpoint, &model))
    }

    /// Whether its prompts are counted by its own tokenizer.
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    /// The prompt tokens of the chat request `body` before it is answered: its messages'
    /// tokens by the tokenizer the definition declares (the chat template's are left to the
    /// calibration), else a token per four characters of its messages as JSON
    /// ([`estimated_prompt_tokens`]).
    pub fn prompt_estimate(&self, body: &Value) -> u64 {
        let Some(tokenizer) = &self.tokenizer else {
            return estimated_prompt_tokens(body);
        };
        let messages = body["messages"]
            .as_array()
            .map_or(&[][..], |m| m.as_slice());
        messages
            .iter()
            .map(|m| {
                let text = m["content"].as_str().unwrap_or_default();
                tokenizer
                    .encode(text, false)
                    .map_or(text.len() as u64 / 4, |e| e.len() as u64)
            })
            .sum()
    }

    /// The calibration kept, read once.
    async fn kept_calibration(&self) -> Calibration {
        let kept = self.calibration_kept();
        *self
            .kept_calibration
            .get_or_init(|| async move {
                match kept {
                    Some(kept) => kept.read().await,
                    None => Calibration::default(),
                }
            })
            .await
    }

    /// Adds a prompt estimated at `estimated` tokens that the server counted as `reported`,
    /// and keeps the whole calibration in the warehouse: one write at a time, the last one
    /// with every pair ([`cache::flush`] waits for it).
    fn calibrate(&self, call: &Call<'_>, estimated: u64, reported: u64) {
        if reported == 0 {
            return;
        }
        let mut state = self.calibration.lock();
        state.pairs.add(estimated, reported);
        // Kept only where the statement writes the cache.
        let Some(kept) = self.calibration_kept().filter(|_| call.cache == Mode::On) else {
            return;
        };
        if state.writing {
            state.again = true;
            return;
        }
        state.writing = true;
        let (state, cell) = (self.calibration.clone(), self.kept_calibration.clone());
        cache::pending(tokio::spawn(async move {
            let _ = cell.get_or_init(|| kept.read()).await;
            loop {
                let (pairs, written) = {
                    let mut s = state.lock();
                    s.again = false;
                    (s.pairs, s.written)
                };
                // What the file holds now (another process's pairs too), and ours since.
                let now = kept.read().await;
                let wrote = kept.write(&now.merged(&pairs.since(&written))).await;
                let mut s = state.lock();
                if wrote {
                    s.written = pairs;
                }
                if !s.again {
                    s.writing = false;
                    break;
                }
            }
        }));
    }

    /// The tokens a prompt estimated at `estimated` is likely to count, by the calibration, and
    /// the requests the calibration has seen (0: none, the estimate itself).
    pub async fn calibrated_prompt_tokens(&self, estimated: u64) -> (u64, u64) {
        let all = self
            .kept_calibration()
            .await
            .merged(&self.calibration.lock().pairs);
        match all.tokens(estimated) {
            Some(tokens) => (tokens, all.n),
            None => (estimated, 0),
        }
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

    /// The cache's key of the chat request `body`.
    pub fn cache_key(&self, body: &Value) -> String {
        cache::key(&self.endpoint.endpoint, body)
    }

    /// The cache's key of the embedding of `text`.
    pub fn embedding_key(&self, text: &str) -> String {
        let request = json!({"model": self.endpoint.model, "input": text, "api": "embeddings"});
        cache::key(&self.endpoint.endpoint, &request)
    }

    /// The answer the cache (as `call` reads it) holds to the chat request `body`, if any.
    pub async fn cached_reply(&self, call: &Call<'_>, body: &Value) -> Option<Arc<Reply>> {
        let cache = self.cache.as_ref().filter(|_| call.cache != Mode::Off)?;
        // Without its secret the cache holds nothing: none is made for a question.
        if !cache.has_secret().await {
            return None;
        }
        let raw = cache.get(&self.cache_key(body)).await?;
        let api_key = self.api_key().ok().flatten();
        Reply::parse(raw)
            .ok()
            .map(|r| Arc::new(r.scrubbed(api_key.as_deref())))
    }

    /// Whether the cache (as `call` reads it) holds an answer to the request `key`.
    pub async fn is_answered(&self, call: &Call<'_>, key: &str) -> bool {
        match self.cache.as_ref().filter(|_| call.cache != Mode::Off) {
            // Without its secret the cache holds nothing: none is made for a question.
            Some(cache) => cache.has_secret().await && cache.get(key).await.is_some(),
            None => false,
        }
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
        let batch = self.batch_mode(call)?;
        if let Some(cache) = cache
            && let Some(raw) = cache.get(key).await
            && let Ok(reply) = Reply::parse(raw.clone())
        {
            // An answer a batch brought that no statement paid for yet is this one's.
            if batch && self.batches.take_uncharged(key) {
                self.charge_batched(call, Some(body), &raw);
            } else {
                self.count(call, &Usage::cache_hit());
            }
            return Ok(Ok(Arc::new(reply.scrubbed(api_key.as_deref()))));
        }
        let prompt = self.prompt_estimate(body);
        let reserve = (prompt + u64::from(self.endpoint.max_tokens)) as f64;
        let prompt_estimate = prompt + 1;
        // A server that says nothing of its tokens is charged an estimate, so budgets hold.
        let count = |raw: &str| match Reply::parse(raw.to_string()) {
            Ok(reply) if !reply.estimated => {
                self.calibrate(call, prompt, reply.prompt_tokens);
                (reply.prompt_tokens, reply.completion_tokens)
            }
            Ok(reply) => (prompt_estimate, reply.completion_tokens),
            Err(_) => (prompt_estimate, raw.len() as u64 / 4),
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
                Some(cache) => match self.claimed(call, cache, key, batch).await {
                    Err(e) => return Err(Unshared::Stop(e)),
                    Ok(cache::Claim::Answered(raw)) => return Ok(raw),
                    Ok(cache::Claim::Mine(claim)) => Some(claim),
                    Ok(cache::Claim::Unclaimed) => None,
                },
                None => None,
            };
            paid.store(true, std::sync::atomic::Ordering::Relaxed);
            let sent = if batch {
                self.batched(call, key, body).await
            } else {
                self.request(call, "chat/completions", body, reserve, &count)
                    .await
            };
            let raw = match sent {
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
}
