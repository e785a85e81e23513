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

    /// The command line or a SQL file was not usable.
    #[error("{0}")]
    Usage(String),

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
            // Planning-time mistakes read as plan errors, the way DataFusion reports its own.
            e @ (Error::UnknownModel { .. } | Error::Binding { .. }) => {
                DataFusionError::Plan(e.to_string())
            }
            e => DataFusionError::External(Box::new(e)),
        }
    }
}

/// What a panic said: its message, with where it happened when the panic hook recorded it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let said = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string());
    match LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(recorded) => recorded,
        None => said,
    }
}

/// The message and place of the last panic, as the hook [`record_panics`] saw it.
static LAST_PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Panics are recorded, not printed: the statement they end reports them as one error.
pub fn record_panics() {
    std::panic::set_hook(Box::new(|info| {
        *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.to_string());
    }));
}
