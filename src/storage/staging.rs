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
use url::Url;

use super::{StoreRegistry, delete_prefix, is_object_store_url, object_path};
use crate::error::{Error, Result};

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
    /// A staging folder beside `target`, which may be a local path or an `s3://` URL.
    pub fn new(stores: &StoreRegistry, target: &str) -> Result<Self> {
        let is_folder = target.ends_with('/');
        let url = if is_object_store_url(target) {
            Url::parse(target).map_err(|e| Error::Usage(format!("'{target}': {e}")))?
        } else {
            let path = std::path::absolute(target)
                .map_err(|e| Error::io(format!("resolving {target}"), e))?;
            Url::from_file_path(&path)
                .map_err(|()| Error::Usage(format!("'{target}' is not a usable path")))?
        };
        let store = stores.store_for(&url)?;
        let path = object_path(&url)?;
        let mut parts: Vec<String> = path.parts().map(|p| p.as_ref().to_string()).collect();
        let name = parts
            .pop()
            .ok_or_else(|| Error::Usage(format!("'{target}' names no file or folder")))?;
        let parent = Path::from_iter(parts);
        let staging = parent.clone().join(format!(
            ".batchinfer-staging-{}-{}",
            std::process::id(),
            STAGING.fetch_add(1, Ordering::Relaxed)
        ));
        let mut location = url.clone();
        let suffix = if is_folder { "/" } else { "" };
        location.set_path(&format!("/{staging}/{name}{suffix}"));
        let location = if url.scheme() == "file" {
            format!("/{staging}/{name}{suffix}")
        } else {
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
        if self.store.to_string().starts_with("LocalFileSystem") {
            // Object deletion leaves the local folders behind.
            let _ = std::fs::remove_dir_all(format!("/{}", self.staging));
        }
    }
}
