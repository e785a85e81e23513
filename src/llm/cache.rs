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

/// Writes [`Cache::put_soon`] started and nobody has waited for yet.
/// Per process: a process waits for all of them before it exits.
static PENDING: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>> =
    parking_lot::Mutex::new(Vec::new());

/// Whether a failed write was said.
/// Per process: said once per process.
static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps `task` for [`flush`] to wait for.
fn pending(task: tokio::task::JoinHandle<()>) {
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
    async fn release(mut self) {
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

/// 32 random bytes.
#[derive(Clone, Copy)]
struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// 32 bytes from the system's random source (two version-4 UUIDs' worth).
    fn new() -> Secret {
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Secret(bytes)
    }

    fn parse(text: &[u8]) -> Result<Secret, String> {
        let text = std::str::from_utf8(text).unwrap_or("").trim();
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes)
            .map_err(|_| "it does not hold 64 hexadecimal digits".to_string())?;
        Ok(Secret(bytes))
    }

    /// The signature of the entry keeping `reply` for `key`.
    fn sign(&self, key: &str, reply: &str) -> String {
        let text = [key.as_bytes(), b"\n", reply.as_bytes()].concat();
        hex::encode(hmac_sha256(&self.0, &text))
    }
}

/// HMAC-SHA256 (RFC 2104) of `text` under `key` (at most 64 bytes).
fn hmac_sha256(key: &[u8], text: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(text);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Whether `a` and `b` are equal, in a time that does not tell where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The secret in the local file `file`, made there if there is none: a regular file of its
/// owner's alone (not a link), or the cache is not used.
fn local_secret(file: &std::path::Path) -> Result<Secret, String> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let shown = file.display();
    for _ in 0..2 {
        match std::fs::symlink_metadata(file) {
            Ok(meta) => {
                if !meta.file_type().is_file() {
                    return Err(format!("{shown} is not a regular file"));
                }
                if meta.mode() & 0o077 != 0 || meta.uid() != unsafe { libc::geteuid() } {
                    return Err(format!(
                        "{shown} is not this user's alone (it must be owned by the user that \
                         runs batchinfer, with mode 600: chmod 600 {shown})"
                    ));
                }
                let bytes = crate::storage::read_capped(file, 1024).map_err(|e| e.to_string())?;
                return Secret::parse(&bytes).map_err(|e| format!("{shown}: {e}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let folder = file.parent().unwrap_or(std::path::Path::new("."));
                std::fs::create_dir_all(folder).map_err(|e| format!("{shown}: {e}"))?;
                let draft = folder.join(format!(".{SECRET}.{}", uuid::Uuid::new_v4().simple()));
                let made = (|| {
                    let mut out = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&draft)?;
                    out.write_all(hex::encode(Secret::new().0).as_bytes())?;
                    out.sync_all()?;
                    // Never over another process's: the first one made is everyone's.
                    std::fs::hard_link(&draft, file)
                })();
                let _ = std::fs::remove_file(&draft);
                match made {
                    Ok(()) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(format!("{shown} could not be made: {e}")),
                }
            }
            Err(e) => return Err(format!("{shown}: {e}")),
        }
    }
    Err(format!("{shown} could not be read"))
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

    /// The warehouse's secret, read or made once; None (said once) where it cannot be used.
    async fn secret(&self) -> Option<Secret> {
        *self
            .secret
            .get_or_init(|| async {
                let secret = match &self.local {
                    Some(root) => {
                        let file = root.with_file_name(SECRET);
                        tokio::task::spawn_blocking(move || local_secret(&file))
                            .await
                            .unwrap_or_else(|e| Err(e.to_string()))
                    }
                    None => self.remote_secret().await,
                };
                secret
                    .map_err(|e| {
                        crate::say!(
                            "warning: the LLM cache is not used: its secret cannot be used ({e})"
                        )
                    })
                    .ok()
            })
            .await
    }

    /// The secret as an object of the warehouse's store, made there (only where none is yet)
    /// if there is none.
    async fn remote_secret(&self) -> Result<Secret, String> {
        let shown = format!(
            "{}{SECRET}",
            self.location.trim_end_matches('/').trim_end_matches(FOLDER)
        );
        for _ in 0..2 {
            match self.store.get(&self.secret_path).await {
                Ok(got) => {
                    if got.meta.size > 1024 {
                        return Err(format!("{shown} is not a secret batchinfer made"));
                    }
                    let bytes = got.bytes().await.map_err(|e| format!("{shown}: {e}"))?;
                    return Secret::parse(&bytes).map_err(|e| format!("{shown}: {e}"));
                }
                Err(object_store::Error::NotFound { .. }) => {
                    let text = hex::encode(Secret::new().0);
                    let made = self
                        .store
                        .put_opts(
                            &self.secret_path,
                            text.into_bytes().into(),
                            object_store::PutMode::Create.into(),
                        )
                        .await;
                    match made {
                        Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => continue,
                        Err(e) => return Err(format!("{shown} could not be made: {e}")),
                    }
                }
                Err(e) => return Err(format!("{shown}: {e}")),
            }
        }
        Err(format!("{shown} could not be read"))
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
    pub async fn put(&self, key: &str, reply: &str) -> Result<(), String> {
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
            .map_err(|e| {
                format!(
                    "an answer could not be kept in the cache ({}): {e}",
                    self.prefix
                )
            })
    }

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
    fn say_claim(&self, path: &Path, what: &str) {
        if !self
            .claim_said
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            crate::say!("warning: a claim in the LLM cache ({path}): {what}");
        }
    }

    fn claim_path(&self, key: &str) -> Path {
        self.prefix
            .clone()
            .join(key.get(..2).unwrap_or("00"))
            .join(format!("{key}.claim").as_str())
    }

    /// Where the object `path` of a local cache is on the disk.
    fn local_file(&self, path: &Path) -> Option<std::path::PathBuf> {
        let root = self.local.as_ref()?;
        let relative = path.prefix_match(&self.prefix)?;
        Some(
            std::iter::once(root.clone())
                .chain(relative.map(|p| std::path::PathBuf::from(p.as_ref())))
                .collect(),
        )
    }

    /// Deletes the claim at `path`; on a local disk never through a link.
    async fn delete_claim(&self, path: &Path) {
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
    async fn read_claim(&self, path: &Path) -> Result<Option<Vec<u8>>, ()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let secret = Secret([7; 32]);
        assert_ne!(secret.sign("k", "a"), secret.sign("k", "b"));
        assert_ne!(secret.sign("k", "a"), Secret([8; 32]).sign("k", "a"));
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"ab", b"abc"));
    }
}
