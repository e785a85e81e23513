//! The tables of a warehouse: one folder per table under `tables/`, which appears whole or not
//! at all, in one way per store kind:
//!
//! - **Local files**: a table is written into a hidden staging folder beside the others
//!   (`tables/.staging-NAME-PID-N/`, held by a lock while its statement runs) and made the table
//!   by one rename; a CREATE OR REPLACE TABLE swaps it with the old folder in one
//!   `renameat2(RENAME_EXCHANGE)` (two renames elsewhere). A staging folder no process holds is
//!   removed by the next process that opens the warehouse.
//! - **S3** has no rename: a table's files are uploaded in place with their completion held back
//!   ([`super::commit`]), and completed together once all are written. While they complete, the
//!   name is claimed by an object ([`TABLE_CLAIM`]) created only where none exists, so that of
//!   two statements creating one table exactly one goes on.
//!
//! Either way, a statement that fails or is interrupted leaves no file a later query would read.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use url::Url;

use super::folder::{STAGING, Staging, exchange, remove_abandoned_partials};
use super::{
    CommitKind, CommitStore, CommittedWrite, delete_prefix, display_location, object_path,
};
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

/// A table being written: DataFusion writes to [`TableWrite::target`]; the files become the table
/// on [`TableWrite::commit`], or are discarded.
#[derive(Debug)]
pub struct TableWrite {
    name: String,
    replace: bool,
    target: String,
    output: CommittedWrite,
    how: How,
}

#[derive(Debug)]
enum How {
    /// Into a staging folder, renamed to `dest` at commit (local files).
    Rename { staging: Staging, dest: PathBuf },
    /// In place, completed at commit under a claim (S3).
    Claim {
        store: Arc<dyn ObjectStore>,
        prefix: Path,
    },
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

    /// Whether table `name` is complete: its folder holds a file other than a claim or a hidden
    /// file (a write in progress).
    pub async fn is_complete(&self, name: &str) -> Result<bool> {
        let prefix = object_path(&self.url(name)?)?;
        let mut objects = self.store.inner().list(Some(&prefix));
        while let Some(object) = objects.next().await {
            match object {
                Ok(object)
                    if object
                        .location
                        .filename()
                        .is_some_and(|f| f != TABLE_CLAIM && !f.starts_with('.')) =>
                {
                    return Ok(true);
                }
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
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

    /// Begins writing table `name` (replacing one of that name at commit with `replace`; without,
    /// a table there then is an error). `place` says where the files are written and how they
    /// commit ([`crate::cluster::Placement::write_to`]) given where they go.
    pub fn begin(
        &self,
        name: &str,
        replace: bool,
        place: impl FnOnce(&str) -> Result<(String, CommittedWrite)>,
    ) -> Result<TableWrite> {
        let location = self.location(name)?;
        let (to, how) = match self.local_dir() {
            Some(tables) => {
                let staging = Staging::new(&tables, name)?;
                let mut to = staging.dir.display().to_string();
                to.push('/');
                let dest = tables.join(name);
                (to, How::Rename { staging, dest })
            }
            None => {
                let prefix = object_path(&self.url(name)?)?;
                let store = self.store.inner().clone();
                (location, How::Claim { store, prefix })
            }
        };
        let (target, output) = place(&to)?;
        Ok(TableWrite {
            name: name.to_string(),
            replace,
            target,
            output,
            how,
        })
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

impl TableWrite {
    /// Where the statement writes the table's files.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Makes the written files the table; `empty` is its one file when the write made none (a
    /// table needs one to carry its schema).
    pub async fn commit(self, empty: Vec<u8>) -> Result<()> {
        let TableWrite {
            name,
            replace,
            output,
            how,
            ..
        } = self;
        let taken = || {
            Error::table(
                &name,
                format!("table '{name}' already exists (another statement created it meanwhile)"),
            )
        };
        match how {
            How::Rename { staging, dest } => {
                output.commit().await?;
                if std::fs::read_dir(&staging.dir)
                    .map_err(|e| Error::io(format!("reading {}", staging.dir.display()), e))?
                    .next()
                    .is_none()
                {
                    let file = staging.dir.join("part-0.parquet");
                    std::fs::write(&file, empty)
                        .map_err(|e| Error::io(format!("writing {}", file.display()), e))?;
                }
                let renamed = if replace && dest.exists() {
                    exchange(&staging.dir, &dest)
                } else {
                    std::fs::rename(&staging.dir, &dest)
                };
                renamed.map_err(|e| match e.raw_os_error() {
                    Some(code) if code == libc::ENOTEMPTY || code == libc::EEXIST => taken(),
                    _ => Error::io(format!("committing table {name} to {}", dest.display()), e),
                })?;
                // After an exchange the staging folder holds the old table: dropping it removes
                // it.
                drop(staging);
            }
            How::Claim { store, prefix } => {
                let claim = prefix.clone().join(TABLE_CLAIM);
                let claimed = if replace {
                    // Objects already complete under the prefix are the old table's.
                    match delete_prefix(store.as_ref(), &prefix).await {
                        Ok(()) => store
                            .put(&claim, PutPayload::new())
                            .await
                            .map(drop)
                            .map_err(Error::from),
                        Err(e) => Err(e),
                    }
                } else {
                    claim_table(store.as_ref(), &prefix, &claim, taken).await
                };
                if let Err(e) = claimed {
                    output.abort().await;
                    return Err(e);
                }
                let committed = match output.commit().await {
                    Ok(files) => files,
                    Err(e) => {
                        if !replace {
                            let _ = store.delete(&claim).await;
                        }
                        return Err(e);
                    }
                };
                if committed == 0 {
                    store
                        .put(&prefix.clone().join("part-0.parquet"), empty.into())
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// Discards the written files.
    pub async fn abort(self) {
        self.output.abort().await;
    }
}

/// Claims a table in S3: the claim is created only where none exists (S3's conditional PUT). A
/// table with files and no claim (written before claims were made) counts as taken too.
async fn claim_table(
    store: &dyn ObjectStore,
    prefix: &Path,
    claim: &Path,
    taken: impl Fn() -> Error,
) -> Result<()> {
    match store
        .put_opts(claim, PutPayload::new(), PutMode::Create.into())
        .await
    {
        Ok(_) => {}
        Err(object_store::Error::AlreadyExists { .. }) => return Err(taken()),
        // A store without conditional writes: the listing below is the only check.
        Err(object_store::Error::NotImplemented { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let others: Vec<_> = store
        .list(Some(prefix))
        .try_filter(|object| futures::future::ready(object.location != *claim))
        .take(1)
        .try_collect()
        .await?;
    if !others.is_empty() {
        let _ = store.delete(claim).await;
        return Err(taken());
    }
    Ok(())
}
