//! One ONNX Runtime session per model, run by several calls at once.
//!
//! All partitions of all queries share the model's one session: ONNX Runtime's `Run` may be
//! called from several threads at once on one session, each call running on its caller's
//! thread when the session has one intra-op thread. So the model's weights (and the copies
//! ONNX Runtime makes of them for its kernels, several times the file's size for a
//! transformer) are held once, however many calls run in parallel. At most `max_sessions`
//! calls run at a time; a call beyond waits for one to finish.
//!
//! The `ort` crate's `Session::run` takes `&mut self`, a choice of the binding, not of ONNX
//! Runtime, whose C API documents `Run` as safe to call concurrently; [`SessionPool::run`]
//! calls it through that C API with the session shared.

use std::ffi::CString;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ort::AsPointer;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::DynValue;
use parking_lot::{Condvar, Mutex};

use crate::config::GraphOptimization;
use crate::device::Target;
use crate::onnx::external::ExternalFiles;
use crate::stop::StopToken;

/// How the session of a model is built and run.
#[derive(Debug, Clone, Copy)]
pub struct SessionOptions {
    /// The most calls that run at once.
    pub max_sessions: usize,
    /// ONNX Runtime's threads inside one call.
    pub intra_threads: usize,
    pub optimization: GraphOptimization,
    /// Inputs change shape from call to call (texts): no memory patterns, which ONNX Runtime
    /// plans for one shape.
    pub varying_shapes: bool,
    /// Where the session runs.
    pub device: Target,
}

/// A model's session and the calls running on it.
#[derive(Debug)]
pub struct SessionPool {
    session: Session,
    /// External data files, handed to ONNX Runtime in memory: kept as long as the session.
    _files: ExternalFiles,
    input_names: Vec<CString>,
    output_names: Vec<CString>,
    options: SessionOptions,
    running: Mutex<Running>,
    finished: Condvar,
    /// Nanoseconds during which at least one call ran.
    occupied: AtomicU64,
}

/// The calls running now, and since when one has been.
#[derive(Debug, Default)]
struct Running {
    calls: usize,
    since: Option<Instant>,
}

/// How often a call waiting for a free slot looks for a stop signal.
const STOP_POLL: Duration = Duration::from_millis(50);

impl SessionPool {
    /// Builds the session from the model's bytes and the external data files it names.
    pub fn new(
        bytes: &[u8],
        files: ExternalFiles,
        options: SessionOptions,
    ) -> crate::error::Result<Self> {
        let max_sessions = options.device.sessions(options.max_sessions).max(1);
        let options = SessionOptions {
            max_sessions,
            ..options
        };
        // Parallel calls share the session's intra-op threads: as many as they would have had
        // each, up to the cores (one thread each: none, every call runs on its caller's).
        let threads = match options.intra_threads {
            0 | 1 => 1,
            n => (n * max_sessions).min(crate::config::EngineConfig::cores().max(n)),
        };
        let session = build_session(
            bytes,
            &files,
            SessionOptions {
                intra_threads: threads,
                ..options
            },
        )?;
        let names = |outlets: &[ort::value::Outlet]| {
            outlets
                .iter()
                .map(|o| {
                    CString::new(o.name()).map_err(|_| {
                        crate::error::Error::ModelFile(format!(
                            "the model names a tensor '{}' with a NUL",
                            o.name()
                        ))
                    })
                })
                .collect::<crate::error::Result<Vec<_>>>()
        };
        Ok(SessionPool {
            input_names: names(session.inputs())?,
            output_names: names(session.outputs())?,
            session,
            _files: files,
            options,
            running: Mutex::new(Running::default()),
            finished: Condvar::new(),
            occupied: AtomicU64::new(0),
        })
    }

    /// The session, to read its inputs and outputs.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Runs the model on `inputs` (one per model input, in the model's order) and returns its
    /// outputs in the model's order. Waits while `max_sessions` calls are running, and gives up
    /// waiting at a stop signal; the time inside ONNX Runtime (not the wait) is added to `nanos`.
    pub fn run(
        &self,
        inputs: &[SessionInputValue<'_>],
        nanos: &AtomicU64,
        stop: &StopToken,
    ) -> crate::error::Result<Vec<DynValue>> {
        if inputs.len() != self.input_names.len() {
            return Err(crate::error::Error::ModelFile(format!(
                "{} inputs given to a model that takes {}",
                inputs.len(),
                self.input_names.len()
            )));
        }
        let _slot = self.slot(stop)?;
        let call = crate::stop::InFlight::start()?;
        // A signal that came while the call was registered: it was not there to be told.
        if stop.requested().is_some() {
            return Err(crate::error::Error::ModelFile("cancelled".to_string()));
        }
        let started = std::time::Instant::now();
        let input_names: Vec<*const std::ffi::c_char> =
            self.input_names.iter().map(|n| n.as_ptr()).collect();
        let output_names: Vec<*const std::ffi::c_char> =
            self.output_names.iter().map(|n| n.as_ptr()).collect();
        let values: Vec<*const ort::sys::OrtValue> = inputs.iter().map(|v| v.ptr()).collect();
        let mut outputs: Vec<*mut ort::sys::OrtValue> = vec![ptr::null_mut(); output_names.len()];
        // SAFETY: the session, run options, names and input values outlive the call; the names and values
        // arrays hold `len` valid pointers each; `outputs` has room for one value per output
        // name, each set by ONNX Runtime to a value the caller owns (taken below). ONNX
        // Runtime's `Run` is safe to call on one session from several threads at once.
        let status = unsafe {
            (ort::api().Run)(
                self.session.ptr().cast_mut(),
                call.options().ptr(),
                input_names.as_ptr(),
                values.as_ptr(),
                values.len(),
                output_names.as_ptr(),
                output_names.len(),
                outputs.as_mut_ptr(),
            )
        };
        nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // SAFETY: each non-null pointer is a value ONNX Runtime returned to this caller, owned
        // from here on by the `DynValue` (released when it is dropped), allocated by the
        // session's allocator.
        let taken: Vec<Option<DynValue>> = outputs
            .into_iter()
            .map(|p| {
                NonNull::new(p)
                    .map(|p| unsafe { DynValue::from_ptr(p, Some(self.session.allocator())) })
            })
            .collect();
        // SAFETY: `status` was returned by ONNX Runtime's `Run` just above.
        unsafe { ort::Error::result_from_status(status) }.map_err(crate::error::Error::from)?;
        taken
            .into_iter()
            .zip(&self.output_names)
            .map(|(value, name)| {
                value.ok_or_else(|| {
                    crate::error::Error::ModelFile(format!(
                        "ONNX Runtime returned no output {name:?}"
                    ))
                })
            })
            .collect()
    }

    /// Waits for a free slot and takes it until the returned guard is dropped; a stop signal
    /// ends the wait.
    fn slot(&self, stop: &StopToken) -> crate::error::Result<Slot<'_>> {
        let mut running = self.lock();
        loop {
            if stop.requested().is_some() {
                return Err(crate::error::Error::ModelFile("cancelled".to_string()));
            }
            if running.calls < self.options.max_sessions {
                break;
            }
            self.finished.wait_for(&mut running, STOP_POLL);
        }
        running.calls += 1;
        running.since.get_or_insert_with(Instant::now);
        Ok(Slot(self))
    }

    /// The most calls this model runs at once.
    pub fn max_sessions(&self) -> usize {
        self.options.max_sessions
    }

    /// The device the session runs on.
    pub fn device(&self) -> Target {
        self.options.device
    }

    /// Nanoseconds during which at least one call was running, so far (with the time inside
    /// the calls, summed, it tells how many ran at once).
    pub fn occupied_nanos(&self) -> u64 {
        let running = self.lock();
        let now = running.since.map_or(0, |s| s.elapsed().as_nanos() as u64);
        self.occupied.load(Ordering::Relaxed) + now
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Running> {
        // A count is never left half-updated: a panic elsewhere leaves it usable.
        self.running.lock()
    }
}

/// A running call's slot, given back when dropped.
struct Slot<'p>(&'p SessionPool);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut running = self.0.lock();
        running.calls -= 1;
        if running.calls == 0
            && let Some(since) = running.since.take()
        {
            self.0
                .occupied
                .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        drop(running);
        self.0.finished.notify_one();
    }
}

fn build_session(
    bytes: &[u8],
    files: &ExternalFiles,
    options: SessionOptions,
) -> crate::error::Result<Session> {
    let device = options.device;
    let env = device.environment()?;
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
    build().map_err(|e| crate::error::Error::ModelFile(format!("on {device}: {e}")))
}
