//! A file's first and last bytes as a model's input, as content-type models such as Google's
//! magika read files. A model folder declares it in `batchinfer.json`:
//!
//! ```json
//! {"bytes": {"head": 1024, "tail": 1024, "strip_whitespace": true, "pad": 256}}
//! ```
//!
//! `predict('model', content)` over a BLOB (or text) column then feeds each row as `head + tail`
//! integers: the first `head` bytes and the last `tail` bytes, each a value 0 to 255, padded
//! with `pad` where the file is shorter (the head at its end, the tail at its start). With
//! `strip_whitespace`, ASCII whitespace is first stripped from the start of the first `block`
//! bytes (4096 unless declared) and from the end of the last `block` bytes, as magika does.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Int32Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field};
use serde_json::Value;

use crate::error::{Error, Result};

/// How a model reads a file's bytes, as its folder declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct BytesSpec {
    /// How many bytes from the start, and from the end.
    pub head: usize,
    pub tail: usize,
    /// ASCII whitespace stripped from the start of the head's block and the end of the tail's.
    pub strip_whitespace: bool,
    /// The value of a missing byte.
    pub pad: i32,
    /// How many bytes at each end are read before they are stripped.
    pub block: usize,
}

/// The most values a row may have (head + tail).
const MAX_VALUES: usize = 1 << 20;

/// The keys of batchinfer.json's "bytes".
const KEYS: &[&str] = &["head", "tail", "strip_whitespace", "pad", "block"];

/// A "bytes" declaration that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadBytesSpec {
    #[error("an object is expected, as {{\"head\": 1024, \"tail\": 1024}}")]
    NotAnObject,
    #[error("\"{0}\" is not one of its keys ({keys})", keys = KEYS.join(", "))]
    UnknownKey(String),
    #[error("\"{key}\" must be a whole number of bytes, 0 to {MAX_VALUES}, not {got}")]
    Count { key: &'static str, got: String },
    #[error("\"{key}\" must be {expected}, not {got}")]
    Expected {
        key: &'static str,
        expected: &'static str,
        got: String,
    },
    #[error("\"head\" or \"tail\" must be more than 0 bytes")]
    Nothing,
    #[error("\"head\" and \"tail\" together must be at most {MAX_VALUES}")]
    TooMany,
    #[error("\"block\" ({0}) must be at least \"head\" and \"tail\"")]
    BlockTooSmall(usize),
}

impl BytesSpec {
    /// `batchinfer.json`'s `"bytes"` among `files` (name, bytes); None where it has none.
    pub fn from_files(files: &[(&str, Vec<u8>)]) -> Result<Option<BytesSpec>> {
        let Some((_, bytes)) = files.iter().find(|(f, _)| *f == "batchinfer.json") else {
            return Ok(None);
        };
        let json: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::ModelFile(format!("batchinfer.json is not JSON: {e}")))?;
        match json.get("bytes") {
            None => Ok(None),
            Some(spec) => Self::from_json(spec)
                .map(Some)
                .map_err(|e| Error::ModelFile(format!("batchinfer.json, \"bytes\": {e}"))),
        }
    }

    fn from_json(spec: &Value) -> std::result::Result<BytesSpec, BadBytesSpec> {
        let object = spec.as_object().ok_or(BadBytesSpec::NotAnObject)?;
        if let Some(key) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(BadBytesSpec::UnknownKey(key.clone()));
        }
        let count = |key: &'static str, default: usize| match object.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .filter(|n| *n as usize <= MAX_VALUES)
                .map(|n| n as usize)
                .ok_or_else(|| BadBytesSpec::Count {
                    key,
                    got: v.to_string(),
                }),
        };
        let head = count("head", 0)?;
        let tail = count("tail", 0)?;
        if head + tail == 0 {
            return Err(BadBytesSpec::Nothing);
        }
        if head + tail > MAX_VALUES {
            return Err(BadBytesSpec::TooMany);
        }
        let block = count("block", head.max(tail).max(4096))?;
        if block < head.max(tail) {
            return Err(BadBytesSpec::BlockTooSmall(block));
        }
        let strip_whitespace = match object.get("strip_whitespace") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(BadBytesSpec::Expected {
                    key: "strip_whitespace",
                    expected: "true or false",
                    got: v.to_string(),
                });
            }
        };
        let pad = match object.get("pad") {
            None => 256,
            Some(v) => v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| BadBytesSpec::Expected {
                    key: "pad",
                    expected: "a whole number",
                    got: v.to_string(),
                })?,
        };
        Ok(BytesSpec {
            head,
            tail,
            strip_whitespace,
            pad,
            block,
        })
    }

    /// The values a row has.
    pub fn values_per_row(&self) -> usize {
        self.head + self.tail
    }

    /// The type of a prepared column: a fixed-size list of integers, a file a row.
    pub fn prepared_type(&self) -> DataType {
        DataType::FixedSizeList(
            Arc::new(Field::new_list_field(DataType::Int32, false)),
            self.values_per_row() as i32,
        )
    }

    /// How DESCRIBE MODEL shows it.
    pub fn describe(&self) -> String {
        format!(
            "the first {} and last {} bytes of each file{}, padded with {} (batchinfer.json)",
            self.head,
            self.tail,
            if self.strip_whitespace {
                format!(
                    ", whitespace stripped at both ends of blocks of {}",
                    self.block
                )
            } else {
                String::new()
            },
            self.pad
        )
    }

    /// One file's values into `out` (`values_per_row` long).
    pub fn prepare(&self, bytes: &[u8], out: &mut [i32]) {
        let block = self.block.min(bytes.len());
        let mut first = &bytes[..block];
        let mut last = &bytes[bytes.len() - block..];
        if self.strip_whitespace {
            let start = first
                .iter()
                .position(|b| !is_space(*b))
                .unwrap_or(first.len());
            first = &first[start..];
            let end = last
                .iter()
                .rposition(|b| !is_space(*b))
                .map_or(0, |i| i + 1);
            last = &last[..end];
        }
        let (head_out, tail_out) = out.split_at_mut(self.head);
        let head = &first[..first.len().min(self.head)];
        for (o, b) in head_out.iter_mut().zip(head) {
            *o = i32::from(*b);
        }
        head_out[head.len()..].fill(self.pad);
        let tail = &last[last.len() - last.len().min(self.tail)..];
        let padding = self.tail - tail.len();
        tail_out[..padding].fill(self.pad);
        for (o, b) in tail_out[padding..].iter_mut().zip(tail) {
            *o = i32::from(*b);
        }
    }

    /// A column of files (BLOB or text) as the model's rows; NULL where the file is NULL.
    pub fn prepare_column(&self, column: &ArrayRef) -> Result<ArrayRef> {
        let rows = column.len();
        let per_row = self.values_per_row();
        let mut values = vec![self.pad; rows * per_row];
        let mut valid = vec![true; rows];
        let mut each = |i: usize, bytes: Option<&[u8]>| match bytes {
            Some(bytes) => self.prepare(bytes, &mut values[i * per_row..(i + 1) * per_row]),
            None => valid[i] = false,
        };
        match column.data_type() {
            DataType::Binary => {
                let a = column.as_binary::<i32>();
                (0..rows).for_each(|i| each(i, a.is_valid(i).then(|| a.value(i))));
            }
            DataType::LargeBinary => {
                let a = column.as_binary::<i64>();
                (0..rows).for_each(|i| each(i, a.is_valid(i).then(|| a.value(i))));
            }
            DataType::BinaryView => {
                let a = column.as_binary_view();
                (0..rows).for_each(|i| each(i, a.is_valid(i).then(|| a.value(i))));
            }
            DataType::Utf8 => {
                let a = column.as_string::<i32>();
                (0..rows).for_each(|i| each(i, a.is_valid(i).then(|| a.value(i).as_bytes())));
            }
            DataType::LargeUtf8 => {
                let a = column.as_string::<i64>();
                (0..rows).for_each(|i| each(i, a.is_valid(i).then(|| a.value(i).as_bytes())));
            }
            DataType::Utf8View => {
                let a = column.as_string_view();
                (0..rows).for_each(|i| each(i, a.is_valid(i).then(|| a.value(i).as_bytes())));
            }
            other => {
                return Err(Error::Tensor(format!(
                    "a file's bytes are read from a BLOB or text column, not {other}"
                )));
            }
        }
        let list = FixedSizeListArray::try_new(
            Arc::new(Field::new_list_field(DataType::Int32, false)),
            per_row as i32,
            Arc::new(Int32Array::from(values)),
            Some(NullBuffer::from(valid)),
        )?;
        Ok(Arc::new(list))
    }
}

/// ASCII whitespace as Python's `bytes.strip()` takes it (which magika uses): space, tab, line
/// feed, carriage return, vertical tab and form feed.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// Whether `t` is a column a file's bytes are read from.
pub fn is_file_column(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(head: usize, tail: usize, strip: bool) -> BytesSpec {
        BytesSpec {
            head,
            tail,
            strip_whitespace: strip,
            pad: 256,
            block: 4096,
        }
    }

    fn values(spec: &BytesSpec, bytes: &[u8]) -> Vec<i32> {
        let mut out = vec![0; spec.values_per_row()];
        spec.prepare(bytes, &mut out);
        out
    }

    #[test]
    fn short_files_are_padded_head_at_its_end_tail_at_its_start() {
        // Stripped: "ab \n" at the start, "  ab" at the end.
        assert_eq!(
            values(&spec(4, 4, true), b"  ab \n"),
            vec![97, 98, 32, 10, 32, 32, 97, 98]
        );
        assert_eq!(
            values(&spec(3, 3, true), b" a "),
            vec![97, 32, 256, 256, 32, 97]
        );
        // Vertical tab and form feed are whitespace too, as Python strips them.
        assert_eq!(
            values(&spec(2, 2, true), b"\x0b\x0cab\x0b"),
            vec![97, 98, 97, 98]
        );
        assert_eq!(
            values(&spec(3, 2, false), b"abcdef"),
            vec![97, 98, 99, 101, 102]
        );
        assert_eq!(values(&spec(2, 2, true), b""), vec![256; 4]);
    }

    #[test]
    fn whitespace_is_stripped_within_the_block_only() {
        let mut file = vec![b' '; 5000];
        file.extend_from_slice(b"xy");
        // The first block is all blanks: nothing of the head is left, as magika reads it.
        assert_eq!(values(&spec(2, 2, true), &file), vec![256, 256, 120, 121]);
    }

    #[test]
    fn declarations_are_checked() {
        let bad = |json: &str| {
            let v: Value = serde_json::from_str(json).unwrap();
            BytesSpec::from_json(&v).unwrap_err().to_string()
        };
        assert!(bad(r#"{"head": 0}"#).contains("more than 0"));
        assert!(bad(r#"{"head": 8, "mid": 3}"#).contains("\"mid\""));
        assert!(bad(r#"{"head": -1}"#).contains("whole number"));
        assert!(bad(r#"{"head": 8, "strip_whitespace": 1}"#).contains("true or false"));
        assert!(bad(r#"{"head": 10000000}"#).contains("0 to"));
        assert!(bad(r#"{"head": 100, "block": 10}"#).contains("at least"));
    }
}
