//! A pool of ONNX Runtime sessions for one model.
//!
//! `Session::run` takes `&mut self`, so a session serves one call at a time. Partitions scoring
//! in parallel each take a session from the pool; sessions are created on demand up to the
//! configured number, all from the same model bytes held in memory (the file is read once).

use std::sync::{Arc, Condvar, Mutex};

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;

use super::external::ExternalFiles;
use crate::config::GraphOptimization;
use crate::device::Target;

/// How sessions of a model are built.
#[derive(Debug, Clone, Copy)]
pub struct SessionOptions {
    pub max_sessions: usize,
    pub intra_threads: usize,
    pub optimization: GraphOptimization,
    /// Inputs change shape from call to call (texts): no memory patterns, which ONNX Runtime
    /// plans for one shape.
    pub varying_shapes: bool,
    /// Where the sessions run.
    pub device: Target,
}

#[derive(Debug)]
struct PoolState {
    idle: Vec<Session>,
    created: usize,
}

/// Sessions of one model, shared by every partition of every query.
#[derive(Debug)]
pub struct SessionPool {
    bytes: Arc<[u8]>,
    /// External data files, given to each session in memory.
    files: ExternalFiles,
    options: SessionOptions,
    state: Mutex<PoolState>,
    returned: Condvar,
}

/// A session taken from the pool; it goes back when dropped.
pub struct PooledSession<'p> {
    pool: &'p SessionPool,
    session: Option<Session>,
}

impl SessionPool {
    /// Builds the first session (which also proves the bytes are a model ONNX Runtime accepts).
    pub fn new(
        bytes: Arc<[u8]>,
        files: ExternalFiles,
        options: SessionOptions,
    ) -> Result<(Self, Session), String> {
        let first = build_session(&bytes, &files, options)?;
        let options = SessionOptions {
            max_sessions: options.device.sessions(options.max_sessions),
            ..options
        };
        let pool = SessionPool {
            bytes,
            files,
            options,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                created: 1,
            }),
            returned: Condvar::new(),
        };
        Ok((pool, first))
    }

    /// Puts a session built elsewhere (the first one) into the pool.
    pub fn give(&self, session: Session) {
        self.lock().idle.push(session);
        self.returned.notify_one();
    }

    /// Takes an idle session, builds one if fewer than the maximum exist, or waits for one.
    pub fn acquire(&self) -> Result<PooledSession<'_>, String> {
        let mut state = self.lock();
        loop {
            if let Some(session) = state.idle.pop() {
                return Ok(PooledSession {
                    pool: self,
                    session: Some(session),
                });
            }
            if state.created < self.options.max_sessions.max(1) {
                state.created += 1;
                drop(state);
                return match build_session(&self.bytes, &self.files, self.options) {
                    Ok(session) => Ok(PooledSession {
                        pool: self,
                        session: Some(session),
                    }),
                    Err(e) => {
                        self.lock().created -= 1;
                        Err(e)
                    }
                };
            }
            state = self
                .returned
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The most sessions this pool builds.
    pub fn max_sessions(&self) -> usize {
        self.options.max_sessions.max(1)
    }

    /// The device the sessions run on.
    pub fn device(&self) -> Target {
        self.options.device
    }

    /// Sessions built so far.
    pub fn sessions(&self) -> usize {
        self.lock().created
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves the session list intact: keep using it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::ops::Deref for PooledSession<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        self.session
            .as_ref()
            .expect("a pooled session is present until dropped")
    }
}

impl std::ops::DerefMut for PooledSession<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        self.session
            .as_mut()
            .expect("a pooled session is present until dropped")
    }
}

impl Drop for PooledSession<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.pool.give(session);
        }
    }
}

fn build_session(
    bytes: &[u8],
    files: &ExternalFiles,
    options: SessionOptions,
) -> Result<Session, String> {
    let device = options.device;
    let env = device.environment().map_err(|e| e.to_string())?;
    let build = || -> ort::Result<Session> {
        let mut builder = Session::builder(env)?
            .with_optimization_level(match options.optimization {
                GraphOptimization::Disable => GraphOptimizationLevel::Disable,
                GraphOptimization::Basic => GraphOptimizationLevel::Level1,
                GraphOptimization::Extended => GraphOptimizationLevel::Level2,
                GraphOptimization::All => GraphOptimizationLevel::All,
            })?
            .with_intra_threads(options.intra_threads.max(1))?
            .with_inter_threads(1)?
            // Threads that spin between calls steal the cores DataFusion decodes Parquet on.
            .with_intra_op_spinning(false)?
            .with_memory_pattern(!options.varying_shapes)?
            // External data comes only from the files given (see `external`): a file not given is
            // looked for under a path that cannot exist (/dev/null is no folder), never in the
            // working directory.
            .with_config_entry(
                "session.model_external_initializers_file_folder_path",
                "/dev/null/no-external-data",
            )?;
        for (location, data) in files {
            builder = builder.with_external_initializer_file_in_memory(location, data.clone())?;
        }
        let providers = device.execution_providers();
        if !providers.is_empty() {
            builder = builder.with_execution_providers(providers)?;
        }
        builder.commit_from_memory(bytes)
    };
    build().map_err(|e| format!("on {device}: {e}"))
}
