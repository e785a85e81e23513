//! Where a model's files come from: a URL, local or in S3, read straight into memory (no
//! temporary file).

use std::fmt;
use std::path::Path;

use url::Url;

use crate::message::display_error;
use crate::storage::{StoreRegistry, location_url};

pub use crate::onnx::MODEL_CAP;
/// The largest `tokenizer.json` read.
pub const TOKENIZER_CAP: u64 = 256 << 20;
/// The largest configuration file beside a model read (`config.json`, `batchinfer.json`, ...).
pub const CONFIG_CAP: u64 = 1 << 20;

/// A model file (or a file beside it, such as its `tokenizer.json`): a URL, `file:` for a local
/// path, read through the engine's stores.
#[derive(Debug, Clone)]
pub struct ModelSource {
    url: Url,
    /// How messages name it: as it was written, a local path as a path.
    shown: String,
}

/// Two sources are one when they are one file, however they were written.
impl PartialEq for ModelSource {
    fn eq(&self, other: &Self) -> bool {
        self.url == other.url
    }
}

impl Eq for ModelSource {}

impl ModelSource {
    /// A path or a URL, as written in `CREATE MODEL ... FROM`, `--models` or a warehouse model
    /// definition (a relative path is made absolute).
    pub fn parse(location: &str) -> crate::error::Result<Self> {
        let url = location_url(location)?;
        let shown = match url.scheme() {
            "file" if !location.starts_with("file:") => location.to_string(),
            _ => crate::storage::display_location(&url),
        };
        Ok(ModelSource { url, shown })
    }

    /// The model at `url`.
    pub fn from_url(url: Url) -> Self {
        let shown = crate::storage::display_location(&url);
        ModelSource { url, shown }
    }

    /// [`ModelSource::parse`] of a path that may hold a URL (`--models s3://bucket/models/`).
    pub fn from_path(path: &Path) -> crate::error::Result<Self> {
        match path.to_str() {
            Some(location) => Self::parse(location),
            None => std::path::absolute(path)
                .ok()
                .and_then(|path| Url::from_file_path(path).ok())
                .map(Self::from_url)
                .ok_or_else(|| {
                    crate::error::Error::ModelFile(format!(
                        "{} is not a usable path",
                        path.display()
                    ))
                }),
        }
    }

    /// Where the file is.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The file `name` (a relative path) in the folder of this one. Each part is a path segment,
    /// encoded: a name is never read as `..` or a query.
    pub fn beside(&self, name: &str) -> ModelSource {
        let mut beside = self.url.clone();
        if let Ok(mut segments) = beside.path_segments_mut() {
            segments.pop().extend(name.split('/'));
        }
        Self::from_url(beside)
    }

    /// The last part of the path as the URL writes it (encoded): `model.onnx` for a model
    /// folder's model.
    pub fn file_name(&self) -> Option<&str> {
        self.url.path_segments()?.next_back()
    }

    /// The file's bytes, or `None` when there is no such file. A file over `cap` bytes, or one
    /// that is not a regular file (a FIFO, a device), is an error.
    pub fn read_if_exists(
        &self,
        stores: &StoreRegistry,
        cap: u64,
    ) -> crate::error::Result<Option<Vec<u8>>> {
        stores
            .read_file_if_exists(&self.url, cap)
            .map_err(|e| crate::error::Error::ModelFile(display_error(&e)))
    }

    /// The file's bytes; its absence is an error.
    pub fn read(&self, stores: &StoreRegistry, cap: u64) -> crate::error::Result<Vec<u8>> {
        stores
            .read_file(&self.url, cap)
            .map_err(|e| crate::error::Error::ModelFile(display_error(&e)))
    }
}

impl fmt::Display for ModelSource {
    /// A local path as a path; a password in a URL is never printed (nor kept: no store takes
    /// one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", crate::storage::blank_passwords(&self.shown))
    }
}
