//! Claims: a request in flight, claimed in the cache so that another process asking the same
//! waits for its answer instead of paying for it again; a claim renewed while its request runs,
//! taken over after a lease where nothing renews it.

use super::*;

/// How long a claim holds unless renewed ([`Cache::claim`]).
pub const LEASE: Duration = Duration::from_secs(30);

/// What [`Cache::claim`] came to.
pub enum Claim {
    /// The request is this process's to send; the guard holds the claim.
    Mine(ClaimGuard),
    /// Another process answered it meanwhile: its reply.
    Answered(String),
    /// Claims cannot be made in this store: sent without one.
    Unclaimed,
}

/// A claim this process holds, renewed while it lives; removed when released or dropped (the
/// request failed, or its statement stopped).
pub struct ClaimGuard {
    cache: Cache,
    path: Path,
    owner: String,
    renewal: Option<tokio::task::JoinHandle<()>>,
}

impl ClaimGuard {
    fn new(cache: Cache, path: Path, owner: String) -> ClaimGuard {
        let renewal = {
            let (cache, path, owner) = (cache.clone(), path.clone(), owner.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LEASE / 3).await;
                    let _ = cache.store.put(&path, claim_body(&owner).into()).await;
                }
            })
        };
        ClaimGuard {
            cache,
            path,
            owner,
            renewal: Some(renewal),
        }
    }

    /// Removes the claim, if it is still this process's.
    pub(super) async fn release(mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        remove_claim(&self.cache, &self.path, &self.owner).await;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some(renewal) = self.renewal.take() else {
            return;
        };
        renewal.abort();
        let (cache, path, owner) = (self.cache.clone(), self.path.clone(), self.owner.clone());
        // Waited for by [`flush`] with the writes, so that a process ending now leaves none.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            pending(runtime.spawn(async move { remove_claim(&cache, &path, &owner).await }));
        }
    }
}

/// Removes the claim at `path` where `owner` still holds it (another process may have taken it
/// over after its lease).
async fn remove_claim(cache: &Cache, path: &Path, owner: &str) {
    let Ok(Some(bytes)) = cache.read_claim(path).await else {
        return;
    };
    let held = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .is_some_and(|claim| claim.get("owner").and_then(Value::as_str) == Some(owner));
    if held {
        cache.delete_claim(path).await;
    }
}

/// A claim's contents: who holds it, and until when unless renewed.
fn claim_body(owner: &str) -> Vec<u8> {
    json!({"owner": owner, "until_ms": now_ms() + LEASE.as_millis() as u64})
        .to_string()
        .into_bytes()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Cache {
    /// Claims the request `key` for this process, so that other processes asking the same at
    /// once wait for its answer instead of paying for it again: a `KEY.claim` beside the entry,
    /// made only where none is, renewed every [`LEASE`] / 3 while the request runs, and removed
    /// when the answer is kept or the request ends without one. A claim of another process is
    /// waited on until its answer is kept or it is removed (the request is then sent here); one
    /// that does not change for a [`LEASE`] by this process's clock (its process died, or it is
    /// no claim: garbage, a FIFO, a folder) is taken over, whatever time it says.
    pub async fn claim(&self, key: &str) -> Claim {
        let path = self.claim_path(key);
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let mut pause = Duration::from_millis(50);
        // The other claim as last read, and since when it has read so.
        let mut seen: Option<(Option<Vec<u8>>, std::time::Instant)> = None;
        loop {
            let made = self
                .store
                .put_opts(
                    &path,
                    claim_body(&owner).into(),
                    object_store::PutMode::Create.into(),
                )
                .await;
            match made {
                Ok(_) => {
                    let guard = ClaimGuard::new(self.clone(), path, owner);
                    // Answered between the lookup and the claim: nothing to send.
                    return match self.get(key).await {
                        Some(reply) => {
                            guard.release().await;
                            Claim::Answered(reply)
                        }
                        None => Claim::Mine(guard),
                    };
                }
                Err(object_store::Error::AlreadyExists { .. }) => {}
                // A store that cannot make an object only where none is: no claims.
                Err(_) => return Claim::Unclaimed,
            }
            if let Some(reply) = self.get(key).await {
                return Claim::Answered(reply);
            }
            let now = match self.read_claim(&path).await {
                // Gone meanwhile: claimed anew at once.
                Ok(None) => continue,
                Ok(Some(bytes)) => Some(bytes),
                Err(()) => None,
            };
            match &seen {
                Some((before, since)) if *before == now => {
                    if since.elapsed() >= LEASE {
                        self.say_claim(&path, "it was not renewed for 30 s: taken over");
                        self.delete_claim(&path).await;
                        if !matches!(self.read_claim(&path).await, Ok(None)) {
                            crate::say!(
                                "warning: a claim in the LLM cache ({path}) cannot be removed \
                                 (remove it): the request is sent without one"
                            );
                            return Claim::Unclaimed;
                        }
                        continue;
                    }
                }
                _ => seen = Some((now, std::time::Instant::now())),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Says, once for this cache, what became of a claim of another process.
    pub(super) fn say_claim(&self, path: &Path, what: &str) {
        if !self
            .claim_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            crate::say!("warning: a claim in the LLM cache ({path}): {what}");
        }
    }

    pub(super) fn claim_path(&self, key: &str) -> Path {
        self.prefix
            .clone()
            .join(key.get(..2).unwrap_or("00"))
            .join(format!("{key}.claim").as_str())
    }

    /// Where the object `path` of a local cache is on the disk.
    pub(super) fn local_file(&self, path: &Path) -> Option<std::path::PathBuf> {
        let root = self.local.as_ref()?;
        let relative = path.prefix_match(&self.prefix)?;
        Some(
            std::iter::once(root.clone())
                .chain(relative.map(|p| std::path::PathBuf::from(p.as_ref())))
                .collect(),
        )
    }

    /// Deletes the claim at `path`; on a local disk never through a link.
    pub(super) async fn delete_claim(&self, path: &Path) {
        let Some(root) = &self.local else {
            let _ = self.store.delete(path).await;
            return;
        };
        let Some(file) = self.local_file(path) else {
            return;
        };
        let root = root.clone();
        let _ = tokio::task::spawn_blocking(move || {
            crate::storage::beneath::remove_file_beneath(&root, &file)
        })
        .await;
    }

    /// The claim at `path`, if there is one: on a local disk read as a regular file only (a
    /// FIFO is an error, never a wait).
    pub(super) async fn read_claim(&self, path: &Path) -> Result<Option<Vec<u8>>, ()> {
        if self.local.is_none() {
            return match self.store.get(path).await {
                Ok(got) if got.meta.size <= 4096 => {
                    got.bytes().await.map(|b| Some(b.to_vec())).map_err(drop)
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                _ => Err(()),
            };
        };
        let file = self.local_file(path).ok_or(())?;
        if std::fs::symlink_metadata(&file).is_err() {
            return Ok(None);
        }
        tokio::task::spawn_blocking(move || crate::storage::read_capped(&file, 4096))
            .await
            .map_err(drop)?
            .map(Some)
            .map_err(drop)
    }
}
