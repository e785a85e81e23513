//! The warehouse: the folder where batchinfer keeps what outlives a process.
//!
//! ```text
//! warehouse/
//!   models.json              model name -> source, from CREATE MODEL
//!   tables/NAME/*.parquet    one folder per table, from CREATE TABLE ... AS
//!   tables/.staging-*/       a CREATE TABLE in progress; renamed to tables/NAME/ when complete
//! ```
//! A table appears only by the rename of a complete folder, so a CREATE TABLE that fails or is
//! interrupted leaves nothing a later query would read (staging folders are hidden, and removed
//! when the warehouse is next opened).
//!
//! A warehouse in S3 (`--warehouse s3://bucket/wh/`) has the same layout without staging folders:
//! a table's files are uploaded in place with their completion held back, and completed together
//! once all are written ([`crate::storage::commit`]), so a failed CREATE TABLE leaves no object.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{StoreRegistry, is_object_store_url};

/// A warehouse folder (created on first write), local or in S3.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: PathBuf,
    /// The warehouse's URL (ending in `/`) when it is in S3.
    bucket: Option<Url>,
    stores: Arc<StoreRegistry>,
}

static STAGING: AtomicU64 = AtomicU64::new(0);

impl Warehouse {
    /// The warehouse at `root`: a folder, or an `s3://bucket/prefix/` whose objects `stores`
    /// reach.
    pub fn new(root: impl Into<PathBuf>, stores: Arc<StoreRegistry>) -> Result<Self> {
        let root = root.into();
        let bucket = match root.to_str() {
            Some(location) if is_object_store_url(location) => {
                let mut url = Url::parse(location)
                    .map_err(|e| Error::Usage(format!("warehouse '{location}': {e}")))?;
                if !url.path().ends_with('/') {
                    url.set_path(&format!("{}/", url.path()));
                }
                Some(url)
            }
            _ => None,
        };
        // Absolute, so that the executors of a cluster write where this process reads.
        let root = match bucket {
            None => std::path::absolute(&root)
                .map_err(|e| Error::io(format!("resolving {}", root.display()), e))?,
            Some(_) => root,
        };
        Ok(Warehouse {
            root,
            bucket,
            stores,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The warehouse's URL when it is in S3 (`s3://bucket/prefix/`).
    pub fn bucket(&self) -> Option<&Url> {
        self.bucket.as_ref()
    }

    fn object(&self, bucket: &Url, name: &str) -> Result<Url> {
        bucket
            .join(name)
            .map_err(|e| Error::Usage(format!("{bucket}{name}: {e}")))
    }

    /// Where table `name`'s files are, as a listing-table location (`.../tables/NAME/`).
    pub fn table_location(&self, name: &str) -> Result<String> {
        match &self.bucket {
            Some(bucket) => Ok(self.object(bucket, &format!("tables/{name}/"))?.to_string()),
            None => {
                let mut dir = self.table_dir(name).display().to_string();
                dir.push('/');
                Ok(dir)
            }
        }
    }

    fn models_file(&self) -> PathBuf {
        self.root.join("models.json")
    }

    fn tables_dir(&self) -> PathBuf {
        self.root.join("tables")
    }

    /// The folder of table `name`.
    pub fn table_dir(&self, name: &str) -> PathBuf {
        self.tables_dir().join(name)
    }

    /// Models defined by CREATE MODEL: name -> source path.
    pub fn models(&self) -> Result<BTreeMap<String, String>> {
        let (text, path) = match &self.bucket {
            Some(bucket) => {
                let url = self.object(bucket, "models.json")?;
                match self.stores.read_blocking(&url) {
                    Ok(bytes) => (
                        String::from_utf8_lossy(&bytes).into_owned(),
                        url.to_string(),
                    ),
                    Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => {
                        return Ok(BTreeMap::new());
                    }
                    Err(e) => return Err(e),
                }
            }
            None => {
                let path = self.models_file();
                match std::fs::read_to_string(&path) {
                    Ok(text) => (text, path.display().to_string()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(BTreeMap::new());
                    }
                    Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
                }
            }
        };
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Usage(format!("{path} is not valid JSON: {e}")))?;
        Ok(json
            .get("models")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Replaces the model definitions, atomically (write then rename).
    pub fn save_models(&self, models: &BTreeMap<String, String>) -> Result<()> {
        let map: Map<String, Value> = models
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({ "models": map }))
            .map_err(|e| Error::Usage(e.to_string()))?;
        if let Some(bucket) = &self.bucket {
            // One PUT: S3 replaces an object atomically.
            return self
                .stores
                .write_blocking(&self.object(bucket, "models.json")?, text.into_bytes());
        }
        std::fs::create_dir_all(&self.root)
            .map_err(|e| Error::io(format!("creating {}", self.root.display()), e))?;
        let tmp = self
            .root
            .join(format!(".models.json.{}", std::process::id()));
        std::fs::write(&tmp, text)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, self.models_file())
            .map_err(|e| Error::io(format!("writing {}", self.models_file().display()), e))
    }

    /// Names of the complete tables.
    pub fn tables(&self) -> Result<Vec<String>> {
        if let Some(bucket) = &self.bucket {
            let mut names: Vec<String> = self
                .stores
                .list_blocking(&self.object(bucket, "tables/")?)?
                .iter()
                .filter_map(|key| Some(key.split_once('/')?.0.to_string()))
                .filter(|n| !n.starts_with('.'))
                .collect();
            names.sort();
            names.dedup();
            return Ok(names);
        }
        let dir = self.tables_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        Ok(names)
    }

    /// A fresh hidden folder to write a table into before it is committed.
    pub fn staging_dir(&self, name: &str) -> Result<PathBuf> {
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let dir = self
            .tables_dir()
            .join(format!(".staging-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok(dir)
    }

    /// Makes a staged table the table `name`, replacing any table of that name.
    pub fn commit(&self, staging: &Path, name: &str) -> Result<PathBuf> {
        let dest = self.table_dir(name);
        if dest.exists() {
            self.remove_table(name)?;
        }
        std::fs::rename(staging, &dest)
            .map_err(|e| Error::io(format!("committing table {name} to {}", dest.display()), e))?;
        Ok(dest)
    }

    /// Removes a table's files.
    pub fn remove_table(&self, name: &str) -> Result<()> {
        if let Some(bucket) = &self.bucket {
            return self
                .stores
                .delete_prefix_blocking(&self.object(bucket, &format!("tables/{name}/"))?);
        }
        let dir = self.table_dir(name);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
        }
    }

    /// Removes the staging folders that interrupted writes of this or earlier processes left.
    pub fn remove_abandoned_staging(&self) {
        let prefix = ".staging-";
        if let Ok(entries) = std::fs::read_dir(self.tables_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                // Only other processes' leftovers: a running CREATE TABLE of this one stays.
                let ours = format!("-{}-", std::process::id());
                if name.starts_with(prefix) && !name.contains(&ours) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
}
