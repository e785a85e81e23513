//! The files of one scan, and how they are read: dealt to partitions in order of name, cut
//! into record batches, a few read at once, each checked against its limits.

use super::*;

/// An error that is a file's own (too large, not text): a materialized view leaves the file out
/// and scores the others.
pub(super) fn unreadable(message: String) -> DataFusionError {
    DataFusionError::External(Box::new(crate::storage::unreadable::Unreadable(message)))
}

/// A file that was removed or changed after it was listed, while the statement read it.
#[derive(Debug)]
pub(super) struct Gone(pub(super) String);

impl fmt::Display for Gone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Gone {}

/// The files of one scan, and how they are read.
pub(super) struct Files {
    pub(super) store: Arc<dyn ObjectStore>,
    /// The store's URL, by which an executor of a cluster finds it.
    pub(super) store_url: String,
    pub(super) metas: Vec<ObjectMeta>,
    /// Each file as a person names it: a local path, or the object's URL.
    pub(super) names: Vec<String>,
    pub(super) form: Form,
    pub(super) max_bytes: u64,
    pub(super) batch_rows: usize,
    /// Each file's first and last this many bytes alone ([`BlobTable::of_ends`]).
    pub(super) ends: Option<u64>,
    /// Whether a document that cannot be read fails as its file's error (a materialized view's
    /// refresh leaves such a file out, named) rather than being a row that says why.
    pub(super) files_errors_fail: bool,
}

impl fmt::Debug for Files {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Files")
            .field("files", &self.metas.len())
            .field("form", &self.form)
            .finish()
    }
}

impl Files {
    pub(super) fn function(&self) -> &'static str {
        self.form.function()
    }

    /// The files of `partition` of `partitions`: a run of them in order of name.
    pub(super) fn of_partition(&self, partition: usize, partitions: usize) -> Range<usize> {
        let n = self.metas.len();
        (n * partition / partitions)..(n * (partition + 1) / partitions)
    }

    /// `files` cut into the files of each record batch: at most `batch_rows`, and (with their
    /// content) [`BATCH_BYTES`] but for one larger file.
    pub(super) fn batches(&self, files: Range<usize>, content: bool) -> Vec<Range<usize>> {
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
    pub(super) fn read_size(&self, i: usize) -> u64 {
        let size = self.metas[i].size;
        self.ends
            .map_or(size, |block| size.min(block.saturating_mul(2)))
    }

    /// Why file `i` is not read: what would be read of it is over the limit.
    pub(super) fn too_large(&self, i: usize) -> DataFusionError {
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
    pub(super) async fn read(&self, i: usize) -> datafusion::error::Result<bytes::Bytes> {
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
    pub(super) async fn read_listed(&self, i: usize) -> datafusion::error::Result<bytes::Bytes> {
        let meta = &self.metas[i];
        let name = &self.names[i];
        let failed = |e: object_store::Error| match e {
            object_store::Error::NotFound { .. } => {
                DataFusionError::External(Box::new(Gone(format!(
                    "{}: {name} was removed after it was listed",
                    self.function()
                ))))
            }
            object_store::Error::Generic { source, .. }
                if source.to_string().contains("changed while it was read") =>
            {
                DataFusionError::External(Box::new(Gone(format!("{}: {source}", self.function()))))
            }
            e => DataFusionError::Execution(format!("{}: reading {name}: {e}", self.function())),
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
    pub(super) async fn batch(
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
                1 if self.form == Form::Text => {
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
