//! Running statements and showing what they return: the one runner behind `query -e`, `-f`,
//! statements piped on standard input and the interactive shell. Results go to stdout in the
//! chosen format ([`crate::output`]); the per-statement summary, warnings and errors to stderr.

use std::io::{BufRead, Write};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::output::{OutputFormat, print_batches};
use crate::progress::run_with_progress;
use crate::statements::{Statement, complete_prefix};

/// How statements run and print.
pub struct Runner<'e> {
    pub engine: &'e Engine,
    pub format: OutputFormat,
    /// A summary line per statement on stderr (rows, time, model work).
    pub timing: bool,
}

impl Runner<'_> {
    /// Runs each statement of `script` in order; stops at the first error.
    pub async fn run_script(&self, script: &str) -> Result<()> {
        for statement in self.engine.statements(script)? {
            self.run(statement).await?;
        }
        Ok(())
    }

    /// Runs one statement and prints what it returns. SIGINT (Ctrl-C) and SIGTERM cancel it:
    /// what it wrote is discarded (S3 uploads aborted, hidden files removed) before this returns
    /// [`Error::Cancelled`].
    pub async fn run(&self, statement: Statement) -> Result<()> {
        let started = Instant::now();
        let stop = crate::stop::StopToken::now();
        let _running = Running::start();
        // A panic in the engine or a library (a malformed file can cause one) ends the statement
        // with an error, not the process or the shell.
        let work = AssertUnwindSafe(run_with_progress(self.engine, statement)).catch_unwind();
        let report = tokio::select! {
            report = work => match report.map_err(|panic| Error::Internal(crate::error::panic_message(&panic)))? {
                Ok(report) => report,
                // A model stopped between micro-batches: the statement ends as cancelled.
                Err(e) => match stop.requested() {
                    Some(signal) => return cancelled(signal).await,
                    None => return Err(e),
                },
            },
            signal = stop_signal() => return cancelled(signal).await,
        };
        let mut stdout = std::io::stdout().lock();
        print_batches(&mut stdout, self.format, &report.schema, &report.batches)?;
        stdout
            .flush()
            .map_err(|e| Error::io("writing results", e))?;
        if self.timing {
            eprintln!("{}", report.summary(started.elapsed()));
        }
        report_failed_rows(self.engine).await;
        Ok(())
    }

    /// Runs statements read from `input` as each is completed by a `;` outside strings and
    /// comments (what is left at the end runs too); `\q`, `quit` or `exit` on a line of its own
    /// stop. A failing statement is reported and the rest still run (the result is then an
    /// error); a cancelled one stops everything.
    pub async fn run_lines(&mut self, mut input: impl BufRead) -> Result<()> {
        let dialect = self.engine.dialect()?;
        let (mut pending, mut failed) = (String::new(), false);
        let mut print = crate::commands::print_options(false);
        loop {
            let mut line = String::new();
            let read = input
                .read_line(&mut line)
                .map_err(|e| Error::io("reading standard input", e))?;
            if read == 0 {
                break;
            }
            if pending.trim().is_empty() && matches!(line.trim(), "\\q" | "quit" | "exit") {
                break;
            }
            // A backslash command on a line of its own, as in the shell (`\pset format csv`).
            if line.trim_start().starts_with('\\')
                && crate::statements::only_comments(&pending, dialect.as_ref())
            {
                pending.clear();
                let command = line.split_whitespace().collect::<Vec<_>>().join(" ");
                let mut options = crate::commands::ShellOptions {
                    format: self.format,
                    timing: self.timing,
                    color: false,
                };
                let go_on =
                    crate::commands::backslash(self.engine, &command, &mut options, &mut print)
                        .await;
                (self.format, self.timing) = (options.format, options.timing);
                if !go_on {
                    break;
                }
                continue;
            }
            pending.push_str(&line);
            // Only a line with a `;` can complete a statement: the others are not tokenized
            // again (which made a long statement's lines cost the square of their number).
            if !line.contains(';') {
                continue;
            }
            let complete = complete_prefix(&pending, dialect.as_ref());
            if complete > 0 {
                let script: String = pending.drain(..complete).collect();
                failed |= self.report(self.run_script(&script).await)?;
            }
        }
        if !pending.trim().is_empty() {
            failed |= self.report(self.run_script(&pending).await)?;
        }
        if failed {
            return Err(Error::Statement("some statements failed".to_string()));
        }
        Ok(())
    }

    /// Prints a statement's error and goes on (true: it failed), or stops at a cancellation.
    fn report(&self, result: Result<()>) -> Result<bool> {
        match result {
            Ok(()) => Ok(false),
            Err(e @ Error::Cancelled(_)) => Err(e),
            Err(e) => {
                eprintln!("Error: {}", display_error(&e));
                Ok(true)
            }
        }
    }
}

/// Says, after a statement succeeded, on how many rows each model failed (which got NULL) and
/// where those kept as rejects are. Rejects that cannot be counted are a warning, not an error.
pub async fn report_failed_rows(engine: &Engine) {
    let (rejected, folder) = engine.statement_rejects().await.unwrap_or_else(|e| {
        eprintln!(
            "warning: the statement's rejects cannot be counted: {}",
            display_error(&e)
        );
        (Vec::new(), String::new())
    });
    for (model, rows) in &rejected {
        eprintln!(
            "warning: model '{model}' failed on {rows} row(s), which got NULL; they are kept in \
             {folder}"
        );
    }
    for (model, rows) in engine.registry().take_failed_rows() {
        if !rejected.iter().any(|(m, _)| *m == model) {
            eprintln!(
                "warning: model '{model}' failed on {rows} row(s), which got NULL \
                 (batchinfer.on_error = 'null')"
            );
        }
    }
}

/// Answers a stop signal: waits until what the statement wrote is discarded.
async fn cancelled(signal: &'static str) -> Result<()> {
    HEEDED.fetch_add(1, Ordering::SeqCst);
    crate::storage::discards_done().await;
    let kept = crate::storage::take_kept_despite_cancel();
    if !kept.is_empty() {
        // Too late to stop a commit under way: said as it is.
        return Err(Error::Statement(format!(
            "{signal} came as the statement committed: {} were kept",
            kept.join(", ")
        )));
    }
    Err(Error::Cancelled(signal))
}

/// How many stop signals a running statement has answered (by stopping).
static HEEDED: AtomicU64 = AtomicU64::new(0);

/// How many statements are running (in [`Runner::run`]).
static RUNNING: AtomicU64 = AtomicU64::new(0);

/// Counts a statement in [`RUNNING`] while it lives.
pub(crate) struct Running;

/// Says that the stop signal that came was answered (by stopping what was running).
pub(crate) fn heed() {
    HEEDED.fetch_add(1, Ordering::SeqCst);
}

impl Running {
    pub(crate) fn start() -> Running {
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
