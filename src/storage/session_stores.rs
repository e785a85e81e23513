//! A session's view of the engine's stores: the same stores (connected once, shared by every
//! session of the process), read under the session's own limits. `batchinfer.max_footer_bytes`
//! is one session's setting, and two sessions of a server or two Python connections each read
//! with their own cap, never with the one another session set last; and every path is checked
//! against the session's confinement ([`Access`]) as it is read or written.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::execution::object_store::ObjectStoreRegistry;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use parking_lot::RwLock;
use url::Url;

use super::StoreRegistry;
use super::access::{Access, Op, Refused};
use super::footer::{DEFAULT_MAX_FOOTER_BYTES, is_parquet_tail, metadata_len};
use crate::config::BatchInferOptions;

/// The warehouse's one file no statement of any session reads, through any store: the key the
/// LLM cache signs its entries with ([`crate::llm::cache`]).
pub const WAREHOUSE_SECRET: &str = "llm-cache.key";

/// The limits one session reads and writes under, set from its options as each of its
/// statements starts: its footer cap and its confinement ([`Access`]).
#[derive(Debug)]
pub struct SessionLimits {
    footer_bytes: AtomicU64,
    access: RwLock<Arc<Access>>,
    /// The warehouse's root, whose files are the catalog's to read and write.
    warehouse: OnceLock<Url>,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            footer_bytes: AtomicU64::new(DEFAULT_MAX_FOOTER_BYTES),
            access: RwLock::new(Arc::new(Access::default())),
            warehouse: OnceLock::new(),
        }
    }
}

impl SessionLimits {
    /// The limits `options` set (a cluster's task, which has no warehouse).
    pub fn of(options: Option<&BatchInferOptions>) -> Self {
        let limits = SessionLimits::default();
        if let Some(options) = options {
            limits.follow(options);
        }
        limits
    }

    /// The session's options as they are now, for its statements from now on.
    pub fn follow(&self, options: &BatchInferOptions) {
        self.footer_bytes
            .store(options.max_footer_bytes, Ordering::Relaxed);
        *self.access.write() = Arc::new(Access::new(options, self.warehouse.get()));
    }

    /// The warehouse whose files the session's catalog reads and writes.
    pub fn set_warehouse(&self, root: &Url) {
        let _ = self.warehouse.set(root.clone());
    }

    /// What the session may read and write now.
    pub fn access(&self) -> Arc<Access> {
        self.access.read().clone()
    }
}

/// The stores of one session: the engine's [`StoreRegistry`], each store handed out under the
/// session's [`SessionLimits`].
#[derive(Debug)]
pub struct SessionStores {
    stores: Arc<StoreRegistry>,
    limits: Arc<SessionLimits>,
}

impl SessionStores {
    pub fn new(stores: Arc<StoreRegistry>, limits: Arc<SessionLimits>) -> Self {
        SessionStores { stores, limits }
    }
}

impl ObjectStoreRegistry for SessionStores {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.stores.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        self.stores.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        let inner = self.stores.get_store(url)?;
        let base = match url.scheme() {
            "file" => String::new(),
            scheme => format!("{scheme}://{}", url.host_str().unwrap_or_default()),
        };
        Ok(Arc::new(Limited {
            inner,
            limits: self.limits.clone(),
            base,
        }))
    }
}

/// One store read under a session's limits.
#[derive(Debug, Clone)]
struct Limited {
    inner: Arc<dyn ObjectStore>,
    limits: Arc<SessionLimits>,
    /// `scheme://bucket` of the store ("" for local files), to name an object.
    base: String,
}

impl fmt::Display for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Limited {
    /// Where `location` is, as a URL (a local file's path made a `file:` URL).
    fn url_of(&self, location: &Path) -> object_store::Result<Url> {
        let url = if self.base.is_empty() {
            object_store::local::LocalFileSystem::new()
                .path_to_filesystem(location)
                .ok()
                .and_then(|path| Url::from_file_path(path).ok())
        } else {
            Url::parse(&format!("{}/{location}", self.base)).ok()
        };
        url.ok_or_else(|| refused(format!("'{location}' cannot be checked as a path")))
    }

    /// Refuses `op` on `location` where the session may not (its warehouse's files are the
    /// catalog's, allowed).
    fn allowed(&self, access: &Access, location: &Path, op: Op) -> object_store::Result<()> {
        if self.is_secret(location) {
            return Err(refused(format!(
                "'{}' is the warehouse's secret that signs the LLM cache: no statement reads or \
                 writes it",
                self.url_of(location)
                    .map_or_else(|_| location.to_string(), |u| u.to_string())
            )));
        }
        if !access.confined() {
            return Ok(());
        }
        access
            .check(&self.url_of(location)?, op, true)
            .map_err(|e| refused(e.0))
    }

    /// Whether `location` is the warehouse's secret ([`WAREHOUSE_SECRET`]), which no
    /// statement of any session reads: whoever holds it can sign cache entries. Named as it is,
    /// or through links (a local file is judged where it really is).
    fn is_secret(&self, location: &Path) -> bool {
        let secret = WAREHOUSE_SECRET;
        let Some(root) = self.limits.warehouse.get() else {
            return false;
        };
        let Ok(own) = root.join(secret) else {
            return false;
        };
        let Ok(url) = self.url_of(location) else {
            return false;
        };
        if url == own {
            return true;
        }
        // Through a link (to it, or to a folder on the way): only local files can be links.
        match (url.to_file_path(), own.to_file_path()) {
            (Ok(file), Ok(own)) => {
                let maybe = file.file_name().is_some_and(|name| name == secret)
                    || std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_symlink());
                maybe && super::access::resolved(&file) == super::access::resolved(&own)
            }
            _ => false,
        }
    }

    /// [`Limited::allowed`] with the session's confinement as it is now.
    fn check(&self, location: &Path, op: Op) -> object_store::Result<()> {
        self.allowed(&self.limits.access(), location, op)
    }

    /// A listing under `prefix`: the prefix checked, and each entry (a link in a local folder
    /// may lead out of it).
    fn checked_listing(
        &self,
        prefix: Option<&Path>,
        listing: BoxStream<'static, object_store::Result<ObjectMeta>>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let access = self.limits.access();
        if !access.confined() {
            // The warehouse's secret is left out of every listing.
            let me = self.clone();
            return listing
                .filter(move |entry| {
                    let hidden = entry.as_ref().is_ok_and(|e| me.is_secret(&e.location));
                    futures::future::ready(!hidden)
                })
                .boxed();
        }
        let root = Path::default();
        if let Err(e) = self.allowed(&access, prefix.unwrap_or(&root), Op::Read) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        let (me, hide) = (self.clone(), self.clone());
        listing
            .filter(move |entry| {
                let hidden = entry.as_ref().is_ok_and(|e| hide.is_secret(&e.location));
                futures::future::ready(!hidden)
            })
            .map(move |entry| {
                let entry = entry?;
                me.allowed(&access, &entry.location, Op::Read)?;
                Ok(entry)
            })
            .boxed()
    }

    /// A Parquet footer among `fetched` claiming more metadata than the session's cap: the
    /// error naming the file. A range that only looks like a footer (it ends in `PAR1`) is
    /// checked against the object's size first, so that no page of data is taken for one.
    async fn check_footers(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
        fetched: &[bytes::Bytes],
    ) -> object_store::Result<()> {
        let cap = self.limits.footer_bytes.load(Ordering::Relaxed);
        for (range, bytes) in ranges.iter().zip(fetched) {
            if !is_parquet_tail(bytes) {
                continue;
            }
            let mut tail = [0u8; 8];
            tail.copy_from_slice(&bytes[bytes.len() - 8..]);
            let claimed = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
            if claimed <= cap {
                continue;
            }
            let size = self.inner.head(location).await?.size;
            if range.end != size {
                continue;
            }
            let shown = format!("{}/{location}", self.base);
            if let Err(e) = metadata_len(&shown, size, tail, cap) {
                return Err(object_store::Error::Generic {
                    store: "batchinfer",
                    source: Box::new(super::unreadable::Unreadable(e.to_string())),
                });
            }
        }
        Ok(())
    }
}

#[async_trait]
impl ObjectStore for Limited {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check(location, Op::Write)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check(location, Op::Write)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check(location, Op::Read)?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.check(location, Op::Read)?;
        let fetched = self.inner.get_ranges(location, ranges).await?;
        self.check_footers(location, ranges, &fetched).await?;
        Ok(fetched)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let me = self.clone();
        let access = self.limits.access();
        let locations = locations
            .map(move |location| {
                let location = location?;
                me.allowed(&access, &location, Op::Write)?;
                Ok(location)
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.checked_listing(prefix, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.checked_listing(prefix, self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let access = self.limits.access();
        self.allowed(&access, prefix.unwrap_or(&Path::default()), Op::Read)?;
        let listed = self.inner.list_with_delimiter(prefix).await?;
        for entry in &listed.objects {
            self.allowed(&access, &entry.location, Op::Read)?;
        }
        Ok(listed)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check(from, Op::Read)?;
        self.check(to, Op::Write)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.check(from, Op::Write)?;
        self.check(to, Op::Write)?;
        self.inner.rename_opts(from, to, options).await
    }
}

/// The store's error for a path the session's confinement refuses.
fn refused(message: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "batchinfer",
        source: Box::new(Refused(message)),
    }
}
