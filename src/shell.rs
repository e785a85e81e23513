//! The interactive shell: DataFusion's own line editor helper, printing and backslash commands
//! (`datafusion-cli` as a library), around batchinfer's statement router so that `CREATE MODEL`
//! and friends work beside SQL.
//!
//! History (`~/.batchinfer_history`), multi-line statements ended by `;`, `\?`, `\d`, `\q`,
//! `\pset format csv`, `\timing` (the per-statement summary), and Ctrl-C, which cancels the
//! running statement and keeps the shell.

use std::borrow::Cow;

use datafusion_cli::helper::CliHelper;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::{CmdKind, Highlighter};
use rustyline::hint::Hinter;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Context, Editor, Helper};

pub use crate::commands::ShellOptions;
use crate::commands::{backslash, print_options};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::runner::Runner;

/// DataFusion's helper, with a validator that also accepts batchinfer's statements.
struct ShellHelper {
    inner: CliHelper,
}

impl Helper for ShellHelper {}

impl Completer for ShellHelper {
    type Candidate = Pair;
    fn complete(
        &self,
        line: &str,
        pos: usize,
        ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        self.inner.complete(line, pos, ctx)
    }
}

impl Hinter for ShellHelper {
    type Hint = String;
    fn hint(&self, line: &str, pos: usize, ctx: &Context<'_>) -> Option<String> {
        self.inner.hint(line, pos, ctx)
    }
}

impl Highlighter for ShellHelper {
    fn highlight<'l>(&self, line: &'l str, pos: usize) -> Cow<'l, str> {
        self.inner.highlight(line, pos)
    }
    fn highlight_char(&self, line: &str, pos: usize, kind: CmdKind) -> bool {
        self.inner.highlight_char(line, pos, kind)
    }
    fn highlight_hint<'h>(&self, hint: &'h str) -> Cow<'h, str> {
        self.inner.highlight_hint(hint)
    }
}

impl Validator for ShellHelper {
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        let input = ctx.input().trim_end();
        if input.starts_with('\\') {
            return Ok(ValidationResult::Valid(None));
        }
        if !input.ends_with(';') {
            return Ok(ValidationResult::Incomplete);
        }
        // Statements are checked when they run, where errors get the engine's full message.
        Ok(ValidationResult::Valid(None))
    }
}

/// Runs the interactive shell until `\q` or end of input.
pub async fn run_shell(engine: &Engine, mut options: ShellOptions) -> Result<()> {
    let mut editor: Editor<ShellHelper, rustyline::history::DefaultHistory> =
        Editor::new().map_err(|e| Error::Usage(format!("cannot start the line editor: {e}")))?;
    let dialect = engine
        .context()
        .state()
        .config()
        .options()
        .sql_parser
        .dialect;
    editor.set_helper(Some(ShellHelper {
        inner: CliHelper::new(&dialect, options.color),
    }));
    let history =
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".batchinfer_history"));
    let statement_dialect = engine.dialect()?;
    // What is kept of a line: its secrets blanked, as plans have them.
    let kept = |line: &str| crate::statements::blank_secrets(line, statement_dialect.as_ref());
    if let Some(h) = &history {
        let _ = editor.load_history(h);
        // A history written before secrets were blanked in it is blanked once read.
        let entries: Vec<String> = editor.history().iter().map(|e| kept(e)).collect();
        let _ = editor.clear_history();
        for entry in entries {
            let _ = editor.add_history_entry(entry);
        }
    }
    println!(
        "batchinfer {}: SQL with predict() and embed(). End statements with ';'. \\? for help, \\q to quit.",
        env!("CARGO_PKG_VERSION")
    );
    let mut print = print_options(options.color);
    let mut ended = Ok(());
    loop {
        match editor.readline("batchinfer> ") {
            Ok(line) if line.trim_start().starts_with('\\') => {
                let _ = editor.add_history_entry(kept(line.trim_end()));
                let command = line.split_whitespace().collect::<Vec<_>>().join(" ");
                if !backslash(engine, &command, &mut options, &mut print).await {
                    break;
                }
            }
            Ok(line) => {
                let _ = editor.add_history_entry(kept(line.trim_end()));
                let runner = Runner {
                    engine,
                    format: options.format,
                    timing: options.timing,
                };
                match runner.run_script(&line).await {
                    Ok(()) => {}
                    // SIGTERM asks the process to end, not only the statement.
                    Err(e @ Error::Cancelled("SIGTERM")) => {
                        ended = Err(e);
                        break;
                    }
                    Err(Error::Cancelled(_)) => println!("^C (cancelled)"),
                    Err(e) => eprintln!("Error: {}", display_error(&e)),
                }
            }
            Err(ReadlineError::Interrupted) => {
                println!("^C");
                continue;
            }
            Err(ReadlineError::Eof) => {
                println!("\\q");
                break;
            }
            Err(e) => return Err(Error::Usage(format!("reading the terminal: {e}"))),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    ended
}
