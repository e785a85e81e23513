//! Files as rows: `read_blob('folder/ or glob')` and `read_text(...)`, with DuckDB's columns
//! (`filename`, `content`, `size`, `last_modified`), over every store a path can name.
//!
//! The files are listed when the query runs, through the store registry as every path is, and
//! dealt to the partitions in order of name. A file's bytes are read only when the query uses
//! `content`: a projection of `filename` and `size` lists and reads nothing else. Each partition
//! reads a record batch of files at a time (at most the session's batch size of them, and
//! 16 MiB of content, or one larger file), a few files at once, so memory stays flat however many
//! files there are. A file larger than `batchinfer.max_blob_bytes` is refused, named; so is a
//! file `read_text` finds is not UTF-8.
//!
//! Where the query's only use of `content` is a bytes model's (magika's first and last blocks,
//! [`crate::rules::file_ends`]), each file's content is its first and last block alone, whatever
//! its size: two ranged reads of it.

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
const BATCH_BYTES: u64 = 16 << 20;

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
            location,
            text: self.text,
            schema: schema(self.text),
            only: None,
            ends: None,
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

/// The metadata key that marks `filename` as the name of the file beside it: a model reading
/// the file's content names the file in its errors and rejects ([`crate::rules::file_names`]).
pub const FILE_NAME: &str = "batchinfer.file_name";

/// Whether `field` is a file's name, beside its content.
pub fn is_file_name(field: &Field) -> bool {
    field.metadata().contains_key(FILE_NAME) && *field.data_type() == DataType::Utf8
}

/// The columns of `read_blob` (content BLOB) or `read_text` (content VARCHAR).
fn schema(text: bool) -> SchemaRef {
    let content = if text {
        DataType::Utf8
    } else {
        DataType::Binary
    };
    Arc::new(Schema::new(vec![
        Field::new("filename", DataType::Utf8, false).with_metadata(
            [(FILE_NAME.to_string(), "true".to_string())]
                .into_iter()
                .collect(),
        ),
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
#[derive(Debug, Clone)]
pub struct BlobTable {
    url: ListingTableUrl,
    /// The folder or glob as the query names it.
    location: String,
    text: bool,
    schema: SchemaRef,
    /// Where the table is these files (by URL, and the version each must have) rather than
    /// those listed: a materialized view's unit of them.
    only: Option<Arc<Vec<(String, String)>>>,
    /// Where `content` is the first and last this many bytes of each file (the whole of a file
    /// of at most twice as many): see [`Self::of_ends`].
    ends: Option<u64>,
}

/// A listed file's URL: its store's and its path.
fn file_url(base: &url::Url, meta: &ObjectMeta) -> url::Url {
    let mut file = base.clone();
    if let Ok(mut segments) = file.path_segments_mut() {
        segments
            .clear()
            .extend(meta.location.parts().map(|p| p.as_ref().to_string()));
    }
    file
}

impl BlobTable {
    /// The function and its folder or glob, as the query names them.
    pub fn shown(&self) -> String {
        format!(
            "{}('{}')",
            if self.text { "read_text" } else { "read_blob" },
            self.location.replace('\'', "''")
        )
    }

    /// The files named now, in order of name: each one's URL and what its store says of it.
    pub async fn files(
        &self,
        state: &dyn Session,
    ) -> datafusion::error::Result<Vec<(String, ObjectMeta)>> {
        let store = state.runtime_env().object_store(&self.url)?;
        let base = self.base()?;
        let mut files = self.list(store.as_ref()).await?;
        files.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(files
            .into_iter()
            .map(|meta| (file_url(&base, &meta).to_string(), meta))
            .collect())
    }

    /// This table, of the files `files` only (by URL, each of the version it must have: a file
    /// changed since is an error, not read).
    pub fn of_files(&self, files: Vec<(String, String)>) -> BlobTable {
        BlobTable {
            only: Some(Arc::new(files)),
            ..self.clone()
        }
    }

    /// This table, its `content` each file's first `block` bytes and its last `block` (the
    /// whole file where it has at most `2 * block`): all a model that reads only the ends of a
    /// file takes, as magika does, read without reading the rest. Not for `read_text`, whose
    /// content is checked to be UTF-8 whole.
    pub fn of_ends(&self, block: u64) -> Option<BlobTable> {
        (!self.text && block > 0).then(|| BlobTable {
            ends: Some(block),
            ..self.clone()
        })
    }

    /// Whether its content is each file's ends alone ([`Self::of_ends`]).
    pub fn ends(&self) -> Option<u64> {
        self.ends
    }

    /// Its folder, where its files are local and their folder is not there (moved, or not
    /// mounted: not a folder emptied).
    pub fn gone(&self) -> Option<std::path::PathBuf> {
        crate::storage::local_file(self.url.prefix())
            .filter(|path| self.is_local() && !path.exists())
    }

    /// Whether its files are local ones.
    pub fn is_local(&self) -> bool {
        crate::storage::is_local_store(&self.url.object_store())
    }

    fn base(&self) -> datafusion::error::Result<url::Url> {
        url::Url::parse(self.url.object_store().as_str())
            .map_err(|e| DataFusionError::Plan(format!("{}: {e}", self.url)))
    }

    /// The files of [`Self::of_files`], as their store says they are now.
    async fn named(
        &self,
        store: &dyn ObjectStore,
        files: &[(String, String)],
    ) -> datafusion::error::Result<Vec<ObjectMeta>> {
        let local = self.is_local();
        let function = if self.text { "read_text" } else { "read_blob" };
        futures::stream::iter(files.iter().cloned())
            .map(|(file, version)| async move {
                let url = url::Url::parse(&file)
                    .map_err(|e| DataFusionError::Plan(format!("{file}: {e}")))?;
                let path = object_store::path::Path::from_url_path(url.path())
                    .map_err(|e| DataFusionError::Plan(format!("{file}: {e}")))?;
                let meta = store.head(&path).await?;
                if crate::storage::file_version(local, &meta) != version {
                    return Err(DataFusionError::Execution(format!(
                        "{function}: {} changed since it was listed",
                        crate::storage::display_location(&url)
                    )));
                }
                Ok(meta)
            })
            .buffered(READS_AT_ONCE)
            .try_collect()
            .await
    }

    fn function(&self) -> &'static str {
        if self.text { "read_text" } else { "read_blob" }
    }

    /// A local file whose name cannot be a path (`source` says why), where the glob would not
    /// have matched it anyway: its name, shown. None where the file would be read.
    fn unnamed_left_out(&self, source: &object_store::path::Error) -> Option<String> {
        let glob = self.url.get_glob().as_ref()?;
        let full = match source {
            object_store::path::Error::BadSegment { path, .. }
            | object_store::path::Error::NonUnicode { path, .. } => path.clone(),
            object_store::path::Error::InvalidPath { path } => path.to_string_lossy().into_owned(),
            _ => return None,
        };
        let folder = self.url.prefix().as_ref().trim_matches('/').to_string();
        let relative = full.trim_start_matches('/').strip_prefix(folder.as_str())?;
        let relative = relative.trim_start_matches('/');
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        (!glob.matches_with(relative, options)).then(|| relative.to_string())
    }

    /// The error of a file whose name cannot be a path.
    fn unnameable(&self, source: &object_store::path::Error) -> DataFusionError {
        let why = match source {
            object_store::path::Error::NonUnicode { path, .. } => {
                format!("the name of {path:?} is not UTF-8")
            }
            object_store::path::Error::BadSegment { path, .. } => format!(
                "the name of {path:?} holds a newline or another character a path cannot hold"
            ),
            other => other.to_string(),
        };
        DataFusionError::Execution(format!(
            "{}: a file under {} has a name a filename cannot hold: {why}; rename it",
            self.function(),
            self.location
        ))
    }

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
        // A glob's `*`, `?` and `[...]` match within a folder's name, `**` across folders.
        let within_folders = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: false,
        };
        let named = |location: &object_store::path::Path| {
            let Some(parts) = location.prefix_match(prefix) else {
                return false;
            };
            let under: Vec<_> = parts.collect();
            // Hidden files and folders (a write in progress among them) are left out.
            if under.iter().any(|p| p.as_ref().starts_with('.')) {
                return false;
            }
            glob.as_ref().is_none_or(|glob| {
                let path = under
                    .iter()
                    .map(|p| p.as_ref())
                    .collect::<Vec<_>>()
                    .join("/");
                glob.matches_with(&path, within_folders)
            })
        };
        // A bucket's root is listed whole (an empty prefix would be read as "/").
        let under = Some(prefix).filter(|p| !p.as_ref().is_empty());
        let mut listing = store.list(under);
        let mut listed = Vec::new();
        while let Some(entry) = listing.next().await {
            match entry {
                Ok(meta) => {
                    if named(&meta.location) {
                        listed.push(meta);
                    }
                }
                // A local file whose name no path can hold (not UTF-8, a newline or another
                // control character) cannot be a row's filename: a query that would read it is
                // refused rather than given part of the files; one whose glob leaves it out
                // goes on.
                Err(object_store::Error::InvalidPath { source }) => {
                    if let Some(name) = self.unnamed_left_out(&source) {
                        crate::say!(
                            "warning: {}: {name:?} left out: its name cannot be a filename, and \
                             the glob does not match it",
                            self.function()
                        );
                        continue;
                    }
                    return Err(self.unnameable(&source));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(listed)
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
        let mut files = match &self.only {
            Some(only) => self.named(store.as_ref(), only).await?,
            None => self.list(store.as_ref()).await?,
        };
        files.sort_by(|a, b| a.location.cmp(&b.location));
        // No filter is pushed here: the first files are the rows a LIMIT keeps.
        if let Some(limit) = limit {
            files.truncate(limit);
        }
        let base = self.base()?;
        let names = files
            .iter()
            .map(|meta| crate::storage::display_location(&file_url(&base, meta)))
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
        Ok(Arc::new(BlobExec::new(
            Files {
                store,
                store_url: self.url.object_store().as_str().to_string(),
                metas: files,
                names,
                text: self.text,
                max_bytes: options.max_blob_bytes,
                batch_rows: usize::from(state.config_options().execution.batch_size).max(1),
                ends: self.ends,
            },
            columns,
            schema,
            partitions,
        )))
    }
}

/// An error that is a file's own (too large, not text): a materialized view leaves the file out
/// and scores the others.
fn unreadable(message: String) -> DataFusionError {
    DataFusionError::External(Box::new(crate::storage::unreadable::Unreadable(message)))
}

/// The files of one scan, and how they are read.
struct Files {
    store: Arc<dyn ObjectStore>,
    /// The store's URL, by which an executor of a cluster finds it.
    store_url: String,
    metas: Vec<ObjectMeta>,
    /// Each file as a person names it: a local path, or the object's URL.
    names: Vec<String>,
    text: bool,
    max_bytes: u64,
    batch_rows: usize,
    /// Each file's first and last this many bytes alone ([`BlobTable::of_ends`]).
    ends: Option<u64>,
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
            let size = self.read_size(i);
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

    /// How many bytes of file `i` are read.
    fn read_size(&self, i: usize) -> u64 {
        let size = self.metas[i].size;
        self.ends
            .map_or(size, |block| size.min(block.saturating_mul(2)))
    }

    /// Why file `i` is not read: what would be read of it is over the limit.
    fn too_large(&self, i: usize) -> DataFusionError {
        let raise = if self.max_bytes < crate::config::MAX_BLOB_BYTES {
            "raise it (SET batchinfer.max_blob_bytes = '2047M', the most) or leave it out of the \
             glob"
        } else {
            "a file's content is at most that: leave it out of the glob"
        };
        let read = match self.ends {
            Some(block) => format!(
                ", of which {} would be read",
                self.read_size(i).min(2 * block)
            ),
            None => String::new(),
        };
        unreadable(format!(
            "{}: {} is {} bytes{read}, more than batchinfer.max_blob_bytes ({}); {raise}",
            self.function(),
            self.names[i],
            self.metas[i].size,
            self.max_bytes
        ))
    }

    /// The bytes of file `i`, or why not: larger than the limit, not there as listed, or (a
    /// local file) changed while it was read: replaced or rewritten, its bytes would be another
    /// file's cut to the listed size.
    async fn read(&self, i: usize) -> datafusion::error::Result<bytes::Bytes> {
        let bytes = self.read_listed(i).await?;
        let meta = &self.metas[i];
        if self.store_url.starts_with("file:") && meta.e_tag.is_some() {
            let now = match self.store.head(&meta.location).await {
                Ok(now) => format!("{} {}", now.size, now.e_tag.unwrap_or_default()),
                Err(object_store::Error::NotFound { .. }) => "gone".to_string(),
                Err(e) => {
                    return Err(DataFusionError::Execution(format!(
                        "{}: reading {}: {e}",
                        self.function(),
                        self.names[i]
                    )));
                }
            };
            let listed = format!(
                "{} {}",
                meta.size,
                meta.e_tag.as_deref().unwrap_or_default()
            );
            if now != listed {
                return Err(unreadable(format!(
                    "{}: {} changed while it was read (listed with {} bytes; it was replaced, \
                     rewritten or deleted since): read it again",
                    self.function(),
                    self.names[i],
                    meta.size
                )));
            }
        }
        Ok(bytes)
    }

    /// [`Files::read`]: the bytes, as the store gives them.
    async fn read_listed(&self, i: usize) -> datafusion::error::Result<bytes::Bytes> {
        let meta = &self.metas[i];
        let name = &self.names[i];
        let failed = |e: object_store::Error| {
            DataFusionError::Execution(format!("{}: reading {name}: {e}", self.function()))
        };
        if self.read_size(i) > self.max_bytes {
            return Err(self.too_large(i));
        }
        // Its first and last blocks, where it has more than them: a block's worth of neither
        // is ever read, however large the file (the size limit is on what is read).
        if let Some(block) = self.ends
            && meta.size > block.saturating_mul(2)
        {
            let ranges = [0..block, meta.size - block..meta.size];
            let parts = self
                .store
                .get_ranges(&meta.location, &ranges)
                .await
                .map_err(failed)?;
            let mut both = Vec::with_capacity((2 * block) as usize);
            for part in parts {
                both.extend_from_slice(&part);
            }
            return Ok(both.into());
        }
        if meta.size == 0 {
            return Ok(bytes::Bytes::new());
        }
        self.store
            .get_range(&meta.location, 0..meta.size)
            .await
            .map_err(failed)
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
                            unreadable(format!(
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

impl BlobExec {
    fn new(files: Files, columns: Vec<usize>, schema: SchemaRef, partitions: usize) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        BlobExec {
            files: Arc::new(files),
            columns,
            schema,
            partitions,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for BlobExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let read = match (self.columns.contains(&1), self.files.ends) {
            (false, _) => "names and sizes only".to_string(),
            (true, None) => "with their content".to_string(),
            (true, Some(block)) => format!("the first and last {block} bytes of each"),
        };
        write!(f, "BlobExec: {} files, {read}", self.files.metas.len())
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

/// `read_blob`'s table and exec as a cluster sends them: the scheduler plans over the table, the
/// executors read the files the exec lists.
pub mod wire {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    struct Table {
        url: String,
        glob: Option<String>,
        location: String,
        text: bool,
        only: Option<Vec<(String, String)>>,
        #[serde(default)]
        ends: Option<u64>,
    }

    #[derive(Serialize, Deserialize)]
    struct File {
        location: String,
        size: u64,
        last_modified_us: i64,
        e_tag: Option<String>,
        version: Option<String>,
        name: String,
    }

    #[derive(Serialize, Deserialize)]
    struct Exec {
        store: String,
        text: bool,
        max_bytes: u64,
        batch_rows: usize,
        #[serde(default)]
        ends: Option<u64>,
        columns: Vec<usize>,
        partitions: usize,
        files: Vec<File>,
    }

    fn malformed(e: impl fmt::Display) -> DataFusionError {
        DataFusionError::Internal(format!("a read_blob sent by the cluster is malformed: {e}"))
    }

    /// `provider` as bytes, where it is a `read_blob`'s table.
    pub fn encode_table(provider: &dyn TableProvider) -> Option<Vec<u8>> {
        let table = provider.downcast_ref::<BlobTable>()?;
        serde_json::to_vec(&Table {
            url: table.url.get_url().to_string(),
            glob: table
                .url
                .get_glob()
                .as_ref()
                .map(|g| g.as_str().to_string()),
            location: table.location.clone(),
            text: table.text,
            only: table.only.as_ref().map(|o| o.as_ref().clone()),
            ends: table.ends,
        })
        .ok()
    }

    pub fn decode_table(buf: &[u8]) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        let table: Table = serde_json::from_slice(buf).map_err(malformed)?;
        let url = url::Url::parse(&table.url).map_err(malformed)?;
        let mut listing = ListingTableUrl::try_new(url, None)?;
        if let Some(glob) = &table.glob {
            listing = listing.with_glob(glob)?;
        }
        Ok(Arc::new(BlobTable {
            url: listing,
            location: table.location,
            text: table.text,
            schema: schema(table.text),
            only: table.only.map(Arc::new),
            ends: table.ends.filter(|_| !table.text),
        }))
    }

    /// `plan` as bytes, where it is a `read_blob`'s exec.
    pub fn encode_exec(plan: &dyn ExecutionPlan) -> Option<Vec<u8>> {
        let exec = plan.downcast_ref::<BlobExec>()?;
        let files = &exec.files;
        serde_json::to_vec(&Exec {
            store: files.store_url.clone(),
            text: files.text,
            max_bytes: files.max_bytes,
            batch_rows: files.batch_rows,
            ends: files.ends,
            columns: exec.columns.clone(),
            partitions: exec.partitions,
            files: files
                .metas
                .iter()
                .zip(&files.names)
                .map(|(meta, name)| File {
                    location: meta.location.to_string(),
                    size: meta.size,
                    last_modified_us: meta.last_modified.timestamp_micros(),
                    e_tag: meta.e_tag.clone(),
                    version: meta.version.clone(),
                    name: name.clone(),
                })
                .collect(),
        })
        .ok()
    }

    pub fn decode_exec(
        buf: &[u8],
        ctx: &TaskContext,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let exec: Exec = serde_json::from_slice(buf).map_err(malformed)?;
        let store_url = datafusion::execution::object_store::ObjectStoreUrl::parse(&exec.store)?;
        let store = ctx.runtime_env().object_store(&store_url)?;
        let mut metas = Vec::with_capacity(exec.files.len());
        let mut names = Vec::with_capacity(exec.files.len());
        for file in exec.files {
            metas.push(ObjectMeta {
                location: object_store::path::Path::parse(&file.location).map_err(malformed)?,
                last_modified: chrono::DateTime::from_timestamp_micros(file.last_modified_us)
                    .ok_or_else(|| malformed("a file's time"))?,
                size: file.size,
                e_tag: file.e_tag,
                version: file.version,
            });
            names.push(file.name);
        }
        let full = schema(exec.text);
        if exec.columns.iter().any(|c| *c >= full.fields().len()) || exec.partitions == 0 {
            return Err(malformed("its columns or partitions"));
        }
        let projected = Arc::new(full.project(&exec.columns)?);
        Ok(Arc::new(BlobExec::new(
            Files {
                store,
                store_url: exec.store,
                metas,
                names,
                text: exec.text,
                max_bytes: exec.max_bytes,
                batch_rows: exec.batch_rows.max(1),
                ends: exec.ends.filter(|b| *b > 0 && !exec.text),
            },
            exec.columns,
            projected,
            exec.partitions,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(sizes: &[u64], batch_rows: usize) -> Files {
        Files {
            store: Arc::new(object_store::memory::InMemory::new()),
            store_url: "memory://".into(),
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
            ends: None,
        }
    }

    #[test]
    fn batches_hold_a_few_files_and_bounded_bytes() {
        let mb = 1 << 20;
        let f = files(&[5 * mb, 10 * mb, 5 * mb, 200 * mb, 1, 1, 1], 3);
        assert_eq!(f.batches(0..7, true), vec![0..2, 2..3, 3..4, 4..7]);
        // Without content, only the rows count.
        assert_eq!(f.batches(0..7, false), vec![0..3, 3..6, 6..7]);
        assert_eq!(f.batches(3..3, true), Vec::<Range<usize>>::new());
    }

    #[tokio::test]
    async fn a_file_read_at_its_ends_is_its_first_and_last_blocks() {
        let store = Arc::new(object_store::memory::InMemory::new());
        let mut f = files(&[10, 6, 0], 100);
        for (i, content) in [&b"0123456789"[..], b"abcdef", b""].into_iter().enumerate() {
            let path = object_store::path::Path::from(format!("f{i}"));
            store.put(&path, content.to_vec().into()).await.unwrap();
        }
        f.store = store;
        f.max_bytes = 6;
        f.ends = Some(3);
        assert_eq!(f.read(0).await.unwrap().as_ref(), b"012789");
        // A file of at most two blocks is read whole; the limit is on what is read, the ends of
        // a larger file too.
        f.max_bytes = 5;
        assert!(
            f.read(0)
                .await
                .is_err_and(|e| e.to_string().contains("of which 6 would be read"))
        );
        f.max_bytes = 4;
        assert!(
            f.read(1)
                .await
                .is_err_and(|e| e.to_string().contains("f1 is 6 bytes"))
        );
        f.max_bytes = 6;
        assert_eq!(f.read(1).await.unwrap().as_ref(), b"abcdef");
        assert_eq!(f.read(2).await.unwrap().as_ref(), b"");
        assert_eq!(f.batches(0..3, true), vec![0..3]);
    }

    /// A local file replaced by a larger one between its listing and its read is an error
    /// naming it, never the new file's bytes cut to the listed size.
    #[tokio::test]
    async fn a_local_file_replaced_after_its_listing_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt");
        std::fs::write(&path, b"abcdef").unwrap();
        let store = Arc::new(object_store::local::LocalFileSystem::new());
        let location = object_store::path::Path::from_filesystem_path(&path).unwrap();
        let mut f = files(&[6], 100);
        f.metas = vec![store.head(&location).await.unwrap()];
        f.store = store;
        f.store_url = "file:///".into();
        assert_eq!(f.read(0).await.unwrap().as_ref(), b"abcdef");
        let replacement = dir.path().join("b.txt");
        std::fs::write(&replacement, vec![b'z'; 50_000]).unwrap();
        std::fs::rename(&replacement, &path).unwrap();
        let read = f.read(0).await;
        assert!(
            read.as_ref()
                .is_err_and(|e| e.to_string().contains("f0 changed while it was read")),
            "{read:?}"
        );
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
