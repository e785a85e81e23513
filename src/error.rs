//! The crate's one error type, and its conversions to and from DataFusion's.
//!
//! Errors raised inside `predict` travel through DataFusion as `DataFusionError`; the messages are
//! written for a person at a terminal: which model, which input, what was expected, what was given
//! ([`crate::message`] unwraps DataFusion's layers for printing).

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Everything that can go wrong in batchinfer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ONNX Runtime library could not be found, fetched or loaded.
    #[error("ONNX Runtime is not available: {0}")]
    Runtime(String),

    /// `predict('name', ...)` named a model that is not registered.
    #[error("unknown model '{name}'; {available}")]
    UnknownModel { name: String, available: String },

    /// A model file could not be read or is not a model ONNX Runtime accepts.
    #[error("model '{model}' could not be loaded from {path}: {message}")]
    ModelLoad {
        model: String,
        path: String,
        message: String,
    },

    /// The columns given to a model do not fit its inputs (a planning-time error).
    #[error("model '{model}': {message}")]
    Binding { model: String, message: String },

    /// ONNX Runtime failed while running a model on a batch.
    #[error("model '{model}' failed on rows {first_row}..{end_row} of a batch: {message}")]
    Inference {
        model: String,
        first_row: usize,
        end_row: usize,
        message: String,
    },

    /// A model produced an output batchinfer cannot turn into an Arrow column.
    #[error("model '{model}', output '{output}': {message}")]
    Output {
        model: String,
        output: String,
        message: String,
    },

    /// A bug: code batchinfer runs panicked (the message says where).
    #[error("internal error (a bug, please report it): {0}")]
    Internal(String),

    /// A signal stopped the statement; what it wrote was discarded.
    #[error("cancelled by {0}: the statement stopped, and nothing it wrote was kept")]
    Cancelled(&'static str),

    /// The command line, or the terminal the shell reads, was not usable.
    #[error("{0}")]
    Usage(String),

    /// A path or URL names no place batchinfer can read or write (`problem` is the whole sentence).
    #[error("{problem}")]
    Location { location: String, problem: String },

    /// A store (S3, Google Cloud Storage, Azure, HTTP) cannot be connected or used as asked.
    #[error("{problem}")]
    Store { location: String, problem: String },

    /// The warehouse, or a folder or file of it, cannot be used.
    #[error("{problem}")]
    Warehouse { path: String, problem: String },

    /// A table cannot be created, replaced, dropped or written as the statement asks.
    #[error("{problem}")]
    Table { table: String, problem: String },

    /// A PostgreSQL or SQLite table cannot be defined or reached.
    #[error("{problem}")]
    Database {
        database: &'static str,
        table: String,
        problem: String,
    },

    /// A materialized view cannot be created, refreshed, read or dropped as the statement asks.
    #[error("{problem}")]
    View { view: String, problem: String },

    /// A model cannot be defined, replaced, dropped or quantized as the statement asks.
    #[error("{problem}")]
    Model { model: String, problem: String },

    /// A setting or an option has a value batchinfer cannot use.
    #[error("{problem}")]
    Setting { name: String, problem: String },

    /// A statement asks for what batchinfer does not do (its shape, not its data).
    #[error("{0}")]
    Statement(String),

    /// More bytes or rows than batchinfer reads or holds at once.
    #[error("{what} is {size} {unit}, {limit}")]
    TooLarge {
        what: String,
        size: u64,
        unit: &'static str,
        limit: String,
    },

    /// More rows failed than the error budget (`batchinfer.max_errors`) allows.
    #[error("{problem}")]
    ErrorBudget {
        failed: u64,
        budget: String,
        problem: String,
    },

    /// Column values that cannot be a model's input tensor, or an output that cannot be a column.
    #[error("{0}")]
    Tensor(String),

    /// A model file (its graph, its external data, its tokenizer files) that cannot be used.
    #[error("{0}")]
    ModelFile(String),

    /// An error of ONNX Runtime's, as it says it.
    #[error("{0}")]
    Onnx(#[from] ort::Error),

    /// A shared library (ONNX Runtime's, CUDA's), or the wheel or cache it comes from, that
    /// cannot be used.
    #[error("{0}")]
    Library(String),

    /// A feature's own error, which says itself what went wrong (an endpoint model's: each
    /// feature converts its errors into this or the variants above); `kind` is what callers
    /// branch on. The root error names no feature.
    #[error("{error}")]
    Feature {
        kind: Kind,
        error: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A GPU (CUDA) that was asked for cannot be used.
    #[error("{0}")]
    Gpu(String),

    /// A Parquet file could not be written.
    #[error(transparent)]
    Parquet(#[from] datafusion::parquet::errors::ParquetError),

    /// A cluster process (scheduler or executor) could not start or serve.
    #[error("cluster: {0}")]
    Cluster(#[source] Box<ballista_core::error::BallistaError>),

    /// A model definition kept in the warehouse cannot be read: the file, and what is wrong.
    #[error("{path} {problem}")]
    Definition { path: String, problem: String },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Arrow(#[from] ArrowError),

    #[error(transparent)]
    ObjectStore(#[from] object_store::Error),

    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A path or URL that names no usable place (`location` with no password in it).
    pub fn location(location: impl ToString, problem: impl Into<String>) -> Self {
        Error::Location {
            location: location.to_string(),
            problem: problem.into(),
        }
    }

    /// A store that cannot be connected or used as asked.
    pub fn store(location: impl ToString, problem: impl Into<String>) -> Self {
        Error::Store {
            location: location.to_string(),
            problem: problem.into(),
        }
    }

    /// The warehouse, or a folder or file of it, that cannot be used.
    pub fn warehouse(path: impl ToString, problem: impl Into<String>) -> Self {
        Error::Warehouse {
            path: path.to_string(),
            problem: problem.into(),
        }
    }

    /// A table that cannot be created, replaced, dropped or written.
    pub fn table(table: impl ToString, problem: impl Into<String>) -> Self {
        Error::Table {
            table: table.to_string(),
            problem: problem.into(),
        }
    }

    /// A PostgreSQL or SQLite table that cannot be defined or reached.
    pub fn database(
        database: &'static str,
        table: impl ToString,
        problem: impl Into<String>,
    ) -> Self {
        Error::Database {
            database,
            table: table.to_string(),
            problem: problem.into(),
        }
    }

    /// A materialized view that cannot be created, refreshed, read or dropped.
    pub fn view(view: impl ToString, problem: impl Into<String>) -> Self {
        Error::View {
            view: view.to_string(),
            problem: problem.into(),
        }
    }

    /// A model that cannot be defined, replaced, dropped or quantized.
    pub fn model(model: impl ToString, problem: impl Into<String>) -> Self {
        Error::Model {
            model: model.to_string(),
            problem: problem.into(),
        }
    }

    /// A setting or an option whose value cannot be used.
    pub fn setting(name: impl ToString, problem: impl Into<String>) -> Self {
        Error::Setting {
            name: name.to_string(),
            problem: problem.into(),
        }
    }

    /// An I/O error with what was being done and to which path.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<Error> for DataFusionError {
    fn from(err: Error) -> Self {
        match err {
            Error::DataFusion(e) => e,
            Error::Arrow(e) => DataFusionError::ArrowError(Box::new(e), None),
            Error::ObjectStore(e) => DataFusionError::ObjectStore(Box::new(e)),
            // Kept whole, so that its kind ([`Error::kind`]) is still known after DataFusion.
            e => DataFusionError::External(Box::new(e)),
        }
    }
}

/// What kind of failure an error is, for a caller that branches on it (Python's exception
/// classes). The innermost of batchinfer's errors decides, through DataFusion's layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A model: unknown, not loadable, failing as it runs, or its endpoint failing.
    Model,
    /// The data given to a model: columns that do not fit its inputs, values that cannot be its
    /// tensors, more than batchinfer holds at once, more failed rows than the error budget.
    Input,
    /// A store, a file, a database or the warehouse could not be read or written.
    Storage,
    /// Stopped by a signal (Ctrl-C); nothing the statement wrote was kept.
    Cancelled,
    /// Anything else: SQL that does not parse or plan, a setting, a table or view missing.
    Other,
}

impl Error {
    /// What kind of failure this is ([`Kind`]).
    pub fn kind(&self) -> Kind {
        match self {
            Error::UnknownModel { .. }
            | Error::ModelLoad { .. }
            | Error::Inference { .. }
            | Error::Output { .. }
            | Error::Model { .. }
            | Error::ModelFile(_)
            | Error::Onnx(_)
            | Error::Runtime(_)
            | Error::Gpu(_) => Kind::Model,
            Error::Feature { kind, .. } => *kind,
            Error::Binding { .. }
            | Error::Tensor(_)
            | Error::TooLarge { .. }
            | Error::ErrorBudget { .. } => Kind::Input,
            Error::Location { .. }
            | Error::Store { .. }
            | Error::Warehouse { .. }
            | Error::ObjectStore(_)
            | Error::Io { .. }
            | Error::Database { .. }
            | Error::Parquet(_) => Kind::Storage,
            Error::Cancelled(_) => Kind::Cancelled,
            Error::DataFusion(e) => datafusion_kind(e),
            Error::Arrow(ArrowError::ExternalError(inner)) => external_kind(inner.as_ref()),
            _ => Kind::Other,
        }
    }
}

fn datafusion_kind(e: &DataFusionError) -> Kind {
    match e {
        DataFusionError::External(inner) => external_kind(inner.as_ref()),
        DataFusionError::ArrowError(arrow, _) => match arrow.as_ref() {
            ArrowError::ExternalError(inner) => external_kind(inner.as_ref()),
            _ => Kind::Other,
        },
        DataFusionError::ObjectStore(_)
        | DataFusionError::IoError(_)
        | DataFusionError::ParquetError(_) => Kind::Storage,
        DataFusionError::Context(_, inner) | DataFusionError::Diagnostic(_, inner) => {
            datafusion_kind(inner)
        }
        DataFusionError::Shared(inner) => datafusion_kind(inner),
        _ => Kind::Other,
    }
}

fn external_kind(inner: &(dyn std::error::Error + Send + Sync + 'static)) -> Kind {
    if let Some(e) = inner.downcast_ref::<Error>() {
        e.kind()
    } else if let Some(e) = inner.downcast_ref::<DataFusionError>() {
        datafusion_kind(e)
    } else if inner.downcast_ref::<object_store::Error>().is_some() {
        Kind::Storage
    } else {
        Kind::Other
    }
}

/// What a panic said: its message, with where it happened when the panic hook recorded it on
/// this thread (a statement's panic is caught on the thread it happened on; one caught
/// elsewhere, a spawned task's, is told by its message alone).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let said = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string());
    match LAST_PANIC.with(|last| last.take()) {
        Some(recorded) if recorded.contains(&said) => recorded,
        _ => said,
    }
}

thread_local! {
    /// The message and place of the last panic on this thread, as the hook [`record_panics`]
    /// saw it: each statement's own, whatever panics on other threads.
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Panics are recorded, not printed: the statement they end reports them as one error.
pub fn record_panics() {
    std::panic::set_hook(Box::new(|info| {
        let _ = LAST_PANIC.try_with(|last| *last.borrow_mut() = Some(info.to_string()));
    }));
}
