//! Object stores: local files; S3 or any S3-compatible server (MinIO, Ceph, R2, ...), Google Cloud
//! Storage, Azure Blob Storage, and plain HTTP(S) servers (read only), each found by URL the
//! first time a query, a model or the warehouse names it (`s3://`, `gs://`, `az://`, `abfss://`,
//! `https://`; `cloud.rs` says which scheme is which store).
//!
//! Each store is configured from the environment as object_store's `from_env` reads it (the
//! docs/storage.md has one table per store): `AWS_*` for S3 (with the AWS SDK's credential chain for
//! profiles, SSO and instance metadata), `GOOGLE_*` for Google Cloud Storage, `AZURE_*` for
//! Azure, and per table with SQL `OPTIONS ('aws.region' '...')`, `('gcp.service_account_key'
//! '...')`, `('azure.account_name' '...')` on `CREATE EXTERNAL TABLE` and `COPY ... TO`. A
//! connection gives up after [`CONNECT_TIMEOUT`], a request after [`REQUEST_TIMEOUT`] without an
//! answer, and a failed request is retried at most [`RETRIES`] times, none starting later than
//! [`RETRY_TIMEOUT`] after the first: an unreachable endpoint, or one that accepts connections
//! and never answers, is an error within seconds, not a hang.
//!
//! Every store, local files included, is wrapped in a [`CommitStore`], which lets a write defer
//! making its files visible until the whole statement has succeeded (see [`commit`]):
//! [`StoreRegistry::begin_write`] is where COPY, INSERT and CREATE TABLE begin theirs.

pub mod access;
pub mod beneath;
mod cloud;
pub mod commit;
mod credentials;
mod deferred;
mod deferred_upload;
mod files;
pub mod fill;
mod folder;
pub mod footer;
pub mod hints;
mod location;
mod manifest;
mod s3;
mod session_stores;
pub mod staging;
mod table;
pub mod unreadable;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::DataFusionError;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::ObjectStore;
use object_store::path::Path;
use parking_lot::RwLock;
use url::Url;

pub use commit::{
    CommitKind, CommitStore, PendingWrite, discard_in_background, discards_done,
    kept_despite_cancel, take_kept_despite_cancel,
};
pub use files::read_capped;
pub use fill::Fill;
pub use location::{
    Location, absolute_location, blank_passwords, check_write_target, display_location,
    file_version, folder_location, folder_url, is_local_store, is_object_store_url, local_file,
    local_path, location_url, object_path, parse_location,
};
pub use manifest::Manifests;
pub use session_stores::{SessionLimits, SessionStores, WAREHOUSE_SECRET};
pub use staging::StagedOutput;
pub use table::{MAX_NAME_BYTES, TABLE_CLAIM, Tables, check_name, named_folders};

use crate::error::{Error, Result};
use cloud::bucket_of;
pub use cloud::{Azure, Cloud, Gcp, SqlStoreOptions, StoreOptions};
use location::no_store_for;
use s3::s3_builder;

/// A write whose files appear together when it commits, or never.
#[derive(Debug)]
pub enum CommittedWrite {
    /// Uploads made by this process, their completion held back.
    Deferred(PendingWrite),
    /// Files written by other processes into a staging folder.
    Staged(StagedOutput),
}

impl CommittedWrite {
    /// Fills the write's files at commit ([`fill`]): true where it will, false where others
    /// write them (a cluster's executors), whose files cannot be.
    pub fn fill_at_commit(&self, fill: Fill) -> bool {
        match self {
            CommittedWrite::Deferred(write) => {
                write.fill_at_commit(fill);
                true
            }
            CommittedWrite::Staged(_) => false,
        }
    }

    /// Makes the files visible; how many there are.
    pub async fn commit(self) -> Result<usize> {
        match self {
            CommittedWrite::Deferred(write) => Ok(write.commit().await?),
            CommittedWrite::Staged(staged) => staged.commit().await,
        }
    }

    /// Discards the files.
    pub async fn abort(self) {
        match self {
            CommittedWrite::Deferred(write) => write.abort().await,
            CommittedWrite::Staged(staged) => staged.discard().await,
        }
    }
}

/// The largest file read whole when nothing smaller is said (model files have a cap of their
/// own): a file batchinfer reads into memory never grows without bound.
pub const READ_CAP: u64 = 1 << 30;

/// Room for a file of `size` bytes read whole, or an error saying there is not that much memory
/// (rather than an abort when the allocation fails).
pub(super) fn reserve(what: &str, size: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    usize::try_from(size)
        .ok()
        .and_then(|size| bytes.try_reserve_exact(size).ok())
        .ok_or_else(|| Error::TooLarge {
            what: what.to_string(),
            size,
            unit: "bytes",
            limit: "more than this process can hold in memory".into(),
        })?;
    Ok(bytes)
}

pub(super) fn too_large(what: &str, size: u64, cap: u64) -> Error {
    Error::TooLarge {
        what: what.to_string(),
        size,
        unit: "bytes",
        limit: format!("over the {cap} bytes batchinfer reads of such a file"),
    }
}

/// Retries of a failed request (connection refused, 5xx, throttling) before it is an error.
pub const RETRIES: usize = 3;
/// The longest a request is retried for.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a connection to the endpoint may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one request may take, its upload included (a 10 MiB part needs 350 KB/s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The object stores of an engine: DataFusion's registry (local files and whatever is registered
/// by hand), with the buckets and containers of S3, Google Cloud Storage and Azure, and HTTP(S)
/// servers, connected on first use.
#[derive(Debug)]
pub struct StoreRegistry {
    inner: DefaultObjectStoreRegistry,
    /// Local files, whose writes commit by rename.
    local: Arc<CommitStore>,
    /// The stores by `scheme://[container@]bucket[:port]`, with the options they were made
    /// with, to begin and commit deferred writes on them.
    buckets: RwLock<HashMap<String, (StoreOptions, Arc<CommitStore>)>>,
}

impl Default for StoreRegistry {
    fn default() -> Self {
        let inner = DefaultObjectStoreRegistry::new();
        let local = Arc::new(CommitStore::local());
        let file = Url::parse("file://").expect("a constant URL");
        inner.register_store(&file, local.clone());
        StoreRegistry {
            inner,
            local,
            buckets: RwLock::new(HashMap::new()),
        }
    }
}

/// What tells one store from another in a URL: its scheme, the container of an
/// `abfss://CONTAINER@ACCOUNT...` URL, the bucket (host) and port. Never a password.
fn store_key(url: &Url) -> String {
    let container = match url.username() {
        "" => String::new(),
        name => format!("{name}@"),
    };
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    format!(
        "{}://{container}{}{port}",
        url.scheme(),
        url.host_str().unwrap_or_default()
    )
}

#[cfg(test)]
#[test]
fn stores_are_told_apart_by_container_bucket_and_port_never_by_password() {
    let key = |u: &str| store_key(&Url::parse(u).unwrap());
    assert_eq!(key("s3://b/k"), "s3://b");
    assert_eq!(key("s3://user:secret@b/k"), "s3://user@b");
    assert_eq!(
        key("abfss://one@acct.dfs.core.windows.net/k"),
        "abfss://one@acct.dfs.core.windows.net"
    );
    assert_ne!(
        key("abfss://one@acct.dfs.core.windows.net/k"),
        key("abfss://two@acct.dfs.core.windows.net/k")
    );
    assert_ne!(key("http://h:1/a"), key("http://h:2/a"));
}

/// A new client of the store `url` is in, made with `options` over the environment's settings.
fn client(url: &Url, options: &StoreOptions) -> Result<(Cloud, Arc<dyn ObjectStore>)> {
    let cloud = Cloud::of(url).ok_or_else(|| no_store_for(url))?;
    if let Some(other) = options.for_other_than(cloud) {
        return Err(Error::store(
            blank_passwords(url.as_str()),
            format!(
                "'{other}' options are not for '{}', a {} location{}",
                blank_passwords(url.as_str()),
                cloud.name(),
                match cloud.option_prefix() {
                    Some(prefix) => format!(" (its options are '{prefix}.*')"),
                    None => " (it takes no options)".to_string(),
                }
            ),
        ));
    }
    let store: Arc<dyn ObjectStore> = match cloud {
        Cloud::S3 => Arc::new(s3_builder(bucket_of(url, cloud)?, &options.aws)?.build()?),
        Cloud::Gcs => cloud::gcs(url, options)?,
        Cloud::Azure => cloud::azure(url, options)?,
        Cloud::Http => cloud::http(url)?,
    };
    Ok((cloud, store))
}

impl StoreRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects the store of `url` (an `s3://`, `gs://`, `az://`, `abfss://` or `https://` URL)
    /// with `options` (SQL `OPTIONS`) over the environment's settings. A bucket (or container,
    /// or server) has one set of settings in an engine: the first that connects it. Settings
    /// given again are the same store; other settings for it are refused, since DataFusion finds
    /// a table's store by its bucket alone (two tables of one bucket with two sets of keys
    /// would both read with one of them), and writes in progress hold on to the store they began
    /// on.
    pub fn connect(&self, url: &Url, options: &StoreOptions) -> Result<Arc<CommitStore>> {
        let key = store_key(url);
        let connected =
            |buckets: &HashMap<String, (StoreOptions, Arc<CommitStore>)>| {
                buckets.get(&key).map(|(known, store)| {
                if known.same_as(options) {
                    Ok(store.clone())
                } else {
                    Err(Error::store(key.clone(), format!(
                        "{key} is connected already, with {}: a bucket or container takes one \
                         set of settings in a session (DataFusion finds a table's store by its \
                         bucket alone); give every table of {key} the same OPTIONS, or none",
                        match known.is_empty() {
                            true => "the environment's settings",
                            false => "other OPTIONS",
                        }
                    )))
                }
            })
            };
        if let Some(store) = connected(&self.buckets.read()) {
            return store;
        }
        let (cloud, client) = client(url, options)?;
        let kind = match cloud {
            Cloud::S3 | Cloud::Gcs | Cloud::Azure => CommitKind::HoldUploads,
            Cloud::Http => CommitKind::ReadOnly(cloud.name()),
        };
        let mut buckets = self.buckets.write();
        // Connected meanwhile by another statement: that store, as above.
        if let Some(store) = connected(&buckets) {
            return store;
        }
        let store = Arc::new(CommitStore::new(client, kind));
        buckets.insert(key, (options.clone(), store.clone()));
        Ok(store)
    }

    /// Connects the store `location` names with `options` (SQL `OPTIONS`); a location in no
    /// store (a local path) takes none. The store's key where this connected it first (for
    /// [`StoreRegistry::forget`]).
    pub fn connect_with(&self, location: &str, options: &StoreOptions) -> Result<Option<String>> {
        match parse_location(location)? {
            Location::Url(url) if url.scheme() != "file" => {
                let key = store_key(&url);
                let known = self.buckets.read().contains_key(&key);
                self.connect(&url, options)?;
                Ok((!known).then_some(key))
            }
            _ => Ok(None),
        }
    }

    /// Forgets the settings of the store `key` (as [`StoreRegistry::connect_with`] gave it),
    /// unless a write on it is in progress: the statement that connected it failed (wrong keys,
    /// say), and the next may connect it with other settings.
    pub fn forget(&self, key: &str) {
        let mut buckets = self.buckets.write();
        if buckets
            .get(key)
            .is_some_and(|(_, store)| !store.has_pending_writes())
        {
            buckets.remove(key);
        }
    }

    /// Begins a write to `target` (a file or a folder ending in `/`; a local path or a URL):
    /// nothing written under it becomes visible until the returned write commits.
    pub fn begin_write(&self, target: &str) -> Result<PendingWrite> {
        check_write_target(target)?;
        let url = location_url(target)?;
        let store = self.commit_store(&url)?;
        if let Some(name) = store.read_only() {
            return Err(read_only(&url, name));
        }
        Ok(store.begin(object_path(&url)?))
    }

    /// The store of a URL: local files, or the bucket, container or server of an object store's
    /// URL, connected from the environment on first use.
    pub fn commit_store(&self, url: &Url) -> Result<Arc<CommitStore>> {
        if url.scheme() == "file" {
            return Ok(self.local.clone());
        }
        if let Some((_, store)) = self.buckets.read().get(&store_key(url)) {
            return Ok(store.clone());
        }
        // First use, with the environment's settings (a statement's OPTIONS connect before).
        self.connect(url, &StoreOptions::default())
    }

    /// A client for `url`'s store made with the store's options, for use on another runtime
    /// (connections pooled by a runtime do not outlive it), and the object's path in it.
    pub(super) fn own_client(&self, url: &Url) -> Result<(Arc<dyn ObjectStore>, Path)> {
        let options = self
            .buckets
            .read()
            .get(&store_key(url))
            .map(|(options, _)| options.clone())
            .unwrap_or_default();
        let (_, store) = client(url, &options)?;
        Ok((store, object_path(url)?))
    }

    /// The store for any URL this registry resolves.
    pub fn store_for(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.get_store(url)?)
    }
}

/// The error for a write to a store batchinfer only reads.
pub(super) fn read_only(url: &Url, store: &str) -> Error {
    Error::store(
        blank_passwords(url.as_str()),
        format!(
            "'{}' is on an {store} server, which batchinfer reads from only: write to a local \
         folder, s3://, gs:// or az://",
            blank_passwords(url.as_str())
        ),
    )
}

impl ObjectStoreRegistry for StoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        match url.scheme() {
            "file" => self.inner.get_store(url),
            _ if Cloud::of(url).is_some() => {
                Ok(self.commit_store(url).map_err(DataFusionError::from)?)
            }
            _ => Err(DataFusionError::Plan(no_store_for(url).to_string())),
        }
    }
}

/// Reads the whole object `path` of `store` (at most `cap` bytes; checked before its body is
/// read), or `None` where there is none. A local file is read only if it is a regular file
/// ([`read_capped`]), so that a FIFO or a device in its place is an error, not a wait.
pub async fn read_object(store: &CommitStore, path: &Path, cap: u64) -> Result<Option<Vec<u8>>> {
    let read = match &store.kind {
        CommitKind::StageAndRename(local) => {
            let file = local.path_to_filesystem(path)?;
            if !file.exists() && file.symlink_metadata().is_err() {
                return Ok(None);
            }
            tokio::task::spawn_blocking(move || read_capped(&file, cap))
                .await
                .map_err(|e| Error::location(path, format!("reading {path}: {e}")))?
        }
        _ => read_body(store.inner().as_ref(), path, path.as_ref(), cap).await,
    };
    match read {
        Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => Ok(None),
        // Removed between the check and the read.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        read => read.map(Some),
    }
}

/// The small JSON object `path` of `store` (at most `cap` bytes, checked before its body is
/// read) as a `T`; None where there is none, it is larger, or it is not a `T`.
pub async fn read_small_json<T: serde::de::DeserializeOwned>(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    cap: u64,
) -> Option<T> {
    let bytes = read_body(store.as_ref(), path, path.as_ref(), cap)
        .await
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes `value` as the JSON object `path` of `store`, whole, by one PUT; whether the store
/// took it.
pub async fn write_small_json<T: serde::Serialize>(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    value: &T,
) -> bool {
    let Ok(json) = serde_json::to_vec(value) else {
        return false;
    };
    object_store::ObjectStoreExt::put(store.as_ref(), path, json.into())
        .await
        .is_ok()
}

/// The body of object `path` (`what` in messages), refused once it is over `cap` bytes.
pub(super) async fn read_body(
    store: &dyn ObjectStore,
    path: &Path,
    what: &str,
    cap: u64,
) -> Result<Vec<u8>> {
    use futures::StreamExt;
    let result = object_store::ObjectStoreExt::get(store, path).await?;
    if result.meta.size > cap {
        return Err(too_large(what, result.meta.size, cap));
    }
    let mut bytes = reserve(what, result.meta.size)?;
    let mut body = result.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        if (bytes.len() + chunk.len()) as u64 > cap {
            return Err(too_large(what, (bytes.len() + chunk.len()) as u64, cap));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Deletes every object under `prefix`.
pub async fn delete_prefix(
    store: &dyn ObjectStore,
    prefix: &object_store::path::Path,
) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    let locations = store
        .list(Some(prefix))
        .map_ok(|meta| meta.location)
        .boxed();
    store
        .delete_stream(locations)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Runs an I/O future to completion from synchronous code, on a thread with a runtime of its own.
pub fn block_on_io<F>(future: F) -> Result<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|rt| rt.block_on(future))
            })
            .join()
    })
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    .map_err(|e| Error::io("starting a runtime for object-store I/O", e))
}
