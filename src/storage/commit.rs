//! Deferred commits: the objects a write makes on S3 become visible only once the whole write has
//! succeeded.
//!
//! S3 has no rename, so "write a staging folder, then rename it" is not available. Instead, each
//! object a write puts under its target is sent as a multipart upload whose completion is held
//! back: the bytes are on the server, but no object exists until `CompleteMultipartUpload`. When
//! the statement succeeds, [`PendingWrite::commit`] completes them all; when it fails, is
//! cancelled or the connection is lost, the uploads are aborted (or, with the server gone, simply
//! never completed) and no file of the table appears. This is how Hadoop's S3A "magic" committer
//! works. The window left is the commit itself: a few requests, one per file, after all the data
//! is written.
//!
//! Outputs stream: parts are uploaded as they fill (DataFusion's 10 MiB buffers), so memory stays
//! bounded whatever the size of the table.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};

/// An object store whose writes under a [`PendingWrite`]'s prefix wait for its commit.
#[derive(Debug)]
pub struct CommitStore {
    inner: Arc<dyn ObjectStore>,
    writes: Mutex<Vec<Arc<WriteState>>>,
}

/// The uploads of one write, held back until it commits.
#[derive(Debug)]
struct WriteState {
    prefix: Path,
    uploads: Mutex<Vec<Box<dyn MultipartUpload>>>,
}

impl WriteState {
    fn take(&self) -> Vec<Box<dyn MultipartUpload>> {
        std::mem::take(&mut *self.uploads.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn hold(&self, upload: Box<dyn MultipartUpload>) {
        self.uploads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(upload);
    }
}

/// A write in progress: its objects appear on [`PendingWrite::commit`], or never.
#[derive(Debug)]
pub struct PendingWrite {
    store: Arc<CommitStore>,
    state: Arc<WriteState>,
    finished: bool,
}

impl CommitStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        CommitStore {
            inner,
            writes: Mutex::new(Vec::new()),
        }
    }

    /// The store underneath, whose writes are immediate.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Holds back every object written under `prefix` (a folder, or one file) until the returned
    /// write is committed.
    pub fn begin(self: &Arc<Self>, prefix: Path) -> PendingWrite {
        let state = Arc::new(WriteState {
            prefix,
            uploads: Mutex::new(Vec::new()),
        });
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(state.clone());
        PendingWrite {
            store: self.clone(),
            state,
            finished: false,
        }
    }

    fn deferring(&self, location: &Path) -> Option<Arc<WriteState>> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|w| location.prefix_matches(&w.prefix))
            .cloned()
    }

    fn end(&self, state: &Arc<WriteState>) {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|w| !Arc::ptr_eq(w, state));
    }
}

impl PendingWrite {
    /// Makes every object of the write visible; how many there are. Should a completion fail, the
    /// uploads not yet completed are aborted and the error returned.
    pub async fn commit(mut self) -> object_store::Result<usize> {
        self.finished = true;
        self.store.end(&self.state);
        let mut uploads = self.state.take();
        let count = uploads.len();
        while let Some(mut upload) = uploads.pop() {
            if let Err(e) = upload.complete().await {
                uploads.push(upload);
                abort_all(uploads).await;
                return Err(e);
            }
        }
        Ok(count)
    }

    /// Discards the write: no object of it will appear.
    pub async fn abort(mut self) {
        self.finished = true;
        self.store.end(&self.state);
        abort_all(self.state.take()).await;
    }
}

/// Best effort: an upload that cannot be aborted (the server is gone) is never completed either,
/// and S3 lifecycle rules (`AbortIncompleteMultipartUpload`) reclaim its parts.
async fn abort_all(uploads: Vec<Box<dyn MultipartUpload>>) {
    for mut upload in uploads {
        let _ = upload.abort().await;
    }
}

impl Drop for PendingWrite {
    /// A write dropped without commit (a cancelled statement) is aborted in the background.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.store.end(&self.state);
        let uploads = self.state.take();
        if !uploads.is_empty()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(abort_all(uploads));
        }
    }
}

/// A multipart upload whose completion is handed to its write instead of sent.
#[derive(Debug)]
struct DeferredUpload {
    upload: Option<Box<dyn MultipartUpload>>,
    state: Arc<WriteState>,
}

fn finished_upload() -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: "a part was written after the upload was completed".into(),
    }
}

#[async_trait]
impl MultipartUpload for DeferredUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        match self.upload.as_mut() {
            Some(upload) => upload.put_part(data),
            None => Box::pin(async { Err(finished_upload()) }),
        }
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let upload = self.upload.take().ok_or_else(finished_upload)?;
        self.state.hold(upload);
        Ok(PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        match self.upload.take() {
            Some(mut upload) => upload.abort().await,
            None => Ok(()),
        }
    }
}

impl fmt::Display for CommitStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl ObjectStore for CommitStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let Some(state) = self.deferring(location) else {
            return self.inner.put_opts(location, payload, opts).await;
        };
        // A small file is one put; as a one-part upload it can wait for the commit too.
        let options = PutMultipartOptions {
            tags: opts.tags,
            attributes: opts.attributes,
            ..Default::default()
        };
        let mut upload = self.inner.put_multipart_opts(location, options).await?;
        if let Err(e) = upload.put_part(payload).await {
            let _ = upload.abort().await;
            return Err(e);
        }
        state.hold(upload);
        Ok(PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(match self.deferring(location) {
            Some(state) => Box::new(DeferredUpload {
                upload: Some(upload),
                state,
            }),
            None => upload,
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
