//! batchinfer's reader for local Parquet files.
//!
//! DataFusion's Parquet reader is asynchronous: for each row group it fetches every projected
//! column chunk whole before decoding (a 1M-row group of ten float columns is 44 MB), so each
//! partition holds a row group in memory, and a file of one row group is read by one partition
//! while the others idle. For local files batchinfer reads with arrow-rs's synchronous reader
//! instead, which streams each column chunk page by page from the file, on a blocking thread
//! per partition that keeps up to two batches ready ahead of the query (decoding overlaps the
//! model). Row groups are dealt to the partitions by rows; when there are fewer row groups than
//! partitions, row groups are split into row ranges (pages before a range are skipped unread).
//!
//! `FixedSizeList` columns of numbers whose statistics count no NULLs are read as flat columns of
//! their values ([`FullListPages`]): their levels are checked page by page, never decoded.
//!
//! The plan rule swaps a `DataSourceExec` over Parquet for this scan only when the result is the
//! same by construction: local files, no pushed-down predicate, limit, declared ordering,
//! partition columns or per-file access plans, and every file readable with the table's column
//! types. A projection the scan carries (DataFusion pushes `predict(...)` into it) is evaluated
//! on the query's thread. Anything else keeps DataFusion's reader (`SET
//! batchinfer.streaming_scan = false` keeps it always).

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, ArrowPrimitiveType, FixedSizeListArray, PrimitiveArray};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::datatypes::{
    ArrowNativeType, DataType, Field, FieldRef, Float32Type, Float64Type, Int32Type, Int64Type,
    Schema, SchemaRef,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::{FileSource, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use datafusion::parquet::basic::{Encoding, PageType, Type as PhysicalType};
use datafusion::parquet::column::page::{Page, PageMetadata, PageReader};
use datafusion::parquet::column::reader::{ColumnReader, ColumnReaderImpl, get_column_reader};
use datafusion::parquet::data_type::DataType as ParquetDataType;
use datafusion::parquet::errors::{ParquetError, Result as ParquetResult};
use datafusion::parquet::file::metadata::RowGroupMetaData;
use datafusion::parquet::file::serialized_reader::SerializedPageReader;
use datafusion::parquet::schema::types::ColumnDescriptor;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::projection::Projector;
use datafusion::physical_expr::utils::reassign_expr_columns;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;
use object_store::local::LocalFileSystem;

use crate::config::BatchInferOptions;

/// Batches each partition's reader keeps decoded ahead of the query.
const READ_AHEAD: usize = 2;

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

/// One file as this scan reads it.
#[derive(Debug)]
struct ScanFile {
    path: PathBuf,
    /// Footer metadata, with the table's column types as the schema to read.
    metadata: ArrowReaderMetadata,
    /// The file's top-level columns arrow-rs's reader reads (None: none).
    mask: Option<ProjectionMask>,
    /// The `FixedSizeList` columns read by [`ListReader`] instead.
    lists: Vec<ListColumn>,
    /// Where each column read comes from.
    columns: Vec<Source>,
}

/// Where a column read comes from: arrow-rs's batch (its position there) or a list reader.
#[derive(Debug, Clone, Copy)]
enum Source {
    Arrow(usize),
    List(usize),
}

/// A `FixedSizeList` column whose values are never NULL (per the footer's statistics), read
/// straight from its Parquet leaf as a flat column of values (levels checked, not decoded), the
/// values handed over as the list's child without another pass. arrow-rs's general list reader
/// builds validity bitmaps and walks every level for lists of any shape, 2.5x the time.
#[derive(Debug, Clone)]
struct ListColumn {
    leaf: usize,
    size: usize,
    item: FieldRef,
}

/// Rows `rows` of row group `row_group` of file `file`.
#[derive(Debug, Clone)]
struct Unit {
    file: usize,
    row_group: usize,
    rows: Range<usize>,
    /// All rows of the row group.
    group_rows: usize,
    /// Whether the row group may be split into row ranges: reading a range that starts inside
    /// it skips the rows before, and arrow-rs's skip fails on some valid DELTA_BINARY_PACKED
    /// columns ("delta*n overflow in skip"), so a row group with delta-encoded columns is read
    /// whole, by one partition.
    splittable: bool,
}

/// Reads local Parquet files, each partition its share of row groups (or row ranges of them),
/// page by page on a thread of its own.
#[derive(Debug)]
pub struct StreamingParquetExec {
    files: Arc<Vec<ScanFile>>,
    partitions: Vec<Vec<Unit>>,
    /// The columns read, and the projection that computes the output from them (None: the
    /// columns read are the output).
    read_schema: SchemaRef,
    projector: Option<Projector>,
    schema: SchemaRef,
    batch_size: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl StreamingParquetExec {
    /// The scan that reads what `node` reads, or None when `node` is not a local Parquet scan
    /// this reader gives the same rows for.
    fn replacing(node: &Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Option<Self> {
        let exec = node.downcast_ref::<DataSourceExec>()?;
        let (scan, source) = exec.downcast_to_file_source::<ParquetSource>()?;
        if scan.object_store_url.as_str() != "file:///"
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
        // The table's columns to read, and the projection (DataFusion pushes a projection's
        // expressions, `predict(...)` among them, into the scan) that computes the output from
        // them, unless it only picks columns.
        let (indices, projection) = match source.projection() {
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
        let names: Vec<String> = read_fields.iter().map(|f| f.name().clone()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let (read_schema, projector) = match projection {
            None if indices.len() == output.fields().len() => (output.clone(), None),
            None => return None,
            Some(projection) => {
                let read_schema = Arc::new(Schema::new(read_fields));
                let projector = projection
                    .try_map_exprs(|e| reassign_expr_columns(e, &read_schema))
                    .and_then(|p| p.make_projector_with_schema_metadata(&read_schema, &output))
                    .ok()
                    .filter(|p| p.output_schema() == &output)?;
                (read_schema, Some(projector))
            }
        };

        let local = LocalFileSystem::new();
        let mut locations = Vec::new();
        for file in scan.file_groups.iter().flat_map(|g| g.iter()) {
            if !file.extensions.is_empty() || !file.partition_values.is_empty() {
                return None;
            }
            if !locations.contains(&file.object_meta.location) {
                locations.push(file.object_meta.location.clone());
            }
        }
        let mut files = Vec::with_capacity(locations.len());
        for location in &locations {
            let path = local.path_to_filesystem(location).ok()?;
            files.push(ScanFile::open(path, &table, &names, &read_schema)?);
        }

        let mut units = Vec::new();
        for (f, file) in files.iter().enumerate() {
            for (g, group) in file.metadata.metadata().row_groups().iter().enumerate() {
                let rows = usize::try_from(group.num_rows()).ok()?;
                let splittable = group.columns().iter().all(|column| {
                    !column.encodings().any(|e| {
                        matches!(
                            e,
                            Encoding::DELTA_BINARY_PACKED
                                | Encoding::DELTA_LENGTH_BYTE_ARRAY
                                | Encoding::DELTA_BYTE_ARRAY
                        )
                    })
                });
                if rows > 0 {
                    units.push(Unit {
                        file: f,
                        row_group: g,
                        rows: 0..rows,
                        group_rows: rows,
                        splittable,
                    });
                }
            }
        }
        let batch_size = scan
            .batch_size
            .unwrap_or(config.execution.batch_size.get())
            .max(1);
        let units = split_for(units, partitions, batch_size);
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

impl ScanFile {
    /// The file at `path` read as columns `names` of `table`, typed as `output`; None when the
    /// file cannot be read that way (DataFusion's reader then reads it, and reports any error).
    fn open(path: PathBuf, table: &Schema, names: &[&str], output: &Schema) -> Option<Self> {
        let file = File::open(&path).ok()?;
        let natural = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).ok()?;
        // The file's columns with the table's types (DataFusion reads strings as views, ...).
        let fields: Vec<Field> = natural
            .schema()
            .fields()
            .iter()
            .map(|f| match table.field_with_name(f.name()) {
                Ok(t) if t.data_type() != f.data_type() => {
                    f.as_ref().clone().with_data_type(t.data_type().clone())
                }
                _ => f.as_ref().clone(),
            })
            .collect();
        let hint = Arc::new(Schema::new_with_metadata(
            fields,
            natural.schema().metadata().clone(),
        ));
        let metadata = ArrowReaderMetadata::try_new(
            natural.metadata().clone(),
            ArrowReaderOptions::new().with_schema(hint),
        )
        .ok()?;
        let schema = metadata.schema().clone();
        for (name, field) in names.iter().zip(output.fields()) {
            let read = schema.field_with_name(name).ok()?;
            if read.data_type() != field.data_type() || (read.is_nullable() && !field.is_nullable())
            {
                return None;
            }
        }
        // Roots to read, in file order; those that are lists of never-NULL numbers go to a
        // list reader.
        let name_roots: Vec<usize> = names
            .iter()
            .map(|n| schema.index_of(n).ok())
            .collect::<Option<_>>()?;
        let mut roots = name_roots.clone();
        roots.sort_unstable();
        roots.dedup();
        let mut arrow_roots = Vec::new();
        let mut lists = Vec::new();
        let mut list_roots = Vec::new();
        for &root in &roots {
            match ListColumn::for_root(&metadata, root) {
                Some(list) => {
                    lists.push(list);
                    list_roots.push(root);
                }
                None => arrow_roots.push(root),
            }
        }
        let columns: Vec<Source> = name_roots
            .iter()
            .map(|root| match arrow_roots.iter().position(|r| r == root) {
                Some(i) => Some(Source::Arrow(i)),
                None => list_roots.iter().position(|r| r == root).map(Source::List),
            })
            .collect::<Option<_>>()?;
        let mask = (!arrow_roots.is_empty())
            .then(|| ProjectionMask::roots(metadata.parquet_schema(), arrow_roots));
        Some(Self {
            path,
            metadata,
            mask,
            lists,
            columns,
        })
    }
}

impl ListColumn {
    /// Root column `root` as a list column this reader reads directly, if it is one: a
    /// `FixedSizeList` of Float32, Float64, Int32 or Int64 over one Parquet leaf, whose every
    /// row group's statistics count no NULLs (null or empty lists, null items).
    fn for_root(metadata: &ArrowReaderMetadata, root: usize) -> Option<Self> {
        let field = metadata.schema().fields().get(root)?;
        let DataType::FixedSizeList(item, size) = field.data_type() else {
            return None;
        };
        let physical = match item.data_type() {
            DataType::Float32 => PhysicalType::FLOAT,
            DataType::Float64 => PhysicalType::DOUBLE,
            DataType::Int32 => PhysicalType::INT32,
            DataType::Int64 => PhysicalType::INT64,
            _ => return None,
        };
        let parquet = metadata.parquet_schema();
        let mut leaves =
            (0..parquet.num_columns()).filter(|&l| parquet.get_column_root_idx(l) == root);
        let leaf = leaves.next()?;
        if leaves.next().is_some() {
            return None;
        }
        let column = parquet.column(leaf);
        if column.max_rep_level() != 1 || column.physical_type() != physical {
            return None;
        }
        // Levels in the RLE/bit-packed hybrid (not the long-deprecated BIT_PACKED levels).
        let no_nulls = metadata.metadata().row_groups().iter().all(|group| {
            let chunk = group.column(leaf);
            chunk.statistics().and_then(|s| s.null_count_opt()) == Some(0)
                && !chunk.encodings().any(|e| {
                    #[allow(deprecated)] // Named only to be refused.
                    let old = Encoding::BIT_PACKED;
                    e == old
                })
        });
        let size = usize::try_from(*size).ok().filter(|&s| s > 0)?;
        no_nulls.then(|| Self {
            leaf,
            size,
            item: item.clone(),
        })
    }

    /// A reader of this column in `group` (of `rows` rows) of the file `handle`.
    fn open(
        &self,
        handle: &Arc<File>,
        group: &RowGroupMetaData,
        rows: usize,
    ) -> ParquetResult<Box<dyn ListReader>> {
        let pages = SerializedPageReader::new(handle.clone(), group.column(self.leaf), rows, None)?;
        let descr = group.schema_descr().column(self.leaf);
        let pages = FullListPages::new(pages, self.size, descr.max_def_level());
        // The leaf's values as a column of their own: the pages reach it without levels.
        let flat = Arc::new(ColumnDescriptor::new(
            descr.self_type_ptr(),
            0,
            0,
            descr.path().clone(),
        ));
        let column = get_column_reader(flat, Box::new(pages));
        Ok(match column {
            ColumnReader::FloatColumnReader(r) => {
                Box::new(TypedList::<Float32Type, _>::new(self, r))
            }
            ColumnReader::DoubleColumnReader(r) => {
                Box::new(TypedList::<Float64Type, _>::new(self, r))
            }
            ColumnReader::Int32ColumnReader(r) => Box::new(TypedList::<Int32Type, _>::new(self, r)),
            ColumnReader::Int64ColumnReader(r) => Box::new(TypedList::<Int64Type, _>::new(self, r)),
            _ => {
                return Err(ParquetError::General("not a list of numbers".to_string()));
            }
        })
    }
}

/// Reads a list column's records in batches.
trait ListReader: Send {
    fn skip(&mut self, records: usize) -> Result<()>;
    fn read(&mut self, records: usize) -> Result<ArrayRef>;
}

struct TypedList<A: ArrowPrimitiveType, P: ParquetDataType> {
    column: ListColumn,
    reader: ColumnReaderImpl<P>,
    _arrow: std::marker::PhantomData<fn() -> A>,
}

impl<A: ArrowPrimitiveType, P: ParquetDataType> TypedList<A, P> {
    fn new(column: &ListColumn, reader: ColumnReaderImpl<P>) -> Self {
        Self {
            column: column.clone(),
            reader,
            _arrow: std::marker::PhantomData,
        }
    }
}

impl<A, P> ListReader for TypedList<A, P>
where
    A: ArrowPrimitiveType<Native = P::T>,
    P: ParquetDataType,
    P::T: ArrowNativeType,
{
    fn skip(&mut self, records: usize) -> Result<()> {
        let values = records * self.column.size;
        let skipped = self.reader.skip_records(values)?;
        if skipped != values {
            return Err(DataFusionError::Execution(format!(
                "list column ended after {skipped} of {values} values"
            )));
        }
        Ok(())
    }

    fn read(&mut self, records: usize) -> Result<ArrayRef> {
        let size = self.column.size;
        let want = records * size;
        let mut values: Vec<P::T> = Vec::with_capacity(want);
        while values.len() < want {
            let (n, _, _) =
                self.reader
                    .read_records(want - values.len(), None, None, &mut values)?;
            if n == 0 {
                return Err(DataFusionError::Execution(format!(
                    "list column ended after {} of {want} values",
                    values.len()
                )));
            }
        }
        let values = PrimitiveArray::<A>::new(ScalarBuffer::from(values), None);
        Ok(Arc::new(FixedSizeListArray::try_new(
            self.column.item.clone(),
            size as i32,
            Arc::new(values),
            None,
        )?))
    }
}

/// With fewer row groups than partitions, each is split into row ranges (of at least a batch)
/// so that every partition has rows to read.
fn split_for(units: Vec<Unit>, partitions: usize, batch_size: usize) -> Vec<Unit> {
    if units.is_empty() || units.len() >= partitions {
        return units;
    }
    let pieces = partitions.div_ceil(units.len());
    let mut out = Vec::with_capacity(units.len() * pieces);
    for unit in units {
        if !unit.splittable {
            out.push(unit);
            continue;
        }
        let len = unit.rows.len().div_ceil(pieces).max(batch_size);
        let mut start = unit.rows.start;
        while start < unit.rows.end {
            let end = (start + len).min(unit.rows.end);
            out.push(Unit {
                rows: start..end,
                ..unit.clone()
            });
            start = end;
        }
    }
    out
}

/// `units` in order, in `partitions` consecutive runs of about equal rows.
fn deal(units: Vec<Unit>, partitions: usize) -> Vec<Vec<Unit>> {
    let total: usize = units.iter().map(|u| u.rows.len()).sum();
    let mut out: Vec<Vec<Unit>> = vec![Vec::new(); partitions];
    let mut done = 0;
    for unit in units {
        // The partition whose share of the rows holds this unit's middle row.
        let middle = done + unit.rows.len() / 2;
        let p = (middle * partitions / total.max(1)).min(partitions - 1);
        done += unit.rows.len();
        out[p].push(unit);
    }
    out
}

/// The pages of a list leaf as the pages of a flat column of its values, for lists that are all
/// full (`size` values, no NULLs): each data page's repetition and definition levels are checked
/// where they lie, run by run, without decoding them into memory, and cut off. A page that breaks
/// the promise is an error (the footer's statistics said there were no NULLs).
struct FullListPages<R: PageReader> {
    inner: R,
    size: usize,
    max_def: i16,
    def_width: u8,
    /// Levels of the column chunk before the next page (lists need not start on a page).
    position: usize,
    /// For each offset into a list, the 8 repetition levels from there as one bit-packed byte.
    expected: Vec<u8>,
}

impl<R: PageReader> FullListPages<R> {
    fn new(inner: R, size: usize, max_def: i16) -> Self {
        let expected = (0..size)
            .map(|offset| {
                (0..8).fold(0u8, |byte, bit| {
                    byte | (u8::from((offset + bit) % size != 0) << bit)
                })
            })
            .collect();
        Self {
            inner,
            size,
            max_def,
            def_width: (16 - (max_def as u16).leading_zeros()) as u8,
            position: 0,
            expected,
        }
    }

    fn broken(&self) -> ParquetError {
        ParquetError::General(format!(
            "a list column has NULL or short lists although the file's statistics count no \
             NULLs (expected lists of {} values); read it with SET batchinfer.streaming_scan = \
             false",
            self.size
        ))
    }

    /// Whether `reps` (bit width 1) are those of full lists for `n` levels from `self.position`.
    fn full_reps(&self, reps: &[u8], n: usize) -> bool {
        let size = self.size;
        let start = self.position;
        hybrid_runs(
            reps,
            n,
            1,
            |at, count, value| {
                let offset = (start + at) % size;
                match value {
                    0 => (offset == 0 && count == 1) || size == 1,
                    1 => offset != 0 && offset + count <= size,
                    _ => false,
                }
            },
            |at, bytes, count| {
                bytes.iter().enumerate().all(|(j, &byte)| {
                    let bits = (count - 8 * j).min(8);
                    let mask = ((1u16 << bits) - 1) as u8;
                    (byte ^ self.expected[(start + at + 8 * j) % size]) & mask == 0
                })
            },
        )
    }

    /// Whether `defs` are all the maximum definition level, for `n` levels.
    fn full_defs(&self, defs: &[u8], n: usize) -> bool {
        let (max, width) = (self.max_def as u64, self.def_width as usize);
        hybrid_runs(
            defs,
            n,
            self.def_width,
            |_, _, value| value == max,
            |_, bytes, count| {
                (0..count).all(|i| {
                    let bit = i * width;
                    let mut value = 0u64;
                    for b in 0..width {
                        let at = bit + b;
                        value |= u64::from((bytes[at / 8] >> (at % 8)) & 1) << b;
                    }
                    value == max
                })
            },
        )
    }

    fn flatten(&mut self, page: Page) -> ParquetResult<Page> {
        let page = match page {
            Page::DataPage {
                buf,
                num_values,
                encoding,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => {
                let n = num_values as usize;
                if def_level_encoding != Encoding::RLE || rep_level_encoding != Encoding::RLE {
                    return Err(self.broken());
                }
                let (reps, after_reps) = length_prefixed(&buf, 0).ok_or_else(|| self.broken())?;
                let (defs, values) =
                    length_prefixed(&buf, after_reps).ok_or_else(|| self.broken())?;
                if !self.full_reps(&buf[reps], n) || !self.full_defs(&buf[defs], n) {
                    return Err(self.broken());
                }
                self.position += n;
                Page::DataPage {
                    buf: buf.slice(values..),
                    num_values,
                    encoding,
                    def_level_encoding: Encoding::RLE,
                    rep_level_encoding: Encoding::RLE,
                    statistics: None,
                }
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                num_nulls,
                def_levels_byte_len,
                rep_levels_byte_len,
                is_compressed,
                ..
            } => {
                let n = num_values as usize;
                let reps = rep_levels_byte_len as usize;
                let defs = reps + def_levels_byte_len as usize;
                if num_nulls != 0
                    || defs > buf.len()
                    || !self.full_reps(&buf[..reps], n)
                    || !self.full_defs(&buf[reps..defs], n)
                {
                    return Err(self.broken());
                }
                self.position += n;
                Page::DataPageV2 {
                    buf: buf.slice(defs..),
                    num_values,
                    encoding,
                    num_nulls: 0,
                    num_rows: num_values,
                    def_levels_byte_len: 0,
                    rep_levels_byte_len: 0,
                    is_compressed,
                    statistics: None,
                }
            }
            dictionary => dictionary,
        };
        Ok(page)
    }
}

/// The byte range of a level stream that starts at `at` with its 4-byte length, and where the
/// next part of the page starts.
fn length_prefixed(buf: &[u8], at: usize) -> Option<(Range<usize>, usize)> {
    let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?) as usize;
    let end = (at + 4).checked_add(len).filter(|&end| end <= buf.len())?;
    Some((at + 4..end, end))
}

/// Walks the runs of an RLE/bit-packed hybrid stream of `n` values of `width` bits: `run(at,
/// count, value)` for a repeated run, `packed(at, bytes, count)` for bit-packed values (`count`
/// of them in `bytes`, padding excluded); true when the stream holds `n` values and every run
/// passes.
fn hybrid_runs(
    data: &[u8],
    n: usize,
    width: u8,
    run: impl Fn(usize, usize, u64) -> bool,
    packed: impl Fn(usize, &[u8], usize) -> bool,
) -> bool {
    let width = width as usize;
    let value_bytes = width.div_ceil(8);
    let (mut at, mut i) = (0usize, 0usize);
    while at < n {
        // ULEB128 header.
        let mut header = 0u64;
        let mut shift = 0;
        loop {
            let Some(&byte) = data.get(i) else {
                return false;
            };
            i += 1;
            header |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 56 {
                return false;
            }
        }
        let count = (header >> 1) as usize;
        if count == 0 {
            return false;
        }
        if header & 1 == 1 {
            let values = count * 8;
            let Some(bytes) = data.get(i..i + count * width) else {
                return false;
            };
            i += count * width;
            let used = values.min(n - at);
            if !packed(at, &bytes[..(used * width).div_ceil(8)], used) {
                return false;
            }
            at += used;
        } else {
            let Some(bytes) = data.get(i..i + value_bytes) else {
                return false;
            };
            i += value_bytes;
            let value = bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b));
            if at + count > n || !run(at, count, value) {
                return false;
            }
            at += count;
        }
    }
    true
}

impl<R: PageReader> Iterator for FullListPages<R> {
    type Item = ParquetResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl<R: PageReader> FullListPages<R> {
    /// Passes over data pages that hold no value (writers make them: pyarrow with small pages
    /// and one row per write). The column goes on in the next page, but a column reader that met
    /// an empty page would take it for the end of the column.
    fn skip_empty_pages(&mut self) -> ParquetResult<()> {
        while let Some(m) = self.inner.peek_next_page()?
            && !m.is_dict
            && m.num_levels == Some(0)
        {
            self.inner.skip_next_page()?;
        }
        Ok(())
    }
}

impl<R: PageReader> PageReader for FullListPages<R> {
    fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
        loop {
            match self.inner.get_next_page()? {
                None => return Ok(None),
                Some(page)
                    if page.page_type() != PageType::DICTIONARY_PAGE && page.num_values() == 0 => {}
                Some(page) => return self.flatten(page).map(Some),
            }
        }
    }

    fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
        self.skip_empty_pages()?;
        // One value per level: as many rows of the flat column as levels.
        Ok(self.inner.peek_next_page()?.map(|m| PageMetadata {
            num_rows: if m.is_dict { m.num_rows } else { m.num_levels },
            ..m
        }))
    }

    fn skip_next_page(&mut self) -> ParquetResult<()> {
        self.skip_empty_pages()?;
        if let Some(m) = self.inner.peek_next_page()?
            && !m.is_dict
        {
            self.position += m.num_levels.ok_or_else(|| self.broken())?;
        }
        self.inner.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> ParquetResult<bool> {
        Ok(true)
    }
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
fn read_unit(
    file: &ScanFile,
    unit: &Unit,
    batch_size: usize,
    schema: &SchemaRef,
    tx: &tokio::sync::mpsc::Sender<Result<RecordBatch>>,
) -> Result<bool> {
    let context = |e: &dyn fmt::Display| {
        DataFusionError::Execution(format!("reading {}: {e}", file.path.display()))
    };
    let handle = Arc::new(File::open(&file.path).map_err(|e| context(&e))?);
    let mut arrow = match &file.mask {
        None => None,
        Some(mask) => {
            let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
                handle.try_clone().map_err(|e| context(&e))?,
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
            Some(builder.build().map_err(|e| context(&e))?)
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn units(rows: &[usize]) -> Vec<Unit> {
        rows.iter()
            .enumerate()
            .map(|(g, &n)| Unit {
                file: 0,
                row_group: g,
                rows: 0..n,
                group_rows: n,
                splittable: true,
            })
            .collect()
    }

    fn covered(units: &[Unit]) -> Vec<(usize, Range<usize>)> {
        units
            .iter()
            .map(|u| (u.row_group, u.rows.clone()))
            .collect()
    }

    #[test]
    fn one_row_group_is_split_across_the_partitions() {
        let split = split_for(units(&[1_000_000]), 2, 8192);
        assert_eq!(
            covered(&split),
            vec![(0, 0..500_000), (0, 500_000..1_000_000)]
        );
        let dealt = deal(split, 2);
        assert_eq!(dealt[0].len(), 1);
        assert_eq!(dealt[1].len(), 1);
    }

    #[test]
    fn small_row_groups_are_not_split_below_a_batch() {
        let split = split_for(units(&[10_000]), 4, 8192);
        assert_eq!(covered(&split), vec![(0, 0..8192), (0, 8192..10_000)]);
    }

    /// A page reader with no pages: the level checks need only the lists' shape.
    struct NoPages;

    impl Iterator for NoPages {
        type Item = ParquetResult<Page>;
        fn next(&mut self) -> Option<Self::Item> {
            None
        }
    }

    impl PageReader for NoPages {
        fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
            Ok(None)
        }
        fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
            Ok(None)
        }
        fn skip_next_page(&mut self) -> ParquetResult<()> {
            Ok(())
        }
    }

    #[test]
    fn repetition_levels_of_full_lists_pass_and_short_lists_do_not() {
        let lists_of_3 = FullListPages::new(NoPages, 3, 1);
        // One bit-packed group (header 3), levels read from the lowest bit.
        // [0,1,1, 0,1,1]: two lists of 3.
        assert!(lists_of_3.full_reps(&[3, 0b0011_0110], 6));
        // [0,1, 0,1,1,1]: a list of 2, then one of 4.
        assert!(!lists_of_3.full_reps(&[3, 0b0011_1010], 6));
        // Repeated runs: 0 once, 1 twice (header count << 1), then a list of 3 as a run of 1s
        // that is one too long.
        assert!(lists_of_3.full_reps(&[2, 0, 4, 1, 2, 0, 4, 1], 6));
        assert!(!lists_of_3.full_reps(&[2, 0, 6, 1, 2, 0, 2, 1], 6));
        // The stream must hold all the levels.
        assert!(!lists_of_3.full_reps(&[2, 0, 4, 1], 6));
        // A page that starts inside a list.
        let mut later = FullListPages::new(NoPages, 3, 1);
        later.position = 1;
        assert!(later.full_reps(&[4, 1, 2, 0, 4, 1], 5));
        assert!(!later.full_reps(&[2, 0, 4, 1], 3));
        // Lists of one value: every level is 0.
        assert!(FullListPages::new(NoPages, 1, 1).full_reps(&[10, 0], 5));
    }

    #[test]
    fn definition_levels_must_all_be_the_maximum() {
        // Nullable list of nullable items: levels up to 3, 2 bits each.
        let pages = FullListPages::new(NoPages, 2, 3);
        assert!(pages.full_defs(&[12, 3], 6));
        assert!(!pages.full_defs(&[12, 2], 6));
        // Bit-packed: four 3s then four 2s, 2 bits each.
        assert!(pages.full_defs(&[3, 0xff, 0xff], 8));
        assert!(!pages.full_defs(&[3, 0xff, 0xaa], 8));
        // Padding past the last level is not looked at.
        assert!(pages.full_defs(&[3, 0xff, 0x00], 4));
    }

    #[test]
    fn enough_row_groups_are_dealt_whole_by_rows() {
        let split = split_for(units(&[100, 100, 100, 700]), 2, 10);
        assert_eq!(split.len(), 4);
        let dealt = deal(split, 2);
        let rows: Vec<usize> = dealt
            .iter()
            .map(|p| p.iter().map(|u| u.rows.len()).sum())
            .collect();
        assert_eq!(rows, vec![300, 700]);
        // Every row group exactly once, in order.
        let all: Vec<usize> = dealt.iter().flatten().map(|u| u.row_group).collect();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }
}
