//! Running statements and showing what they return: the one runner behind `query -e`, `-f`,
//! statements piped on standard input and the interactive shell. Results go to stdout in the
//! chosen format ([`crate::output`]); the per-statement summary, warnings and errors to stderr.

use std::io::{BufRead, Write};
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures::FutureExt;

pub use crate::signals::{exit_on_unheeded_signals, stop_signal};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::output::{OutputFormat, print_batches};
use crate::progress::run_with_progress;
use crate::signals::{Running, heed};
use crate::statement_context::StatementContext;
use crate::statements::{Statement, complete_prefix};
use crate::view::schedule::Schedule;

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
                    Some(signal) => return cancelled(signal, Some(self.engine)).await,
                    None => return Err(e),
                },
            },
            signal = stop_signal() => return cancelled(signal, Some(self.engine)).await,
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
    for warning in failed_rows(engine).await {
        eprintln!("warning: {warning}");
    }
}

/// The warnings [`report_failed_rows`] prints, one a model, for the statement that just ran.
pub async fn failed_rows(engine: &Engine) -> Vec<String> {
    failed_rows_of(engine, &engine.statement()).await
}

/// [`failed_rows`] of `statement` (a query's, whose rows were read after it was planned: its
/// session may have begun another since).
pub async fn failed_rows_of(engine: &Engine, statement: &StatementContext) -> Vec<String> {
    let mut warnings = Vec::new();
    let (rejected, folder) = engine.rejects_of(statement).await.unwrap_or_else(|e| {
        warnings.push(format!(
            "the statement's rejects cannot be counted: {}",
            display_error(&e)
        ));
        (Vec::new(), String::new())
    });
    for (model, rows) in &rejected {
        warnings.push(format!(
            "model '{model}' failed on {rows} row(s), which got NULL; they are kept in {folder}"
        ));
    }
    for (model, rows) in crate::rejects::take_nulled(statement) {
        if !rejected.iter().any(|(m, _)| *m == model) {
            warnings.push(format!(
                "model '{model}' failed on {rows} row(s), which got NULL \
                 (batchinfer.on_error = 'null')"
            ));
        }
    }
    warnings
}

/// Answers a stop signal: waits until what the statement wrote is discarded, and says so (or
/// what a commit already under way kept of `engine`'s statement, where one was running).
pub async fn cancelled(signal: &'static str, engine: Option<&Engine>) -> Result<()> {
    heed();
    crate::storage::discards_done().await;
    let kept = engine.map_or_else(Vec::new, |engine| {
        crate::storage::take_kept_despite_cancel(&engine.statement())
    });
    if !kept.is_empty() {
        // Too late to stop a commit under way: said as it is.
        return Err(Error::Statement(format!(
            "{signal} came as the statement committed: {} were kept",
            kept.join(", ")
        )));
    }
    Err(Error::Cancelled(signal))
}

/// `batchinfer refresh VIEW`: materialized view `name` refreshed as `schedule` says
/// ([`crate::view::schedule`]), each refresh a statement of its own, its failed rows reported.
pub async fn refresh_view(engine: &Engine, name: &str, schedule: Schedule) -> Result<()> {
    let _running = Running::start();
    if !engine.view_exists(name).await? {
        return Err(Error::view(
            name,
            format!("there is no materialized view '{name}' (SHOW MATERIALIZED VIEWS lists them)"),
        ));
    }
    crate::view::schedule::refresh_view(
        name,
        schedule,
        async || engine.refresh(name).await,
        async || report_failed_rows(engine).await,
    )
    .await
}
