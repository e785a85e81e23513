//! Staged outputs: a write that other processes carry out (the executors of a Ballista cluster)
//! goes to a hidden staging folder beside its target, and is moved into the target only when the
//! whole job has succeeded. A failed or cancelled job leaves its files in the staging folder,
//! which is removed; the target never holds a partial result.
//!
//! In one process, S3 writes use [`super::commit`] instead, which needs no copy: here the uploads
//! are made by other processes, whose completions this one cannot hold back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path;

use object_store::local::LocalFileSystem;

use super::{StoreRegistry, delete_prefix, location_url, object_path};
use crate::error::{Error, Result};

/// Per process: a counter for unique names.
static STAGING: AtomicU64 = AtomicU64::new(0);

/// A write to `target` (a folder ending in `/`, or one file) carried out into a staging folder.
#[derive(Debug)]
pub struct StagedOutput {
    store: Arc<dyn ObjectStore>,
    /// The staging folder; what is under it is moved to the same place under `parent`.
    staging: Path,
    parent: Path,
    location: String,
}

impl StagedOutput {
    /// A staging folder beside `target`, which may be a local path or an object store's URL.
    pub fn new(stores: &StoreRegistry, target: &str) -> Result<Self> {
        let suffix = if target.ends_with('/') { "/" } else { "" };
        let url = location_url(target)?;
        let store = stores.store_for(&url)?;
        // On the path as it is encoded: its parts stay as they are, none encoded twice.
        let path = object_path(&url)?;
        let (folder, name) = path.as_ref().rsplit_once('/').ok_or_else(|| {
            Error::location(target, format!("'{target}' names no file or folder"))
        })?;
        let unusable =
            |e: object_store::path::Error| Error::location(target, format!("'{target}': {e}"));
        let parent = Path::parse(folder).map_err(unusable)?;
        let staging = Path::parse(format!(
            "{folder}/.batchinfer-staging-{}-{}",
            std::process::id(),
            STAGING.fetch_add(1, Ordering::Relaxed)
        ))
        .map_err(unusable)?;
        let staged = Path::parse(format!("{staging}/{name}")).map_err(unusable)?;
        let location = if url.scheme() == "file" {
            let local = LocalFileSystem::new()
                .path_to_filesystem(&staged)
                .map_err(|e| Error::location(target, format!("'{target}': {e}")))?;
            format!("{}{suffix}", local.display())
        } else {
            let mut location = url.clone();
            location.set_path(&format!("/{staged}{suffix}"));
            location.to_string()
        };
        Ok(StagedOutput {
            store,
            staging,
            parent,
            location,
        })
    }

    /// Where the job writes: give this to DataFusion instead of the target.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Moves every staged file to its place under the target; how many there were.
    pub async fn commit(self) -> Result<usize> {
        let staged: Vec<object_store::ObjectMeta> =
            self.store.list(Some(&self.staging)).try_collect().await?;
        for file in &staged {
            let Some(relative) = file.location.prefix_match(&self.staging) else {
                continue;
            };
            let dest = relative.fold(self.parent.clone(), |path, part| path.join(part));
            object_store::ObjectStoreExt::rename(self.store.as_ref(), &file.location, &dest)
                .await?;
        }
        self.discard().await;
        Ok(staged.len())
    }

    /// Removes the staging folder and what is in it.
    pub async fn discard(self) {
        let _ = delete_prefix(self.store.as_ref(), &self.staging).await;
        if self.store.to_string().starts_with("LocalFileSystem")
            && let Ok(folder) = LocalFileSystem::new().path_to_filesystem(&self.staging)
        {
            // Object deletion leaves the local folders behind.
            let _ = std::fs::remove_dir_all(folder);
        }
    }
}
