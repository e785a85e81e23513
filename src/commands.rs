//! The backslash commands (`\timing`, `\x`, `\pset format csv`, `\d`, `\?`, `\h`, `\q`) and the settings
//! they change: typed in the shell or piped to it, they do the same.

use clap::ValueEnum;
use datafusion_cli::command::Command;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};

use crate::engine::Engine;
use crate::output::OutputFormat;

/// Settings of a shell session.
pub struct ShellOptions {
    /// How results print (`\pset format table|csv|json|ndjson`).
    pub format: OutputFormat,
    /// The per-statement summary line (`\timing` toggles it).
    pub timing: bool,
    /// Colors for DataFusion's own backslash commands' output.
    pub color: bool,
}

/// How DataFusion's backslash commands print (`\d`, `\?`).
pub(crate) fn print_options(color: bool) -> PrintOptions {
    PrintOptions {
        format: PrintFormat::Table,
        quiet: true,
        maxrows: MaxRows::Limited(40),
        color,
        instrumented_registry: Default::default(),
    }
}

/// Carries out a backslash command; false for `\q`. `\timing`, `\x`, `\pset format`, `\?`
/// and `\h` for batchinfer's functions and statements are the shell's; the others are
/// DataFusion's. What it says of a setting goes to stderr, so that
/// piped output holds results only.
pub(crate) async fn backslash(
    engine: &Engine,
    command: &str,
    options: &mut ShellOptions,
    print: &mut PrintOptions,
) -> bool {
    let invalid = || eprintln!("'{command}' is not a valid command; \\? lists them");
    let (word, rest) = command
        .split_once(char::is_whitespace)
        .unwrap_or((command, ""));
    match (word, rest.trim()) {
        ("\\timing", "") => {
            options.timing = !options.timing;
            eprintln!("Timing is {}.", if options.timing { "on" } else { "off" });
            return true;
        }
        ("\\x", "") => {
            options.format = match options.format {
                OutputFormat::Vertical => OutputFormat::Table,
                _ => OutputFormat::Vertical,
            };
            let on = options.format == OutputFormat::Vertical;
            eprintln!("Vertical display is {}.", if on { "on" } else { "off" });
            return true;
        }
        ("\\?", "") => {
            println!("{}", crate::help::COMMANDS);
            return true;
        }
        ("\\h", "") => {
            println!("{}", crate::help::index());
            return true;
        }
        ("\\h", name) => {
            match crate::help::topic(name) {
                Some(text) => println!("{text}"),
                None => eprintln!(
                    "'{name}' is not one of batchinfer's functions or statements (\\h lists them); \
                     SHOW FUNCTIONS LIKE '{name}' describes DataFusion's functions"
                ),
            }
            return true;
        }
        _ => {}
    }
    match command[1..].parse::<Command>() {
        Ok(Command::Quit) => return false,
        Ok(Command::OutputFormat(Some(setting))) => {
            // `\pset format csv`: the setting is "format csv".
            let name = setting.trim().trim_start_matches("format").trim();
            match OutputFormat::from_str(name, true) {
                Ok(format) => {
                    options.format = format;
                    eprintln!("Output format is {format:?}.");
                }
                Err(_) => invalid(),
            }
        }
        Ok(Command::OutputFormat(None)) => eprintln!("Output format is {:?}.", options.format),
        Ok(cmd) => {
            if matches!(cmd, Command::ListTables)
                && let Err(e) = engine.list_tables().await
            {
                eprintln!("Error: {}", crate::message::display_error(&e));
            }
            if let Err(e) = cmd.execute(engine.context(), print).await {
                eprintln!("Error: {e}");
            }
        }
        Err(_) => invalid(),
    }
    true
}
