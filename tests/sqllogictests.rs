//! Runs every `sql/*.slt` file against a fresh engine with the models in `data/models`.
//!
//! `cargo test --test sqllogictests` runs them all; `cargo test --test sqllogictests -- NAME`
//! runs the files whose name contains NAME. The arguments are libtest's (`--test-threads 1`,
//! `--nocapture`, `--skip NAME`, `--exact`, `--list`, ...), so `cargo test -- --test-threads 1`
//! still runs every file; a run in which no file runs, with no filter that excludes them all,
//! fails. Each query's column types are checked against its `query` line's letters: `I` for
//! integers, `R` for floating point and decimals, `T` for everything else.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use batchinfer::message::display_error;
use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::Array;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use sqllogictest::{DBOutput, DefaultColumnType};

struct BatchInferDb {
    engine: Engine,
}

#[derive(Debug)]
struct DbError(String);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for DbError {}

#[async_trait]
impl sqllogictest::AsyncDB for BatchInferDb {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DbError> {
        let err = |e: batchinfer::Error| DbError(display_error(&e));
        let df = self.engine.sql(sql).await.map_err(err)?;
        let schema = df.schema().inner().clone();
        let batches = df
            .collect()
            .await
            .map_err(|e| err(batchinfer::Error::DataFusion(e)))?;
        if schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        let options = FormatOptions::default().with_null("NULL");
        let mut rows = Vec::new();
        for batch in &batches {
            let formatters: Vec<ArrayFormatter> = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<Result<_, _>>()
                .map_err(|e| DbError(e.to_string()))?;
            for row in 0..batch.num_rows() {
                rows.push(
                    formatters
                        .iter()
                        .zip(batch.columns())
                        .map(|(f, c)| {
                            if c.is_null(row) {
                                "NULL".to_string()
                            } else {
                                f.value(row).to_string()
                            }
                        })
                        .collect(),
                );
            }
        }
        let types = schema
            .fields()
            .iter()
            .map(|f| column_type(f.data_type()))
            .collect();
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "batchinfer"
    }
}

/// The letter of a column's type in a `query` line.
fn column_type(data_type: &datafusion::arrow::datatypes::DataType) -> DefaultColumnType {
    if data_type.is_integer() {
        DefaultColumnType::Integer
    } else if data_type.is_floating() || data_type.is_decimal() {
        DefaultColumnType::FloatingPoint
    } else {
        DefaultColumnType::Text
    }
}

/// What libtest's command line asks of this runner: filters (a file runs when its path contains
/// one, or is one with `--exact`), `--skip` filters, and `--list`.
#[derive(Debug, Default)]
struct Arguments {
    filters: Vec<String>,
    skip: Vec<String>,
    exact: bool,
    list: bool,
}

impl Arguments {
    fn parse(args: impl Iterator<Item = String>) -> Self {
        // libtest's options that take a value, as a separate argument or after '='.
        const VALUED: &[&str] = &[
            "--test-threads",
            "--skip",
            "--format",
            "--color",
            "--logfile",
            "--shuffle-seed",
            "-Z",
        ];
        let mut parsed = Arguments::default();
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--exact" => parsed.exact = true,
                "--list" => parsed.list = true,
                "--skip" => parsed.skip.extend(args.next()),
                a if a.starts_with("--skip=") => parsed.skip.push(a["--skip=".len()..].into()),
                a if VALUED.contains(&a) => {
                    args.next();
                }
                a if a.starts_with('-') => {}
                _ => parsed.filters.push(arg),
            }
        }
        parsed
    }

    fn selects(&self, name: &str) -> bool {
        let matches = |f: &String| {
            if self.exact {
                name == f
            } else {
                name.contains(f.as_str())
            }
        };
        (self.filters.is_empty() || self.filters.iter().any(matches))
            && !self.skip.iter().any(|s| name.contains(s.as_str()))
    }
}

/// The `sql/*.slt` files, sorted.
fn slt_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("sql")
        .expect("the sql/ folder of the repository")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    files
}

async fn run_file(path: &Path, scratch: &Path) -> Result<(), String> {
    let scratch = scratch.to_path_buf();
    let warehouse = scratch.join("warehouse");
    let mut runner = sqllogictest::Runner::new(move || {
        // Each file gets a warehouse of its own: CREATE TABLE ... AS writes Parquet there.
        let engine = Engine::new(EngineConfig {
            models_dir: Some("data/models".into()),
            warehouse: Some(warehouse.clone()),
            ..Default::default()
        });
        async move {
            engine
                .map(|engine| BatchInferDb { engine })
                .map_err(|e| DbError(display_error(&e)))
        }
    });
    // Files write their outputs under ${SCRATCH}, a fresh folder for each file.
    runner.set_var("SCRATCH".to_string(), scratch.display().to_string());
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner
        .run_file_async(path)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[tokio::main]
async fn main() {
    let arguments = Arguments::parse(std::env::args().skip(1));
    let all = slt_files();
    let files: Vec<&PathBuf> = all
        .iter()
        .filter(|p| arguments.selects(&p.to_string_lossy()))
        .collect();
    if arguments.list {
        for path in &files {
            println!("{}: test", path.display());
        }
        return;
    }
    let mut failed = 0;
    println!("\nrunning {} tests", files.len());
    for path in &files {
        let scratch = tempfile::tempdir().expect("a temporary folder");
        match run_file(path, scratch.path()).await {
            Ok(()) => println!("test {} ... ok", path.display()),
            Err(e) => {
                failed += 1;
                println!("test {} ... FAILED\n{e}\n", path.display());
            }
        }
    }
    let filtered = all.len() - files.len();
    let outcome = if failed > 0 { "FAILED" } else { "ok" };
    println!(
        "\ntest result: {outcome}. {} passed; {failed} failed; 0 ignored; 0 measured; {filtered} filtered out\n",
        files.len() - failed
    );
    if all.is_empty() {
        println!("no .slt file found in sql/");
        std::process::exit(1);
    }
    if files.is_empty() && arguments.filters.is_empty() {
        // Only --skip can have excluded them all: not a run that checked anything.
        println!("every .slt file was skipped");
        std::process::exit(1);
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
