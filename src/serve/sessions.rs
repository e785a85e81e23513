//! Client sessions: each an engine session of its own (its `SET` options, the tables it
//! registers, the statement at hand) over the models the server loaded once, named by a session
//! token the client got when it was let in ([`super::auth`]). A session keeps the results its
//! statements made until they are read, and its prepared statements until they are closed; it
//! ends when idle longer than `--idle-timeout`, or, past [`super::MAX_SESSIONS`], when it is the
//! one idle longest.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::dataframe::DataFrame;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tonic::Status;

use super::MAX_SESSIONS;
use super::auth::{Credentials, Shown};
use super::throttle::Throttle;
use crate::engine::Engine;
use crate::statements::Statement;

/// The results a session keeps unread; a newer one ends the oldest.
const MAX_RESULTS: usize = 64;

/// The prepared statements a session keeps open.
const MAX_PREPARED: usize = 1024;

/// What a session's prepared statements may hold, their SQL and bound parameters together.
const MAX_PREPARED_BYTES: usize = 64 << 20;

/// The sessions of the server.
pub struct Sessions {
    root: Arc<Engine>,
    /// By the SHA-256 of their token (a lookup reveals nothing of a token by its timing).
    by_token: Mutex<HashMap<[u8; 32], Arc<ClientSession>>>,
    numbers: AtomicU64,
    idle: Duration,
    /// Failed logins slowed, per peer address.
    throttle: Throttle,
}

/// A client's session.
pub struct ClientSession {
    /// Its number, in what the server says.
    pub number: u64,
    root: Arc<Engine>,
    engine: tokio::sync::OnceCell<Engine>,
    /// Held by the statement of the session that runs (planned, or run to its end): one at a
    /// time, as the engine's statement at hand is the session's.
    pub turn: tokio::sync::Mutex<()>,
    results: Mutex<BTreeMap<u64, Pending>>,
    prepared: Mutex<BTreeMap<u64, Prepared>>,
    last_used: Mutex<Instant>,
    /// The calls it was let in for.
    calls: AtomicU64,
}

/// A statement's result, made by `GetFlightInfo` and read by `DoGet`.
pub enum Pending {
    /// A query, planned: it runs as it is read.
    Query {
        df: DataFrame,
        /// When it must have ended (`--statement-timeout`).
        deadline: Option<Instant>,
        /// The statement it is: what its models fail on is told when its rows are all read.
        statement: Box<crate::statement_context::StatementContext>,
    },
    /// What a statement that already ran returned.
    Done {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        /// Its batches' memory, counted against the server's `--memory-limit` until they are
        /// sent.
        held: Option<datafusion::execution::memory_pool::MemoryReservation>,
    },
}

impl Pending {
    /// The columns of the result.
    pub fn schema(&self) -> SchemaRef {
        match self {
            Pending::Query { df, .. } => df.schema().inner().clone(),
            Pending::Done { schema, .. } => schema.clone(),
        }
    }
}

/// A prepared statement: its SQL, parsed, and the parameters last bound to it.
#[derive(Clone)]
pub struct Prepared {
    pub statement: Statement,
    pub parameters: Vec<RecordBatch>,
    /// The size of its SQL.
    pub bytes: usize,
}

impl Prepared {
    /// What it holds in memory, roughly: its SQL and its parameters.
    fn held(&self) -> usize {
        self.bytes
            + self
                .parameters
                .iter()
                .map(RecordBatch::get_array_memory_size)
                .sum::<usize>()
    }
}

/// A call let in: its session, and the token to give the client where the session is new.
pub struct Access {
    pub session: Arc<ClientSession>,
    pub issued: Option<String>,
}

impl Sessions {
    /// The sessions of a server over `root`'s models and warehouse.
    pub fn new(root: Arc<Engine>, idle: Duration) -> Self {
        Sessions {
            root,
            by_token: Mutex::default(),
            numbers: AtomicU64::new(1),
            idle,
            throttle: Throttle::default(),
        }
    }

    /// Lets a call in by its `authorization` header: its session, or a new one. A new session
    /// is kept (its token to be sent in the reply's headers) where `keep`, else it lasts the
    /// call (a reply that cannot carry headers).
    #[allow(clippy::result_large_err)]
    pub fn access(
        &self,
        credentials: &Credentials,
        header: Option<&str>,
        keep: bool,
    ) -> Result<Access, Status> {
        match credentials.check(header) {
            Shown::Refused(why) => Err(Status::unauthenticated(why)),
            Shown::Session(token) => {
                if let Some(session) = self.live(&token) {
                    *session.last_used.lock() = Instant::now();
                    session.calls.fetch_add(1, Ordering::Relaxed);
                    return Ok(Access {
                        session,
                        issued: None,
                    });
                }
                if credentials.required() {
                    return Err(self.unknown());
                }
                self.open(keep)
            }
            Shown::Credential => self.open(keep),
        }
    }

    /// Whether a call with this `authorization` header may go on at all: it shows a credential
    /// of the server's, or a session token the server gave (or none is needed).
    #[allow(clippy::result_large_err)]
    pub fn admits(
        &self,
        credentials: &Credentials,
        header: Option<&str>,
        peer: Option<IpAddr>,
    ) -> Result<(), Status> {
        let shown = credentials.check(header);
        // A session's own token goes on, whatever others at its address tried.
        if let Shown::Session(token) = &shown
            && self.live(token).is_some()
        {
            return Ok(());
        }
        if !credentials.required() {
            return match shown {
                Shown::Refused(why) => Err(Status::unauthenticated(why)),
                _ => Ok(()),
            };
        }
        // A call that shows nothing guesses nothing: it is refused, not counted.
        if header.is_none() {
            return match shown {
                Shown::Refused(why) => Err(Status::unauthenticated(why)),
                _ => Ok(()),
            };
        }
        self.throttle.wait(peer)?;
        match shown {
            Shown::Refused(why) => {
                self.throttle.failed(peer);
                Err(Status::unauthenticated(why))
            }
            Shown::Session(_) => {
                self.throttle.failed(peer);
                Err(self.unknown())
            }
            Shown::Credential => {
                self.throttle.succeeded(peer);
                Ok(())
            }
        }
    }

    /// The session `token` names, if it has not ended (idle past `--idle-timeout` with
    /// nothing under way, it ends now).
    fn live(&self, token: &str) -> Option<Arc<ClientSession>> {
        let key = digest(token);
        let mut sessions = self.by_token.lock();
        let session = sessions.get(&key)?;
        if Arc::strong_count(session) == 1 && session.last_used.lock().elapsed() >= self.idle {
            sessions.remove(&key);
            return None;
        }
        Some(session.clone())
    }

    /// The refusal of a token that names no session.
    fn unknown(&self) -> Status {
        Status::unauthenticated(format!(
            "the token is not valid: not the server's, nor one of a session it has (sessions end \
             idle over {}, when {MAX_SESSIONS} are open and they are the longest idle, or when \
             the server restarts); connect again",
            humantime::format_duration(self.idle)
        ))
    }

    /// Takes the result `handle` names from whichever session keeps it.
    pub fn take_result_of_any(&self, handle: u64) -> Option<Pending> {
        let sessions: Vec<Arc<ClientSession>> = self.by_token.lock().values().cloned().collect();
        sessions.iter().find_map(|s| s.take_result(handle))
    }

    /// A new session (see [`Sessions::access`]).
    #[allow(clippy::result_large_err)]
    fn open(&self, keep: bool) -> Result<Access, Status> {
        let session = Arc::new(ClientSession {
            number: self.numbers.fetch_add(1, Ordering::Relaxed),
            root: self.root.clone(),
            engine: tokio::sync::OnceCell::new(),
            turn: tokio::sync::Mutex::new(()),
            results: Mutex::default(),
            prepared: Mutex::default(),
            last_used: Mutex::new(Instant::now()),
            calls: AtomicU64::new(1),
        });
        if !keep {
            return Ok(Access {
                session,
                issued: None,
            });
        }
        let token = new_token();
        let mut sessions = self.by_token.lock();
        self.end_idle(&mut sessions);
        if sessions.len() >= MAX_SESSIONS {
            // The one idle longest, among those with nothing under way, makes room: first
            // among those used for one call alone (a client that never sent its token back).
            let oldest = sessions
                .iter()
                .filter(|(_, s)| Arc::strong_count(s) == 1)
                .min_by_key(|(_, s)| (s.calls.load(Ordering::Relaxed) > 1, *s.last_used.lock()))
                .map(|(key, _)| *key);
            match oldest {
                Some(key) => {
                    sessions.remove(&key);
                }
                None => {
                    return Err(Status::resource_exhausted(format!(
                        "the server has {MAX_SESSIONS} sessions, each with a call under way; \
                         try again when one ends"
                    )));
                }
            }
        }
        sessions.insert(digest(&token), session.clone());
        Ok(Access {
            session,
            issued: Some(token),
        })
    }

    /// Ends the sessions idle longer than `--idle-timeout` with nothing under way.
    pub fn sweep(&self) {
        self.end_idle(&mut self.by_token.lock());
    }

    fn end_idle(&self, sessions: &mut HashMap<[u8; 32], Arc<ClientSession>>) {
        sessions
            .retain(|_, s| Arc::strong_count(s) > 1 || s.last_used.lock().elapsed() < self.idle);
    }
}

impl ClientSession {
    /// The session's engine, where its first statement made it (never made here).
    pub fn started_engine(&self) -> Option<&Engine> {
        self.engine.get()
    }

    /// The session's engine, made on its first statement.
    pub async fn engine(&self) -> crate::Result<&Engine> {
        self.engine
            .get_or_try_init(|| async { self.root.session() })
            .await
    }

    /// Keeps `result` for a `DoGet`: its handle.
    pub fn keep_result(&self, result: Pending) -> u64 {
        let handle = random_handle();
        let mut results = self.results.lock();
        results.insert(handle, result);
        while results.len() > MAX_RESULTS {
            results.pop_first();
        }
        handle
    }

    /// Takes the result `handle` names (a result is read once).
    pub fn take_result(&self, handle: u64) -> Option<Pending> {
        self.results.lock().remove(&handle)
    }

    /// Keeps a prepared statement: its handle.
    #[allow(clippy::result_large_err)]
    pub fn prepare(&self, prepared: Prepared) -> Result<u64, Status> {
        let mut all = self.prepared.lock();
        if all.len() >= MAX_PREPARED {
            return Err(Status::resource_exhausted(format!(
                "the session has {MAX_PREPARED} prepared statements open: close some"
            )));
        }
        check_held(&all, prepared.held())?;
        let handle = random_handle();
        all.insert(handle, prepared);
        Ok(handle)
    }

    /// The prepared statement `handle` names.
    pub fn prepared(&self, handle: u64) -> Option<Prepared> {
        self.prepared.lock().get(&handle).cloned()
    }

    /// Binds `parameters` to prepared statement `handle`; false where there is none.
    #[allow(clippy::result_large_err)]
    pub fn bind(&self, handle: u64, parameters: Vec<RecordBatch>) -> Result<bool, Status> {
        let mut all = self.prepared.lock();
        let Some(old) = all.remove(&handle) else {
            return Ok(false);
        };
        let bound = Prepared {
            parameters,
            ..old.clone()
        };
        if let Err(refused) = check_held(&all, bound.held()) {
            all.insert(handle, old);
            return Err(refused);
        }
        all.insert(handle, bound);
        Ok(true)
    }

    /// Closes prepared statement `handle`.
    pub fn close(&self, handle: u64) {
        self.prepared.lock().remove(&handle);
    }
}

/// Refuses a prepared statement of `more` bytes beside `all` past [`MAX_PREPARED_BYTES`].
#[allow(clippy::result_large_err)]
fn check_held(all: &BTreeMap<u64, Prepared>, more: usize) -> Result<(), Status> {
    let held: usize = all.values().map(Prepared::held).sum();
    if held + more > MAX_PREPARED_BYTES {
        return Err(Status::resource_exhausted(format!(
            "the session's prepared statements would hold {} MiB, over {} MiB: close some",
            (held + more) >> 20,
            MAX_PREPARED_BYTES >> 20
        )));
    }
    Ok(())
}

/// A handle of a result or prepared statement: 64 random bits, so that one cannot be guessed.
fn random_handle() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// A new session token: 256 bits from the operating system's generator, as hex.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(16) {
        chunk.copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    // A v4 UUID fixes 6 of its 128 bits: 244 random bits remain, hashed to spread them.
    hex::encode(Sha256::digest(bytes))
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}
