//! How a [`CommitStore`]'s writes wait for their commit: its object store methods, and the
//! uploads it hands out for files under a pending write's prefix.

use std::fmt;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};

use super::commit::{CommitKind, CommitStore, hidden_sibling};
use super::deferred_upload::{DeferredUpload, data_bytes, spill_failed};
use super::fill::Tail;

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
        self.writes_allowed(location)?;
        let Some(state) = self.deferring(location) else {
            return self.inner.put_opts(location, payload, opts).await;
        };
        if let CommitKind::StageAndRename(_) = self.kind {
            let hidden = hidden_sibling(location);
            self.inner.put_opts(&hidden, payload, opts).await?;
            state.stage(hidden, location.clone());
            return Ok(PutResult {
                e_tag: None,
                version: None,
            });
        }
        // A small file is one put; as a one-part upload it can wait for the commit too.
        let options = PutMultipartOptions {
            tags: opts.tags,
            attributes: opts.attributes,
            ..Default::default()
        };
        let mut upload = self.inner.put_multipart_opts(location, options).await?;
        let mut tail = state.tail();
        let parts: Vec<PutPayload> = match tail.as_mut() {
            Some(tail) => tail
                .push(&data_bytes(&payload))
                .into_iter()
                .map(PutPayload::from)
                .collect(),
            None => vec![payload],
        };
        for part in parts {
            if let Err(e) = upload.put_part(part).await {
                let _ = upload.abort().await;
                return Err(e);
            }
        }
        if let Some(Err(e)) = tail.as_mut().map(Tail::spill) {
            let _ = upload.abort().await;
            return Err(spill_failed(e));
        }
        state.hold(upload, tail);
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
        self.writes_allowed(location)?;
        let Some(state) = self.deferring(location) else {
            return self.inner.put_multipart_opts(location, opts).await;
        };
        let staged = match self.kind {
            CommitKind::StageAndRename(_) => Some((hidden_sibling(location), location.clone())),
            CommitKind::HoldUploads | CommitKind::ReadOnly(_) => None,
        };
        let write_to = staged.as_ref().map_or(location, |(hidden, _)| hidden);
        let upload = self.inner.put_multipart_opts(write_to, opts).await?;
        Ok(Box::new(DeferredUpload::new(upload, state, staged)))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        // A FIFO would block the read until someone writes to it, a device never ends.
        if let CommitKind::StageAndRename(fs) = &self.kind {
            let path = fs.path_to_filesystem(location)?;
            if let Ok(meta) = std::fs::metadata(&path)
                && !meta.is_file()
                && !meta.is_dir()
            {
                return Err(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: format!(
                        "{} is not a regular file (a FIFO, a device, or a link to one): \
                         batchinfer reads regular files",
                        path.display()
                    )
                    .into(),
                });
            }
        }
        let asked = match &options.range {
            Some(object_store::GetRange::Bounded(range)) => Some(range.clone()),
            _ => None,
        };
        let result = self
            .inner
            .get_opts(location, options)
            .await
            .map_err(|e| self.cut_short(e, location, asked.as_ref()))?;
        // A local range is read here, so that a file cut short meanwhile is said as such, not
        // as the local store's "Requested range was invalid" or "expected: 6, actual: 6".
        let result = match (&self.kind, &asked) {
            (CommitKind::StageAndRename(_), Some(_)) => {
                let (meta, range, attributes) = (
                    result.meta.clone(),
                    result.range.clone(),
                    result.attributes.clone(),
                );
                let bytes = result
                    .bytes()
                    .await
                    .map_err(|e| self.cut_short(e, location, Some(&range)))?;
                GetResult {
                    payload: object_store::GetResultPayload::Stream(Box::pin(
                        futures::stream::once(async move { Ok(bytes) }),
                    )),
                    meta,
                    range,
                    attributes,
                }
            }
            _ => result,
        };
        // A store gives what is there of a range: an object that shrank since its size was
        // read (replaced between two requests) would hand a reader fewer bytes than it asked
        // for, which parquet's decoder takes for a bug of its own (a panic).
        if let Some(asked) = asked
            && result.range != asked
        {
            return Err(changed_while_read(
                &self.shown(location),
                &asked,
                result.meta.size,
            ));
        }
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        object_store::coalesce_ranges(
            ranges,
            |range| async move {
                let options = GetOptions::new().with_range(Some(range.clone()));
                let result = self.get_opts(location, options).await?;
                let size = result.meta.size;
                let bytes = result.bytes().await?;
                if bytes.len() as u64 != range.end - range.start {
                    return Err(changed_while_read(&self.shown(location), &range, size));
                }
                // The end of a Parquet file, as a reader fetches it to find the metadata: the
                // length it claims is checked against the file before a decoder trusts it (and
                // against the session's cap by the session's stores, `SessionStores`).
                if range.end == size && super::footer::is_parquet_tail(&bytes) {
                    let mut tail = [0u8; 8];
                    tail.copy_from_slice(&bytes[bytes.len() - 8..]);
                    super::footer::metadata_len(&self.shown(location), size, tail, u64::MAX)
                        .map_err(|message| object_store::Error::Generic {
                            store: "batchinfer",
                            source: Box::new(super::unreadable::Unreadable(message.to_string())),
                        })?;
                }
                Ok(bytes)
            },
            object_store::OBJECT_STORE_COALESCE_DEFAULT,
        )
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        if let CommitKind::ReadOnly(store) = self.kind {
            use futures::StreamExt;
            return locations
                .map(move |location| Err(read_only_store(store, &location?)))
                .boxed();
        }
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
        self.writes_allowed(to)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.writes_allowed(to)?;
        self.inner.rename_opts(from, to, options).await
    }
}

impl CommitStore {
    /// `error`, a local read of `asked` of `location`, said as "changed while it was read" where
    /// the file was cut short since its size was taken (object_store says "Requested range was
    /// invalid" or "Out of range of file ..., expected: .., actual: ..").
    fn cut_short(
        &self,
        error: object_store::Error,
        location: &Path,
        asked: Option<&std::ops::Range<u64>>,
    ) -> object_store::Error {
        let CommitKind::StageAndRename(fs) = &self.kind else {
            return error;
        };
        let text = error.to_string();
        if !text.contains("Requested range was invalid") && !text.contains("Out of range of file") {
            return error;
        }
        let size = fs
            .path_to_filesystem(location)
            .ok()
            .and_then(|path| std::fs::metadata(path).ok())
            .map(|meta| meta.len());
        match (asked, size) {
            (Some(asked), Some(size)) => changed_while_read(&self.shown(location), asked, size),
            _ => object_store::Error::Generic {
                store: "batchinfer",
                source: format!(
                    "{} changed while it was read: it is shorter than when it was listed, or gone",
                    self.shown(location)
                )
                .into(),
            },
        }
    }

    /// Where `location` is, as a person reads it: a local file's path, else the object's key.
    fn shown(&self, location: &Path) -> String {
        match &self.kind {
            CommitKind::StageAndRename(fs) => fs
                .path_to_filesystem(location)
                .map_or_else(|_| location.to_string(), |p| p.display().to_string()),
            _ => location.to_string(),
        }
    }

    /// Refuses a write to a store batchinfer reads from only.
    fn writes_allowed(&self, location: &Path) -> object_store::Result<()> {
        match self.read_only() {
            Some(store) => Err(read_only_store(store, location)),
            None => Ok(()),
        }
    }
}

/// The error for an object that is not what it was when its size was read.
fn changed_while_read(
    location: &str,
    asked: &std::ops::Range<u64>,
    size: u64,
) -> object_store::Error {
    object_store::Error::Generic {
        store: "batchinfer",
        source: format!(
            "{location} changed while it was read: bytes {}..{} were asked for, and it now has \
             {size} bytes",
            asked.start, asked.end
        )
        .into(),
    }
}

fn read_only_store(store: &'static str, location: &Path) -> object_store::Error {
    object_store::Error::NotSupported {
        source: format!("'{location}' is on an {store} server, which batchinfer reads from only")
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    /// A local file cut short between its listing (its size) and the reads a Parquet reader
    /// makes of it: one message naming the file and what changed, never object_store's
    /// "Requested range was invalid" or "expected: 6, actual: 6".
    #[tokio::test]
    async fn a_local_file_cut_short_mid_read_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.parquet");
        std::fs::write(&file, vec![7u8; 100]).unwrap();
        let url = url::Url::from_directory_path(dir.path()).unwrap();
        let store = crate::storage::StoreRegistry::new()
            .commit_store(&url)
            .unwrap();
        let location =
            crate::storage::object_path(&url::Url::from_file_path(&file).unwrap()).unwrap();
        assert_eq!(store.get_range(&location, 90..100).await.unwrap().len(), 10);
        std::fs::write(&file, vec![7u8; 50]).unwrap();
        let shown = file.display().to_string();
        // Past its new end: object_store's "Requested range was invalid".
        let past = store
            .get_range(&location, 90..100)
            .await
            .unwrap_err()
            .to_string();
        // Across its new end: object_store's "Out of range of file ..., expected: .., actual: ..".
        let across = store
            .get_range(&location, 40..60)
            .await
            .unwrap_err()
            .to_string();
        let ranges = store
            .get_ranges(&location, &[0..10, 40..60])
            .await
            .unwrap_err()
            .to_string();
        for message in [past, across, ranges] {
            assert!(
                message.contains(&format!("{shown} changed while it was read"))
                    && message.contains("it now has 50 bytes")
                    && !message.contains("Requested range")
                    && !message.contains("expected:"),
                "{message}"
            );
        }
    }
}
