//! [`StreamingParquetExec`]: each partition reads its units on a thread of its own, a few batches
//! ahead of the query.

use std::fmt;
use std::fs::File;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::Statistics;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::parquet::arrow::arrow_reader::{
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowSelection, RowSelector,
};
use datafusion::parquet::errors::Result as ParquetResult;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::projection::Projector;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

use super::file::{ScanFile, Source};
use super::units::Unit;

/// Batches each partition's reader keeps decoded ahead of the query.
pub(super) const READ_AHEAD: usize = 2;

/// Reads local Parquet files, each partition its share of row groups (or row ranges of them),
/// page by page on a thread of its own.
#[derive(Debug)]
pub struct StreamingParquetExec {
    pub(crate) files: Arc<Vec<ScanFile>>,
    pub(crate) partitions: Vec<Vec<Unit>>,
    /// The columns read, and the projection that computes the output from them (None: the
    /// columns read are the output).
    pub(crate) read_schema: SchemaRef,
    pub(crate) projector: Option<Projector>,
    pub(crate) schema: SchemaRef,
    pub(crate) batch_size: usize,
    pub(crate) properties: Arc<PlanProperties>,
    pub(crate) metrics: ExecutionPlanMetricsSet,
}

impl DisplayAs for StreamingParquetExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let files: Vec<String> = self
            .files
            .iter()
            .map(|file| file.path.display().to_string())
            .collect();
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let units: usize = self.partitions.iter().map(Vec::len).sum();
        write!(
            f,
            "StreamingParquetExec: files=[{}], columns=[{}], row groups or ranges={units}, partitions={}",
            files.join(", "),
            columns.join(", "),
            self.partitions.len()
        )
    }
}

impl ExecutionPlan for StreamingParquetExec {
    fn name(&self) -> &str {
        "StreamingParquetExec"
    }

    /// The rows it reads (known from the files' footers), for the progress line's estimate;
    /// said inexact, as it is only ever used for that.
    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        let units: Vec<&Unit> = match partition {
            Some(p) => self.partitions.get(p).into_iter().flatten().collect(),
            None => self.partitions.iter().flatten().collect(),
        };
        let rows = units.iter().map(|u| u.rows.len()).sum();
        let mut statistics = Statistics::new_unknown(&self.schema);
        statistics.num_rows = Precision::Inexact(rows);
        Ok(Arc::new(statistics))
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "StreamingParquetExec has no children".to_string(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let units = self.partitions.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!("StreamingParquetExec has no partition {partition}"))
        })?;
        let files = self.files.clone();
        let read_schema = self.read_schema.clone();
        let batch_size = self.batch_size;
        let (tx, rx) = tokio::sync::mpsc::channel(READ_AHEAD);
        let reader = tokio::task::spawn_blocking({
            move || {
                for unit in &units {
                    match read_unit(&files[unit.file], unit, batch_size, &read_schema, &tx) {
                        Ok(true) => {}
                        // The query stopped reading: so does this thread.
                        Ok(false) => return,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e));
                            return;
                        }
                    }
                }
            }
        });
        let metrics = BaselineMetrics::new(&self.metrics, partition);
        let batches = futures::stream::unfold((rx, Some(reader)), |(mut rx, reader)| async move {
            if let Some(item) = rx.recv().await {
                return Some((item, (rx, reader)));
            }
            // The reader is done; a panic in it must not pass for the end of the data.
            match reader?.await {
                Err(e) if e.is_panic() => Some((
                    Err(DataFusionError::Execution(format!(
                        "the Parquet reader failed: {e}"
                    ))),
                    (rx, None),
                )),
                _ => None,
            }
        })
        .map({
            let projector = self.projector.clone();
            move |item| {
                let batch = match &projector {
                    None => item?,
                    // Here, on the query's thread, while the reader decodes the next batches.
                    Some(projector) => projector.project_batch(&item?)?,
                };
                metrics.record_output(batch.num_rows());
                Ok(batch)
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            batches,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Sends the rows of `unit` to `tx` in batches; false when the receiver has gone.
pub(super) fn read_unit(
    file: &ScanFile,
    unit: &Unit,
    batch_size: usize,
    schema: &SchemaRef,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<bool> {
    // What the file holds cannot be read: the file's own error (opening it is not).
    let context = |e: &dyn fmt::Display| {
        DataFusionError::External(Box::new(crate::storage::unreadable::Unreadable(format!(
            "reading {}: {e}",
            file.path.display()
        ))))
    };
    let handle = Arc::new(File::open(&file.path).map_err(|e| {
        DataFusionError::Execution(format!("reading {}: {e}", file.path.display()))
    })?);
    let mut arrow = arrow_reader(file, unit, batch_size, &handle).map_err(|e| context(&e))?;
    let group = file.metadata.metadata().row_group(unit.row_group);
    let mut lists = file
        .lists
        .iter()
        .map(|list| list.open(&handle, group, unit.group_rows))
        .collect::<ParquetResult<Vec<_>>>()
        .map_err(|e| context(&e))?;
    if unit.rows.start > 0 {
        for list in &mut lists {
            list.skip(unit.rows.start).map_err(|e| context(&e))?;
        }
    }
    let mut remaining = unit.rows.len();
    while remaining > 0 {
        let batch = match &mut arrow {
            None => None,
            Some(reader) => Some(
                reader
                    .next()
                    .ok_or_else(|| context(&"the row group ended early"))?
                    .map_err(|e| context(&e))?,
            ),
        };
        let rows = batch
            .as_ref()
            .map_or(batch_size.min(remaining), RecordBatch::num_rows);
        if rows == 0 || rows > remaining {
            return Err(context(&"the row group's batches do not add up"));
        }
        let list_arrays = lists
            .iter_mut()
            .map(|list| list.read(rows))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| context(&e))?;
        let columns = file
            .columns
            .iter()
            .map(|source| match (source, &batch) {
                (Source::Arrow(i), Some(batch)) => batch.column(*i).clone(),
                (Source::List(i), _) => list_arrays[*i].clone(),
                (Source::Arrow(_), None) => unreachable!("arrow columns come with a mask"),
            })
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| context(&e))?;
        if tx.blocking_send(Ok(batch)).is_err() {
            return Ok(false);
        }
        remaining -= rows;
    }
    Ok(true)
}

/// arrow-rs's reader of the unit's rows, for the columns it reads (None: it reads none).
fn arrow_reader(
    file: &ScanFile,
    unit: &Unit,
    batch_size: usize,
    handle: &File,
) -> ParquetResult<Option<ParquetRecordBatchReader>> {
    let Some(mask) = &file.mask else {
        return Ok(None);
    };
    let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
        handle.try_clone()?,
        file.metadata.clone(),
    )
    .with_row_groups(vec![unit.row_group])
    .with_projection(mask.clone())
    .with_batch_size(batch_size);
    if unit.rows.len() < unit.group_rows {
        let mut selectors = Vec::with_capacity(3);
        if unit.rows.start > 0 {
            selectors.push(RowSelector::skip(unit.rows.start));
        }
        selectors.push(RowSelector::select(unit.rows.len()));
        if unit.rows.end < unit.group_rows {
            selectors.push(RowSelector::skip(unit.group_rows - unit.rows.end));
        }
        builder = builder.with_row_selection(RowSelection::from(selectors));
    }
    Ok(Some(builder.build()?))
}
