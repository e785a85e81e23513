//! Batch mode (`OPTIONS ('batch' 'on')`, or `SET batchinfer.llm_batch = 'on'`): a chat model's
//! requests go to the provider's Batch API (OpenAI's `/v1/files` and `/v1/batches`, which vLLM
//! and other providers share) instead of one call each, at the provider's batch price.
//!
//! The requests a statement's rows ask at once (those not answered by the cache) are gathered
//! for [`WINDOW`] and submitted as one batch (at most [`MAX_LINES`] requests, each line's
//! `custom_id` its cache key). Before the batch is made, its record is written to the warehouse
//! ([`kept`]), and the batch's `metadata` names the record: a process killed at any point leaves
//! a record that the next process using the model's batch mode goes on with (finding the batch
//! by its metadata where the record has no batch yet), so that nothing is submitted twice. When a
//! batch ends, its answers go into the cache — only those whose `custom_id` is the key of the
//! request the batch's input file holds for it — and its record is removed; the rows waiting for
//! them are answered. A request that failed at the server or was not run before the batch expired
//! is submitted again in a later batch, alone (up to [`SUBMISSIONS`] times); one the server
//! refused (a 4xx) is the row's error.
//!
//! A statement waits for its batches for at most `batchinfer.llm_batch_wait` (unset: until they
//! end): past it, it stops and writes nothing, and its batches go on at the provider; the
//! statement run again (a view's refresh among them) takes their answers from the cache or from
//! the batches, submitting none of them again.

pub mod api;
pub mod kept;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::cache::Cache;
use api::{Failure, Provider};
use kept::{Record, Records};

/// How long the requests arriving at once are gathered before their batch is submitted: until
/// none came for this long.
pub const WINDOW: Duration = Duration::from_millis(300);

/// The most requests one batch holds.
pub const MAX_LINES: usize = 10_000;

/// The most times a request is submitted (the first included) before its failure is the row's.
pub const SUBMISSIONS: u32 = 3;

/// The longest wait between two reads of a batch's state.
const MAX_POLL: Duration = Duration::from_secs(30);

/// Where a request submitted in a batch is.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Waiting to be submitted.
    Queued,
    /// In the batch (the provider's id, or the record's while it is made).
    Submitted(String),
    /// Answered.
    Done(Answer),
}

/// What a batch came to for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The reply's body (a chat completion), kept in the cache.
    Reply(String),
    /// Failed at the server, or expired: worth submitting again.
    Again(String),
    /// Refused: the row's error.
    Failed(String),
    /// Not to be had now, though it may be paid for (its batch cannot be read, or was not
    /// submitted): the statement stops, writing nothing.
    Stop(String),
}

/// A model's batches in this process: the requests waiting to be submitted, and those
/// submitted, by cache key.
#[derive(Debug, Default)]
pub struct Batches {
    shared: Arc<Mutex<Shared>>,
    /// The statement that last went through the warehouse's records: each statement does
    /// once, so that a long-lived process sees the batches other processes recorded since.
    resumed_for: tokio::sync::Mutex<String>,
}

#[derive(Debug, Default)]
struct Shared {
    queue: Vec<(String, Value)>,
    collecting: bool,
    waiting: HashMap<String, watch::Sender<Progress>>,
    /// Requests whose recorded batch cannot be read now (its state, its files): never
    /// submitted again by this process until a statement finds the record readable.
    stuck: HashMap<String, String>,
    /// The records this process follows, or has finished.
    followed: HashSet<String>,
    /// Answers a batch brought that no row of this process was waiting for: charged to the
    /// statement of this process that takes them.
    uncharged: HashSet<String>,
}

/// What a model's batches are made with: its endpoint, the warehouse's records and cache.
#[derive(Clone)]
pub struct Place {
    pub provider: Provider,
    pub records: Records,
    pub cache: Cache,
    /// The endpoint's URL as cache keys name it.
    pub endpoint: String,
}

/// How long a statement going through the records waits for a batch's state before it leaves
/// the batch to a task of its own.
const LOOK: Duration = Duration::from_secs(10);

/// A record without a batch whose batch may be being made is looked for this long before it
/// is given up (its requests submitted again).
const MAKING: u64 = 3600;

/// A record whose file may still be uploading (its batch not asked for yet) is left this long
/// to the process writing it.
const UPLOADING: u64 = 900;

/// The most answers kept as not charged yet, in this process.
const MOST_UNCHARGED: usize = 1 << 20;

/// Polls of a batch answered with a final error before this process leaves it (its record
/// kept, for the next statement).
const FINAL_POLLS: u32 = 20;

impl Batches {
    /// Goes through the warehouse's records once for the statement `statement`: the batches
    /// other processes (or this one, killed) recorded are followed, and those that ended have
    /// their answers in the cache when it returns. The replies it took that nobody was waiting
    /// for: the statement's to pay.
    pub async fn resume(
        &self,
        place: &Place,
        statement: &str,
    ) -> Result<Vec<(String, String)>, String> {
        let mut last = self.resumed_for.lock().await;
        if *last == statement {
            return Ok(Vec::new());
        }
        // Records that cannot be read now: nothing is submitted until they can.
        let records = place.records.all().await?;
        *last = statement.to_string();
        let fresh: Vec<Record> = {
            let mut s = self.shared.lock();
            let mut fresh = Vec::new();
            for record in records {
                if !s.followed.insert(record.record.clone()) {
                    continue;
                }
                let at = record
                    .batch
                    .clone()
                    .unwrap_or_else(|| record.record.clone());
                for key in &record.keys {
                    s.stuck.remove(key);
                    s.waiting
                        .entry(key.clone())
                        .or_insert_with(|| watch::channel(Progress::Submitted(at.clone())).0);
                }
                fresh.push(record);
            }
            fresh
        };
        // Each on a task of its own, which ends whatever becomes of the statement: the keys
        // it put as waiting are always answered.
        let tasks: Vec<_> = fresh
            .into_iter()
            .map(|record| tokio::spawn(resume_one(place.clone(), self.shared.clone(), record)))
            .collect();
        let mut taken = Vec::new();
        for task in tasks {
            for (key, raw) in task.await.unwrap_or_default() {
                if self.take_uncharged(&key) {
                    taken.push((key, raw));
                }
            }
        }
        Ok(taken)
    }

    /// Whether the cache's answer to `key` came from a batch no statement has been charged for
    /// (and now one is).
    pub fn take_uncharged(&self, key: &str) -> bool {
        self.shared.lock().uncharged.remove(key)
    }

    /// Where the request `key` (`body`) is: submitted in a batch with those asked at once, or
    /// in a batch already (this process's, or one a record names).
    pub fn progress(&self, place: &Place, key: &str, body: &Value) -> watch::Receiver<Progress> {
        let mut shared = self.shared.lock();
        if let Some(why) = shared.stuck.get(key) {
            return watch::channel(Progress::Done(Answer::Stop(why.clone()))).1;
        }
        if let Some(sender) = shared.waiting.get(key) {
            return sender.subscribe();
        }
        let (sender, receiver) = watch::channel(Progress::Queued);
        shared.waiting.insert(key.to_string(), sender);
        shared.queue.push((key.to_string(), body.clone()));
        if !shared.collecting {
            shared.collecting = true;
            let (place, shared) = (place.clone(), self.shared.clone());
            // Waited for before the process ends: a submission is never left half made.
            super::cache::pending(tokio::spawn(collect(place, shared)));
        }
        receiver
    }
}

/// The requests queued during [`WINDOW`], submitted as batches of at most [`MAX_LINES`].
async fn collect(place: Place, shared: Arc<Mutex<Shared>>) {
    let mut seen = 0;
    loop {
        tokio::time::sleep(WINDOW).await;
        let queued = shared.lock().queue.len();
        if queued == seen || queued >= MAX_LINES {
            break;
        }
        seen = queued;
    }
    loop {
        let lines: Vec<(String, Value)> = {
            let mut s = shared.lock();
            // Requests whose statement stopped before they were submitted are not.
            let s = &mut *s;
            let waiting = &mut s.waiting;
            s.queue.retain(|(key, _)| {
                let wanted = waiting.get(key).is_some_and(|w| w.receiver_count() > 0);
                if !wanted {
                    waiting.remove(key);
                }
                wanted
            });
            let n = s.queue.len().min(MAX_LINES);
            if n == 0 {
                s.collecting = false;
                return;
            }
            s.queue.drain(..n).collect()
        };
        submit(&place, &shared, lines).await;
    }
}

/// Gives `answer` to the rows waiting for `key`; whether any was.
fn settle(shared: &Mutex<Shared>, key: &str, answer: Answer) -> bool {
    let mut s = shared.lock();
    match s.waiting.remove(key) {
        Some(sender) => {
            let waited = sender.receiver_count() > 0;
            sender.send_replace(Progress::Done(answer));
            waited
        }
        None => false,
    }
}

/// The requests of `record`, whose batch cannot be read now (`why`): the statements waiting
/// for them stop, and this process submits none of them again; the record is kept, and the
/// next statement reads it again.
fn stick(shared: &Mutex<Shared>, record: &Record, why: &str) {
    let why = format!(
        "{why}; its record (llm-batches/) is kept, and the next statement reads it again: \
         nothing is submitted twice"
    );
    for key in &record.keys {
        settle(shared, key, Answer::Stop(why.clone()));
    }
    let mut s = shared.lock();
    for key in &record.keys {
        s.stuck.insert(key.clone(), why.clone());
    }
    s.followed.remove(&record.record);
}

fn mark(shared: &Mutex<Shared>, keys: &[String], batch: &str) {
    let s = shared.lock();
    for key in keys {
        if let Some(sender) = s.waiting.get(key) {
            sender.send_replace(Progress::Submitted(batch.to_string()));
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Submits `lines` as one batch: its record kept first, its file uploaded, the record saying
/// the batch is being made, the batch made (or found, where the request making it failed), the
/// record naming it; then followed to its end on a task of its own.
async fn submit(place: &Place, shared: &Arc<Mutex<Shared>>, lines: Vec<(String, Value)>) {
    let keys: Vec<String> = lines.iter().map(|(k, _)| k.clone()).collect();
    let fail = |why: String| {
        for key in &keys {
            settle(shared, key, Answer::Stop(why.clone()));
        }
    };
    let mut record = Record {
        record: uuid::Uuid::new_v4().simple().to_string(),
        keys: keys.clone(),
        batch: None,
        creating: false,
        created: now(),
    };
    shared.lock().followed.insert(record.record.clone());
    if !place.records.write(&record).await {
        return fail(
            "the warehouse did not keep the record of a batch (llm-batches/): nothing was \
             submitted"
                .into(),
        );
    }
    let mut jsonl = Vec::new();
    for (key, body) in &lines {
        let line = json!({"custom_id": key, "method": "POST", "url": "/v1/chat/completions", "body": body});
        jsonl.extend_from_slice(line.to_string().as_bytes());
        jsonl.push(b'\n');
    }
    drop(lines);
    let file = match place.provider.upload(&jsonl).await {
        Ok(file) => file,
        Err(e) => {
            place.records.remove(&record.record).await;
            return fail(format!("the batch's file was not uploaded: {}", e.why()));
        }
    };
    // From here on the batch may exist: the record says so before it is asked for.
    record.creating = true;
    if !place.records.write(&record).await {
        place.records.remove(&record.record).await;
        return fail(
            "the warehouse did not keep the record of a batch (llm-batches/): nothing was \
             submitted"
                .into(),
        );
    }
    let mut made: Result<String, Failure> = Err(Failure::Again("no try".into()));
    for attempt in 0..6u32 {
        made = place.provider.create(&file, &record.record).await;
        let Err(Failure::Again(_)) = &made else {
            break;
        };
        // The batch may have been made though its reply was lost: made again only where the
        // provider says it has none of this record.
        tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
        match place.provider.find(&record.record).await {
            Ok(Some(batch)) => {
                made = Ok(batch);
                break;
            }
            Ok(None) => {}
            Err(e) => {
                return stick(
                    shared,
                    &record,
                    &format!(
                        "the batch may have been made though the endpoint's reply was lost, and \
                         its batches cannot be listed to find it ({})",
                        e.why()
                    ),
                );
            }
        }
    }
    let batch = match made {
        Ok(batch) => batch,
        Err(Failure::Final(why)) => {
            place.records.remove(&record.record).await;
            return fail(format!("the batch was not made: {why}"));
        }
        Err(Failure::Again(why)) => {
            return stick(
                shared,
                &record,
                &format!("the batch was not made, or its reply was lost: {why}"),
            );
        }
    };
    record.batch = Some(batch.clone());
    // A record that keeps no batch is found again by its metadata.
    let _ = place.records.write(&record).await;
    mark(shared, &keys, &batch);
    let (place, shared) = (place.clone(), shared.clone());
    tokio::spawn(async move {
        follow(&place, &shared, record).await;
    });
}

/// A record found in the warehouse: its batch followed (taken now where it has ended); one
/// without a batch found by its metadata, or given up where none can have been made.
async fn resume_one(
    place: Place,
    shared: Arc<Mutex<Shared>>,
    mut record: Record,
) -> Vec<(String, String)> {
    let (place, shared) = (&place, &shared);
    if record.batch.is_none() {
        let found = match tokio::time::timeout(LOOK, place.provider.find(&record.record)).await {
            Ok(found) => found,
            Err(_) => Err(Failure::Again("no reply".into())),
        };
        match found {
            Ok(Some(batch)) => {
                record.batch = Some(batch.clone());
                let _ = place.records.write(&record).await;
                mark(shared, &record.keys, &batch);
            }
            // No batch was asked for (its process was killed while it uploaded), or none was
            // made in an hour: its requests are submitted again.
            Ok(None)
                if now() > record.created + if record.creating { MAKING } else { UPLOADING } =>
            {
                place.records.remove(&record.record).await;
                for key in &record.keys {
                    settle(
                        shared,
                        key,
                        Answer::Again("its batch was never made".into()),
                    );
                }
                return Vec::new();
            }
            Ok(None) => {
                stick(
                    shared,
                    &record,
                    "its batch is being made by another process, or was by one that stopped \
                     (left 15 minutes to its upload and an hour to its making, after which its \
                     requests are submitted again)",
                );
                return Vec::new();
            }
            Err(e) => {
                stick(
                    shared,
                    &record,
                    &format!("its batch cannot be looked for now ({})", e.why()),
                );
                return Vec::new();
            }
        }
    }
    let Some(batch) = record.batch.clone() else {
        return Vec::new();
    };
    // A batch that has ended is taken now, before any row asks.
    if let Ok(Ok(state)) = tokio::time::timeout(LOOK, place.provider.state(&batch)).await
        && state.is_over()
    {
        let keys = record.clone();
        return match tokio::time::timeout(6 * LOOK, finish(place, shared, record, &batch, &state))
            .await
        {
            Ok(taken) => taken,
            Err(_) => {
                stick(
                    shared,
                    &keys,
                    &format!("the answers of its batch {batch} were not read within a minute"),
                );
                Vec::new()
            }
        };
    }
    let (place, shared) = (place.clone(), shared.clone());
    tokio::spawn(async move {
        follow(&place, &shared, record).await;
    });
    Vec::new()
}

/// The batch of `record` read until it ends, its answers put in the cache and given to the rows
/// waiting for them, and its record removed; the replies nobody was waiting for, by key.
/// A provider that cannot be reached is asked again until it can; one that keeps refusing to
/// say (a 4xx, a reply that is not a batch) is left after [`FINAL_POLLS`] tries, the record
/// kept.
async fn follow(place: &Place, shared: &Mutex<Shared>, record: Record) -> Vec<(String, String)> {
    let Some(batch) = record.batch.clone() else {
        return Vec::new();
    };
    let mut wait = Duration::from_millis(500);
    let mut refused = 0;
    let state = loop {
        match place.provider.state(&batch).await {
            Ok(state) if state.is_over() => break state,
            Ok(_) | Err(Failure::Again(_)) => refused = 0,
            Err(Failure::Final(why)) => {
                refused += 1;
                if refused >= FINAL_POLLS {
                    stick(
                        shared,
                        &record,
                        &format!("the state of its batch {batch} cannot be read: {why}"),
                    );
                    return Vec::new();
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 3 / 2).min(MAX_POLL);
    };
    finish(place, shared, record, &batch, &state).await
}

/// The answers of the ended batch of `record` put in the cache and given to the rows waiting
/// for them, its record removed; the replies nobody was waiting for, by key. Where its files
/// cannot be read, nothing is taken and the record is kept.
async fn finish(
    place: &Place,
    shared: &Mutex<Shared>,
    record: Record,
    batch: &str,
    state: &api::State,
) -> Vec<(String, String)> {
    let answers = match results(place, &record, batch, state).await {
        Ok(answers) => answers,
        Err(why) => {
            stick(
                shared,
                &record,
                &format!("the answers of its batch {batch} cannot be read: {why}"),
            );
            return Vec::new();
        }
    };
    let mut unwaited = Vec::new();
    for key in &record.keys {
        let answer = answers.get(key).cloned().unwrap_or_else(|| {
            Answer::Again(format!(
                "the batch {batch} ended '{}' without an answer to it",
                state.status
            ))
        });
        if let Answer::Reply(raw) = &answer {
            // What the statement cannot wait for is kept for the next.
            if let Err(e) = place.cache.put(key, raw).await {
                crate::say!("warning: {e}");
            }
        }
        let reply = match &answer {
            Answer::Reply(raw) => Some(raw.clone()),
            _ => None,
        };
        if !settle(shared, key, answer)
            && let Some(raw) = reply
        {
            let mut s = shared.lock();
            if s.uncharged.len() < MOST_UNCHARGED {
                s.uncharged.insert(key.clone());
            }
            drop(s);
            unwaited.push((key.clone(), raw));
        }
    }
    place.records.remove(&record.record).await;
    unwaited
}

/// The answers of an ended batch, by key: each output line whose `custom_id` is one of the
/// record's keys and the key of the request the batch's input file holds for it.
async fn results(
    place: &Place,
    record: &Record,
    batch: &str,
    state: &api::State,
) -> Result<HashMap<String, Answer>, String> {
    let mut answers = HashMap::new();
    let Some(input) = &state.input_file_id else {
        return Err("the batch names no input file".into());
    };
    let input = place
        .provider
        .content(input)
        .await
        .map_err(|e| format!("its input file: {}", e.why()))?;
    let wanted: std::collections::HashSet<&str> = record.keys.iter().map(String::as_str).collect();
    let mut asked = std::collections::HashSet::new();
    for line in input.split(|b| *b == b'\n') {
        let Ok(line) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if let Some(id) = line["custom_id"].as_str()
            && wanted.contains(id)
            && super::cache::key(&place.endpoint, &line["body"]) == id
        {
            asked.insert(id.to_string());
        }
    }
    let api_key = place.provider.api_key.as_deref();
    for file in [&state.output_file_id, &state.error_file_id]
        .into_iter()
        .flatten()
    {
        let content = place
            .provider
            .content(file)
            .await
            .map_err(|e| format!("its file {file}: {}", e.why()))?;
        for line in content.split(|b| *b == b'\n') {
            let Ok(line) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let Some(id) = line["custom_id"].as_str().filter(|id| asked.contains(*id)) else {
                continue;
            };
            let status = line["response"]["status_code"].as_u64();
            let answer = if status == Some(200) {
                let raw = crate::llm::client::scrub(line["response"]["body"].to_string(), api_key);
                match crate::llm::client::Reply::parse(raw.clone()) {
                    Ok(_) => Answer::Reply(raw),
                    Err(why) => Answer::Failed(why.to_string()),
                }
            } else {
                let error = if line["error"].is_object() {
                    &line["error"]
                } else {
                    &line["response"]["body"]["error"]
                };
                let said = error["message"]
                    .as_str()
                    .or(error["code"].as_str())
                    .unwrap_or("no reason given");
                let why = crate::llm::client::scrub(
                    format!(
                        "the batch {batch} answered {}: {}",
                        status.map_or("no reply".to_string(), |s| s.to_string()),
                        crate::llm::output::excerpt(said)
                    ),
                    api_key,
                );
                match status {
                    Some(400..=407) | Some(410..=424) | Some(426..=428) | Some(430..=499) => {
                        Answer::Failed(why)
                    }
                    _ => Answer::Again(why),
                }
            };
            answers.insert(id.to_string(), answer);
        }
    }
    Ok(answers)
}
