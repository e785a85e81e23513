//! Versioned manifests: a small document replaced whole, each version a new object
//! `manifest-<20 digits>.json` in one folder, created only where none of that version exists (a
//! hard link locally, S3's conditional PUT with `If-None-Match`). Of two writers of the same
//! version exactly one succeeds, and the other learns it did not; a reader reads the highest
//! version, which is always whole. This is how a materialized view commits a refresh
//! ([`crate::view`]): one create per commit, the same on every store.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use super::{CommitStore, read_object};
use crate::error::{Error, Result};

/// The versions of one manifest, in the folder `folder` of `store`.
#[derive(Debug, Clone)]
pub struct Manifests {
    store: Arc<CommitStore>,
    folder: Path,
}

/// The largest manifest read.
const MANIFEST_CAP: u64 = 256 << 20;

/// Versions older than the newest by more than this, and written more than [`KEPT_SECONDS`]
/// ago, are removed after a commit.
const KEPT_VERSIONS: u64 = 8;
const KEPT_SECONDS: i64 = 600;

impl Manifests {
    pub fn new(store: Arc<CommitStore>, folder: Path) -> Self {
        Manifests { store, folder }
    }

    fn inner(&self) -> &Arc<dyn ObjectStore> {
        self.store.inner()
    }

    fn path(&self, version: u64) -> Path {
        self.folder
            .clone()
            .join(format!("manifest-{version:020}.json"))
    }

    /// The versions there are, oldest first (one listing of the folder, not of what is below).
    pub async fn versions(&self) -> Result<Vec<u64>> {
        Ok(self.listed().await?.into_iter().map(|(v, _)| v).collect())
    }

    /// The newest version, named so that it differs from any other object that had that number
    /// (a view dropped and created again counts from 1 again): its number and its ETag or time.
    pub async fn newest(&self) -> Result<Option<String>> {
        let listed = self.objects().await?;
        Ok(listed.last().map(|(version, meta)| {
            let tag = meta.e_tag.clone().unwrap_or_default();
            format!(
                "{version}:{tag}:{}",
                meta.last_modified.timestamp_nanos_opt().unwrap_or(0)
            )
        }))
    }

    /// The versions there are, oldest first, with when each was written (seconds since 1970).
    async fn listed(&self) -> Result<Vec<(u64, i64)>> {
        Ok(self
            .objects()
            .await?
            .into_iter()
            .map(|(v, meta)| (v, meta.last_modified.timestamp()))
            .collect())
    }

    /// The versions there are, oldest first, each with its object.
    async fn objects(&self) -> Result<Vec<(u64, object_store::ObjectMeta)>> {
        let listed = match self.inner().list_with_delimiter(Some(&self.folder)).await {
            Ok(listed) => listed.objects,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut versions: Vec<_> = listed
            .iter()
            .filter_map(|o| {
                let digits = o
                    .location
                    .filename()?
                    .strip_prefix("manifest-")?
                    .strip_suffix(".json")?;
                let version = digits.parse().ok().filter(|_| digits.len() == 20)?;
                Some((version, o.clone()))
            })
            .collect();
        versions.sort_unstable_by_key(|(v, _)| *v);
        Ok(versions)
    }

    /// The bytes of `version`, or `None` where it is not there (removed, or never made).
    pub async fn read(&self, version: u64) -> Result<Option<Vec<u8>>> {
        read_object(&self.store, &self.path(version), MANIFEST_CAP).await
    }

    /// The newest version and its bytes, or `None` where there is none.
    pub async fn latest(&self) -> Result<Option<(u64, Vec<u8>)>> {
        // A version removed between the listing and the read has a newer one: list again.
        for _ in 0..8 {
            let Some(&version) = self.versions().await?.last() else {
                return Ok(None);
            };
            if let Some(bytes) = read_object(&self.store, &self.path(version), MANIFEST_CAP).await?
            {
                return Ok(Some((version, bytes)));
            }
        }
        Err(Error::warehouse(
            &self.folder,
            format!(
                "the manifest in {} keeps changing while it is read",
                self.folder
            ),
        ))
    }

    /// Creates `version` with `bytes`: `false` (and nothing written) where another writer
    /// created that version, or a later one, first.
    pub async fn create(&self, version: u64, bytes: Vec<u8>) -> Result<bool> {
        // A version removed as old must not be created again, behind the newest, where no
        // reader would see it: old versions are removed only long after they were written, and
        // a writer behind the newest is told so here.
        if self.versions().await?.last().is_some_and(|v| *v >= version) {
            return Ok(false);
        }
        let options = PutOptions::from(PutMode::Create);
        match self
            .inner()
            .put_opts(&self.path(version), bytes.into(), options)
            .await
        {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        // Readers read the newest; the old ones only take room. The version is committed: a
        // failure to tidy up is not this commit's.
        let _ = self.prune(version).await;
        Ok(true)
    }

    /// Removes versions older than `newest` by more than [`KEPT_VERSIONS`] and written more than
    /// [`KEPT_SECONDS`] ago.
    async fn prune(&self, newest: u64) -> Result<()> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let cutoff = now - KEPT_SECONDS;
        for (version, written) in self.listed().await? {
            if version + KEPT_VERSIONS < newest && written < cutoff {
                self.delete(&self.path(version)).await?;
            }
        }
        Ok(())
    }

    /// Removes the folder (or its sub-folder `under`) and everything in it, locally the folders
    /// too.
    pub async fn remove_folder(&self, under: Option<&str>) -> Result<()> {
        let mut folder = self.folder.clone();
        for part in under.into_iter().flat_map(|u| u.split('/')) {
            folder = folder.join(part);
        }
        super::delete_prefix(self.inner().as_ref(), &folder).await?;
        if let super::CommitKind::StageAndRename(local) = &self.store.kind {
            let dir = local.path_to_filesystem(&folder)?;
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(format!("removing {}", dir.display()), e)),
            }
        }
        Ok(())
    }

    /// The names of the folders in the sub-folder `under` (one listing).
    pub async fn folders_under(&self, under: &str) -> Result<Vec<String>> {
        let folder = self.folder.clone().join(under);
        match self.inner().list_with_delimiter(Some(&folder)).await {
            Ok(listed) => Ok(listed
                .common_prefixes
                .iter()
                .filter_map(|p| p.filename().map(str::to_string))
                .collect()),
            Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the sub-folder `under` where it is an empty local folder (S3 has no folders).
    pub fn remove_if_empty(&self, under: &str) {
        if let super::CommitKind::StageAndRename(local) = &self.store.kind
            && let Ok(dir) = local.path_to_filesystem(&self.folder.clone().join(under))
        {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Removes every version before `version`.
    pub async fn remove_before(&self, version: u64) -> Result<()> {
        for old in self.versions().await?.into_iter().filter(|v| *v < version) {
            self.delete(&self.path(old)).await?;
        }
        Ok(())
    }

    /// The objects under `folder` (the whole tree), with their size and when they were last
    /// written.
    pub async fn files_under(&self, folder: &Path) -> Result<Vec<object_store::ObjectMeta>> {
        match self.inner().list(Some(folder)).try_collect().await {
            Ok(files) => Ok(files),
            Err(object_store::Error::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the object `path` (nothing where there is none).
    pub async fn delete(&self, path: &Path) -> Result<()> {
        match self.inner().delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
