//! Long work shows progress: while a statement runs for more than a second and stderr is a
//! terminal, a line on stderr shows the rows scored so far, rows/s, the time elapsed, and an
//! estimate of the time left where Parquet metadata gives the row count. Nothing is printed when
//! stderr is not a terminal, so scripts stay clean. After the statement, [`RunReport::summary`]
//! says how long it took and how much of it was spent inside the model.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::physical_plan::{ExecutionPlan, collect};

use crate::engine::Engine;
use crate::error::Result;
use crate::statements::Statement;

/// What a statement returned, and the model work it took.
pub struct RunReport {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// What the statement wrote (a COPY's target, a table), if it wrote.
    pub written: Option<String>,
    /// Rows the models scored, calls into ONNX Runtime, and time inside them (summed over
    /// sessions running in parallel).
    pub scored_rows: u64,
    pub model_calls: u64,
    pub model_time: Duration,
}

impl RunReport {
    /// One short line: the rows returned (or written, and where), the wall time, and the model
    /// work: "3 rows in 0.004 s; 3 scored in 1 call, 0.001 s in the model", "scores: 10,000 rows
    /// written in 0.5 s; ...". The model's time is summed over calls running in parallel.
    pub fn summary(&self, wall: Duration) -> String {
        let seconds = wall.as_secs_f64();
        let mut line = match &self.written {
            Some(target) => format!(
                "{target}: {} written in {seconds:.3} s",
                rows(self.rows_written())
            ),
            None => format!("{} in {seconds:.3} s", rows(self.rows_returned())),
        };
        if self.model_calls > 0 {
            line.push_str(&format!(
                "; {} scored in {} call{}, {:.3} s in the model",
                thousands(self.scored_rows),
                thousands(self.model_calls),
                if self.model_calls == 1 { "" } else { "s" },
                self.model_time.as_secs_f64(),
            ));
        }
        line
    }

    fn rows_returned(&self) -> u64 {
        self.batches.iter().map(|b| b.num_rows() as u64).sum()
    }

    /// The rows a write reports: its `count` (COPY, INSERT), or its row count (CREATE TABLE).
    fn rows_written(&self) -> u64 {
        let count = self.batches.first().and_then(|b| {
            let column = b.columns().first()?;
            datafusion::arrow::compute::cast(
                column,
                &datafusion::arrow::datatypes::DataType::UInt64,
            )
            .ok()?
            .as_any()
            .downcast_ref::<datafusion::arrow::array::UInt64Array>()
            .filter(|a| !a.is_empty())
            .map(|a| a.value(0))
        });
        count.unwrap_or_else(|| self.rows_returned())
    }
}

/// "1 row", "10,000 rows".
fn rows(n: u64) -> String {
    format!("{} row{}", thousands(n), if n == 1 { "" } else { "s" })
}

/// 10000 as "10,000".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Runs one statement to completion, with a progress line on a terminal.
pub async fn run_with_progress(engine: &Engine, statement: Statement) -> Result<RunReport> {
    let written = statement.writes();
    let registry = engine.registry().clone();
    let before = registry.totals();
    let total = Arc::new(AtomicU64::new(0));
    let work = {
        let total = total.clone();
        async move {
            let df = engine.run(statement).await?;
            let schema = df.schema().inner().clone();
            let task = Arc::new(df.task_ctx());
            let plan = df.create_physical_plan().await?;
            total.store(leaf_rows(&plan), Ordering::Relaxed);
            let batches = collect(plan, task).await?;
            Ok::<_, crate::error::Error>((schema, batches))
        }
    };
    let (schema, batches) = if std::io::stderr().is_terminal() {
        let elsewhere = engine.placement().running_on();
        show_progress(work, &registry, before.0, &total, elsewhere.as_deref()).await?
    } else {
        work.await?
    };
    let after = registry.totals();
    Ok(RunReport {
        schema,
        batches,
        written,
        // A model dropped or replaced by the statement takes its counts with it.
        scored_rows: after.0.saturating_sub(before.0),
        model_time: Duration::from_nanos(after.1.saturating_sub(before.1)),
        model_calls: after.2.saturating_sub(before.2),
    })
}

async fn show_progress<T>(
    work: impl std::future::Future<Output = Result<T>>,
    registry: &crate::model::ModelRegistry,
    base_rows: u64,
    total: &AtomicU64,
    elsewhere: Option<&str>,
) -> Result<T> {
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut shown = false;
    tokio::pin!(work);
    loop {
        tokio::select! {
            result = &mut work => {
                if shown {
                    eprint!("\r\x1b[2K");
                    let _ = std::io::stderr().flush();
                }
                return result;
            }
            _ = ticker.tick() => {
                let elapsed = started.elapsed();
                if elapsed < Duration::from_secs(1) {
                    continue;
                }
                if let Some(elsewhere) = elsewhere {
                    // The executors score the rows; this process only waits for the job.
                    eprint!("\r\x1b[2Krunning on {elsewhere}, {:.1} s elapsed", elapsed.as_secs_f64());
                    let _ = std::io::stderr().flush();
                    shown = true;
                    continue;
                }
                let rows = registry.totals().0.saturating_sub(base_rows);
                let rate = rows as f64 / elapsed.as_secs_f64();
                let mut line = format!("{rows} rows scored, {rate:.0} rows/s, {:.1} s elapsed", elapsed.as_secs_f64());
                let total = total.load(Ordering::Relaxed);
                if total > 0 && rows > 0 && rows <= total {
                    let left = (total - rows) as f64 / rate.max(1e-9);
                    line.push_str(&format!(", about {left:.0} s left of {total} rows"));
                }
                eprint!("\r\x1b[2K{line}");
                let _ = std::io::stderr().flush();
                shown = true;
            }
        }
    }
}

/// Rows the plan's sources will read, where their metadata says (Parquet footers do).
#[allow(deprecated)] // partition_statistics is the per-node entry point that leaf sources still implement
fn leaf_rows(plan: &Arc<dyn ExecutionPlan>) -> u64 {
    if plan.children().is_empty() {
        return match plan.partition_statistics(None).map(|s| s.num_rows) {
            Ok(Precision::Exact(n) | Precision::Inexact(n)) => n as u64,
            _ => 0,
        };
    }
    plan.children().into_iter().map(leaf_rows).sum()
}
