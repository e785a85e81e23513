//! Tables registered from Python. A table (pyarrow, pandas, polars) is read once, when it is
//! registered: its arrays are the caller's buffers, shared, not copied, sliced into record
//! batches of the engine's size and dealt to its partitions so that every core scores. A
//! stream (a `RecordBatchReader`) is read as the first statement that reads it runs, and only
//! by that one.

use std::sync::Arc;

use batchinfer::Error as EngineError;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Float32Type, Float64Type, Schema, SchemaRef,
};
use datafusion::arrow::ffi_stream::ArrowArrayStreamReader;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchReader};
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::datasource::MemTable;
use datafusion::execution::TaskContext;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;
use parking_lot::Mutex;

/// A table's batches, read now, as a table of `partitions` partitions of batches of at most
/// `rows` rows (slices: no copy).
pub fn shared(
    reader: ArrowArrayStreamReader,
    partitions: usize,
    rows: usize,
) -> batchinfer::Result<Arc<dyn TableProvider>> {
    let (schema, nan_columns) = nan_is_null(&reader.schema());
    let partitions = partitions.max(1);
    let mut dealt: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions];
    let mut next = 0;
    for batch in reader {
        let batch = with_nan_as_null(batch?, &schema, &nan_columns)?;
        let mut offset = 0;
        while offset < batch.num_rows() {
            let length = rows.min(batch.num_rows() - offset);
            dealt[next % partitions].push(batch.slice(offset, length));
            next += 1;
            offset += length;
        }
    }
    Ok(Arc::new(MemTable::try_new(schema, dealt)?))
}

/// The schema metadata the Python package names a pandas DataFrame's float columns in (their
/// positions, comma-separated): shared as they are, their NaN is a missing value, made NULL here.
const NAN_IS_NULL: &str = "batchinfer.nan_is_null";

/// `schema` without [`NAN_IS_NULL`], and the float columns it named.
fn nan_is_null(schema: &SchemaRef) -> (SchemaRef, Vec<usize>) {
    let mut metadata = schema.metadata().clone();
    let Some(named) = metadata.remove(NAN_IS_NULL) else {
        return (schema.clone(), Vec::new());
    };
    let columns = named
        .split(',')
        .filter_map(|p| p.trim().parse::<usize>().ok())
        .filter(|&p| {
            p < schema.fields().len()
                && matches!(
                    schema.field(p).data_type(),
                    DataType::Float32 | DataType::Float64
                )
        })
        .collect();
    let schema = Schema::new_with_metadata(schema.fields().clone(), metadata);
    (Arc::new(schema), columns)
}

/// `batch` in `schema`, the NaN of `columns` made NULL: their values shared, a validity bitmap
/// added where one is NaN. The columns are looked at on every core.
fn with_nan_as_null(
    batch: RecordBatch,
    schema: &SchemaRef,
    columns: &[usize],
) -> batchinfer::Result<RecordBatch> {
    let mut arrays = batch.columns().to_vec();
    if !columns.is_empty() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_thread = columns.len().div_ceil(cores);
        let converted: Vec<(usize, ArrayRef)> = std::thread::scope(|scope| {
            let workers: Vec<_> = columns
                .chunks(per_thread)
                .map(|chunk| {
                    let arrays = &arrays;
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|&c| (c, nan_as_null(&arrays[c])))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| match w.join() {
                    Ok(converted) => converted,
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect()
        });
        for (c, array) in converted {
            arrays[c] = array;
        }
    }
    Ok(RecordBatch::try_new(schema.clone(), arrays)?)
}

/// A float column's NaN as NULL (the column itself where it has none).
fn nan_as_null(array: &ArrayRef) -> ArrayRef {
    fn convert<T: ArrowPrimitiveType>(
        array: &ArrayRef,
        nan: impl Fn(T::Native) -> bool,
    ) -> ArrayRef {
        let values = array.as_primitive::<T>();
        if !values.values().iter().any(|&v| nan(v)) {
            return array.clone();
        }
        let valid = BooleanBuffer::collect_bool(values.len(), |i| !nan(values.values()[i]));
        let nulls = NullBuffer::union(values.nulls(), Some(&NullBuffer::new(valid)));
        Arc::new(PrimitiveArray::<T>::new(values.values().clone(), nulls))
    }
    match array.data_type() {
        DataType::Float32 => convert::<Float32Type>(array, f32::is_nan),
        DataType::Float64 => convert::<Float64Type>(array, f64::is_nan),
        _ => array.clone(),
    }
}

/// A stream, read by the first statement that reads it.
pub fn once(name: &str, reader: ArrowArrayStreamReader) -> Arc<dyn TableProvider> {
    let schema = reader.schema();
    let stream = Arc::new(Once {
        name: name.to_string(),
        schema: schema.clone(),
        reader: Mutex::new(Some(reader)),
    });
    // One partition: the stream's order is kept, and read once.
    Arc::new(
        StreamingTable::try_new(schema, vec![stream])
            .expect("the partition has the table's schema"),
    )
}

/// The partition of a stream registered once.
struct Once {
    name: String,
    schema: SchemaRef,
    reader: Mutex<Option<ArrowArrayStreamReader>>,
}

impl std::fmt::Debug for Once {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream registered as '{}'", self.name)
    }
}

impl PartitionStream for Once {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let reader = self.reader.lock().take();
        let stream = match reader {
            // Each batch read on a blocking thread: reading may wait on Python (a generator
            // behind a RecordBatchReader), which takes the GIL.
            Some(reader) => futures::stream::unfold(Some(reader), |reader| async move {
                let mut reader = reader?;
                let working = crate::run::Working::start();
                let read = tokio::task::spawn_blocking(move || {
                    let batch = reader.next();
                    // Counted until the reader is dropped too (releasing it calls into Python),
                    // wherever that happens: a statement dropped leaves it to this thread.
                    (batch, reader, working)
                })
                .await;
                match read {
                    Ok((Some(batch), reader, _)) => Some((batch.map_err(Into::into), Some(reader))),
                    Ok((None, _, _)) => None,
                    Err(e) => Some((
                        Err(datafusion::error::DataFusionError::External(Box::new(e))),
                        None,
                    )),
                }
            })
            .boxed(),
            None => {
                let read = EngineError::Usage(format!(
                    "the stream registered as '{}' was read by an earlier statement, and a \
                     stream is read once: register it again, or register a table (a pyarrow \
                     Table, a pandas or polars DataFrame), which every statement can read",
                    self.name
                ));
                futures::stream::once(async move { Err(read.into()) }).boxed()
            }
        };
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), stream))
    }
}
