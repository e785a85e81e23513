//! A value a write's files hold that is known only when the write commits (what endpoint models
//! did for the rows: [`crate::lineage::UsageRecord`]). Each file is written with a placeholder
//! of fixed length, unique to the write, and the commit overwrites it with the value, padded
//! with spaces to the same length: nothing else in the file moves, so every offset and length
//! a Parquet footer keeps stays true.
//!
//! - **Local files** are filled in their hidden sibling, before the rename that commits them.
//! - **Uploads** (S3, Azure, Google Cloud Storage) send their parts as they come, except the
//!   bytes from where the placeholder may begin (a [`Tail`]): those are held, filled and sent as
//!   the last parts at commit. Parts keep the writer's size (every part but the last of one
//!   size, at least [`MIN_PART`], as S3 and the servers that want equal parts accept). While a
//!   file is written its tail is in memory, at most about two parts; once written, a tail of
//!   more than 64 KiB waits for the commit in an unnamed temporary file, so a write of many
//!   files holds little of each in memory. At commit every tail is sent before any upload is
//!   completed.
//! - Files written by a cluster's executors are not filled: their write does not take one
//!   ([`super::CommittedWrite::fill_at_commit`]).

use std::fmt;
use std::sync::Arc;

/// The smallest part an upload sends before its last (S3's and Google Cloud Storage's minimum).
pub const MIN_PART: usize = 5 << 20;

/// What a write's files are filled with at commit.
pub struct Fill {
    placeholder: Arc<[u8]>,
    value: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
}

impl fmt::Debug for Fill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fill")
            .field("placeholder", &String::from_utf8_lossy(&self.placeholder))
            .finish()
    }
}

impl Fill {
    /// Files holding `placeholder` get `value()` in its place when the write commits. The
    /// placeholder must be unique to the write (no data can hold it) and at least as long as
    /// any value.
    pub fn new(placeholder: &str, value: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> Self {
        Fill {
            placeholder: placeholder.as_bytes().into(),
            value: Box::new(value),
        }
    }

    pub(super) fn placeholder(&self) -> Arc<[u8]> {
        self.placeholder.clone()
    }

    /// The value, padded with spaces to the placeholder's length; None where it does not fit
    /// (the placeholder then stays).
    pub(super) fn padded(&self) -> Option<Vec<u8>> {
        let mut value = (self.value)();
        if value.len() > self.placeholder.len() {
            return None;
        }
        value.resize(self.placeholder.len(), b' ');
        Some(value)
    }
}

/// Overwrites the last `placeholder` in `bytes` with `value` (of its length); whether there was
/// one.
pub(super) fn fill_bytes(bytes: &mut [u8], placeholder: &[u8], value: &[u8]) -> bool {
    if placeholder.is_empty() || value.len() != placeholder.len() {
        return false;
    }
    match bytes
        .windows(placeholder.len())
        .rposition(|w| w == placeholder)
    {
        Some(at) => {
            bytes[at..at + value.len()].copy_from_slice(value);
            true
        }
        None => false,
    }
}

/// Fills a local Parquet file in place: the placeholder is looked for in its footer (the
/// metadata the last 8 bytes give the length of).
pub(super) fn fill_local_file(
    path: &std::path::Path,
    placeholder: &[u8],
    value: &[u8],
) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom, Write};
    if placeholder.is_empty() || value.len() != placeholder.len() {
        return Ok(false);
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let size = file.metadata()?.len();
    if size < 12 {
        return Ok(false);
    }
    let mut end = [0u8; 8];
    file.seek(SeekFrom::Start(size - 8))?;
    file.read_exact(&mut end)?;
    if &end[4..] != b"PAR1" {
        return Ok(false);
    }
    let metadata_len = u64::from(u32::from_le_bytes([end[0], end[1], end[2], end[3]]));
    let Some(start) = size.checked_sub(8 + metadata_len) else {
        return Ok(false);
    };
    let mut footer = vec![0u8; metadata_len as usize];
    file.seek(SeekFrom::Start(start))?;
    file.read_exact(&mut footer)?;
    let Some(at) = footer
        .windows(placeholder.len())
        .rposition(|w| w == placeholder)
    else {
        return Ok(false);
    };
    file.seek(SeekFrom::Start(start + at as u64))?;
    file.write_all(value)?;
    Ok(true)
}

/// The end of an upload held back to be filled at commit: what is written is sent on as parts
/// of one size (the writer's first, at least [`MIN_PART`]), as S3-compatible servers that want
/// parts of equal size accept, except from where the placeholder begins (or, until it is seen,
/// the bytes that could be its beginning). Once its writer is done, what it holds waits for the
/// commit on disk ([`Tail::spill`]), not in memory.
#[derive(Debug)]
pub(super) struct Tail {
    placeholder: Arc<[u8]>,
    held: Vec<u8>,
    /// Where the placeholder begins in `held`, once seen.
    found_at: Option<usize>,
    /// The size of every part but the last.
    part: Option<usize>,
    min_part: usize,
    /// The bytes held, moved to an unnamed file while they wait for the commit.
    spilled: Option<std::fs::File>,
}

/// Bytes held past this wait for the commit in a file.
const SPILL: usize = 64 << 10;

impl Tail {
    pub(super) fn new(placeholder: Arc<[u8]>) -> Self {
        Tail::with_min_part(placeholder, MIN_PART)
    }

    fn with_min_part(placeholder: Arc<[u8]>, min_part: usize) -> Self {
        Tail {
            placeholder,
            held: Vec::new(),
            found_at: None,
            part: None,
            min_part,
            spilled: None,
        }
    }

    /// Takes the next bytes written; the parts to send now, each of the upload's part size.
    pub(super) fn push(&mut self, data: &[u8]) -> Vec<bytes::Bytes> {
        let part = *self.part.get_or_insert(data.len().max(self.min_part));
        let m = self.placeholder.len().max(1);
        let searched_from = self.held.len().saturating_sub(m - 1);
        self.held.extend_from_slice(data);
        if self.found_at.is_none() {
            self.found_at = self.held[searched_from..]
                .windows(m)
                .position(|w| w == &*self.placeholder)
                .map(|at| at + searched_from);
        }
        let sendable = match self.found_at {
            Some(at) => at,
            None => self.held.len().saturating_sub(m - 1),
        };
        let whole = sendable / part * part;
        if whole == 0 {
            return Vec::new();
        }
        let rest = self.held.split_off(whole);
        if let Some(at) = &mut self.found_at {
            *at -= whole;
        }
        let sent = bytes::Bytes::from(std::mem::replace(&mut self.held, rest));
        (0..whole)
            .step_by(part)
            .map(|at| sent.slice(at..at + part))
            .collect()
    }

    /// Moves the bytes held to an unnamed file, where they wait for the commit: the writer is
    /// done, and a write of many files keeps little of each in memory.
    pub(super) fn spill(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        if self.held.len() <= SPILL || self.spilled.is_some() {
            return Ok(());
        }
        let mut file = unnamed_file()?;
        file.write_all(&self.held)?;
        self.held = Vec::new();
        self.spilled = Some(file);
        Ok(())
    }

    /// The parts left to send, the placeholder among them filled with `value` (None: left as
    /// it is): of the upload's part size, the last no larger.
    pub(super) fn finish(mut self, value: Option<&[u8]>) -> std::io::Result<Vec<bytes::Bytes>> {
        if let Some(mut file) = self.spilled.take() {
            use std::io::{Read, Seek, SeekFrom};
            file.seek(SeekFrom::Start(0))?;
            file.read_to_end(&mut self.held)?;
        }
        if let Some(value) = value {
            fill_bytes(&mut self.held, &self.placeholder, value);
        }
        let part = self.part.unwrap_or(self.min_part).max(1);
        let held = bytes::Bytes::from(self.held);
        Ok((0..held.len())
            .step_by(part)
            .map(|at| held.slice(at..(at + part).min(held.len())))
            .collect())
    }
}

/// A file of the temporary folder no one else can open: removed as soon as it is made, gone
/// when it is closed.
fn unnamed_file() -> std::io::Result<std::fs::File> {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Per process: a counter for unique names.
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        ".batchinfer-tail-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `len` bytes with the placeholder at `at`, written in chunks of `chunk` bytes:
    /// the parts sent, then the rest filled (spilled to a file or not), make the file with the
    /// value in its place, and every part but the last has one size, the last no larger.
    fn upload(len: usize, at: usize, chunk: usize, min_part: usize, spill: bool) {
        let placeholder: Arc<[u8]> = b"<placeholder-0123456789>".as_slice().into();
        let value = b"{\"requests\":3}          ";
        assert_eq!(value.len(), placeholder.len());
        let mut file: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        file[at..at + placeholder.len()].copy_from_slice(&placeholder);
        let mut expected = file.clone();
        expected[at..at + value.len()].copy_from_slice(value);

        let mut tail = Tail::with_min_part(placeholder.clone(), min_part);
        let mut sent = Vec::new();
        for data in file.chunks(chunk) {
            sent.extend(tail.push(data));
        }
        if spill {
            let mut held = tail.held.len();
            tail.spill().unwrap();
            if held > SPILL {
                assert!(tail.held.is_empty() && tail.spilled.is_some());
                held = 0;
            }
            assert_eq!(tail.held.len(), held);
        }
        sent.extend(tail.finish(Some(value)).unwrap());
        let size = chunk.max(min_part);
        for (i, part) in sent.iter().enumerate() {
            if i + 1 < sent.len() {
                assert_eq!(part.len(), size, "part {i} of {}", sent.len());
            } else {
                assert!(part.len() <= size && !part.is_empty());
            }
        }
        assert_eq!(sent.concat(), expected, "len {len}, at {at}, chunk {chunk}");
    }

    #[test]
    fn an_upload_is_filled_wherever_its_parts_are_cut() {
        let len = 1000;
        for chunk in [1, 7, 23, 24, 25, 100, 333, 1000] {
            for at in [0, 1, 99, 100, 101, 500, 952, 976] {
                for min_part in [1, 50, 100, 2000] {
                    upload(len, at.min(len - 24), chunk, min_part, false);
                }
            }
        }
        // Past the size that waits on disk.
        let len = 3 * SPILL;
        for at in [0, SPILL - 5, 2 * SPILL + 7, len - 24] {
            upload(len, at, SPILL / 2, SPILL, true);
            upload(len, at, 4096, 100, true);
        }
    }

    #[test]
    fn parts_are_sent_before_the_placeholder() {
        let placeholder: Arc<[u8]> = b"PLACEHOLDER".as_slice().into();
        let mut tail = Tail::with_min_part(placeholder, 10);
        let sizes = |parts: Vec<bytes::Bytes>| parts.iter().map(|p| p.len()).collect::<Vec<_>>();
        // Parts of the first write's size (15); the last 10 bytes could begin the placeholder.
        assert_eq!(sizes(tail.push(&[0u8; 15])), Vec::<usize>::new());
        assert_eq!(sizes(tail.push(&[1u8; 15])), vec![15]);
        assert_eq!(sizes(tail.push(&[2u8; 30])), vec![15, 15]);
        let mut end = vec![3u8; 20];
        end.extend(b"PLACEHOLDER");
        end.extend([4u8; 40]);
        // What came before it goes; the placeholder and what follows wait for the commit.
        assert_eq!(sizes(tail.push(&end)), vec![15, 15]);
        assert_eq!(sizes(tail.push(&[5u8; 100])), Vec::<usize>::new());
        let mut rest = vec![15; 10];
        rest.push(6);
        assert_eq!(sizes(tail.finish(None).unwrap()), rest);
    }

    #[test]
    fn a_local_parquet_footer_is_filled_in_place() {
        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::parquet::arrow::ArrowWriter;
        use datafusion::parquet::file::metadata::KeyValue;
        use datafusion::parquet::file::properties::WriterProperties;
        use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
        use datafusion::parquet::record::RowAccessor;

        let placeholder = format!("{{\"x\":\"{}\"}}{}", "f".repeat(32), " ".repeat(40));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.parquet");
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from_iter_values(0..10_000))],
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_key_value_metadata(Some(vec![KeyValue::new(
                "k".to_string(),
                placeholder.clone(),
            )]))
            .build();
        let mut writer =
            ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, Some(props))
                .unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let size = std::fs::metadata(&path).unwrap().len();

        let mut value = br#"{"requests":12}"#.to_vec();
        value.resize(placeholder.len(), b' ');
        assert!(fill_local_file(&path, placeholder.as_bytes(), &value).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let kv = reader
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap();
        let got = kv.iter().find(|kv| kv.key == "k").unwrap();
        assert_eq!(
            got.value.as_deref().unwrap().trim_end(),
            r#"{"requests":12}"#
        );
        let mut sum = 0i64;
        for row in reader.get_row_iter(None).unwrap() {
            sum += row.unwrap().get_long(0).unwrap();
        }
        assert_eq!(sum, (0..10_000).sum::<i64>(), "every value read back");
        // A file without the placeholder is left alone.
        assert!(!fill_local_file(&path, placeholder.as_bytes(), &value).unwrap());
    }
}
