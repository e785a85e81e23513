//! Runs every `sql/*.slt` file against a fresh engine with the models in `data/models`.
//!
//! `cargo test --test sqllogictests` runs them all; `cargo test --test sqllogictests -- NAME`
//! runs the files whose name contains NAME.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use batchinfer::error::display_error;
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
        let types = vec![DefaultColumnType::Any; schema.fields().len()];
        Ok(DBOutput::Rows { types, rows })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "batchinfer"
    }
}

fn slt_files(filter: Option<&str>) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir("sql")
        .expect("the sql/ folder of the repository")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| filter.is_none_or(|f| p.to_string_lossy().contains(f)))
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
    runner.with_column_validator(|_, _| true);
    runner
        .run_file_async(path)
        .await
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[tokio::main]
async fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let files = slt_files(filter.as_deref());
    let mut failed = 0;
    for path in &files {
        let scratch = tempfile::tempdir().expect("a temporary folder");
        match run_file(path, scratch.path()).await {
            Ok(()) => println!("ok     {}", path.display()),
            Err(e) => {
                failed += 1;
                println!("FAILED {}\n{e}\n", path.display());
            }
        }
    }
    println!("{} passed, {failed} failed", files.len() - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
