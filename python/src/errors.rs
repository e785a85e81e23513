//! batchinfer's errors as Python exceptions: `batchinfer.Error`, and a subclass for each kind a
//! caller branches on ([`batchinfer::error::Kind`]). The message is the one the command line
//! prints.

use batchinfer::Error as EngineError;
use batchinfer::error::Kind;
use batchinfer::message::display_error;
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    batchinfer,
    Error,
    PyException,
    "A statement failed; the message says what, and what was expected."
);
create_exception!(
    batchinfer,
    ModelError,
    Error,
    "A model is unknown, cannot be loaded, or failed as it ran (an endpoint model too)."
);
create_exception!(
    batchinfer,
    InputError,
    Error,
    "The data given to a model does not fit it, or more rows failed than the error budget allows."
);
create_exception!(
    batchinfer,
    StorageError,
    Error,
    "A store, file, database or the warehouse could not be read or written."
);
create_exception!(
    batchinfer,
    CancelledError,
    Error,
    "The statement was stopped (Ctrl-C); nothing it wrote was kept."
);

/// The Python exception for `error`, with the command line's message.
pub fn raise(error: EngineError) -> PyErr {
    let message = display_error(&error);
    match error.kind() {
        Kind::Model => ModelError::new_err(message),
        Kind::Input => InputError::new_err(message),
        Kind::Storage => StorageError::new_err(message),
        Kind::Cancelled => CancelledError::new_err(message),
        _ => Error::new_err(message),
    }
}

/// The exceptions, as the module's `Error`, `ModelError`, ...
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("ModelError", py.get_type::<ModelError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    Ok(())
}
