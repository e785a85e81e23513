//! The answers of endpoint models, kept in the warehouse (`llm-cache/`) by the sha256 of their
//! request (the endpoint's URL and the whole request body: model, messages, schema,
//! temperature, seed, max_tokens): the same request again, in this process or any later one, is
//! answered from here and not paid twice.
//!
//! Each entry is one object, `llm-cache/ab/abcd....json`, written whole by one PUT (a file
//! renamed into place on a local disk), so two writers of one key leave one whole entry. An entry
//! holds its key and the sha256 of the reply it keeps: one that does not match, does not parse or
//! is too large is ignored (and written again), never trusted.
//!
//! Every entry is signed: an HMAC-SHA256 of its key and reply under the warehouse's secret,
//! [`SECRET`] beside the cache (made on first use from 32 random bytes, a local file readable by
//! its owner only; an object of the warehouse's bucket elsewhere). Someone who can write the
//! warehouse but not read the secret cannot make an entry a later caller trusts: an entry whose
//! signature does not match (forged, altered, or kept before entries were signed) is ignored with
//! a warning, and its request is sent.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

mod claims;
mod secret;

pub use claims::{Claim, ClaimGuard, LEASE};
pub use secret::Unusable;
use secret::{Secret, same};

/// Writes [`Cache::put_soon`] started and nobody has waited for yet.
/// Per process: a process waits for all of them before it exits.
static PENDING: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>> =
    parking_lot::Mutex::new(Vec::new());

/// Whether a failed write was said.
/// Per process: said once per process.
static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps `task` for [`flush`] to wait for.
pub(crate) fn pending(task: tokio::task::JoinHandle<()>) {
    PENDING.lock().push(task);
}

/// Waits for the writes [`Cache::put_soon`] started.
pub async fn flush() {
    let pending = std::mem::take(&mut *PENDING.lock());
    for write in pending {
        let _ = write.await;
    }
}

/// The warehouse's folder of answers.
pub const FOLDER: &str = "llm-cache";

/// The warehouse's secret that signs the cache's entries, beside [`FOLDER`].
pub const SECRET: &str = crate::storage::WAREHOUSE_SECRET;

/// The largest entry read: a reply past this is not cached.
const MAX_ENTRY: usize = 16 << 20;

pub use crate::config::CacheMode as Mode;

/// A warehouse's cache of answers.
#[derive(Debug, Clone)]
pub struct Cache {
    store: Arc<dyn ObjectStore>,
    /// `.../llm-cache`
    prefix: Path,
    /// Its URL, for the processes of a cluster.
    location: String,
    /// Its folder, where it is on a local disk: entries there are read as regular files only,
    /// and deleted without following links ([`crate::storage::beneath`]).
    local: Option<std::path::PathBuf>,
    /// Where [`SECRET`] is in `store`.
    secret_path: Path,
    /// The secret, read (or made) on first use; None where it cannot be used (said once).
    secret: Arc<tokio::sync::OnceCell<Option<Secret>>>,
    /// Whether an entry not signed with the secret was said.
    unsigned_said: Arc<std::sync::atomic::AtomicBool>,
    /// Whether a claim of another process taken over was said.
    claim_said: Arc<std::sync::atomic::AtomicBool>,
}

/// The folder `folder` beside the cache `cache_prefix` (the warehouse's `llm-cache`), and the
/// name there of the model `model` at `endpoint` (the sha256 of both): where what the warehouse
/// keeps of a model beside its answers goes (its calibration, its batches' records).
pub fn beside(cache_prefix: &Path, folder: &str, endpoint: &str, model: &str) -> (Path, String) {
    let mut parts: Vec<String> = cache_prefix
        .parts()
        .map(|p| p.as_ref().to_string())
        .collect();
    parts.pop();
    parts.push(folder.to_string());
    let name = hex::encode(Sha256::digest(format!("{endpoint}\u{0}{model}").as_bytes()));
    (Path::from_iter(parts), name)
}

/// The key of `request` sent to `endpoint`.
pub fn key(endpoint: &str, request: &Value) -> String {
    let text = super::canonical(&json!({"endpoint": endpoint, "request": request}));
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl Cache {
    /// The cache under `prefix` (the warehouse's `llm-cache`) of `store`, at the URL
    /// `location`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path, location: String) -> Cache {
        let local = url::Url::parse(&location)
            .ok()
            .filter(|url| url.scheme() == "file")
            .and_then(|url| url.to_file_path().ok());
        let mut parts: Vec<String> = prefix.parts().map(|p| p.as_ref().to_string()).collect();
        parts.pop();
        parts.push(SECRET.to_string());
        Cache {
            store,
            prefix,
            location,
            local,
            secret_path: Path::from_iter(parts),
            secret: Arc::default(),
            unsigned_said: Arc::default(),
            claim_said: Arc::default(),
        }
    }

    /// The cache at the URL `location` (a cluster client's warehouse's), through `stores`.
    pub fn at(
        stores: &crate::storage::StoreRegistry,
        location: &str,
    ) -> crate::error::Result<Cache> {
        let url = url::Url::parse(location).map_err(|e| {
            crate::error::Error::Internal(format!("the LLM cache's location {location}: {e}"))
        })?;
        Ok(Cache::new(
            stores.store_for(&url)?,
            crate::storage::object_path(&url)?,
            location.to_string(),
        ))
    }

    /// Where the warehouse keeps the calibration of the model `model` at `endpoint`, beside
    /// the cache.
    pub fn calibration(&self, endpoint: &str, model: &str) -> super::calibration::Kept {
        super::calibration::Kept::beside(self.store.clone(), &self.prefix, endpoint, model)
    }

    /// Where the warehouse keeps the records of the batches of the model `model` at
    /// `endpoint`, beside the cache ([`crate::llm::batch`]).
    pub fn batch_records(&self, endpoint: &str, model: &str) -> crate::llm::batch::kept::Records {
        crate::llm::batch::kept::Records::beside(self.store.clone(), &self.prefix, endpoint, model)
    }

    /// Its URL.
    pub fn location(&self) -> &str {
        &self.location
    }

    fn path(&self, key: &str) -> Path {
        self.prefix
            .clone()
            .join(key.get(..2).unwrap_or("00"))
            .join(format!("{key}.json").as_str())
    }

    /// The reply kept for `key`, if a whole one is. A local entry that is not a regular file (a
    /// FIFO, a device, a folder) is a miss, said once, never a wait.
    pub async fn get(&self, key: &str) -> Option<String> {
        let secret = self.secret().await?;
        let path = self.path(key);
        let bytes = match &self.local {
            Some(root) => {
                let file = root
                    .join(key.get(..2).unwrap_or("00"))
                    .join(format!("{key}.json"));
                if std::fs::symlink_metadata(&file).is_err() {
                    return None;
                }
                let read = tokio::task::spawn_blocking(move || {
                    crate::storage::read_capped(&file, MAX_ENTRY as u64)
                })
                .await
                .ok()?;
                match read {
                    Ok(bytes) => bytes::Bytes::from(bytes),
                    Err(e) => {
                        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                            crate::say!("warning: an entry of the LLM cache is not used: {e}");
                        }
                        return None;
                    }
                }
            }
            None => {
                let result = self.store.get(&path).await.ok()?;
                if result.meta.size > MAX_ENTRY as u64 {
                    return None;
                }
                result.bytes().await.ok()?
            }
        };
        let entry: Value = serde_json::from_slice(&bytes).ok()?;
        let reply = entry.get("reply")?.as_str()?;
        let whole = entry.get("key")?.as_str() == Some(key)
            && entry.get("sha256")?.as_str()? == hex::encode(Sha256::digest(reply.as_bytes()));
        if !whole {
            return None;
        }
        let signed = entry
            .get("mac")
            .and_then(Value::as_str)
            .is_some_and(|mac| same(mac.as_bytes(), secret.sign(key, reply).as_bytes()));
        if !signed {
            if !self
                .unsigned_said
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                crate::say!(
                    "warning: an entry of the LLM cache ({path}) is not signed with this \
                     warehouse's secret (altered, forged, or kept by a batchinfer that did not \
                     sign): it is not used, and its request is sent"
                );
            }
            return None;
        }
        Some(reply.to_string())
    }

    /// Keeps `reply` for `key` (a reply too large to keep is not kept).
    pub async fn put(&self, key: &str, reply: &str) -> Result<(), Unusable> {
        if reply.len() > MAX_ENTRY - 1024 {
            return Ok(());
        }
        let Some(secret) = self.secret().await else {
            return Ok(());
        };
        let entry = json!({
            "key": key,
            "sha256": hex::encode(Sha256::digest(reply.as_bytes())),
            "mac": secret.sign(key, reply),
            "reply": reply,
        });
        let bytes = entry.to_string().into_bytes();
        self.store
            .put(&self.path(key), bytes.into())
            .await
            .map(drop)
            .map_err(|e| Unusable::NotKept {
                place: self.prefix.to_string(),
                error: e.into(),
            })
    }

    /// Keeps `reply` for `key` on a task of its own, so that a statement that stops meanwhile
    /// (its budget, another row's error) still keeps what it paid for; [`flush`] waits for such
    /// writes. The `claim` this process held for the request, if any, is removed once the answer
    /// is kept. A failure to keep one is said once.
    pub fn put_soon(&self, key: &str, reply: String, claim: Option<ClaimGuard>) {
        let (cache, key) = (self.clone(), key.to_string());
        pending(tokio::spawn(async move {
            if let Err(warning) = cache.put(&key, &reply).await
                && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                crate::say!("warning: {warning}");
            }
            if let Some(claim) = claim {
                claim.release().await;
            }
        }));
    }

    /// The entries and their bytes.
    pub async fn size(&self) -> crate::error::Result<(u64, u64)> {
        let mut listing = self.store.list(Some(&self.prefix));
        let (mut entries, mut bytes) = (0, 0);
        while let Some(meta) = listing.try_next().await? {
            entries += 1;
            bytes += meta.size;
        }
        Ok((entries, bytes))
    }

    /// Removes every entry; returns how many. On a local disk nothing is deleted through a
    /// link: a folder of the cache that links elsewhere is left, and said.
    pub async fn clear(&self) -> crate::error::Result<u64> {
        let paths: Vec<Path> = self
            .store
            .list(Some(&self.prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await?;
        let mut removed = 0;
        let mut links = std::collections::BTreeSet::new();
        for path in paths {
            let Some(root) = &self.local else {
                match self.store.delete(&path).await {
                    Ok(()) => removed += 1,
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                continue;
            };
            let Some(relative) = path.prefix_match(&self.prefix) else {
                continue;
            };
            let relative: std::path::PathBuf = relative.map(|p| p.as_ref().to_string()).collect();
            let (root, file) = (root.clone(), root.join(&relative));
            let deleted = tokio::task::spawn_blocking(move || {
                crate::storage::beneath::remove_file_beneath(&root, &file)
            })
            .await
            .map_err(|e| crate::error::Error::Internal(format!("clearing the LLM cache: {e}")))?;
            match deleted {
                Ok(()) => removed += 1,
                Err(crate::storage::beneath::BeneathError::Link { link, .. }) => {
                    links.insert(link);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(crate::error::Error::io(
                        "clearing the LLM cache".to_string(),
                        std::io::Error::other(e.to_string()),
                    ));
                }
            }
        }
        for link in links {
            crate::say!(
                "warning: {} is a symbolic link in the LLM cache: nothing was deleted through it \
                 (remove the link)",
                link.display()
            );
        }
        Ok(removed)
    }
}
