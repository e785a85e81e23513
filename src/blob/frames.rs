//! `read_frames`' rows: a video's sampled frames ([`crate::video`]), a row each, and a row that
//! says why where a video gives no more (damaged, cut short, no video at all).
//!
//! Each partition decodes its videos one after another on a thread of its own (ffmpeg decoding
//! each on every core), a record batch ahead of the query: frames are decoded while the model
//! scores the batch before. A video is never held whole: its frames come a batch at a time. A
//! video on an object store is copied to a temporary file first (ffmpeg seeks in it), which is
//! removed as soon as ffmpeg has it open.

use std::io::Write;

use datafusion::arrow::array::{Float64Array, Int32Array};

use crate::video::{Frame, Sampling, Unreadable};

use super::files::unreadable;
use super::*;

/// The columns of `read_frames`: those of DuckDB's `read_blob` it shares first, in its order.
pub(super) fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        file_name_field(),
        Field::new("frame", DataType::Int64, true),
        Field::new("pts", DataType::Float64, true),
        Field::new("width", DataType::Int32, true),
        Field::new("height", DataType::Int32, true),
        Field::new("image", DataType::Binary, true),
        Field::new("size", DataType::Int64, false),
        Field::new(
            "last_modified",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        Field::new("error", DataType::Utf8, true),
    ]))
}

/// The most pixels a record batch of frames holds (but for one larger frame): 64 MiB, some
/// 30 frames of 720p.
const BATCH_PIXELS: usize = 64 << 20;

/// The most frames a record batch holds (fewer where the session's batch size is smaller): an
/// image model's batch, and what it prepares, stay small however small the frames.
const BATCH_FRAMES: usize = 32;

/// One row: a frame of file `.0`, or why its frames end.
enum Row {
    Frame(usize, Frame),
    Error(usize, String),
}

type Sent = datafusion::error::Result<Vec<Row>>;

impl Files {
    /// The record batches of the videos `range`: a row per sampled frame of each, of the columns
    /// `columns` (of [`schema`]'s), decoded by a thread of their own a batch ahead.
    pub(super) fn frame_batches(
        self: Arc<Self>,
        range: Range<usize>,
        sampling: Sampling,
        columns: Arc<Vec<usize>>,
        schema: SchemaRef,
    ) -> futures::stream::BoxStream<'static, datafusion::error::Result<RecordBatch>> {
        let (send, receive) = tokio::sync::mpsc::channel::<Sent>(1);
        let files = self.clone();
        let runtime = tokio::runtime::Handle::current();
        let started = std::thread::Builder::new()
            .name("read_frames".into())
            .spawn(move || files.decode(range, sampling, &runtime, &send));
        if let Err(e) = started {
            let e = DataFusionError::Execution(format!("read_frames: starting a thread: {e}"));
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        futures::stream::unfold(receive, |mut receive| async move {
            let rows = receive.recv().await?;
            Some((rows, receive))
        })
        .map(move |rows| self.frame_rows(rows?, &columns, schema.clone()))
        .boxed()
    }

    /// Decodes the videos `range` in order, sending their rows a batch at a time; stops where
    /// the rows are no longer wanted.
    fn decode(
        &self,
        range: Range<usize>,
        sampling: Sampling,
        runtime: &tokio::runtime::Handle,
        send: &tokio::sync::mpsc::Sender<Sent>,
    ) {
        let mut rows = Vec::new();
        let mut pixels = 0usize;
        for i in range {
            let name = &self.names[i];
            let mut given = 0u64;
            let opened = if self.metas[i].size == 0 {
                Err(Opened::Row(format!(
                    "read_frames: {name}: {}",
                    Unreadable::Empty
                )))
            } else {
                self.opened(i, runtime)
            };
            let file = match opened {
                Ok(file) => file,
                Err(Opened::Row(why)) if !self.files_errors_fail => {
                    rows.push(Row::Error(i, why));
                    continue;
                }
                Err(Opened::Row(why)) => {
                    let _ = send.blocking_send(Err(unreadable(why)));
                    return;
                }
                Err(Opened::Statement(e)) => {
                    let _ = send.blocking_send(Err(e));
                    return;
                }
            };
            let mut decoder = match crate::video::frames(file, sampling) {
                Ok(decoder) => decoder,
                Err(e) => {
                    let _ = send.blocking_send(Err(DataFusionError::External(Box::new(e))));
                    return;
                }
            };
            while let Some(next) = decoder.next_frame() {
                match next {
                    Ok(frame) => {
                        given += 1;
                        pixels += frame.image.len();
                        rows.push(Row::Frame(i, frame));
                    }
                    Err(Unreadable::Stopped(why)) => {
                        let _ = send.blocking_send(Err(DataFusionError::Execution(format!(
                            "read_frames: {name}: {why}; run the statement again"
                        ))));
                        return;
                    }
                    Err(why) => {
                        let why = format!("read_frames: {name}: {why}");
                        if self.files_errors_fail {
                            let _ = send.blocking_send(Err(unreadable(why)));
                            return;
                        }
                        given += 1;
                        rows.push(Row::Error(i, why));
                    }
                }
                if pixels >= BATCH_PIXELS || rows.len() >= self.batch_rows.min(BATCH_FRAMES) {
                    pixels = 0;
                    if send.blocking_send(Ok(std::mem::take(&mut rows))).is_err() {
                        return;
                    }
                }
            }
            // A local video rewritten while ffmpeg read it: what was read may be of either.
            if self.store_url.starts_with("file:") && self.changed(i) {
                let why = format!(
                    "read_frames: {name} changed while it was read (it was replaced, rewritten \
                     or deleted): read it again"
                );
                if self.files_errors_fail {
                    let _ = send.blocking_send(Err(unreadable(why)));
                    return;
                }
                given += 1;
                rows.push(Row::Error(i, why));
            }
            if given == 0 {
                let why = format!("read_frames: {name}: it has no frames");
                if self.files_errors_fail {
                    let _ = send.blocking_send(Err(unreadable(why)));
                    return;
                }
                rows.push(Row::Error(i, why));
            }
        }
        if !rows.is_empty() {
            let _ = send.blocking_send(Ok(rows));
        }
    }

    /// Video `i`, opened for ffmpeg: a local file as it was listed, through the session's store
    /// (which checks where it may read); another store's copied to a temporary file, removed
    /// once open.
    fn opened(&self, i: usize, runtime: &tokio::runtime::Handle) -> Result<std::fs::File, Opened> {
        let meta = &self.metas[i];
        let name = &self.names[i];
        let gone = || {
            Opened::Row(format!(
                "read_frames: {name} was removed or changed after it was listed: read it again"
            ))
        };
        let failed = |e: object_store::Error| match e {
            object_store::Error::NotFound { .. } => gone(),
            e => Opened::Statement(DataFusionError::Execution(format!(
                "read_frames: reading {name}: {e}"
            ))),
        };
        if self.store_url.starts_with("file:") {
            // Checked by the session's store (where it is, its links resolved), then opened.
            runtime
                .block_on(self.store.head(&meta.location))
                .map_err(failed)?;
            let path = crate::storage::local_file(&meta.location).ok_or_else(gone)?;
            let file = std::fs::File::open(&path).map_err(|_| gone())?;
            let now = file.metadata().map_err(|_| gone())?;
            if now.len() != meta.size || micros(&now) != Some(meta.last_modified.timestamp_micros())
            {
                return Err(gone());
            }
            return Ok(file);
        }
        let copy = Copy::new().map_err(|e| {
            Opened::Statement(DataFusionError::Execution(format!(
                "read_frames: a temporary file for {name}: {e}"
            )))
        })?;
        let written = runtime.block_on(async {
            let got = self.store.get(&meta.location).await.map_err(failed)?;
            let mut stream = got.into_stream();
            let mut file = std::io::BufWriter::with_capacity(1 << 20, &copy.file);
            let mut written = 0u64;
            while let Some(part) = stream.next().await {
                let part = part.map_err(failed)?;
                written += part.len() as u64;
                file.write_all(&part).map_err(|e| {
                    Opened::Statement(DataFusionError::Execution(format!(
                        "read_frames: copying {name} to a temporary file: {e}"
                    )))
                })?;
            }
            file.flush().map_err(|e| {
                Opened::Statement(DataFusionError::Execution(format!(
                    "read_frames: copying {name} to a temporary file: {e}"
                )))
            })?;
            Ok::<_, Opened>(written)
        })?;
        if written != meta.size {
            return Err(gone());
        }
        copy.reopened().map_err(|e| {
            Opened::Statement(DataFusionError::Execution(format!(
                "read_frames: a temporary file for {name}: {e}"
            )))
        })
    }

    /// Whether local video `i` is not as it was listed now.
    fn changed(&self, i: usize) -> bool {
        let meta = &self.metas[i];
        let Some(now) = crate::storage::local_file(&meta.location)
            .and_then(|path| std::fs::metadata(path).ok())
        else {
            return true;
        };
        now.len() != meta.size || micros(&now) != Some(meta.last_modified.timestamp_micros())
    }

    /// The record batch of `rows`.
    fn frame_rows(
        &self,
        rows: Vec<Row>,
        columns: &[usize],
        schema: SchemaRef,
    ) -> datafusion::error::Result<RecordBatch> {
        let file = |row: &Row| match row {
            Row::Frame(i, _) | Row::Error(i, _) => *i,
        };
        fn frame(row: &Row) -> Option<&Frame> {
            match row {
                Row::Frame(_, frame) => Some(frame),
                Row::Error(..) => None,
            }
        }
        let int32 = |v: u32| i32::try_from(v).unwrap_or(i32::MAX);
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
        for column in columns {
            let array: ArrayRef = match column {
                0 => Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| self.names[file(r)].as_str()),
                )),
                1 => Arc::new(Int64Array::from_iter(
                    rows.iter()
                        .map(|r| frame(r).map(|f| f.index.min(i64::MAX as u64) as i64)),
                )),
                2 => Arc::new(Float64Array::from_iter(
                    rows.iter().map(|r| frame(r).and_then(|f| f.pts)),
                )),
                3 => Arc::new(Int32Array::from_iter(
                    rows.iter().map(|r| frame(r).map(|f| int32(f.width))),
                )),
                4 => Arc::new(Int32Array::from_iter(
                    rows.iter().map(|r| frame(r).map(|f| int32(f.height))),
                )),
                5 => Arc::new(BinaryArray::from_iter(
                    rows.iter().map(|r| frame(r).map(|f| f.image.as_slice())),
                )),
                6 => Arc::new(Int64Array::from_iter_values(
                    rows.iter()
                        .map(|r| self.metas[file(r)].size.min(i64::MAX as u64) as i64),
                )),
                7 => Arc::new(TimestampMicrosecondArray::from_iter_values(
                    rows.iter()
                        .map(|r| self.metas[file(r)].last_modified.timestamp_micros()),
                )),
                _ => Arc::new(StringArray::from_iter(rows.iter().map(|r| match r {
                    Row::Error(_, why) => Some(why.as_str()),
                    Row::Frame(..) => None,
                }))),
            };
            arrays.push(array);
        }
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
    }
}

/// When a file was last modified, in microseconds since 1970 (as its store lists it).
fn micros(meta: &std::fs::Metadata) -> Option<i64> {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_micros() as i64)
}

/// Why a video was not opened: the file's own error (a row), or the statement's.
enum Opened {
    Row(String),
    Statement(DataFusionError),
}

/// A temporary copy of a video from an object store, in the system's temporary folder.
struct Copy {
    path: std::path::PathBuf,
    file: std::fs::File,
}

impl Copy {
    fn new() -> std::io::Result<Copy> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            ".batchinfer-video-{}-{:?}-{now}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok(Copy { path, file })
    }

    /// The copy, for reading from its start; its name is removed when this is dropped (the
    /// file stays readable until it is closed).
    fn reopened(self) -> std::io::Result<std::fs::File> {
        use std::io::Seek;
        let mut file = self.file.try_clone()?;
        file.seek(std::io::SeekFrom::Start(0))?;
        Ok(file)
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
