//! Where a model's files come from: a local path, or an object in S3 read straight into memory
//! (no temporary file).

use std::fmt;
use std::path::{Path, PathBuf};

use url::Url;

use crate::error::Error;
use crate::message::display_error;
use crate::storage::{StoreRegistry, local_path, location_url, read_capped};

/// The largest model file read: ONNX's protobuf encoding ends at 2 GiB.
pub const MODEL_CAP: u64 = 2 << 30;
/// The largest `tokenizer.json` read.
pub const TOKENIZER_CAP: u64 = 256 << 20;
/// The largest configuration file beside a model read (`config.json`, `batchinfer.json`, ...).
pub const CONFIG_CAP: u64 = 1 << 20;

/// A model file (or a file beside it, such as its `tokenizer.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    File(PathBuf),
    Object(Url),
}

impl ModelSource {
    /// A path or an `s3://` URL, as written in `CREATE MODEL ... FROM`, `--models` or
    /// a warehouse model definition.
    pub fn parse(location: &str) -> Result<Self, String> {
        match local_path(location).map_err(|e| e.to_string())? {
            Some(path) => Ok(ModelSource::File(path)),
            None => location_url(location)
                .map(ModelSource::Object)
                .map_err(|e| e.to_string()),
        }
    }

    /// [`ModelSource::parse`] of a path that may hold a URL (`--models s3://bucket/models/`).
    pub fn from_path(path: &Path) -> Result<Self, String> {
        match path.to_str() {
            Some(location) => Self::parse(location),
            None => Ok(ModelSource::File(path.to_path_buf())),
        }
    }

    /// The file `name` (a relative path) in the folder of this one.
    pub fn beside(&self, name: &str) -> ModelSource {
        match self {
            ModelSource::File(path) => {
                ModelSource::File(path.parent().unwrap_or(Path::new("")).join(name))
            }
            // Each part a path segment, encoded: a name is never read as `..` or a query.
            ModelSource::Object(url) => {
                let mut beside = url.clone();
                if let Ok(mut segments) = beside.path_segments_mut() {
                    segments.pop().extend(name.split('/'));
                }
                ModelSource::Object(beside)
            }
        }
    }

    /// The last part of the path: `model.onnx` for a model folder's model.
    pub fn file_name(&self) -> Option<&str> {
        match self {
            ModelSource::File(path) => path.file_name()?.to_str(),
            ModelSource::Object(url) => url.path_segments()?.next_back(),
        }
    }

    /// The file's bytes, or `None` when there is no such file. A file over `cap` bytes, or one
    /// that is not a regular file (a FIFO, a device), is an error.
    pub fn read_if_exists(
        &self,
        stores: &StoreRegistry,
        cap: u64,
    ) -> Result<Option<Vec<u8>>, String> {
        let read = match self {
            ModelSource::File(path) => {
                if !path.exists() && path.symlink_metadata().is_err() {
                    return Ok(None);
                }
                read_capped(path, cap)
            }
            ModelSource::Object(url) => stores.read_blocking_capped(url, cap),
        };
        match read {
            Ok(bytes) => Ok(Some(bytes)),
            Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => Ok(None),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(display_error(&e)),
        }
    }

    /// The file's bytes; its absence is an error.
    pub fn read(&self, stores: &StoreRegistry, cap: u64) -> Result<Vec<u8>, String> {
        self.read_if_exists(stores, cap)?.ok_or_else(|| match self {
            ModelSource::File(path) => format!("{}: No such file or directory", path.display()),
            ModelSource::Object(url) => format!("{url} does not exist"),
        })
    }
}

impl fmt::Display for ModelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSource::File(path) => write!(f, "{}", path.display()),
            // A password in the URL is never printed (nor kept: no store takes one).
            ModelSource::Object(url) => {
                write!(f, "{}", crate::storage::blank_passwords(url.as_str()))
            }
        }
    }
}
