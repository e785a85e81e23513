//! The plan rule that puts [`StreamingParquetExec`] in place of DataFusion's scan of local
//! Parquet files, where the rows are the same by construction.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::parquet::basic::Encoding;
use datafusion::parquet::file::metadata::RowGroupMetaData;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::projection::{ProjectionExprs, Projector};
use datafusion::physical_expr::utils::reassign_expr_columns;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, Partitioning, PlanProperties,
};

use crate::config::BatchInferOptions;
use crate::scan::StreamingParquetExec;
use crate::scan::file::ScanFile;
use crate::scan::units::{Unit, deal, split_for};

/// The plan rule: local Parquet scans become [`StreamingParquetExec`] where that is safe.
#[derive(Debug, Default)]
pub struct StreamingParquetRule;

impl PhysicalOptimizerRule for StreamingParquetRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = config
            .extensions
            .get::<BatchInferOptions>()
            .is_none_or(|options| options.streaming_scan);
        if !enabled {
            return Ok(plan);
        }
        plan.transform_up(
            |node| match StreamingParquetExec::replacing(&node, config) {
                Some(scan) => Ok(Transformed::yes(Arc::new(scan) as Arc<dyn ExecutionPlan>)),
                None => Ok(Transformed::no(node)),
            },
        )
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "batchinfer_streaming_parquet"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

impl StreamingParquetExec {
    /// The scan that reads what `node` reads, or None when `node` is not a local Parquet scan
    /// this reader gives the same rows for.
    pub(super) fn replacing(node: &Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Option<Self> {
        let exec = node.downcast_ref::<DataSourceExec>()?;
        let (scan, source) = exec.downcast_to_file_source::<ParquetSource>()?;
        if !crate::storage::is_local_store(&scan.object_store_url)
            || source.filter().is_some()
            || scan.limit.is_some()
            || scan.preserve_order
            || !scan.output_ordering.is_empty()
            || scan.output_partitioning.is_some()
            || !scan.table_partition_cols().is_empty()
        {
            return None;
        }
        let partitions = node.output_partitioning().partition_count().max(1);
        let table = scan.file_schema().clone();
        let output = node.schema();
        let (names, read_schema, projector) =
            columns_to_read(&table, source.projection(), &output)?;
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let footer_cap = config
            .extensions
            .get::<BatchInferOptions>()
            .map_or(crate::storage::footer::DEFAULT_MAX_FOOTER_BYTES, |o| {
                o.max_footer_bytes
            });
        let files = files_of(scan, &table, &names, &read_schema, footer_cap)?;
        let batch_size = scan
            .batch_size
            .unwrap_or(config.execution.batch_size.get())
            .max(1);
        let units = split_for(units_of(&files)?, partitions, batch_size);
        let partitions = deal(units, partitions);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(output.clone()),
            Partitioning::UnknownPartitioning(partitions.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Some(Self {
            files: Arc::new(files),
            partitions,
            read_schema,
            projector,
            schema: output,
            batch_size,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

/// The names of the table's columns to read, their schema as read, and the projection that
/// computes the output from them (None: the columns read are the output). DataFusion pushes a
/// projection's expressions, `predict(...)` among them, into the scan; one that only picks
/// columns is a list of columns to read.
fn columns_to_read(
    table: &SchemaRef,
    projection: Option<&ProjectionExprs>,
    output: &SchemaRef,
) -> Option<(Vec<String>, SchemaRef, Option<Projector>)> {
    let (indices, projection) = match projection {
        None => ((0..table.fields().len()).collect(), None),
        Some(projection) => {
            let columns: Option<Vec<usize>> = projection
                .iter()
                .map(|e| e.expr.downcast_ref::<Column>().map(|c| c.index()))
                .collect();
            match columns {
                Some(columns) => (columns, None),
                None => (projection.column_indices(), Some(projection.clone())),
            }
        }
    };
    if indices.is_empty() {
        return None;
    }
    let read_fields: Vec<Field> = indices
        .iter()
        .map(|&i| table.fields().get(i).map(|f| f.as_ref().clone()))
        .collect::<Option<_>>()?;
    let names = read_fields.iter().map(|f| f.name().clone()).collect();
    match projection {
        None if indices.len() == output.fields().len() => Some((names, output.clone(), None)),
        None => None,
        Some(projection) => {
            let read_schema = Arc::new(Schema::new(read_fields));
            let projector = projection
                .try_map_exprs(|e| reassign_expr_columns(e, &read_schema))
                .and_then(|p| p.make_projector_with_schema_metadata(&read_schema, output))
                .ok()
                .filter(|p| p.output_schema() == output)?;
            Some((names, read_schema, Some(projector)))
        }
    }
}

/// Each file of the scan once, opened to read `names` typed as `read_schema`; None when one of
/// them cannot be read so (or carries partition values or access plans).
fn files_of(
    scan: &FileScanConfig,
    table: &SchemaRef,
    names: &[&str],
    read_schema: &SchemaRef,
    footer_cap: u64,
) -> Option<Vec<ScanFile>> {
    let mut locations = Vec::new();
    for file in scan.file_groups.iter().flat_map(|g| g.iter()) {
        if !file.extensions.is_empty() || !file.partition_values.is_empty() {
            return None;
        }
        if !locations.contains(&file.object_meta.location) {
            locations.push(file.object_meta.location.clone());
        }
    }
    locations
        .iter()
        .map(|location| {
            let path = crate::storage::local_file(location)?;
            ScanFile::open(path, table, names, read_schema, footer_cap)
        })
        .collect()
}

/// Every row group with rows, whole: whether it may be split into ranges is decided here.
fn units_of(files: &[ScanFile]) -> Option<Vec<Unit>> {
    let mut units = Vec::new();
    for (f, file) in files.iter().enumerate() {
        for (g, group) in file.metadata.metadata().row_groups().iter().enumerate() {
            let rows = usize::try_from(group.num_rows()).ok()?;
            if rows > 0 {
                units.push(Unit {
                    file: f,
                    row_group: g,
                    rows: 0..rows,
                    group_rows: rows,
                    splittable: skips_safely(group),
                });
            }
        }
    }
    Some(units)
}

/// Whether a row group can be read from a row inside it: arrow-rs's skip fails on some valid
/// DELTA_BINARY_PACKED columns ("delta*n overflow in skip"), so one with DELTA_* columns is not.
fn skips_safely(group: &RowGroupMetaData) -> bool {
    group.columns().iter().all(|column| {
        !column.encodings().any(|e| {
            matches!(
                e,
                Encoding::DELTA_BINARY_PACKED
                    | Encoding::DELTA_LENGTH_BYTE_ARRAY
                    | Encoding::DELTA_BYTE_ARRAY
            )
        })
    })
}
