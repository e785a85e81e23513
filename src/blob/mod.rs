//! Files as rows: `read_blob('folder/ or glob')` and `read_text(...)`, with DuckDB's columns
//! (`filename`, `content`, `size`, `last_modified`), over every store a path can name; and
//! `read_document(...)`, a row for each page of a PDF and for each other document, its text
//! ([`crate::documents`]: `document.rs` makes the rows); `read_frames(...)`, a row for each
//! sampled frame of a video ([`crate::video`]: `frames.rs`).
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

mod document;
mod exec;
mod files;
mod frames;
pub mod wire;

use exec::BlobExec;
use files::Files;

/// The most content a record batch of files holds (one larger file is a batch of its own).
const BATCH_BYTES: u64 = 16 << 20;

/// Files a partition reads at once.
const READS_AT_ONCE: usize = 8;

/// What a file is read as: its bytes, its text, or a document's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Form {
    /// `read_blob`: `content` BLOB.
    Blob,
    /// `read_text`: `content` VARCHAR, the file's UTF-8 text.
    Text,
    /// `read_document`: a row per page, its text.
    Document,
    /// `read_frames`: a row per frame of a video, sampled so.
    Frames(crate::video::Sampling),
}

/// The functions that read files, each a folder or glob its first argument.
pub const FUNCTIONS: &[&str] = &["read_blob", "read_text", "read_document", "read_frames"];

impl Form {
    /// The function that reads files in this form.
    pub fn function(self) -> &'static str {
        match self {
            Form::Blob => "read_blob",
            Form::Text => "read_text",
            Form::Document => "read_document",
            Form::Frames(_) => "read_frames",
        }
    }

    /// Whether a scan of `columns` (of its schema's) reads the files' bytes.
    fn reads_content(self, columns: &[usize]) -> bool {
        // A document's rows are its pages, a video's its frames: its bytes are read whatever
        // is used of them.
        matches!(self, Form::Document | Form::Frames(_)) || columns.contains(&1)
    }
}

/// `read_blob`, `read_text` or `read_document`.
#[derive(Debug)]
pub struct BlobFunction {
    pub form: Form,
}

impl BlobFunction {
    fn name(&self) -> &'static str {
        self.form.function()
    }
}

impl TableFunctionImpl for BlobFunction {
    fn call_with_args(
        &self,
        args: TableFunctionArgs,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        let name = self.name();
        let (arg, form) = match (args.exprs(), self.form) {
            ([arg], form) => (arg, form),
            ([arg, sampling], Form::Frames(_)) => (arg, Form::Frames(sampling_of(sampling)?)),
            (_, Form::Frames(_)) => {
                return plan_err!(
                    "read_frames takes a folder or a glob, and how to sample its videos: \
                     read_frames('videos/'), read_frames('videos/*.mp4', 'fps=1'), \
                     read_frames('videos/', 'every_n_frames=30'), read_frames('videos/', \
                     'keyframes_only')"
                );
            }
            _ => {
                return plan_err!(
                    "{name} takes one argument, a folder or a glob: {name}('photos/'), \
                     {name}('s3://bucket/photos/*.jpg')"
                );
            }
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
            form,
            schema: schema(form),
            only: None,
            ends: None,
        }))
    }
}

/// How `read_frames` samples, as its second argument says: `'fps=1'` or a number of frames a
/// second, `'every_n_frames=30'`, `'keyframes_only'`, `'all'`.
fn sampling_of(arg: &Expr) -> datafusion::error::Result<crate::video::Sampling> {
    let text = match arg {
        Expr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::Utf8View(Some(s))
            | ScalarValue::LargeUtf8(Some(s)),
            _,
        ) => s.clone(),
        Expr::Literal(
            v @ (ScalarValue::Int64(Some(_))
            | ScalarValue::Float64(Some(_))
            | ScalarValue::Int32(Some(_))),
            _,
        ) => v.to_string(),
        other => {
            return plan_err!(
                "read_frames: how to sample is a literal ('fps=1', 'every_n_frames=30', \
                 'keyframes_only'), not {other}"
            );
        }
    };
    crate::video::Sampling::parse(&text)
        .map_err(|e| DataFusionError::Plan(format!("read_frames: {e}")))
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

/// Whether `plan` is a scan of `read_frames`.
pub fn reads_frames(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<BlobExec>()
        .is_some_and(|exec| matches!(exec.files.form, Form::Frames(_)))
}

/// The metadata key that marks `filename` as the name of the file beside it: a model reading
/// the file's content names the file in its errors and rejects ([`crate::rules::file_names`]).
pub const FILE_NAME: &str = "batchinfer.file_name";

/// Whether `field` is a file's name, beside its content.
pub fn is_file_name(field: &Field) -> bool {
    field.metadata().contains_key(FILE_NAME) && *field.data_type() == DataType::Utf8
}

/// The columns of `read_blob` (content BLOB), `read_text` (content VARCHAR) or
/// `read_document` ([`document::schema`]).
fn schema(form: Form) -> SchemaRef {
    let content = match form {
        Form::Blob => DataType::Binary,
        Form::Text => DataType::Utf8,
        Form::Document => return document::schema(),
        Form::Frames(_) => return frames::schema(),
    };
    Arc::new(Schema::new(vec![
        file_name_field(),
        Field::new("content", content, false),
        Field::new("size", DataType::Int64, false),
        Field::new(
            "last_modified",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]))
}

/// `filename`, marked as the name of the file its row is read from.
fn file_name_field() -> Field {
    Field::new("filename", DataType::Utf8, false).with_metadata(
        [(FILE_NAME.to_string(), "true".to_string())]
            .into_iter()
            .collect(),
    )
}

/// The files a `read_blob` names.
#[derive(Debug, Clone)]
pub struct BlobTable {
    url: ListingTableUrl,
    /// The folder or glob as the query names it.
    location: String,
    form: Form,
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
        let sampling = match self.form {
            Form::Frames(sampling) => format!(", '{}'", sampling.shown()),
            _ => String::new(),
        };
        format!(
            "{}('{}'{sampling})",
            self.form.function(),
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
        (self.form == Form::Blob && block > 0).then(|| BlobTable {
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
        let function = self.form.function();
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
        self.form.function()
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
        let target = state.config_options().execution.target_partitions;
        // Frames: as many partitions as the session's, some of them empty where there are
        // fewer videos, so that the planner deals no batches of frames among partitions
        // itself (its round robin may queue them faster than the model scores them).
        let partitions = match self.form {
            Form::Frames(_) => target.max(1),
            _ => target.min(files.len()).max(1),
        };
        Ok(Arc::new(BlobExec::new(
            Files {
                store,
                store_url: self.url.object_store().as_str().to_string(),
                metas: files,
                names,
                form: self.form,
                max_bytes: options.max_blob_bytes,
                batch_rows: usize::from(state.config_options().execution.batch_size).max(1),
                ends: self.ends,
                files_errors_fail: self.only.is_some(),
            },
            columns,
            schema,
            partitions,
        )))
    }
}

#[cfg(test)]
mod tests;
