//! The warehouse: the folder where batchinfer keeps what outlives a process.
//!
//! ```text
//! warehouse/
//!   models/NAME.json         one file per model, from CREATE MODEL: {"name", "source"}
//!   tables/NAME/*.parquet    one folder per table, from CREATE TABLE ... AS
//!   tables/.staging-*/       a CREATE TABLE in progress; renamed to tables/NAME/ when complete
//! ```
//! Names are names, never paths: a table or model name is letters, digits, `_` and `-`, at most
//! [`MAX_NAME_BYTES`] bytes ([`check_name`]), checked here, where each name becomes a path or a
//! key, so no statement reaches outside `tables/NAME/` or `models/NAME.json`.
//!
//! A table appears only by the rename of a complete folder, so a CREATE TABLE that fails or is
//! interrupted leaves nothing a later query would read; a CREATE OR REPLACE TABLE swaps the new
//! folder with the old one in one `renameat2(RENAME_EXCHANGE)` (two renames elsewhere). Staging
//! folders are hidden, held by a lock while their CREATE TABLE runs, and removed by the next
//! process that opens the warehouse once no process holds them. One file per model means
//! concurrent CREATE MODEL statements never overwrite each other's definitions.
//!
//! A warehouse in S3 (`--warehouse s3://bucket/wh/`) has the same layout without staging folders:
//! a table's files are uploaded in place with their completion held back, and completed together
//! once all are written ([`crate::storage::commit`]), so a failed CREATE TABLE leaves no object.
//!
//! Warehouses written before one file per model keep `models.json`; its definitions are moved to
//! `models/` the first time the warehouse is opened.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use url::Url;

use crate::error::{Error, Result};
use crate::storage::StoreRegistry;

/// The object that claims a table's name in an S3 warehouse while its CREATE TABLE commits (S3
/// has no rename to make a table appear at once). It is not Parquet, so no reader takes it for
/// data, and a table with nothing else is still being created: not listed.
pub const TABLE_CLAIM: &str = "_batchinfer_table";

/// The longest table or model name, in bytes (folder names have a limit of their own: 255).
pub const MAX_NAME_BYTES: usize = 200;

/// Refuses a table or model name (`kind`: "table", "model") that is not a plain name: empty, over
/// [`MAX_NAME_BYTES`], or holding anything but letters, digits, `_` and `-` (so no `/`, `\`,
/// `.`, `..`, leading dot, `%`, NUL or absolute path ever reaches a path or a key).
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    let problem = if name.is_empty() {
        Some("it is empty".to_string())
    } else if name.len() > MAX_NAME_BYTES {
        Some(format!(
            "it is {} bytes long, the most is {MAX_NAME_BYTES}",
            name.len()
        ))
    } else {
        name.chars()
            .find(|c| !(c.is_alphanumeric() || *c == '_' || *c == '-'))
            .map(|c| format!("it contains {c:?}"))
    };
    match problem {
        None => Ok(()),
        Some(why) => Err(Error::Usage(format!(
            "{kind} name {name:?} is not usable: {why}; {kind} names are letters, digits, '_' \
             and '-' (at most {MAX_NAME_BYTES} bytes)"
        ))),
    }
}

/// A model as CREATE MODEL defined it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// The model's file or folder: a path or an `s3://` URL.
    pub source: String,
    /// The sha256 of the model CREATE MODEL loaded (absent in definitions written before).
    pub sha256: Option<String>,
}

/// The model definitions of a warehouse.
#[derive(Debug, Default)]
pub struct Definitions {
    /// Name -> definition.
    pub models: BTreeMap<String, Definition>,
    /// Name -> why its definition cannot be read.
    pub unusable: BTreeMap<String, String>,
}

/// A warehouse folder (created on first write), local or in S3.
#[derive(Debug, Clone)]
pub struct Warehouse {
    root: PathBuf,
    /// The warehouse's URL (ending in `/`) when it is in S3.
    bucket: Option<Url>,
    stores: Arc<StoreRegistry>,
}

static STAGING: AtomicU64 = AtomicU64::new(0);

/// A table being written: its hidden folder, and the lock that says a process is writing it.
/// Dropped without [`Warehouse::commit`], the folder is removed.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
}

impl Staging {
    /// The folder to write the table's files into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

impl Warehouse {
    /// The warehouse at `root`: a folder, or an `s3://bucket/prefix/` whose objects `stores`
    /// reach.
    pub fn new(root: impl Into<PathBuf>, stores: Arc<StoreRegistry>) -> Result<Self> {
        let root = root.into();
        let text = root.to_string_lossy().into_owned();
        let (root, bucket) = match crate::storage::local_path(&text) {
            // Absolute, so that the executors of a cluster write where this process reads.
            Ok(Some(path)) => (
                std::path::absolute(&path)
                    .map_err(|e| Error::io(format!("resolving {}", path.display()), e))?,
                None,
            ),
            Ok(None) => {
                let mut url = crate::storage::location_url(&text)?;
                if !matches!(url.scheme(), "s3" | "s3a") {
                    return Err(Error::Usage(format!(
                        "warehouse '{text}': a warehouse is a local folder or an s3:// prefix"
                    )));
                }
                if !url.path().ends_with('/') {
                    url.set_path(&format!("{}/", url.path()));
                }
                (root, Some(url))
            }
            Err(e) => return Err(Error::Usage(format!("warehouse '{text}': {e}"))),
        };
        // Its tables are written to and read from paths under it, which DataFusion would take
        // for patterns.
        crate::storage::check_write_target(&root.to_string_lossy())
            .map_err(|e| Error::Usage(format!("the warehouse cannot be used: {e}")))?;
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

    fn object(&self, bucket: &Url, key: &str) -> Result<Url> {
        bucket
            .join(key)
            .map_err(|e| Error::Usage(format!("{bucket}{key}: {e}")))
    }

    /// Where table `name`'s files are, as a listing-table location (`.../tables/NAME/`).
    pub fn table_location(&self, name: &str) -> Result<String> {
        check_name("table", name)?;
        match &self.bucket {
            Some(bucket) => Ok(self.object(bucket, &format!("tables/{name}/"))?.to_string()),
            None => {
                let mut dir = self.table_dir(name)?.display().to_string();
                dir.push('/');
                Ok(dir)
            }
        }
    }

    fn tables_dir(&self) -> PathBuf {
        self.root.join("tables")
    }

    fn models_dir(&self) -> PathBuf {
        self.root.join("models")
    }

    /// The folder of table `name` (a local warehouse).
    pub fn table_dir(&self, name: &str) -> Result<PathBuf> {
        check_name("table", name)?;
        Ok(self.tables_dir().join(name))
    }

    /// Models defined by CREATE MODEL: name -> source path (definitions that cannot be read left
    /// out: see [`Warehouse::definitions`]).
    pub fn models(&self) -> Result<BTreeMap<String, String>> {
        Ok(self
            .definitions()?
            .models
            .into_iter()
            .map(|(name, d)| (name, d.source))
            .collect())
    }

    /// Models defined by CREATE MODEL. A definition that cannot be read (not JSON, no source, a
    /// FIFO, too large) is set apart with what is wrong, so that one bad file does not take the
    /// others, or the warehouse, with it.
    pub fn definitions(&self) -> Result<Definitions> {
        let mut definitions = Definitions::default();
        for (name, text, path) in self.model_files()? {
            let definition = text.and_then(|text| {
                let json: Value = serde_json::from_str(&text)
                    .map_err(|e| Error::Usage(format!("{path} is not valid JSON: {e}")))?;
                let source = json.get("source").and_then(Value::as_str).ok_or_else(|| {
                    Error::Usage(format!("{path} has no \"source\": not a model definition"))
                })?;
                Ok(Definition {
                    source: source.to_string(),
                    sha256: json
                        .get("sha256")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                })
            });
            match definition {
                Ok(definition) => {
                    definitions.models.insert(name, definition);
                }
                Err(e) => {
                    definitions.unusable.insert(name, e.to_string());
                }
            }
        }
        Ok(definitions)
    }

    /// The text of each `models/NAME.json` whose NAME is a usable name (or why it cannot be
    /// read), with where it was read.
    fn model_files(&self) -> Result<Vec<(String, Result<String>, String)>> {
        let name_of = |file: &str| {
            file.strip_suffix(".json")
                .filter(|n| check_name("model", n).is_ok())
                .map(str::to_string)
        };
        let mut files = Vec::new();
        if let Some(bucket) = &self.bucket {
            let folder = self.object(bucket, "models/")?;
            for key in self.stores.list_blocking(&folder)? {
                let Some(name) = name_of(&key) else { continue };
                let url = self.object(&folder, &key)?;
                let text = self
                    .stores
                    .read_blocking_capped(&url, MODEL_DEFINITION_CAP)
                    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
                files.push((name, text, url.into()));
            }
            return Ok(files);
        }
        let dir = self.models_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
            Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().and_then(name_of) else {
                continue;
            };
            let path = entry.path();
            let text = crate::storage::read_capped(&path, MODEL_DEFINITION_CAP)
                .and_then(|bytes| String::from_utf8(bytes).map_err(|e| Error::Usage(e.to_string())))
                .map_err(|e| Error::Usage(format!("reading {}: {e}", path.display())));
            files.push((name, text, path.display().to_string()));
        }
        Ok(files)
    }

    /// Keeps `name -> source` (replacing any definition of that name), with the sha256 of the
    /// model the statement loaded, so that other processes see a redefinition from the same
    /// file: one file written whole, by rename locally or by one PUT in S3.
    pub fn save_model(&self, name: &str, source: &str, sha256: Option<&str>) -> Result<()> {
        check_name("model", name)?;
        let mut definition = serde_json::json!({
            "name": name,
            "source": source,
        });
        if let Some(sha256) = sha256 {
            definition["sha256"] = sha256.into();
        }
        let text =
            serde_json::to_string_pretty(&definition).map_err(|e| Error::Usage(e.to_string()))?;
        let file = format!("{name}.json");
        if let Some(bucket) = &self.bucket {
            let url = self.object(bucket, &format!("models/{file}"))?;
            return self.stores.write_blocking(&url, text.into_bytes());
        }
        let dir = self.models_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{file}.{}-{n}", std::process::id()));
        std::fs::write(&tmp, text)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        let dest = dir.join(file);
        std::fs::rename(&tmp, &dest).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(format!("writing {}", dest.display()), e)
        })
    }

    /// Forgets the model `name`.
    pub fn remove_model(&self, name: &str) -> Result<()> {
        check_name("model", name)?;
        let file = format!("{name}.json");
        if let Some(bucket) = &self.bucket {
            let url = self.object(bucket, &format!("models/{file}"))?;
            return self.stores.delete_blocking(&url);
        }
        let path = self.models_dir().join(file);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", path.display()), e)),
        }
    }

    /// Moves the definitions of a `models.json` (the layout before one file per model) to
    /// `models/`, then removes it. Definitions already in `models/` win.
    pub fn move_legacy_models(&self) -> Result<()> {
        let text = match &self.bucket {
            Some(bucket) => {
                let url = self.object(bucket, "models.json")?;
                match self.stores.read_blocking(&url) {
                    Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => {
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            None => match std::fs::read_to_string(self.root.join("models.json")) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(Error::io("reading models.json", e)),
            },
        };
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| Error::Usage(format!("models.json is not valid JSON: {e}")))?;
        let existing = self.models()?;
        if let Some(models) = json.get("models").and_then(Value::as_object) {
            for (name, source) in models {
                if let (Some(source), None) = (source.as_str(), existing.get(name)) {
                    self.save_model(name, source, None)?;
                }
            }
        }
        match &self.bucket {
            Some(bucket) => self
                .stores
                .delete_blocking(&self.object(bucket, "models.json")?),
            None => {
                let _ = std::fs::remove_file(self.root.join("models.json"));
                Ok(())
            }
        }
    }

    /// Names of the complete tables.
    pub fn tables(&self) -> Result<Vec<String>> {
        let usable = |n: &String| check_name("table", n).is_ok();
        if let Some(bucket) = &self.bucket {
            let mut names: Vec<String> = self
                .stores
                .list_blocking(&self.object(bucket, "tables/")?)?
                .iter()
                .filter_map(|key| key.split_once('/'))
                .filter(|(_, file)| *file != TABLE_CLAIM)
                .map(|(name, _)| name.to_string())
                .filter(usable)
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
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(usable)
            .collect();
        names.sort();
        Ok(names)
    }

    /// A fresh hidden folder to write table `name` into before it is committed, locked for as
    /// long as the returned [`Staging`] lives.
    pub fn staging_dir(&self, name: &str) -> Result<Staging> {
        check_name("table", name)?;
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let base = format!(".staging-{name}-{}-{n}", std::process::id());
        let tables = self.tables_dir();
        std::fs::create_dir_all(&tables)
            .map_err(|e| Error::io(format!("creating {}", tables.display()), e))?;
        let lock_path = tables.join(format!("{base}.lock"));
        let lock = File::create(&lock_path)
            .map_err(|e| Error::io(format!("creating {}", lock_path.display()), e))?;
        lock.lock()
            .map_err(|e| Error::io(format!("locking {}", lock_path.display()), e))?;
        let staging = Staging {
            dir: tables.join(base),
            lock_path,
            _lock: lock,
        };
        std::fs::create_dir(&staging.dir)
            .map_err(|e| Error::io(format!("creating {}", staging.dir.display()), e))?;
        Ok(staging)
    }

    /// Makes a staged table the table `name`. With `replace`, an existing table of that name is
    /// swapped out in one step and then removed; without, an existing table is an error.
    pub fn commit(&self, staging: Staging, name: &str, replace: bool) -> Result<PathBuf> {
        let dest = self.table_dir(name)?;
        let committed = if replace && dest.exists() {
            exchange(staging.dir(), &dest)
        } else {
            std::fs::rename(staging.dir(), &dest)
        };
        committed.map_err(|e| match e.raw_os_error() {
            Some(code) if code == libc::ENOTEMPTY || code == libc::EEXIST => Error::Usage(format!(
                "table '{name}' already exists (another statement created it meanwhile)"
            )),
            _ => Error::io(format!("committing table {name} to {}", dest.display()), e),
        })?;
        // After an exchange the staging folder holds the old table: dropping it removes it.
        drop(staging);
        Ok(dest)
    }

    /// Removes a table's files.
    pub fn remove_table(&self, name: &str) -> Result<()> {
        check_name("table", name)?;
        if let Some(bucket) = &self.bucket {
            return self
                .stores
                .delete_prefix_blocking(&self.object(bucket, &format!("tables/{name}/"))?);
        }
        let dir = self.table_dir(name)?;
        // Out of sight in one rename, then deleted: no reader sees half a table.
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let doomed = self
            .tables_dir()
            .join(format!(".dropped-{name}-{}-{n}", std::process::id()));
        match std::fs::rename(&dir, &doomed) {
            Ok(()) => std::fs::remove_dir_all(&doomed)
                .map_err(|e| Error::io(format!("removing {}", doomed.display()), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
        }
    }

    /// Removes what interrupted writes left: staging folders no running process holds the lock
    /// of, and dropped tables not yet deleted.
    pub fn remove_abandoned_staging(&self) {
        let Ok(entries) = std::fs::read_dir(self.tables_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with(".dropped-") {
                let _ = std::fs::remove_dir_all(&path);
            } else if name.starts_with(".staging-") && !name.ends_with(".lock") {
                let lock_path = self.tables_dir().join(format!("{name}.lock"));
                let abandoned = match File::open(&lock_path) {
                    Ok(lock) => lock.try_lock().is_ok(),
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                };
                if abandoned {
                    let _ = std::fs::remove_dir_all(&path);
                    let _ = std::fs::remove_file(&lock_path);
                }
            }
        }
    }
}

/// The largest `models/NAME.json` read.
const MODEL_DEFINITION_CAP: u64 = 1 << 20;

/// Swaps two folders in one step: `renameat2(RENAME_EXCHANGE)`.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths; the call reads them and nothing else.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Swaps two folders where there is no exchange: two renames, the second undone if it fails.
#[cfg(not(target_os = "linux"))]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let aside = a.with_extension("old");
    std::fs::rename(b, &aside)?;
    if let Err(e) = std::fs::rename(a, b) {
        let _ = std::fs::rename(&aside, b);
        return Err(e);
    }
    std::fs::rename(&aside, a)
}
