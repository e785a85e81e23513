//! What `Connection.sql` returns: a query planned and not yet run, or the rows a statement
//! returned. A query runs once: `collect` keeps its rows (for `to_arrow`, `to_pandas`, ...), or
//! `__arrow_c_stream__` streams them as they are computed, a batch at a time, and the relation
//! is then spent; a model never scores its rows twice for one relation.

use std::sync::Arc;

use batchinfer::Error as EngineError;
use batchinfer::message::display_error;
use batchinfer::output::{OutputFormat, print_batches};
use batchinfer::statement_context::StatementContext;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchIterator, RecordBatchReader};
use datafusion::dataframe::DataFrame;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::arrow_c::{export_schema, export_stream};
use crate::errors::raise;
use crate::run::{self, runtime};
use crate::{Inner, lock_detached};

/// A statement's result (see the module's text).
#[pyclass(frozen, module = "batchinfer._native")]
pub struct Relation {
    inner: Arc<Inner>,
    schema: SchemaRef,
    state: Mutex<State>,
}

enum State {
    Planned(Box<DataFrame>),
    Collected(Vec<RecordBatch>),
    Streamed,
}

/// How many rows `repr` shows.
const SHOWN_ROWS: usize = 10;

impl Relation {
    pub(crate) fn planned(inner: Arc<Inner>, df: DataFrame) -> Relation {
        Relation {
            inner,
            schema: df.schema().inner().clone(),
            state: Mutex::new(State::Planned(Box::new(df))),
        }
    }

    pub(crate) fn collected(
        inner: Arc<Inner>,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    ) -> Relation {
        Relation {
            inner,
            schema,
            state: Mutex::new(State::Collected(batches)),
        }
    }
}

/// `df` as a statement starting now: its scoring stops at a Ctrl-C that comes from now on, not
/// at one that stopped another statement since it was planned.
fn starting_now(df: DataFrame) -> DataFrame {
    let (mut state, plan) = df.into_parts();
    let options = state.config_mut().options_mut();
    if let Some(statement) = options.extensions.get_mut::<StatementContext>() {
        statement.stop_signals_before = batchinfer::stop::signals();
    }
    // The options the physical plan's functions are given are those of the execution's start.
    state.mark_start_execution();
    DataFrame::new(state, plan)
}

fn streamed() -> PyErr {
    raise(EngineError::Usage(
        "this result was streamed already, and a query runs once: run con.sql(...) again, or \
         call to_arrow() first to keep its rows"
            .to_string(),
    ))
}

#[pymethods]
impl Relation {
    /// Runs the query, if it has not run, keeping its rows.
    fn collect(&self, py: Python<'_>) -> PyResult<()> {
        let mut state = lock_detached(py, &self.state)?;
        let df = match &*state {
            State::Planned(df) => starting_now(df.as_ref().clone()),
            State::Collected(_) => return Ok(()),
            State::Streamed => return Err(streamed()),
        };
        let inner = &self.inner;
        let guard = inner.lock(py)?;
        let mut warnings = Vec::new();
        let report = run::collect(py, inner, run::Work::Planned(df), &mut warnings)?;
        drop(guard);
        *state = State::Collected(report.batches);
        drop(state);
        run::warn(py, &warnings)
    }

    /// The rows, as an Arrow C stream (the PyCapsule interface): those kept, or the query's as
    /// it runs.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // The rows are given in their own schema; the interface lets a producer do so.
        let _ = requested_schema;
        let mut state = lock_detached(py, &self.state)?;
        let reader: Box<dyn RecordBatchReader + Send> = match &*state {
            State::Collected(batches) => Box::new(RecordBatchIterator::new(
                batches.clone().into_iter().map(Ok),
                self.schema.clone(),
            )),
            State::Streamed => return Err(streamed()),
            State::Planned(df) => {
                // Refused once the connection is closed, as collect is.
                drop(self.inner.lock(py)?);
                let df = starting_now(df.as_ref().clone());
                let stream = run::run(py, Some(&self.inner.engine), async move || {
                    Ok(df.execute_stream().await?)
                })?;
                *state = State::Streamed;
                Box::new(Streaming {
                    schema: stream.schema(),
                    stream,
                })
            }
        };
        export_stream(py, reader)
    }

    /// The columns' names and types, as an Arrow C schema (the PyCapsule interface).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        export_schema(py, &self.schema)
    }

    /// The columns' names.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let state = lock_detached(py, &self.state)?;
        let columns = self.columns().join(", ");
        match &*state {
            State::Planned(_) => Ok(format!(
                "<batchinfer.Relation: a query not yet run ({columns})>"
            )),
            State::Streamed => Ok(format!(
                "<batchinfer.Relation: a query streamed ({columns})>"
            )),
            State::Collected(batches) => {
                let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                let mut shown = Vec::new();
                let mut left = SHOWN_ROWS;
                for batch in batches {
                    if left == 0 {
                        break;
                    }
                    let take = left.min(batch.num_rows());
                    shown.push(batch.slice(0, take));
                    left -= take;
                }
                let mut text = Vec::new();
                if let Err(e) = print_batches(&mut text, OutputFormat::Table, &self.schema, &shown)
                {
                    return Ok(format!("<batchinfer.Relation: {}>", display_error(&e)));
                }
                let mut text = String::from_utf8_lossy(&text).trim_end().to_string();
                if rows > SHOWN_ROWS {
                    text.push_str(&format!("\n({rows} rows, {SHOWN_ROWS} shown)"));
                }
                Ok(text)
            }
        }
    }
}

/// A query's rows as it runs, for a consumer that pulls them (pyarrow, polars, DuckDB).
struct Streaming {
    schema: SchemaRef,
    stream: SendableRecordBatchStream,
}

impl Iterator for Streaming {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if crate::run::exiting() {
            return Some(Err(ArrowError::ExternalError(
                "the stream ended: Python is exiting".into(),
            )));
        }
        let _working = crate::run::Working::start();
        let stream = &mut self.stream;
        let next = without_gil(move || block_on(stream.next()))?;
        Some(next.map_err(|e| {
            let message = display_error(&EngineError::DataFusion(e));
            ArrowError::ExternalError(message.into())
        }))
    }
}

impl RecordBatchReader for Streaming {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// `f()`, with the GIL released while it runs: a consumer may pull with it held, and the
/// statement may need it (to read a stream registered from Python). Attaching where this thread
/// holds it already only counts once more.
fn without_gil<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    Python::attach(|py| py.detach(f))
}

/// `future`'s output, waited for here; on a thread of its own where this one is inside an async
/// runtime already (a consumer written with one).
fn block_on<T: Send>(future: impl Future<Output = T> + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime().block_on(future);
    }
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| runtime().block_on(future));
        match waiting.join() {
            Ok(output) => output,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
