//! Stop signals (SIGINT, Ctrl-C, and SIGTERM) as the process answers them: statements count
//! themselves running ([`Running`]) and say when they stopped for a signal ([`heed`]); a signal
//! that no statement answers ends the process ([`exit_on_unheeded_signals`]). What long work
//! looks at between its steps is [`crate::stop`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::Error;

/// How many stop signals a running statement has answered (by stopping).
/// Per process: signals are delivered to the process.
static HEEDED: AtomicU64 = AtomicU64::new(0);

/// How many statements are running (in [`Runner::run`]).
/// Per process: signals are delivered to the process.
static RUNNING: AtomicU64 = AtomicU64::new(0);

/// Counts a statement in [`RUNNING`] while it lives.
pub struct Running;

/// Says that the stop signal that came was answered (by stopping what was running).
pub fn heed() {
    HEEDED.fetch_add(1, Ordering::SeqCst);
}

impl Running {
    pub fn start() -> Running {
        RUNNING.fetch_add(1, Ordering::SeqCst);
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long a statement has to answer a stop signal before the process ends.
const HEED_WITHIN: Duration = Duration::from_secs(10);

/// Ends the process when a stop signal goes unanswered. A statement stops at SIGINT or SIGTERM
/// wherever it waits (reading, writing) and between a model's micro-batches ([`crate::stop`]),
/// but planning one is work on a thread that checks for nothing, and a signal that comes between two statements finds none to stop.
/// A signal with no statement running, a second signal before the first is answered, or none
/// answered [`HEED_WITHIN`] after it, exits at once with status 1. Nothing a statement staged
/// has been committed then, so nothing is lost: its hidden files stay hidden, and an S3 upload
/// never completed is no object.
pub fn exit_on_unheeded_signals() {
    let watch = async {
        loop {
            let heeded = HEEDED.load(Ordering::SeqCst);
            let signal = stop_signal().await;
            // The running statement's scoring loops look for it between micro-batches.
            crate::stop::request(signal);
            // Read before HEEDED: a statement counts the signal it answers before it stops
            // running, so a statement that already answered this one is seen to have.
            let running = RUNNING.load(Ordering::SeqCst);
            if HEEDED.load(Ordering::SeqCst) != heeded {
                continue;
            }
            if running == 0 {
                eprintln!("stopped by {signal}: no statement was running");
                std::process::exit(1);
            }
            // Answered, or not: the statement ended without answering it (the signal came as it
            // finished), or HEED_WITHIN passed.
            let answer = async {
                let started = Instant::now();
                while RUNNING.load(Ordering::SeqCst) > 0
                    && HEEDED.load(Ordering::SeqCst) == heeded
                    && started.elapsed() < HEED_WITHIN
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            tokio::select! {
                _ = stop_signal() => {}
                _ = answer => {}
            }
            if HEEDED.load(Ordering::SeqCst) == heeded {
                eprintln!("Error: {}", Error::Cancelled(signal));
                std::process::exit(1);
            }
        }
    };
    // A thread and a runtime of its own: the statement's may be too busy to look.
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(watch),
                Err(e) => eprintln!("warning: stop signals are heeded only between waits: {e}"),
            }
        });
    if let Err(e) = spawned {
        eprintln!("warning: stop signals are heeded only between waits: {e}");
    }
}

/// The first of SIGINT (Ctrl-C) and SIGTERM to come.
pub async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
