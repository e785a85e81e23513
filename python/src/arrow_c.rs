//! The Arrow PyCapsule interface: a stream taken from any object with `__arrow_c_stream__`
//! (pyarrow, pandas through pyarrow, polars, DuckDB, ...), and streams and schemas handed out
//! as capsules. Arrays cross without a copy: each side keeps the other's buffers alive until it
//! releases them.

use std::ffi::CStr;

use batchinfer::Error as EngineError;
use datafusion::arrow::datatypes::Schema;
use datafusion::arrow::ffi::FFI_ArrowSchema;
use datafusion::arrow::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use datafusion::arrow::record_batch::RecordBatchReader;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::errors::raise;

const STREAM: &CStr = c"arrow_array_stream";
const SCHEMA: &CStr = c"arrow_schema";

/// The stream `data.__arrow_c_stream__()` gives.
pub fn import_stream(data: &Bound<'_, PyAny>) -> PyResult<ArrowArrayStreamReader> {
    let not_arrow = || {
        raise(EngineError::Usage(format!(
            "a {} is not data batchinfer can read: register takes a pyarrow Table, \
             RecordBatch or RecordBatchReader, a pandas or polars DataFrame, or any object with \
             __arrow_c_stream__",
            data.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )))
    };
    if !data.hasattr("__arrow_c_stream__")? {
        return Err(not_arrow());
    }
    let capsule = data.call_method1("__arrow_c_stream__", (data.py().None(),))?;
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| not_arrow())?;
    let pointer = capsule
        .pointer_checked(Some(STREAM))
        .map_err(|_| not_arrow())?;
    // SAFETY: a capsule named "arrow_array_stream" holds an ArrowArrayStream (the interface's
    // contract); from_raw moves it out and leaves it released, so that the capsule's destructor
    // does not release it again.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(pointer.as_ptr().cast()) };
    ArrowArrayStreamReader::try_new(stream).map_err(|e| raise(e.into()))
}

/// `reader` as a capsule for `__arrow_c_stream__`.
pub fn export_stream<'py>(
    py: Python<'py>,
    reader: Box<dyn RecordBatchReader + Send>,
) -> PyResult<Bound<'py, PyCapsule>> {
    PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(reader), STREAM)
}

/// `schema` as a capsule for `__arrow_c_schema__`.
pub fn export_schema<'py>(py: Python<'py>, schema: &Schema) -> PyResult<Bound<'py, PyCapsule>> {
    let schema = FFI_ArrowSchema::try_from(schema).map_err(|e| raise(e.into()))?;
    PyCapsule::new_with_value(py, schema, SCHEMA)
}
