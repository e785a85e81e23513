//! `read_document`'s rows: a file's pages ([`crate::documents`]), a row each, or one row that
//! says why the file is no document it can read.

use datafusion::arrow::array::{BooleanArray, Int32Array};

use crate::documents::Page;

use super::files::unreadable;
use super::*;

/// The columns of `read_document`: those of DuckDB's `read_blob` it shares first, in its order.
pub(super) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        file_name_field(),
        Field::new("page", DataType::Int32, true),
        Field::new("pages", DataType::Int32, true),
        Field::new("text", DataType::Utf8, true),
        Field::new("size", DataType::Int64, false),
        Field::new(
            "last_modified",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        Field::new("has_text", DataType::Boolean, true),
        Field::new("error", DataType::Utf8, true),
    ]))
}

/// What one file gave: its pages, or why it gave none.
type Read = Result<Vec<Page>, String>;

/// The most text a record batch of `read_document` holds, but for one larger document (which is
/// at most [`crate::documents::MOST_TEXT`]): text unpacked from small files is no larger in
/// memory than a batch of them.
const BATCH_TEXT: usize = 64 << 20;

/// The files of a batch read, and the pages of those parsed but not yet in a record batch.
struct Parsing {
    files: Arc<Files>,
    contents: std::vec::IntoIter<Result<bytes::Bytes, String>>,
    /// The file of the next content.
    next: usize,
    /// The first file of `reads`.
    start: usize,
    reads: Vec<Read>,
    text: usize,
}

impl Files {
    /// The record batches of the documents `range`: a row per page of each, of the columns
    /// `columns` (of [`schema`]'s). The files are read a few at once (their bytes bounded as
    /// [`Files::batches`] bounds them), then parsed one at a time off the async threads, a
    /// record batch given whenever their text reaches [`BATCH_TEXT`].
    pub(super) fn document_batches(
        self: Arc<Self>,
        range: Range<usize>,
        columns: Arc<Vec<usize>>,
        schema: SchemaRef,
    ) -> futures::stream::BoxStream<'static, datafusion::error::Result<RecordBatch>> {
        let files = self.clone();
        let first = range.start;
        let read = async move {
            let files = &files;
            let contents: Vec<Result<bytes::Bytes, String>> = futures::stream::iter(range.clone())
                .map(|i| async move {
                    match files.read(i).await {
                        Ok(bytes) => Ok(Ok(bytes)),
                        // Too large, changed while read or removed since listed: the
                        // file's own error (a view's refresh reads it again, changed).
                        Err(DataFusionError::External(e))
                            if crate::storage::unreadable::is_unreadable(e.as_ref())
                                || (e.is::<super::files::Gone>() && !files.files_errors_fail) =>
                        {
                            Ok(Err(e.to_string()))
                        }
                        Err(e) => Err(e),
                    }
                })
                .buffered(READS_AT_ONCE)
                .try_collect()
                .await?;
            Ok::<_, DataFusionError>(contents)
        };
        futures::stream::once(read)
            .map_ok(move |contents| {
                let parsing = Parsing {
                    files: self.clone(),
                    contents: contents.into_iter(),
                    next: first,
                    start: first,
                    reads: Vec::new(),
                    text: 0,
                };
                let (columns, schema) = (columns.clone(), schema.clone());
                futures::stream::try_unfold(parsing, move |parsing| {
                    Self::parse_some(parsing, columns.clone(), schema.clone())
                })
            })
            .try_flatten()
            .boxed()
    }

    /// The next record batch of `parsing`, and what is left of it; None where all are given.
    async fn parse_some(
        mut parsing: Parsing,
        columns: Arc<Vec<usize>>,
        schema: SchemaRef,
    ) -> datafusion::error::Result<Option<(RecordBatch, Parsing)>> {
        loop {
            let Some(content) = parsing.contents.next() else {
                if parsing.reads.is_empty() {
                    return Ok(None);
                }
                break;
            };
            let name = parsing.files.names[parsing.next].clone();
            parsing.next += 1;
            // pdfium and the parsers are CPU work: off the threads that drive the streams.
            let read: Read = tokio::task::spawn_blocking(move || match content {
                Err(why) => Ok(Err(why)),
                Ok(bytes) => crate::documents::pages(&name, &bytes)
                    .map(|pages| pages.map_err(|why| format!("read_document: {name}: {why}"))),
            })
            .await
            .map_err(|e| DataFusionError::Execution(format!("read_document: {e}")))?
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
            match &read {
                Err(why) if parsing.files.files_errors_fail => return Err(unreadable(why.clone())),
                Err(why) => parsing.text += why.len(),
                Ok(pages) => parsing.text += pages.iter().map(|p| p.text.len()).sum::<usize>(),
            }
            parsing.reads.push(read);
            if parsing.text >= BATCH_TEXT {
                break;
            }
        }
        let reads = std::mem::take(&mut parsing.reads);
        let batch = parsing
            .files
            .document_rows(parsing.start, &reads, &columns, schema)?;
        parsing.start = parsing.next;
        parsing.text = 0;
        Ok(Some((batch, parsing)))
    }

    /// The record batch of the files from `start` that gave `reads`.
    fn document_rows(
        &self,
        start: usize,
        reads: &[Read],
        columns: &[usize],
        schema: SchemaRef,
    ) -> datafusion::error::Result<RecordBatch> {
        // Each row's file (of `range`) and page (None for a file that gave none).
        let mut rows: Vec<(usize, Option<usize>)> = Vec::new();
        for (k, read) in reads.iter().enumerate() {
            match read {
                Ok(pages) if !pages.is_empty() => {
                    rows.extend((0..pages.len()).map(|p| (start + k, Some(p))))
                }
                _ => rows.push((start + k, None)),
            }
        }
        let read_of = |i: usize| &reads[i - start];
        let page_of = |i: usize, p: Option<usize>| match (read_of(i), p) {
            (Ok(pages), Some(p)) => Some(&pages[p]),
            _ => None,
        };
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
        for column in columns {
            let array: ArrayRef = match column {
                0 => Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|(i, _)| self.names[*i].as_str()),
                )),
                1 => {
                    Arc::new(Int32Array::from_iter(rows.iter().map(|(_, p)| {
                        p.map(|p| i32::try_from(p + 1).unwrap_or(i32::MAX))
                    })))
                }
                2 => Arc::new(Int32Array::from_iter(rows.iter().map(|(i, p)| {
                    match (read_of(*i), p) {
                        (Ok(pages), Some(_)) => {
                            Some(i32::try_from(pages.len()).unwrap_or(i32::MAX))
                        }
                        _ => None,
                    }
                }))),
                3 => Arc::new(StringArray::from_iter(rows.iter().map(|(i, p)| {
                    page_of(*i, *p)
                        .filter(|page| page.error.is_none())
                        .map(|page| page.text.as_str())
                }))),
                4 => Arc::new(Int64Array::from_iter_values(
                    rows.iter()
                        .map(|(i, _)| self.metas[*i].size.min(i64::MAX as u64) as i64),
                )),
                5 => Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter()
                        .map(|(i, _)| self.metas[*i].last_modified.timestamp_micros()),
                )),
                6 => Arc::new(BooleanArray::from_iter(
                    rows.iter()
                        .map(|(i, p)| page_of(*i, *p).map(|page| page.has_text)),
                )),
                _ => Arc::new(StringArray::from_iter(rows.iter().map(|(i, p)| {
                    match (read_of(*i), page_of(*i, *p)) {
                        (Err(why), _) => Some(why.clone()),
                        (
                            Ok(_),
                            Some(Page {
                                error: Some(why), ..
                            }),
                        ) => Some(format!("read_document: {}: {why}", self.names[*i])),
                        _ => None,
                    }
                }))),
            };
            arrays.push(array);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
    }
}
