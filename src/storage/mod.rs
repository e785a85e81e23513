//! Object stores: local files, and S3 or any S3-compatible server (MinIO, Ceph, R2, ...), found by
//! URL the first time a query, a model or the warehouse names `s3://bucket/...`.
//!
//! An S3 store is configured as `AmazonS3Builder::from_env` reads the environment:
//!
//! | variable | meaning |
//! |---|---|
//! | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` | static credentials |
//! | `AWS_PROFILE`, `~/.aws/credentials`, `~/.aws/config`, SSO, web identity, instance metadata | the AWS SDK's credential chain, used when no static credentials are set |
//! | `AWS_REGION` / `AWS_DEFAULT_REGION` | region (else the profile's `region`, else `us-east-1`) |
//! | `AWS_ENDPOINT_URL` | an S3-compatible server, e.g. `http://localhost:9000` (path-style requests) |
//! | `AWS_ALLOW_HTTP=true` | allow a plain-HTTP endpoint |
//! | `AWS_SKIP_SIGNATURE=true` | unsigned requests, for public buckets |
//!
//! and per table with SQL `OPTIONS ('aws.region' '...', 'aws.endpoint' '...', 'aws.allow_http'
//! 'true', 'aws.access_key_id' '...', 'aws.secret_access_key' '...')` on `CREATE EXTERNAL TABLE`
//! and `COPY ... TO`. A connection gives up after [`CONNECT_TIMEOUT`], a request after
//! [`REQUEST_TIMEOUT`] without an answer, and a failed request is retried at most [`RETRIES`]
//! times, none starting later than [`RETRY_TIMEOUT`] after the first: an unreachable endpoint, or
//! one that accepts connections and never answers, is an error within seconds, not a hang.
//!
//! Every store, local files included, is wrapped in a [`CommitStore`], which lets a write defer
//! making its files visible until the whole statement has succeeded (see [`commit`]):
//! [`StoreRegistry::begin_write`] is where COPY, INSERT and CREATE TABLE begin theirs.

pub mod commit;
mod credentials;
mod deferred;
mod files;
mod folder;
pub mod hints;
mod location;
mod manifest;
mod s3;
pub mod staging;
mod table;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use datafusion::common::DataFusionError;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion_cli::object_storage::AwsOptions;
use object_store::ObjectStore;
use object_store::path::Path;
use url::Url;

pub use commit::{CommitKind, CommitStore, PendingWrite, discards_done};
pub use location::{
    Location, absolute_location, blank_passwords, check_write_target, display_location,
    file_version, folder_location, folder_url, is_local_store, is_object_store_url, local_file,
    local_path, location_url, object_path, parse_location,
};
pub use manifest::Manifests;
pub use staging::StagedOutput;
pub use table::{MAX_NAME_BYTES, TABLE_CLAIM, TableWrite, Tables, check_name, named_folders};

use crate::error::{Error, Result};
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
        .ok_or_else(|| {
            Error::Usage(format!(
                "{what} is {size} bytes, more than this process can hold in memory"
            ))
        })?;
    Ok(bytes)
}

pub(super) fn too_large(what: &str, size: u64, cap: u64) -> Error {
    Error::Usage(format!(
        "{what} is {size} bytes, over the {cap} bytes batchinfer reads of such a file"
    ))
}

/// Reads a whole local file of at most `cap` bytes. Only a regular file is read (a symbolic link
/// to one too): a FIFO, a device such as `/dev/zero` or a folder is refused without reading it,
/// and so is a file over the cap, so no file can make batchinfer wait forever or fill its memory.
pub fn read_capped(path: &std::path::Path, cap: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so that opening a FIFO does not wait for a writer; the check is made on the
    // file opened, not on the path, so the file cannot be swapped in between.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(Error::Usage(format!(
            "{} is not a regular file (a FIFO, a device or a folder): batchinfer reads only \
             regular files here",
            path.display()
        )));
    }
    if meta.len() > cap {
        return Err(too_large(&path.display().to_string(), meta.len(), cap));
    }
    let mut bytes = reserve(&path.display().to_string(), meta.len())?;
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if bytes.len() as u64 > cap {
        return Err(too_large(
            &path.display().to_string(),
            bytes.len() as u64,
            cap,
        ));
    }
    Ok(bytes)
}

/// Retries of a failed S3 request (connection refused, 5xx, throttling) before it is an error.
pub const RETRIES: usize = 3;
/// The longest a request is retried for.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest a connection to the endpoint may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest one request may take, its upload included (a 10 MiB part needs 350 KB/s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The object stores of an engine: DataFusion's registry (local files and whatever is registered
/// by hand), with S3 buckets connected on first use.
#[derive(Debug)]
pub struct StoreRegistry {
    inner: DefaultObjectStoreRegistry,
    /// Local files, whose writes commit by rename.
    local: Arc<CommitStore>,
    /// The S3 stores by `s3://bucket`, with the options they were made with, to begin and commit
    /// deferred writes on them.
    buckets: RwLock<HashMap<String, (AwsOptions, Arc<CommitStore>)>>,
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

fn store_key(url: &Url) -> String {
    format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default())
}

impl StoreRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Connects `url`'s bucket with `options` (SQL `OPTIONS`) over the environment's settings,
    /// replacing any store the bucket had.
    pub fn connect_s3(&self, url: &Url, options: &AwsOptions) -> Result<Arc<CommitStore>> {
        let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| {
            Error::Usage(format!("no bucket in '{url}': expected s3://BUCKET/..."))
        })?;
        let store = Arc::new(CommitStore::new(
            Arc::new(s3_builder(bucket, options)?.build()?),
            CommitKind::HoldUploads,
        ));
        let key = store_key(url);
        let base = Url::parse(&key).map_err(|e| Error::Usage(format!("{key}: {e}")))?;
        self.inner.register_store(&base, store.clone());
        self.buckets
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (options.clone(), store.clone()));
        Ok(store)
    }

    /// Connects the bucket `location` names with `options` (SQL `OPTIONS`); a location in no
    /// bucket (a local path) takes none.
    pub fn connect_with(&self, location: &str, options: &AwsOptions) -> Result<()> {
        if let Location::Url(url) = parse_location(location)?
            && matches!(url.scheme(), "s3" | "s3a")
        {
            self.connect_s3(&url, options)?;
        }
        Ok(())
    }

    /// Begins a write to `target` (a file or a folder ending in `/`; a local path or a URL):
    /// nothing written under it becomes visible until the returned write commits.
    pub fn begin_write(&self, target: &str) -> Result<PendingWrite> {
        check_write_target(target)?;
        let url = location_url(target)?;
        Ok(self.commit_store(&url)?.begin(object_path(&url)?))
    }

    /// The store of a URL: local files, or an `s3://` URL's bucket, connected from the
    /// environment on first use.
    pub fn commit_store(&self, url: &Url) -> Result<Arc<CommitStore>> {
        match url.scheme() {
            "file" => return Ok(self.local.clone()),
            "s3" | "s3a" => {}
            _ => return Err(no_store_for(url)),
        }
        if let Some((_, store)) = self
            .buckets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&store_key(url))
        {
            return Ok(store.clone());
        }
        self.connect_s3(url, &AwsOptions::default())
    }

    /// A client for `url`'s bucket made with the bucket's options, for use on another runtime.
    pub(super) fn own_client(
        &self,
        url: &Url,
    ) -> Result<(object_store::aws::AmazonS3, object_store::path::Path)> {
        if !matches!(url.scheme(), "s3" | "s3a") {
            return Err(no_store_for(url));
        }
        let options = self
            .buckets
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&store_key(url))
            .map(|(options, _)| options.clone())
            .unwrap_or_default();
        let bucket = url.host_str().unwrap_or_default();
        Ok((s3_builder(bucket, &options)?.build()?, object_path(url)?))
    }

    /// The store for any URL this registry resolves.
    pub fn store_for(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        Ok(self.get_store(url)?)
    }
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
            "s3" | "s3a" => Ok(self.commit_store(url).map_err(DataFusionError::from)?),
            "file" => self.inner.get_store(url),
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
                .map_err(|e| Error::Usage(format!("reading {path}: {e}")))?
        }
        CommitKind::HoldUploads => {
            read_body(store.inner().as_ref(), path, path.as_ref(), cap).await
        }
    };
    match read {
        Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => Ok(None),
        // Removed between the check and the read.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        read => read.map(Some),
    }
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
