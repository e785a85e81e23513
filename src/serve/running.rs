//! Where and how long a statement runs: on a runtime of its own, apart from the one that
//! answers calls, until its deadline (`--statement-timeout`), dropped with the call that asked
//! for it; a query's rows produced there as the client reads them.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow_flight::error::FlightError;
use datafusion::arrow::array::RecordBatch;
use datafusion::dataframe::DataFrame;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio::sync::OwnedSemaphorePermit;
use tonic::Status;

use super::replies::status;
use super::sessions::ClientSession;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::statement_context::StatementContext;

/// Runs `work` on the statements' runtime ([`statements_runtime`]) until `deadline`, its panics
/// made errors; past the deadline, or when the call is dropped (the client cancelled or left),
/// it is dropped, and what it wrote discarded.
pub(super) async fn within<T: Send + 'static>(
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    work: impl Future<Output = Result<T>> + Send + 'static,
    session: &ClientSession,
) -> Result<T, Status> {
    let task = Aborted(statements_runtime().spawn(work));
    let done = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(done) => done,
            Err(_) => {
                crate::storage::discards_done().await;
                let statement = session
                    .started_engine()
                    .map_or_else(StatementContext::default, Engine::statement);
                return Err(timed_out(timeout, &statement));
            }
        },
        None => task.await,
    };
    match done {
        Ok(result) => result.map_err(status),
        Err(joined) if joined.is_panic() => Err(status(Error::Internal(
            crate::error::panic_message(&joined.into_panic()),
        ))),
        Err(_) => Err(Status::cancelled("the statement was cancelled")),
    }
}

/// The runtime statements run on, apart from the one that answers calls: a statement that
/// keeps a thread busy (planning does, without a pause) leaves the server answering, timing
/// out and cancelling. Its threads: one a statement, and the cores besides.
/// Per process: one server runs in a process.
static STATEMENTS: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

/// Makes the statements' runtime for `max_statements` at once.
pub fn start_statements_runtime(max_statements: usize) -> std::io::Result<()> {
    if STATEMENTS.get().is_some() {
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(max_statements + cores)
        .thread_name("batchinfer-statement")
        .enable_all()
        .build()?;
    let _ = STATEMENTS.set(runtime);
    Ok(())
}

fn statements_runtime() -> &'static tokio::runtime::Runtime {
    STATEMENTS
        .get()
        .expect("the statements' runtime is started with the server")
}

/// A statement's slot, shared: given back when the first holder is dropped.
pub(super) struct Released(Arc<parking_lot::Mutex<Option<OwnedSemaphorePermit>>>);

impl Drop for Released {
    fn drop(&mut self) {
        self.0.lock().take();
    }
}

/// A task on the statements' runtime, aborted when its caller drops it.
struct Aborted<T>(tokio::task::JoinHandle<T>);

impl<T> Future for Aborted<T> {
    type Output = std::result::Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Aborted<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The error of a statement that ran past `--statement-timeout`.
fn timed_out(timeout: Option<Duration>, statement: &StatementContext) -> Status {
    let limit = timeout.map_or_else(String::new, |t| {
        format!(" ({})", humantime::format_duration(t))
    });
    let kept = crate::storage::take_kept_despite_cancel(statement);
    let what = if kept.is_empty() {
        "nothing it wrote was kept".to_string()
    } else {
        format!("it was committing, and kept {}", kept.join(", "))
    };
    Status::deadline_exceeded(format!(
        "the statement ran past --statement-timeout{limit}: it was cancelled, and {what}"
    ))
}

/// A query's rows as they are produced, on the statements' runtime, until its deadline; the
/// slot it runs in and its session held meanwhile. Dropped (the client cancelled or left), it
/// stops; past the deadline it stops and frees its slot, whether or not the client reads.
pub(super) fn produced(
    df: DataFrame,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    slot: OwnedSemaphorePermit,
    (session, statement): (Arc<ClientSession>, StatementContext),
) -> impl Stream<Item = std::result::Result<RecordBatch, FlightError>> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    // The slot is given back by whichever ends first: the work, or the stream the client reads.
    let slot = Released(Arc::new(parking_lot::Mutex::new(Some(slot))));
    let kept = Released(slot.0.clone());
    let told = statement.clone();
    let work = async move {
        // Whether the query's rows were read to the end.
        let produce = async {
            let mut rows = match df.execute_stream().await {
                Ok(rows) => rows,
                Err(e) => {
                    let _ = sender.send(Err(status(Error::from(e)))).await;
                    return false;
                }
            };
            while let Some(batch) = rows.next().await {
                let failed = batch.is_err();
                let batch = batch.map_err(|e| status(Error::from(e)));
                if sender.send(batch).await.is_err() || failed {
                    return false;
                }
            }
            true
        };
        let ended = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline.into(), produce).await,
            None => Ok(produce.await),
        };
        drop(slot);
        match ended {
            Ok(true) => {
                // Read to the end: the client sees the end at once; then the rows its models
                // failed on are said, as the command line says them (outside the deadline).
                drop(sender);
                if let Some(engine) = session.started_engine() {
                    for warning in crate::runner::failed_rows_of(engine, &statement).await {
                        crate::say!("warning: session {}: {warning}", session.number);
                    }
                }
            }
            Ok(false) => {}
            Err(_) => {
                crate::storage::discards_done().await;
                let _ = sender.send(Err(timed_out(timeout, &statement))).await;
            }
        }
        drop(session);
    };
    let task = Aborted(statements_runtime().spawn(work));
    // The deadline is kept here too: a statement busy on its thread (planning) cannot see it.
    let state = (receiver, Some((task, kept)));
    futures::stream::unfold(state, move |(mut receiver, held)| {
        let told = told.clone();
        async move {
            let held = held?;
            let item = match deadline {
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline.into(), receiver.recv()).await {
                        Ok(item) => item?,
                        Err(_) => return Some((Err(timed_out(timeout, &told)), (receiver, None))),
                    }
                }
                None => receiver.recv().await?,
            };
            Some((item, (receiver, Some(held))))
        }
    })
    .map_err(|e| FlightError::Tonic(Box::new(e)))
}
