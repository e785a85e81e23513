//! Files as rows: `read_blob('folder/ or glob')` and `read_text(...)`, with DuckDB's columns
//! (`filename`, `content`, `size`, `last_modified`), over every store a path can name.
//!
//! The files are listed when the query runs, through the store registry as every path is, and
//! dealt to the partitions in order of name. A file's bytes are read only when the query uses
//! `content`: a projection of `filename` and `size` lists and reads nothing else. Each partition
//! reads a record batch of files at a time (at most the session's batch size of them, and
//! 64 MiB of content, or one larger file), a few files at once, so memory stays flat however many
//! files there are. A file larger than `batchinfer.max_blob_bytes` is refused, named; so is a
//! file `read_text` finds is not UTF-8.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BinaryArray, Int64Array, RecordBatch, RecordBatchOptions, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, ScalarValue, plan_err};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::config::BatchInferOptions;

/// The most content a record batch of files holds (one larger file is a batch of its own).
const BATCH_BYTES: u64 = 64 << 20;

/// Files a partition reads at once.
const READS_AT_ONCE: usize = 8;

/// `read_blob` (`text` false) or `read_text` (`text` true).
#[derive(Debug)]
pub struct BlobFunction {
    pub text: bool,
}

impl BlobFunction {
    fn name(&self) -> &'static str {
        if self.text { "read_text" } else { "read_blob" }
    }
}

impl TableFunctionImpl for BlobFunction {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        let name = self.name();
        let [arg] = args.exprs() else {
            return plan_err!(
                "{name} takes one argument, a folder or a glob: {name}('photos/'), \
                 {name}('s3://bucket/photos/*.jpg')"
            );
        };
        let location = match arg {
            Expr::Literal(
                ScalarValue::Utf8(Some(s))
                | ScalarValue::Utf8View(Some(s))
                | ScalarValue::LargeUtf8(Some(s)),
                _,
            ) => s.clone(),
            _ => {
                return plan_err!(
                    "{name}: the folder or glob must be a string literal, as in {name}('photos/')"
                );
            }
        };
        let url = listing_url(&location)?;
        if let Some(path) = crate::storage::local_file(url.prefix())
            && url.get_url().scheme() == "file"
            && !location.contains(['*', '?', '['])
            && !path.exists()
        {
            return plan_err!("{name}: there is no file or folder {}", path.display());
        }
        Ok(Arc::new(BlobTable {
            url,
            text: self.text,
            schema: schema(self.text),
        }))
    }
}

/// `location` as a listing: a local path (with its glob, as DataFusion reads one), or a URL
/// whose glob (from the folder of its first glob character on) DataFusion would read as part of
/// the key.
fn listing_url(location: &str) -> datafusion::error::Result<ListingTableUrl> {
    let is_url = location.contains("://");
    let glob_at = location.find(['*', '?', '[']);
    match (is_url, glob_at) {
        (true, Some(at)) => {
            let folder_end = location[..at].rfind('/').map_or(0, |i| i + 1);
            let (folder, pattern) = location.split_at(folder_end);
            ListingTableUrl::parse(folder)?.with_glob(pattern)
        }
        _ => ListingTableUrl::parse(location),
    }
}

/// The columns of `read_blob` (content BLOB) or `read_text` (content VARCHAR).
fn schema(text: bool) -> SchemaRef {
    let content = if text {
        DataType::Utf8
    } else {
        DataType::Binary
    };
    Arc::new(Schema::new(vec![
        Field::new("filename", DataType::Utf8, false),
        Field::new("content", content, false),
        Field::new("size", DataType::Int64, false),
        Field::new(
            "last_modified",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

/// The files a `read_blob` names.
#[derive(Debug)]
struct BlobTable {
    url: ListingTableUrl,
    text: bool,
    schema: SchemaRef,
}

impl BlobTable {
    /// The files named now: under a folder, every file at any depth; of a glob, those it
    /// matches (`*` within a folder, `**` across folders); one file by its name. Hidden files
    /// (a name starting with `.`: a write in progress among them) are left out.
    async fn list(&self, store: &dyn ObjectStore) -> datafusion::error::Result<Vec<ObjectMeta>> {
        let prefix = self.url.prefix();
        let glob = self.url.get_glob();
        if glob.is_none() && !self.url.is_collection() {
            match store.head(prefix).await {
                Ok(meta) => return Ok(vec![meta]),
                // A folder named without its '/': its files.
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let across_folders = glob.as_ref().is_none_or(|g| g.as_str().contains("**"));
        // A bucket's root is listed whole (an empty prefix would be read as "/").
        let under = Some(prefix).filter(|p| !p.as_ref().is_empty());
        let listed: Vec<ObjectMeta> = store.list(under).try_collect().await?;
        Ok(listed
            .into_iter()
            .filter(|meta| self.url.contains(&meta.location, !across_folders))
            .filter(|meta| {
                meta.location
                    .prefix_match(prefix)
                    .is_none_or(|mut parts| !parts.any(|p| p.as_ref().starts_with('.')))
            })
            .collect())
    }
}

#[async_trait]
impl TableProvider for BlobTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let store = state.runtime_env().object_store(&self.url)?;
        let mut files = self.list(store.as_ref()).await?;
        files.sort_by(|a, b| a.location.cmp(&b.location));
        // No filter is pushed here: the first files are the rows a LIMIT keeps.
        if let Some(limit) = limit {
            files.truncate(limit);
        }
        let base = url::Url::parse(self.url.object_store().as_str())
            .map_err(|e| DataFusionError::Plan(format!("{}: {e}", self.url)))?;
        let names = files
            .iter()
            .map(|meta| {
                let mut file = base.clone();
                if let Ok(mut segments) = file.path_segments_mut() {
                    segments
                        .clear()
                        .extend(meta.location.parts().map(|p| p.as_ref().to_string()));
                }
                crate::storage::display_location(&file)
            })
            .collect();
        let options = state
            .config_options()
            .extensions
            .get::<BatchInferOptions>()
            .cloned()
            .unwrap_or_default();
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        let schema = Arc::new(self.schema.project(&columns)?);
        let partitions = state
            .config_options()
            .execution
            .target_partitions
            .min(files.len())
            .max(1);
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Ok(Arc::new(BlobExec {
            files: Arc::new(Files {
                store,
                metas: files,
                names,
                text: self.text,
                max_bytes: options.max_blob_bytes,
                batch_rows: usize::from(state.config_options().execution.batch_size).max(1),
            }),
            columns,
            schema,
            partitions,
            properties: Arc::new(properties),
        }))
    }
}

/// The files of one scan, and how they are read.
struct Files {
    store: Arc<dyn ObjectStore>,
    metas: Vec<ObjectMeta>,
    /// Each file as a person names it: a local path, or the object's URL.
    names: Vec<String>,
    text: bool,
    max_bytes: u64,
    batch_rows: usize,
}

impl fmt::Debug for Files {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Files")
            .field("files", &self.metas.len())
            .field("text", &self.text)
            .finish()
    }
}

impl Files {
    fn function(&self) -> &'static str {
        if self.text { "read_text" } else { "read_blob" }
    }

    /// The files of `partition` of `partitions`: a run of them in order of name.
    fn of_partition(&self, partition: usize, partitions: usize) -> Range<usize> {
        let n = self.metas.len();
        (n * partition / partitions)..(n * (partition + 1) / partitions)
    }

    /// `files` cut into the files of each record batch: at most `batch_rows`, and (with their
    /// content) [`BATCH_BYTES`] but for one larger file.
    fn batches(&self, files: Range<usize>, content: bool) -> Vec<Range<usize>> {
        let mut batches = Vec::new();
        let (mut start, mut bytes) = (files.start, 0u64);
        for i in files.clone() {
            let size = self.metas[i].size;
            let full = i - start >= self.batch_rows
                || (content && i > start && bytes.saturating_add(size) > BATCH_BYTES);
            if full {
                batches.push(start..i);
                start = i;
                bytes = 0;
            }
            bytes = bytes.saturating_add(size);
        }
        if start < files.end {
            batches.push(start..files.end);
        }
        batches
    }

    /// The bytes of file `i`, or why not: larger than the limit, or not there as listed.
    async fn read(&self, i: usize) -> datafusion::error::Result<bytes::Bytes> {
        let meta = &self.metas[i];
        let name = &self.names[i];
        if meta.size > self.max_bytes {
            return Err(DataFusionError::Execution(format!(
                "{}: {name} is {} bytes, more than batchinfer.max_blob_bytes ({}); raise it \
                 (SET batchinfer.max_blob_bytes = '2047M', the most) or leave it out of the glob",
                self.function(),
                meta.size,
                self.max_bytes
            )));
        }
        if meta.size == 0 {
            return Ok(bytes::Bytes::new());
        }
        self.store
            .get_range(&meta.location, 0..meta.size)
            .await
            .map_err(|e| {
                DataFusionError::Execution(format!("{}: reading {name}: {e}", self.function()))
            })
    }

    /// The record batch of the files `range`, of the columns `columns` (of [`schema`]).
    async fn batch(
        self: Arc<Self>,
        range: Range<usize>,
        columns: Arc<Vec<usize>>,
        schema: SchemaRef,
    ) -> datafusion::error::Result<RecordBatch> {
        let contents: Vec<bytes::Bytes> = if columns.contains(&1) {
            futures::stream::iter(range.clone())
                .map(|i| self.read(i))
                .buffered(READS_AT_ONCE)
                .try_collect()
                .await?
        } else {
            Vec::new()
        };
        let metas = &self.metas[range.clone()];
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
        for column in columns.iter() {
            let array: ArrayRef = match column {
                0 => Arc::new(StringArray::from_iter_values(
                    self.names[range.clone()].iter(),
                )),
                1 if self.text => {
                    let mut texts = Vec::with_capacity(contents.len());
                    for (bytes, i) in contents.iter().zip(range.clone()) {
                        let text = std::str::from_utf8(bytes).map_err(|e| {
                            DataFusionError::Execution(format!(
                                "read_text: {} is not UTF-8 text (byte {} is not); read it with \
                                 read_blob",
                                self.names[i],
                                e.valid_up_to()
                            ))
                        })?;
                        texts.push(text);
                    }
                    Arc::new(StringArray::from_iter_values(texts))
                }
                1 => Arc::new(BinaryArray::from_iter_values(
                    contents.iter().map(|b| b.as_ref()),
                )),
                2 => Arc::new(Int64Array::from_iter_values(
                    metas.iter().map(|m| m.size.min(i64::MAX as u64) as i64),
                )),
                _ => Arc::new(TimestampMicrosecondArray::from_iter_values(
                    metas.iter().map(|m| m.last_modified.timestamp_micros()),
                )),
            };
            arrays.push(array);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(range.len()));
        Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
    }
}

/// Reads the files of a `read_blob`, a run of them per partition.
#[derive(Debug)]
struct BlobExec {
    files: Arc<Files>,
    /// The columns read, of [`schema`]'s.
    columns: Vec<usize>,
    schema: SchemaRef,
    partitions: usize,
    properties: Arc<PlanProperties>,
}

impl DisplayAs for BlobExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "BlobExec: {} files, {}",
            self.files.metas.len(),
            if self.columns.contains(&1) {
                "with their content"
            } else {
                "names and sizes only"
            }
        )
    }
}

impl ExecutionPlan for BlobExec {
    fn name(&self) -> &str {
        "BlobExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(
            &Arc<dyn datafusion::physical_plan::PhysicalExpr>,
        ) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let files = self.files.clone();
        let range = files.of_partition(partition, self.partitions);
        let batches = files.batches(range, self.columns.contains(&1));
        let columns = Arc::new(self.columns.clone());
        let schema = self.schema.clone();
        let stream = futures::stream::iter(batches)
            .then(move |range| files.clone().batch(range, columns.clone(), schema.clone()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64], batch_rows: usize) -> Files {
        Files {
            store: Arc::new(object_store::memory::InMemory::new()),
            metas: sizes
                .iter()
                .enumerate()
                .map(|(i, size)| ObjectMeta {
                    location: format!("f{i}").into(),
                    last_modified: Default::default(),
                    size: *size,
                    e_tag: None,
                    version: None,
                })
                .collect(),
            names: (0..sizes.len()).map(|i| format!("f{i}")).collect(),
            text: false,
            max_bytes: 1 << 30,
            batch_rows,
        }
    }

    #[test]
    fn batches_hold_a_few_files_and_bounded_bytes() {
        let mb = 1 << 20;
        let f = files(&[10 * mb, 50 * mb, 10 * mb, 200 * mb, 1, 1, 1], 3);
        assert_eq!(f.batches(0..7, true), vec![0..2, 2..3, 3..4, 4..7]);
        // Without content, only the rows count.
        assert_eq!(f.batches(0..7, false), vec![0..3, 3..6, 6..7]);
        assert_eq!(f.batches(3..3, true), Vec::<Range<usize>>::new());
    }

    #[test]
    fn partitions_take_every_file_once() {
        let f = files(&[1; 10], 100);
        let mut all = Vec::new();
        for p in 0..4 {
            all.extend(f.of_partition(p, 4));
        }
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }
}
