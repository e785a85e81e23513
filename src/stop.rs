//! A stop asked for while a statement runs (SIGINT, Ctrl-C, or SIGTERM), seen by long work
//! between its steps.
//!
//! A model call runs on a thread that awaits nothing, so a statement busy inside `embed` or
//! `predict` could not notice a signal until its record batch was done (minutes, for a heavy
//! model). The signal watcher ([`crate::signals::exit_on_unheeded_signals`]) counts each signal
//! here and ends the model calls in flight ([`InFlight`]: ONNX Runtime stops a call it is told
//! to terminate between two of its nodes). A statement takes a [`StopToken`] when it starts, and
//! its scoring loops look before each micro-batch (and while waiting for a free call) whether a
//! signal came since, ending the statement with [`Error::Cancelled`]. Nothing is ever cleared:
//! work left running by a statement that was cancelled keeps seeing its stop, and the next
//! statement's token starts after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use ort::session::RunOptions;
use parking_lot::Mutex;

use crate::error::Error;

/// The run options of the model calls in flight, by call number.
/// Per process: a signal stops every model call in flight in the process.
static IN_FLIGHT: Mutex<Vec<(u64, Arc<RunOptions>)>> = Mutex::new(Vec::new());

/// Numbers the calls in flight.
/// Per process: a counter for unique names.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// A model call in flight: a stop signal terminates it through its run options.
pub struct InFlight {
    call: u64,
    options: Arc<RunOptions>,
}

impl InFlight {
    /// Registers a call about to run, with run options of its own.
    pub fn start() -> crate::error::Result<InFlight> {
        let options = Arc::new(RunOptions::new().map_err(Error::from)?);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        lock().push((call, options.clone()));
        Ok(InFlight { call, options })
    }

    /// The run options to give ONNX Runtime's `Run`.
    pub fn options(&self) -> &RunOptions {
        &self.options
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock().retain(|(call, _)| *call != self.call);
    }
}

fn lock() -> parking_lot::MutexGuard<'static, Vec<(u64, Arc<RunOptions>)>> {
    // The list is whole after any panic: keep using it.
    IN_FLIGHT.lock()
}

/// Stop signals received so far.
/// Per process: signals are delivered to the process.
static SIGNALS: AtomicU64 = AtomicU64::new(0);

/// The last of them: 1, SIGINT; 2, SIGTERM.
/// Per process: signals are delivered to the process.
static LAST: AtomicU8 = AtomicU8::new(1);

/// Records that `signal` asks the running statement to stop.
pub fn request(signal: &'static str) {
    LAST.store(if signal == "SIGTERM" { 2 } else { 1 }, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
    for (_, options) in lock().iter() {
        // A call that cannot be told still stops before its next micro-batch.
        let _ = options.terminate();
    }
}

/// Stop signals received so far: what a statement's [`StopToken`] starts from.
pub fn signals() -> u64 {
    SIGNALS.load(Ordering::SeqCst)
}

/// A statement's view of stop signals: those that came after it started. The default token
/// (work outside a statement) never stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopToken {
    since: Option<u64>,
}

impl StopToken {
    /// A token for a statement starting now.
    pub fn now() -> StopToken {
        StopToken {
            since: Some(signals()),
        }
    }

    /// A token that started after `since` signals ([`signals`]).
    pub fn after(since: u64) -> StopToken {
        StopToken { since: Some(since) }
    }

    /// The signal that asked to stop since the token was taken, if one did.
    pub fn requested(&self) -> Option<&'static str> {
        if self.since? == SIGNALS.load(Ordering::SeqCst) {
            return None;
        }
        Some(match LAST.load(Ordering::SeqCst) {
            2 => "SIGTERM",
            _ => "SIGINT",
        })
    }

    /// `Err(Cancelled)` once a stop was asked for: called between micro-batches.
    pub fn check(&self) -> Result<(), Error> {
        match self.requested() {
            Some(signal) => Err(Error::Cancelled(signal)),
            None => Ok(()),
        }
    }
}
