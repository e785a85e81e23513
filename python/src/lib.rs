//! `batchinfer._native`: the extension module of the Python package (`python/batchinfer/`
//! wraps it). A [`Connection`] is one batchinfer [`Engine`]; a statement runs on a thread of its
//! own with the GIL released ([`run`]); data comes in and results go out through the Arrow C
//! stream interface, without copies ([`arrow_c`], [`registered`]).

mod arrow_c;
mod errors;
mod registered;
mod relation;
mod run;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use batchinfer::config::{Device, GraphOptimization, Remote, parse_size};
use batchinfer::engine::EngineOptions;
use batchinfer::progress::Progress;
use batchinfer::{Engine, Error as EngineError};
use clap_free::value_enum;
use datafusion::common::TableReference;
use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;

use crate::errors::raise;
use crate::relation::Relation;

/// A connection: one engine, its models, warehouse and registered tables.
#[pyclass(frozen, module = "batchinfer._native")]
struct Connection {
    inner: Arc<Inner>,
}

/// What a connection and the relations it returned share.
pub(crate) struct Inner {
    engine: Engine,
    /// Held while a statement runs or a result is collected: one statement at a time on a
    /// connection (the statement at hand is the engine's), as in DuckDB.
    busy: Mutex<bool>,
    /// Where progress lines go (`progress=True`), or `Progress::Off`.
    progress: Progress,
}

impl Inner {
    /// The engine, for a statement: `Err` once the connection is closed.
    pub(crate) fn lock(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, bool>> {
        let guard = lock_detached(py, &self.busy)?;
        if *guard {
            return Err(raise(EngineError::Usage(
                "the connection is closed; batchinfer.connect() opens another".to_string(),
            )));
        }
        Ok(guard)
    }
}

#[pymethods]
impl Connection {
    #[new]
    #[pyo3(signature = (models=None, warehouse=None, *, partitions=None, sessions=None,
                        threads=None, batch_rows=None, graph_optimization="all",
                        memory_limit=None, device="cpu", remote=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        models: Option<PathBuf>,
        warehouse: Option<PathBuf>,
        partitions: Option<i64>,
        sessions: Option<i64>,
        threads: Option<i64>,
        batch_rows: Option<i64>,
        graph_optimization: &str,
        memory_limit: Option<Bound<'_, PyAny>>,
        device: &str,
        remote: Option<String>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        // "memory_limit: 'lots' is not a size ...": the option named where its message does not.
        let setting = |name: &str, e: &dyn std::fmt::Display| {
            let said = e.to_string();
            let said = match said.starts_with(name.split('_').next().unwrap_or(name)) {
                true => said,
                false => format!("{name}: {said}"),
            };
            raise(EngineError::setting(name, said))
        };
        let memory_limit = match memory_limit {
            None => None,
            Some(size) => Some(match size.extract::<usize>() {
                Ok(bytes) if bytes > 0 => bytes,
                _ => parse_size(&size.str()?.to_string_lossy())
                    .map_err(|e| setting("memory_limit", &e))?,
            }),
        };
        // A count below 1 is refused by EngineOptions::config, with the others.
        let count = |n: Option<i64>| n.map(|n| usize::try_from(n).unwrap_or(0));
        let options = EngineOptions {
            models,
            partitions: count(partitions),
            sessions: count(sessions),
            threads: count(threads),
            batch_rows: count(batch_rows),
            graph_optimization: value_enum::<GraphOptimization>(graph_optimization)
                .map_err(|e| setting("graph_optimization", &e))?,
            memory_limit,
            warehouse,
            device: Device::from_str(device).map_err(|e| setting("device", &e))?,
            remote: remote
                .map(|r| Remote::from_str(&r))
                .transpose()
                .map_err(|e| setting("remote", &e))?,
        };
        let progress = match progress {
            None => Progress::Off,
            Some(write) => Progress::To(Arc::new(move |line: &str| {
                // A progress line that cannot be shown (the interpreter exiting) is no reason to
                // stop the statement.
                Python::try_attach(|py| {
                    let _ = write.call1(py, (line,));
                });
            })),
        };
        let config = options.config().map_err(raise)?;
        let engine = run::run(py, None, async move || Engine::open(config).await)?;
        Ok(Connection {
            inner: Arc::new(Inner {
                engine,
                busy: Mutex::new(false),
                progress,
            }),
        })
    }

    /// Runs `query`'s statements in order. Every statement but a final query runs now; a final
    /// query (`SELECT`, `WITH`, `VALUES`) is planned now and runs when its result is read.
    /// Returns the last statement's result.
    fn sql(&self, py: Python<'_>, query: &str) -> PyResult<Relation> {
        let inner = &self.inner;
        let guard = inner.lock(py)?;
        let engine = &inner.engine;
        let mut statements = engine.statements(query).map_err(raise)?;
        let Some(last) = statements.pop() else {
            return Err(raise(EngineError::Statement(
                "no statement to run: the text holds none".to_string(),
            )));
        };
        let mut warnings = Vec::new();
        for statement in statements {
            run::collect(py, inner, run::Work::Statement(statement), &mut warnings)?;
        }
        let result = if last.is_query() {
            let df = run::run(py, Some(engine), async || engine.run(last).await)?;
            Relation::planned(inner.clone(), df)
        } else {
            let report = run::collect(py, inner, run::Work::Statement(last), &mut warnings)?;
            Relation::collected(inner.clone(), report.schema, report.batches)
        };
        drop(guard);
        run::warn(py, &warnings)?;
        Ok(result)
    }

    /// Registers `data` (an object with `__arrow_c_stream__`) as the table `name`, in place of
    /// any registered before under that name. `once`: a stream read by the first statement
    /// that reads the table (a `RecordBatchReader`); else read now, its buffers shared, not
    /// copied, and read again by every statement.
    #[pyo3(signature = (name, data, once=false))]
    fn register(
        &self,
        py: Python<'_>,
        name: &str,
        data: &Bound<'_, PyAny>,
        once: bool,
    ) -> PyResult<()> {
        let inner = &self.inner;
        let _guard = inner.lock(py)?;
        check_table_name(name)?;
        let stream = arrow_c::import_stream(data)?;
        let engine = &inner.engine;
        let provider = if once {
            registered::once(name, stream)
        } else {
            let config = engine.config();
            let (partitions, rows) = (config.partitions(), config.batch_size);
            py.detach(move || registered::shared(stream, partitions, rows))
                .map_err(raise)?
        };
        let ctx = engine.context();
        let reference = TableReference::bare(name);
        ctx.deregister_table(reference.clone())
            .map_err(|e| raise(e.into()))?;
        ctx.register_table(reference, provider)
            .map_err(|e| raise(e.into()))?;
        Ok(())
    }

    /// Removes the table `name` registered by `register`; a name not registered is no error.
    fn unregister(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let _guard = self.inner.lock(py)?;
        check_table_name(name)?;
        let ctx = self.inner.engine.context();
        ctx.deregister_table(TableReference::bare(name))
            .map_err(|e| raise(e.into()))?;
        Ok(())
    }

    /// Closes the connection: later statements are refused. Results already read stay.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        *lock_detached(py, &self.inner.busy)? = true;
        Ok(())
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(*lock_detached(py, &self.inner.busy)?)
    }
}

/// `mutex` locked, waiting for it with the GIL released: the thread that holds it may be running
/// a statement that needs the GIL (a stream read from Python, a buffer of Python's released).
/// Ctrl-C stops the wait.
pub(crate) fn lock_detached<'a, T: Send>(
    py: Python<'_>,
    mutex: &'a Mutex<T>,
) -> PyResult<MutexGuard<'a, T>> {
    loop {
        if let Some(guard) = mutex.try_lock() {
            return Ok(guard);
        }
        // Waits until it is free (or a while), then takes it with the GIL held.
        py.detach(|| drop(mutex.try_lock_for(std::time::Duration::from_millis(100))));
        py.check_signals()?;
    }
}

/// A registered table's name: not empty, and of at most 255 bytes.
fn check_table_name(name: &str) -> PyResult<()> {
    if name.is_empty() || name.len() > 255 {
        return Err(raise(EngineError::Usage(format!(
            "'{name}' cannot name a table: a name has 1 to 255 bytes"
        ))));
    }
    Ok(())
}

/// Parsing without clap's derive: a value of a `clap::ValueEnum`, case-insensitive.
mod clap_free {
    /// A text that is none of an enum's values, and its values.
    #[derive(Debug, thiserror::Error)]
    #[error("'{text}' is not one of {}", .values.join(", "))]
    pub struct NotOneOf {
        text: String,
        values: Vec<String>,
    }

    pub fn value_enum<T: clap::ValueEnum>(text: &str) -> Result<T, NotOneOf> {
        T::from_str(text, true).map_err(|_| NotOneOf {
            text: text.to_string(),
            values: T::value_variants()
                .iter()
                .filter_map(|v| v.to_possible_value().map(|p| p.get_name().to_string()))
                .collect(),
        })
    }
}

/// Stops every statement running in the process and waits (up to 10 s) for them to end: the
/// package calls it as Python exits, so that none is left calling into an interpreter that is
/// gone.
#[pyfunction]
fn stop_all(py: Python<'_>) {
    run::wait_for_work(py, std::time::Duration::from_secs(10));
}

/// A worker reading PDFs for the engine of another Python process: serves until its input
/// ends, then ends the process.
#[pyfunction]
fn _pdf_worker() {
    let code = batchinfer::documents::worker::serve();
    std::process::exit(if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    });
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    run::start_runtime()?;
    // What the engine says (a model created, a view refreshed, warnings) goes to sys.stderr,
    // which a notebook shows; the process's own stderr where that cannot be written.
    batchinfer::message::say_to(Arc::new(|line: &str| {
        let said = Python::try_attach(|py| {
            py.import("sys").and_then(|sys| {
                let stderr = sys.getattr("stderr")?;
                stderr.call_method1("write", (format!("{line}\n"),))?;
                stderr.call_method0("flush").map(drop)
            })
        });
        if !matches!(said, Some(Ok(_))) {
            eprintln!("{line}");
        }
    }));
    m.add_function(wrap_pyfunction!(stop_all, m)?)?;
    m.add_function(wrap_pyfunction!(_pdf_worker, m)?)?;
    // PDFs are read by workers: this Python, started again to run `_pdf_worker` from the
    // package this one was imported from.
    let sys = m.py().import("sys")?;
    let python: String = sys.getattr("executable")?.extract()?;
    let package: Option<String> = sys
        .getattr("modules")?
        .get_item("batchinfer")
        .and_then(|package| package.getattr("__file__"))
        .and_then(|file| file.extract())
        .ok();
    if let Some(package) = package.filter(|_| !python.is_empty()) {
        let folder = std::path::Path::new(&package)
            .parent()
            .and_then(|p| p.parent())
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        // A JSON string is a Python string literal.
        let folder = serde_json::to_string(&folder).unwrap_or_default();
        batchinfer::documents::worker::started_by(vec![
            python.into(),
            "-c".into(),
            format!(
                "import sys; sys.path.insert(0, {folder}); import batchinfer._native as n; \
                 n._pdf_worker()"
            )
            .into(),
        ]);
    }
    m.add_class::<Connection>()?;
    m.add_class::<Relation>()?;
    errors::add(m)?;
    Ok(())
}
