//! The tables of a warehouse: one folder per table under `tables/`. A table is a Delta table
//! ([`crate::delta::write`] commits it); a folder of Parquet files written before tables were
//! Delta tables (its files directly in the folder, in S3 with a claim object, [`TABLE_CLAIM`]) is
//! read as such until a CREATE OR REPLACE TABLE makes it a Delta table.
//!
//! Here: the names and folders of tables, what identifies a folder of Parquet files as written,
//! DROP TABLE's removal (out of sight in one rename first where there are folders), and the
//! cleanup of what interrupted writes left in a local warehouse.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

use super::folder::{STAGING, remove_abandoned_partials};
use super::{CommitKind, CommitStore, delete_prefix, display_location, object_path};
use crate::error::{Error, Result};

/// The object that claims a table's name in S3 while its CREATE TABLE commits. It is not
/// Parquet, so no reader takes it for data, and a table with nothing else is still being
/// created: not listed.
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
        Some(why) => Err(Error::setting(
            name,
            format!(
                "{kind} name {name:?} is not usable: {why}; {kind} names are letters, digits, '_' \
             and '-' (at most {MAX_NAME_BYTES} bytes)"
            ),
        )),
    }
}

/// The folders directly under `prefix` whose names are usable names of a `kind` ([`check_name`]),
/// sorted: one listing, whatever the folders hold.
pub async fn named_folders(
    store: &dyn object_store::ObjectStore,
    prefix: &Path,
    kind: &str,
) -> Result<Vec<String>> {
    let listed = match store.list_with_delimiter(Some(prefix)).await {
        Ok(listed) => listed.common_prefixes,
        Err(object_store::Error::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut names: Vec<String> = listed
        .iter()
        .filter_map(|folder| folder.filename())
        .filter(|name| check_name(kind, name).is_ok())
        .map(str::to_string)
        .collect();
    names.sort();
    Ok(names)
}

/// The `tables/` folder of a warehouse.
#[derive(Debug, Clone)]
pub struct Tables {
    store: Arc<CommitStore>,
    /// `tables/`, ending in `/`.
    url: Url,
    prefix: Path,
}

impl Tables {
    /// The `tables/` folder under a warehouse's `root` (a URL ending in `/`) in `store`.
    pub fn new(store: Arc<CommitStore>, root: &Url) -> Result<Self> {
        let url = root
            .join("tables/")
            .map_err(|e| Error::warehouse(root, format!("{root}tables/: {e}")))?;
        let prefix = object_path(&url)?;
        Ok(Tables { store, url, prefix })
    }

    fn url(&self, name: &str) -> Result<Url> {
        check_name("table", name)?;
        self.url
            .join(&format!("{name}/"))
            .map_err(|e| Error::table(name, format!("{}{name}/: {e}", self.url)))
    }

    /// Where table `name`'s files are, as a listing-table location (`.../tables/NAME/`).
    pub fn location(&self, name: &str) -> Result<String> {
        Ok(display_location(&self.url(name)?))
    }

    /// The local folder of `tables/`, for the store kind that has folders.
    fn local_dir(&self) -> Option<PathBuf> {
        match &self.store.kind {
            CommitKind::StageAndRename(local) => local.path_to_filesystem(&self.prefix).ok(),
            _ => None,
        }
    }

    /// Names of the table folders: one listing of `tables/`, whatever the tables hold. A folder
    /// may hold a table still being created ([`Tables::is_complete`]).
    pub async fn folders(&self) -> Result<Vec<String>> {
        named_folders(self.store.inner().as_ref(), &self.prefix, "table").await
    }

    /// Whether table `name`, as a folder of Parquet files (not a Delta table), is complete: its
    /// folder holds a file other than a claim or a hidden file (a write in progress). Files in
    /// its subfolders are not its own (a Delta table's first statement writes there).
    pub async fn is_complete(&self, name: &str) -> Result<bool> {
        Ok(!self.top_level_files(name).await?.is_empty())
    }

    /// The files directly in table `name`'s folder, claims and hidden files aside: a table of
    /// Parquet files written before tables were Delta tables.
    pub async fn top_level_files(&self, name: &str) -> Result<Vec<Path>> {
        let prefix = object_path(&self.url(name)?)?;
        let listed = match self.store.inner().list_with_delimiter(Some(&prefix)).await {
            Ok(listed) => listed.objects,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        Ok(listed
            .into_iter()
            .map(|object| object.location)
            .filter(|location| {
                location
                    .filename()
                    .is_some_and(|f| f != TABLE_CLAIM && !f.starts_with('.'))
            })
            .collect())
    }

    /// Table `name`'s folder, as a URL ending in `/`.
    pub fn table_url(&self, name: &str) -> Result<Url> {
        self.url(name)
    }

    /// The store the tables are in (the whole bucket or file system: paths are the URLs').
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.inner().clone()
    }

    /// What changes when table `name` is created again or replaced: locally its folder's
    /// identity and its change time (a replace swaps the folder in, a rename that sets the change
    /// time; a folder made anew can get the inode number of one removed before, not its change
    /// time), its claim's version in S3 (each CREATE TABLE puts one). `None` when there is no
    /// such table.
    pub async fn version(&self, name: &str) -> Result<Option<String>> {
        let url = self.url(name)?;
        if let Some(tables) = self.local_dir() {
            use std::os::unix::fs::MetadataExt;
            return Ok(std::fs::metadata(tables.join(name)).ok().map(|m| {
                format!(
                    "{}:{}:{}.{:09}",
                    m.dev(),
                    m.ino(),
                    m.ctime(),
                    m.ctime_nsec()
                )
            }));
        }
        let claim = object_path(&url)?.join(TABLE_CLAIM);
        match self.store.inner().head(&claim).await {
            Ok(meta) => Ok(Some(format!(
                "{}:{}",
                meta.e_tag.unwrap_or_default(),
                meta.last_modified
            ))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes table `name`'s files: out of sight in one rename first where there are folders,
    /// so that no reader sees half a table.
    pub async fn remove(&self, name: &str) -> Result<()> {
        let url = self.url(name)?;
        let Some(tables) = self.local_dir() else {
            return delete_prefix(self.store.inner().as_ref(), &object_path(&url)?).await;
        };
        let dir = tables.join(name);
        let n = STAGING.fetch_add(1, Ordering::Relaxed);
        let doomed = tables.join(format!(".dropped-{name}-{}-{n}", std::process::id()));
        match std::fs::rename(&dir, &doomed) {
            Ok(()) => std::fs::remove_dir_all(&doomed)
                .map_err(|e| Error::io(format!("removing {}", doomed.display()), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("removing {}", dir.display()), e)),
        }
    }

    /// Removes what interrupted writes left in a local warehouse: staging folders no running
    /// process holds the lock of, dropped tables not yet deleted, and the hidden files of
    /// INSERTs whose process is gone.
    pub fn remove_abandoned(&self) {
        let Some(tables) = self.local_dir() else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(&tables) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with(".dropped-") {
                let _ = std::fs::remove_dir_all(&path);
            } else if name.starts_with(".staging-") && !name.ends_with(".lock") {
                let lock_path = tables.join(format!("{name}.lock"));
                let abandoned = match File::open(&lock_path) {
                    Ok(lock) => lock.try_lock().is_ok(),
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                };
                if abandoned {
                    let _ = std::fs::remove_dir_all(&path);
                    let _ = std::fs::remove_file(&lock_path);
                }
            } else if entry.file_type().is_ok_and(|t| t.is_dir())
                && check_name("table", &name).is_ok()
            {
                remove_abandoned_partials(&path, 4);
            }
        }
    }
}
