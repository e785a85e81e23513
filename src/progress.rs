//! Long work shows progress: while a statement runs for more than a second, a line shows the
//! rows scored so far, rows/s, the time elapsed, and an estimate of the time left where Parquet
//! metadata gives the row count. The command line draws it on stderr when stderr is a terminal
//! (nothing otherwise, so scripts stay clean); Python's `progress=True` hands it to a function
//! ([`Progress`]). After the statement, [`RunReport::summary`]
//! says how long it took and how much of it was spent inside the model.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::dataframe::DataFrame;
use datafusion::physical_plan::{ExecutionPlan, collect};

use crate::engine::Engine;
use crate::error::Result;
use crate::message::thousands;
use crate::statements::Statement;

/// What a statement returned, and the model work it took.
pub struct RunReport {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
    /// What the statement wrote (a COPY's target, a table), if it wrote.
    pub written: Option<String>,
    /// Rows the models scored, calls into ONNX Runtime, time inside them (summed over calls
    /// running in parallel), and the time during which a model ran at all.
    pub scored_rows: u64,
    pub model_calls: u64,
    pub model_time: Duration,
    pub model_occupied: Duration,
    /// What endpoint models did for it: requests, retries, answers from the cache, tokens, cost.
    pub llm: crate::llm::Usage,
}

impl RunReport {
    /// One short line: the rows returned (or written, and where), the wall time, and the model
    /// work: "3 rows in 0.004 s; 3 scored in 1 call, 0.001 s in the model", "scores: 10,000 rows
    /// written in 0.5 s; 10,000 scored in 2 calls, 0.210 s in the model, 1.9 calls at a time":
    /// the time in the model is that during which a model ran, comparable with the wall time,
    /// and the calls at a time say how busy it kept the cores.
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
                "; {} scored in {} call{}, ",
                thousands(self.scored_rows),
                thousands(self.model_calls),
                if self.model_calls == 1 { "" } else { "s" },
            ));
            let occupied = self.model_occupied.as_secs_f64();
            line.push_str(&format!("{occupied:.3} s in the model"));
            let at_once = self.model_time.as_secs_f64() / occupied.max(1e-9);
            if at_once >= 1.05 {
                line.push_str(&format!(", {at_once:.1} calls at a time"));
            }
        }
        if !self.llm.is_empty() {
            line.push_str("; ");
            line.push_str(&llm_usage(&self.llm, wall));
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

/// What endpoint models did in `wall`: [`crate::llm::Usage::described`], with tokens/s.
fn llm_usage(usage: &crate::llm::Usage, wall: Duration) -> String {
    let tokens = usage.prompt_tokens.saturating_add(usage.completion_tokens);
    let per_second = tokens as f64 / wall.as_secs_f64().max(1e-9);
    format!("{}, {per_second:.0} tokens/s", usage.described())
}

/// "1 row", "10,000 rows".
fn rows(n: u64) -> String {
    format!("{} row{}", thousands(n), if n == 1 { "" } else { "s" })
}

/// Where a statement's progress line goes.
#[derive(Clone, Default)]
pub enum Progress {
    /// Nowhere.
    #[default]
    Off,
    /// Drawn over itself on stderr (a terminal).
    Terminal,
    /// Each new line given to a function (Python's `progress=True`); `""` once at the end, when
    /// a line was shown, to erase it.
    To(Arc<dyn Fn(&str) + Send + Sync>),
}

impl Progress {
    /// [`Progress::Terminal`] where stderr is a terminal, else [`Progress::Off`].
    pub fn on_terminal() -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::Terminal
        } else {
            Progress::Off
        }
    }

    fn show(&self, line: &str) {
        match self {
            Progress::Off => {}
            Progress::Terminal => {
                eprint!("\r\x1b[2K{line}");
                let _ = std::io::stderr().flush();
            }
            Progress::To(show) => show(line),
        }
    }
}

/// Runs one statement to completion, with a progress line on a terminal.
pub async fn run_with_progress(engine: &Engine, statement: Statement) -> Result<RunReport> {
    let written = statement.writes();
    let frame = engine.run(statement);
    run_reported(engine, written, Progress::on_terminal(), frame).await
}

/// Collects the frame `frame` gives (a statement run, or a query planned earlier), with its
/// progress shown as `progress` says; `written` is what the statement writes, if it writes.
pub async fn run_reported(
    engine: &Engine,
    written: Option<String>,
    progress: Progress,
    frame: impl Future<Output = Result<DataFrame>>,
) -> Result<RunReport> {
    let registry = engine.registry().clone();
    let before = registry.totals();
    let llm_before = registry.llm_usage();
    let total = Arc::new(AtomicU64::new(0));
    let work = {
        let total = total.clone();
        async move {
            let df = frame.await?;
            let schema = df.schema().inner().clone();
            let task = Arc::new(df.task_ctx());
            let plan = df.create_physical_plan().await?;
            total.store(leaf_rows(&plan), Ordering::Relaxed);
            let batches = collect(plan, task).await?;
            Ok::<_, crate::error::Error>((schema, batches))
        }
    };
    let line = (!matches!(progress, Progress::Off)).then(|| {
        ProgressLine::start(
            registry.clone(),
            (before.rows, llm_before),
            total,
            engine.placement().running_on(),
            progress,
        )
    });
    let result = work.await;
    drop(line);
    let (schema, batches) = result?;
    let used = registry.totals().since(&before);
    Ok(RunReport {
        schema,
        batches,
        written,
        scored_rows: used.rows,
        model_time: Duration::from_nanos(used.nanos),
        model_calls: used.calls,
        model_occupied: Duration::from_nanos(used.occupied_nanos),
        llm: registry.llm_usage().since(&llm_before),
    })
}

/// The progress line, drawn by a thread of its own: the statement's model calls run on the
/// runtime's threads and await nothing while inside the model, so a ticker among them could go
/// unpolled for a whole record batch. Rows count as each micro-batch returns. Dropped: the line
/// is erased.
struct ProgressLine {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProgressLine {
    fn start(
        registry: Arc<crate::model::ModelRegistry>,
        (base_rows, llm_before): (u64, crate::llm::Usage),
        total: Arc<AtomicU64>,
        elsewhere: Option<String>,
        shown_to: Progress,
    ) -> ProgressLine {
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let draw = move || {
            let started = Instant::now();
            let mut shown = false;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(Duration::from_millis(250))
            {
                let elapsed = started.elapsed();
                if elapsed < Duration::from_secs(1) {
                    continue;
                }
                let line = match &elsewhere {
                    // The executors score the rows; this process only waits for the job.
                    Some(elsewhere) => {
                        format!(
                            "running on {elsewhere}, {:.1} s elapsed",
                            elapsed.as_secs_f64()
                        )
                    }
                    None => {
                        let rows = registry.totals().rows.saturating_sub(base_rows);
                        let llm = registry.llm_usage().since(&llm_before);
                        if llm.is_empty() {
                            progress(rows, total.load(Ordering::Relaxed), elapsed)
                        } else {
                            format!(
                                "{}, {:.1} s elapsed",
                                llm_usage(&llm, elapsed),
                                elapsed.as_secs_f64()
                            )
                        }
                    }
                };
                shown_to.show(&line);
                shown = true;
            }
            if shown {
                shown_to.show("");
            }
        };
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(draw)
            .ok();
        ProgressLine {
            done: Some(done),
            thread,
        }
    }
}

impl Drop for ProgressLine {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// "1,200 rows scored, 410 rows/s, 2.9 s elapsed, about 2 s left of 2,000 rows".
fn progress(rows: u64, total: u64, elapsed: Duration) -> String {
    let rate = rows as f64 / elapsed.as_secs_f64();
    let mut line = format!(
        "{} rows scored, {} rows/s, {:.1} s elapsed",
        thousands(rows),
        thousands(rate.round() as u64),
        elapsed.as_secs_f64()
    );
    if total > 0 && rows > 0 && rows <= total {
        let left = (total - rows) as f64 / rate.max(1e-9);
        line.push_str(&format!(
            ", about {left:.0} s left of {} rows",
            thousands(total)
        ));
    } else if total > 0 && rows == 0 {
        // The first call is still running: what there is to do, before any rate.
        line.push_str(&format!(", {} rows to score", thousands(total)));
    }
    line
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_separates_thousands() {
        assert_eq!(
            progress(1_234_567, 10_000_000, Duration::from_secs(2)),
            "1,234,567 rows scored, 617,284 rows/s, 2.0 s elapsed, about 14 s left of 10,000,000 rows"
        );
        assert_eq!(
            progress(0, 2_500, Duration::from_secs(1)),
            "0 rows scored, 0 rows/s, 1.0 s elapsed, 2,500 rows to score"
        );
    }
}
