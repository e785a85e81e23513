//! A statement run from Python: on a thread of its own, with a stack as deep as the command
//! line's (statements are planned there), the GIL released meanwhile so that other Python
//! threads, and other connections, go on. Ctrl-C (`KeyboardInterrupt`) stops it as SIGINT stops
//! the command line's: the model calls in flight are ended, what it wrote is discarded, and
//! then the `KeyboardInterrupt` is raised.

use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::time::Duration;

use batchinfer::Error as EngineError;
use batchinfer::engine::Engine;
use batchinfer::progress::{RunReport, run_reported};
use batchinfer::statement_context::StatementContext;
use batchinfer::statements::Statement;
use datafusion::dataframe::DataFrame;
use futures::FutureExt;
use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;

use crate::Inner;
use crate::errors::raise;

/// The stack of the threads that plan and run statements (the command line's).
const STACK_BYTES: usize = 64 << 20;

/// How often a waiting statement looks for Ctrl-C.
const SIGNALS_EVERY: Duration = Duration::from_millis(100);

/// The runtime every connection's statements run on, started by the module's import.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME
        .get()
        .expect("the module's import starts the runtime before anything runs")
}

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// Starts [`runtime`]; the module's import fails where it cannot.
pub fn start_runtime() -> PyResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("batchinfer")
        .thread_stack_size(STACK_BYTES)
        .build()
        .map_err(|e| raise(EngineError::io("starting the async runtime", e)))?;
    let _ = RUNTIME.set(runtime);
    Ok(())
}

/// Work under way that may call into Python (statements, a stream's reads): counted so that
/// Python's exit can wait for it ([`wait_for_work`]).
static WORKING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts work under way while it lives.
pub struct Working(());

impl Working {
    pub fn start() -> Working {
        WORKING.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Working(())
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        WORKING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Set as Python exits: running statements are cancelled, streams end.
static EXITING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether Python is exiting ([`wait_for_work`] was called).
pub fn exiting() -> bool {
    EXITING.load(std::sync::atomic::Ordering::SeqCst)
}

/// As Python exits: cancels the statements still running (in daemon threads) and waits, the GIL
/// released, up to `within` for them and their reads to end, so that none calls into an
/// interpreter that is being torn down.
pub fn wait_for_work(py: Python<'_>, within: Duration) {
    let working = || WORKING.load(std::sync::atomic::Ordering::SeqCst);
    EXITING.store(true, std::sync::atomic::Ordering::SeqCst);
    if working() == 0 {
        return;
    }
    batchinfer::stop::request("SIGTERM");
    py.detach(|| {
        let started = std::time::Instant::now();
        while working() > 0 && started.elapsed() < within {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// How a statement's thread ended.
enum Outcome<T> {
    Done(batchinfer::Result<T>),
    /// Stopped by Ctrl-C: `Ok` once all it wrote was discarded, or what was kept.
    Stopped(batchinfer::Result<()>),
}

/// Runs `work` to its end (see the module's text); a statement of `engine`'s, where it is one
/// (what a cancellation kept is its own).
pub fn run<T, F>(py: Python<'_>, engine: Option<&Engine>, work: F) -> PyResult<T>
where
    T: Send,
    F: AsyncFnOnce() -> batchinfer::Result<T> + Send,
{
    let _working = Working::start();
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<&'static str>();
    let done = (Mutex::new(false), Condvar::new());
    std::thread::scope(|scope| {
        let done = &done;
        let worker = std::thread::Builder::new()
            .name("batchinfer-statement".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, move || {
                let outcome = runtime().block_on(async move {
                    let work = AssertUnwindSafe(work()).catch_unwind();
                    tokio::select! {
                        result = work => Outcome::Done(result.unwrap_or_else(|panic| {
                            Err(EngineError::Internal(batchinfer::error::panic_message(&panic)))
                        })),
                        Ok(signal) = cancelled => {
                            Outcome::Stopped(batchinfer::runner::cancelled(signal, engine).await)
                        }
                    }
                });
                *done.0.lock() = true;
                done.1.notify_all();
                outcome
            })
            .map_err(|e| raise(EngineError::io("starting a statement's thread", e)))?;
        let mut cancel = Some(cancel);
        let mut interrupt: Option<PyErr> = None;
        loop {
            let finished = py.detach(|| {
                let mut finished = done.0.lock();
                if !*finished {
                    done.1.wait_for(&mut finished, SIGNALS_EVERY);
                }
                *finished
            });
            if finished {
                break;
            }
            if interrupt.is_none()
                && let Err(e) = py.check_signals()
            {
                interrupt = Some(e);
                // The scoring loops and model calls of the statement stop ([`batchinfer::stop`]),
                // then the statement is dropped and its writes discarded.
                batchinfer::stop::request("SIGINT");
                if let Some(cancel) = cancel.take() {
                    let _ = cancel.send("SIGINT");
                }
            }
            // Python exiting: the statement is dropped, its writes discarded, as at SIGTERM.
            if exiting()
                && let Some(cancel) = cancel.take()
            {
                let _ = cancel.send("SIGTERM");
            }
        }
        let outcome = worker.join().unwrap_or_else(|panic| {
            Outcome::Done(Err(EngineError::Internal(
                batchinfer::error::panic_message(panic.as_ref()),
            )))
        });
        match (outcome, interrupt) {
            (Outcome::Done(result), None) => result.map_err(raise),
            (Outcome::Stopped(Ok(())), Some(interrupt)) => Err(interrupt),
            (Outcome::Stopped(Err(EngineError::Cancelled(_))), Some(interrupt)) => Err(interrupt),
            (Outcome::Stopped(Err(e)), _) => Err(raise(e)),
            // The statement ended before the interrupt reached it: what it did stands.
            (Outcome::Done(result), Some(interrupt)) => match result {
                Ok(_) => Err(raise(EngineError::Statement(
                    "KeyboardInterrupt came as the statement finished: it completed, and what \
                     it wrote is kept"
                        .to_string(),
                ))),
                Err(EngineError::Cancelled(_)) => Err(interrupt),
                Err(e) => Err(raise(e)),
            },
            // Stopped as Python exits.
            (Outcome::Stopped(Ok(())), None) => Err(raise(EngineError::Cancelled("SIGTERM"))),
        }
    })
}

/// What [`collect`] runs: a statement, or a query planned earlier.
pub enum Work {
    Statement(Statement),
    Planned(DataFrame),
}

/// Runs `work` to its end and collects what it returns, with progress where the connection
/// shows it; the warnings of failed rows are added to `warnings`.
pub fn collect(
    py: Python<'_>,
    inner: &Inner,
    work: Work,
    warnings: &mut Vec<String>,
) -> PyResult<RunReport> {
    let engine = &inner.engine;
    let progress = inner.progress.clone();
    let (report, failed) = run(py, Some(engine), async move || {
        let (report, statement) = match work {
            Work::Statement(statement) => {
                let written = statement.writes();
                let report = run_reported(engine, written, progress, engine.run(statement)).await?;
                (report, engine.statement())
            }
            Work::Planned(df) => {
                // The statement it was planned in: the connection may have run others since.
                let task = df.task_ctx();
                let statement = StatementContext::of(Some(task.session_config().options()))
                    .cloned()
                    .unwrap_or_default();
                let report = run_reported(engine, None, progress, async { Ok(df) }).await?;
                (report, statement)
            }
        };
        let failed = batchinfer::runner::failed_rows_of(engine, &statement).await;
        Ok((report, failed))
    })?;
    warnings.extend(failed);
    Ok(report)
}

/// Says each of `warnings` through Python's `warnings` module.
pub fn warn(py: Python<'_>, warnings: &[String]) -> PyResult<()> {
    if warnings.is_empty() {
        return Ok(());
    }
    let module = py.import("warnings")?;
    for warning in warnings {
        module.call_method1(
            "warn",
            (
                warning.as_str(),
                py.get_type::<pyo3::exceptions::PyRuntimeWarning>(),
                2,
            ),
        )?;
    }
    Ok(())
}
