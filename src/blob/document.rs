//! `read_document`'s rows: a file's pages ([`crate::documents`]), a row each, or one row that
//! says why the file is no document it can read.

use datafusion::arrow::array::{BooleanArray, Int32Array};

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
type Read = Result<Vec<crate::documents::Page>, String>;

impl Files {
    /// The record batch of the documents `range`: a row per page of each, of the columns
    /// `columns` (of [`schema`]'s).
    pub(super) async fn document_batch(
        self: Arc<Self>,
        range: Range<usize>,
        columns: &[usize],
        schema: SchemaRef,
    ) -> datafusion::error::Result<RecordBatch> {
        let files = &self;
        let contents: Vec<Result<bytes::Bytes, String>> = futures::stream::iter(range.clone())
            .map(|i| async move {
                match files.read(i).await {
                    Ok(bytes) => Ok(Ok(bytes)),
                    // Too large, or changed while read: the file's own error.
                    Err(DataFusionError::External(e))
                        if crate::storage::unreadable::is_unreadable(e.as_ref()) =>
                    {
                        Ok(Err(e.to_string()))
                    }
                    Err(e) => Err(e),
                }
            })
            .buffered(READS_AT_ONCE)
            .try_collect()
            .await?;
        let names: Vec<String> = self.names[range.clone()].to_vec();
        // pdfium and the parsers are CPU work: off the threads that drive the streams.
        let reads: Vec<Read> = tokio::task::spawn_blocking(move || {
            contents
                .into_iter()
                .zip(&names)
                .map(|(content, name)| match content {
                    Err(why) => Ok(Err(why)),
                    Ok(bytes) => crate::documents::pages(name, &bytes)
                        .map(|pages| pages.map_err(|why| format!("read_document: {name}: {why}"))),
                })
                .collect::<crate::error::Result<Vec<Read>>>()
        })
        .await
        .map_err(|e| DataFusionError::Execution(format!("read_document: {e}")))?
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
        if self.files_errors_fail
            && let Some(Err(why)) = reads.iter().find(|r| r.is_err())
        {
            return Err(unreadable(why.clone()));
        }
        self.document_rows(range, &reads, columns, schema)
    }

    fn document_rows(
        &self,
        range: Range<usize>,
        reads: &[Read],
        columns: &[usize],
        schema: SchemaRef,
    ) -> datafusion::error::Result<RecordBatch> {
        // Each row's file (of `range`) and page (None for a file that gave none).
        let mut rows: Vec<(usize, Option<usize>)> = Vec::new();
        for (k, read) in reads.iter().enumerate() {
            match read {
                Ok(pages) if !pages.is_empty() => {
                    rows.extend((0..pages.len()).map(|p| (range.start + k, Some(p))))
                }
                _ => rows.push((range.start + k, None)),
            }
        }
        let read_of = |i: usize| &reads[i - range.start];
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
                3 => Arc::new(StringArray::from_iter(
                    rows.iter()
                        .map(|(i, p)| page_of(*i, *p).map(|page| page.text.as_str())),
                )),
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
                _ => Arc::new(StringArray::from_iter(rows.iter().map(
                    |(i, _)| match read_of(*i) {
                        Err(why) => Some(why.as_str()),
                        Ok(_) => None,
                    },
                ))),
            };
            arrays.push(array);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
    }
}
