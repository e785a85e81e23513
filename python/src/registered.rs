//! Tables registered from Python. A table (pyarrow, pandas, polars) is read once, when it is
//! registered: its arrays are the caller's buffers, shared, not copied, sliced into record
//! batches of the engine's size and dealt to its partitions so that every core scores. A
//! stream (a `RecordBatchReader`) is read as the first statement that reads it runs, and only
//! by that one.

use std::sync::Arc;

use batchinfer::Error as EngineError;
use datafusion::arrow::datatypes::SchemaRef;
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
    let schema = reader.schema();
    let partitions = partitions.max(1);
    let mut dealt: Vec<Vec<RecordBatch>> = vec![Vec::new(); partitions];
    let mut next = 0;
    for batch in reader {
        let batch = batch?;
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
                let read = tokio::task::spawn_blocking(move || {
                    let batch = reader.next();
                    (batch, reader)
                })
                .await;
                match read {
                    Ok((Some(batch), reader)) => Some((batch.map_err(Into::into), Some(reader))),
                    Ok((None, _)) => None,
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
