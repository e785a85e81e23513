//! A multipart upload under a pending write's prefix: its completion handed to the write
//! instead of sent (S3), or its parts written to a hidden file renamed at the commit (local).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{MultipartUpload, PutPayload, PutResult, UploadPart};

use super::commit::WriteState;
use super::fill::Tail;

/// A multipart upload whose completion is handed to its write instead of sent (S3), or which is
/// written to a hidden file renamed at the write's commit (local).
#[derive(Debug)]
pub(super) struct DeferredUpload {
    upload: Option<Box<dyn MultipartUpload>>,
    state: Arc<WriteState>,
    /// Local files: where the upload goes (hidden) and the target it is renamed to at commit.
    staged: Option<(Path, Path)>,
    /// Uploads of a write filled at commit: the end held back ([`super::fill`]).
    tail: Option<Tail>,
}

impl DeferredUpload {
    pub(super) fn new(
        upload: Box<dyn MultipartUpload>,
        state: Arc<WriteState>,
        staged: Option<(Path, Path)>,
    ) -> Self {
        state.opened();
        // A local file is filled in place at commit; an upload holds back its end.
        let tail = match staged {
            Some(_) => None,
            None => state.tail(),
        };
        DeferredUpload {
            upload: Some(upload),
            state,
            staged,
            tail,
        }
    }
}

impl Drop for DeferredUpload {
    /// Dropped neither completed nor aborted (its writer was cancelled): the write aborts it.
    fn drop(&mut self) {
        if let Some(upload) = self.upload.take() {
            self.state.held.lock().abandoned.push(upload);
            self.state.closed();
        }
    }
}

/// A payload's bytes in one piece.
pub(super) fn data_bytes(payload: &PutPayload) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(payload.content_length());
    for chunk in payload.iter() {
        bytes.extend_from_slice(chunk);
    }
    bytes
}

pub(super) fn spill_failed(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "batchinfer",
        source: format!(
            "the end of an upload, held until the statement commits, could not be kept in the \
             temporary folder {}: {e}",
            std::env::temp_dir().display()
        )
        .into(),
    }
}

pub(super) fn finished_upload() -> object_store::Error {
    object_store::Error::Generic {
        store: "batchinfer",
        source: "a part was written after the upload was completed".into(),
    }
}

#[async_trait]
impl MultipartUpload for DeferredUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let Some(upload) = self.upload.as_mut() else {
            return Box::pin(async { Err(finished_upload()) });
        };
        let part = match self.tail.as_mut() {
            Some(tail) => {
                let parts: Vec<UploadPart> = tail
                    .push(&data_bytes(&data))
                    .into_iter()
                    .map(|part| upload.put_part(PutPayload::from(part)))
                    .collect();
                Box::pin(async move {
                    futures::future::try_join_all(parts).await?;
                    Ok(())
                })
            }
            None => upload.put_part(data),
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return part;
        };
        // On a task of its own, which a dropped writer does not cancel: the write waits for it
        // before it aborts the upload (see WriteState::parts).
        let state = self.state.clone();
        state.parts.fetch_add(1, Ordering::SeqCst);
        let sent = runtime.spawn(async move {
            let sent = part.await;
            state.parts.fetch_sub(1, Ordering::SeqCst);
            state.closed.notify_waiters();
            sent
        });
        Box::pin(async move {
            sent.await.map_err(|e| object_store::Error::Generic {
                store: "batchinfer",
                source: Box::new(e),
            })?
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let mut upload = self.upload.take().ok_or_else(finished_upload)?;
        let completed = match self.staged.take() {
            Some((hidden, target)) => {
                // The hidden file is complete; the rename to the target waits for the commit.
                let written = upload.complete().await;
                if written.is_ok() {
                    self.state.stage(hidden, target);
                }
                written.map(|_| ())
            }
            None => {
                let mut tail = self.tail.take();
                match tail.as_mut().map(Tail::spill).transpose() {
                    Ok(_) => {
                        self.state.hold(upload, tail);
                        Ok(())
                    }
                    Err(e) => {
                        let _ = upload.abort().await;
                        Err(spill_failed(e))
                    }
                }
            }
        };
        self.state.closed();
        completed.map(|()| PutResult {
            e_tag: None,
            version: None,
        })
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        match self.upload.take() {
            Some(mut upload) => {
                let aborted = upload.abort().await;
                self.state.closed();
                aborted
            }
            None => Ok(()),
        }
    }
}
