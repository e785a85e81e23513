//! Running statements and showing what they return: the one runner behind `query -e`, `-f`,
//! statements piped on standard input and the interactive shell. Results go to stdout in the
//! chosen format ([`crate::output`]); the per-statement summary, warnings and errors to stderr.

use std::io::{BufRead, Write};
use std::time::Instant;

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
        let report = tokio::select! {
            report = run_with_progress(self.engine, statement) => report?,
            signal = stop_signal() => {
                crate::storage::discards_done().await;
                return Err(Error::Cancelled(signal));
            }
        };
        let mut stdout = std::io::stdout().lock();
        print_batches(&mut stdout, self.format, &report.schema, &report.batches)?;
        stdout
            .flush()
            .map_err(|e| Error::io("writing results", e))?;
        if self.timing {
            eprintln!("{}", report.summary(started.elapsed()));
        }
        for (model, rows) in self.engine.registry().take_failed_rows() {
            eprintln!(
                "warning: model '{model}' failed on {rows} row(s), which got NULL (batchinfer.on_error = 'null')"
            );
        }
        Ok(())
    }

    /// Runs statements read from `input` as each is completed by a `;` outside strings and
    /// comments (what is left at the end runs too); `\q`, `quit` or `exit` on a line of its own
    /// stop. A failing statement is reported and the rest still run (the result is then an
    /// error); a cancelled one stops everything.
    pub async fn run_lines(&self, mut input: impl BufRead) -> Result<()> {
        let dialect = self.engine.dialect()?;
        let (mut pending, mut failed) = (String::new(), false);
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
            pending.push_str(&line);
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
            return Err(Error::Usage("some statements failed".to_string()));
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
