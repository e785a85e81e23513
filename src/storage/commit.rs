//! Deferred commits: the files a write makes become visible only once the whole write has
//! succeeded. Every store of an engine is wrapped in a [`CommitStore`]; a statement that writes
//! (COPY, INSERT, CREATE TABLE in S3) begins a [`PendingWrite`] over its target, and each store
//! kind commits in its own way:
//!
//! - **S3** ([`CommitKind::HoldUploads`]) has no rename. Each object a write puts under its target
//!   is sent as a multipart upload whose completion is held back: the bytes are on the server, but
//!   no object exists until `CompleteMultipartUpload`. This is how Hadoop's S3A "magic" committer
//!   works. Outputs stream: parts are uploaded as they fill (DataFusion's 10 MiB buffers), so
//!   memory stays bounded whatever the size of the output.
//!   Google Cloud Storage's multipart uploads (its XML API) work the same way, and so does Azure
//!   Blob Storage: its blocks are uploaded, the block list that makes them a blob is held back.
//! - **Local files** ([`CommitKind::StageAndRename`]): each file is written to a hidden sibling
//!   (`.NAME.batchinfer-PID-N.partial`, which no listing of Parquet files picks up) and renamed
//!   over its target at commit: one atomic rename per file.
//!
//! When the statement succeeds, [`PendingWrite::commit`] completes or renames them all; when it
//! fails, is cancelled or the connection is lost, the uploads are aborted and the hidden files
//! removed (or, with the server gone, simply never completed): what was there before stays. The
//! window left is the commit itself, one request or rename per file after all the data is written.
//! The store's methods and the uploads it hands out are in `deferred.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt};
use parking_lot::Mutex;

use super::fill::{Fill, Tail, fill_local_file};
use crate::statement_context::{Ledger, StatementContext};

/// How a store makes a write's files visible at commit.
#[derive(Debug)]
pub enum CommitKind {
    /// Multipart uploads whose completion is held back (S3).
    HoldUploads,
    /// Hidden sibling files renamed over their targets (local files).
    StageAndRename(Arc<LocalFileSystem>),
    /// No writes: a store batchinfer reads from only (an HTTP server), named.
    ReadOnly(&'static str),
}

/// An object store whose writes under a [`PendingWrite`]'s prefix wait for its commit.
#[derive(Debug)]
pub struct CommitStore {
    pub(super) inner: Arc<dyn ObjectStore>,
    pub(super) kind: CommitKind,
    writes: Mutex<Vec<Arc<WriteState>>>,
}

/// What one write holds back until it commits.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Completed uploads waiting for `CompleteMultipartUpload` (S3), with the end of each held
    /// back to be filled ([`super::fill`]).
    pub(super) uploads: Vec<(Box<dyn MultipartUpload>, Option<Tail>)>,
    /// Hidden files written in full, and the target each is renamed to (local).
    pub(super) staged: Vec<(Path, Path)>,
    /// Uploads dropped before they were completed (their writer was cancelled): to abort.
    pub(super) abandoned: Vec<Box<dyn MultipartUpload>>,
}

/// The files of one write, held back until it commits.
#[derive(Debug)]
pub(super) struct WriteState {
    pub(super) prefix: Path,
    pub(super) held: Mutex<Held>,
    /// Uploads begun and not yet completed, aborted or dropped.
    pub(super) open: std::sync::atomic::AtomicUsize,
    /// Parts being sent. They run to their end even when the writer that sent them is dropped:
    /// a part that reached the server after its upload was aborted would stay there.
    pub(super) parts: std::sync::atomic::AtomicUsize,
    /// Told whenever an upload stops being open.
    pub(super) closed: tokio::sync::Notify,
    /// A local folder the write made: removed again if the write is discarded.
    pub(super) made_folder: Option<std::path::PathBuf>,
    /// What its files are filled with at commit, if anything ([`super::fill`]).
    pub(super) fill: Mutex<Option<Arc<Fill>>>,
}

impl WriteState {
    pub(super) fn take(&self) -> Held {
        std::mem::take(&mut *self.held.lock())
    }

    pub(super) fn hold(&self, upload: Box<dyn MultipartUpload>, tail: Option<Tail>) {
        self.held.lock().uploads.push((upload, tail));
    }

    /// The placeholder of the write's fill, if it has one: an upload holds back its end from
    /// it.
    pub(super) fn tail(&self) -> Option<Tail> {
        let fill = self.fill.lock();
        fill.as_ref().map(|f| Tail::new(f.placeholder()))
    }

    pub(super) fn stage(&self, hidden: Path, target: Path) {
        self.held.lock().staged.push((hidden, target));
    }

    pub(super) fn opened(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
        self.closed.notify_waiters();
    }

    /// Waits until no upload of the write is open (a cancelled writer's task is dropped a moment
    /// after the statement) and no part is being sent, at most [`SETTLE`].
    pub(super) async fn settled(&self) {
        let _ = tokio::time::timeout(SETTLE, async {
            loop {
                let notified = self.closed.notified();
                if self.open.load(Ordering::SeqCst) == 0 && self.parts.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }
}

/// The longest a discarded write waits for its cancelled writers to let go of their uploads.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// A write in progress: its files appear on [`PendingWrite::commit`], or never.
#[derive(Debug)]
pub struct PendingWrite {
    store: Arc<CommitStore>,
    state: Arc<WriteState>,
    finished: bool,
}

/// Per process: a counter for unique names.
static HIDDEN: AtomicU64 = AtomicU64::new(0);

/// The hidden sibling a local file is written to before its commit: a name no listing of
/// `*.parquet` picks up, unique to this process and write.
pub(super) fn hidden_sibling(target: &Path) -> Path {
    // On the path as it is encoded: its parts stay as they are, none encoded twice.
    let (folder, name) = match target.as_ref().rsplit_once('/') {
        Some((folder, name)) => (format!("{folder}/"), name),
        None => (String::new(), target.as_ref()),
    };
    // The start of a long name: the hidden name must fit the 255 bytes a file name may have.
    let mut end = name.len().min(150);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let mut name = &name[..end];
    // Nor an escape (`%2F`) cut in two.
    let from = name.len().saturating_sub(2);
    if let Some(at) = name.as_bytes()[from..].iter().position(|b| *b == b'%') {
        name = &name[..from + at];
    }
    let hidden = format!(
        "{folder}.{name}.batchinfer-{}-{}.partial",
        std::process::id(),
        HIDDEN.fetch_add(1, Ordering::Relaxed)
    );
    Path::parse(&hidden).unwrap_or_else(|_| Path::from(hidden))
}

impl CommitStore {
    pub fn new(inner: Arc<dyn ObjectStore>, kind: CommitKind) -> Self {
        CommitStore {
            inner,
            kind,
            writes: Mutex::new(Vec::new()),
        }
    }

    /// The local file system, committing by rename.
    pub fn local() -> Self {
        let local = Arc::new(LocalFileSystem::new());
        Self::new(local.clone(), CommitKind::StageAndRename(local))
    }

    /// The name of the store, where batchinfer only reads from it (an HTTP server).
    pub fn read_only(&self) -> Option<&'static str> {
        match self.kind {
            CommitKind::ReadOnly(name) => Some(name),
            _ => None,
        }
    }

    /// Whether a write on this store has begun and not ended.
    pub fn has_pending_writes(&self) -> bool {
        !self.writes.lock().is_empty()
    }

    /// The store underneath, whose writes are immediate.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// Holds back every file written under `prefix` (a folder, or one file) until the returned
    /// write is committed.
    pub fn begin(self: &Arc<Self>, prefix: Path) -> PendingWrite {
        let made_folder = match &self.kind {
            CommitKind::StageAndRename(local) => local
                .path_to_filesystem(&prefix)
                .ok()
                .and_then(|path| first_missing(&path)),
            _ => None,
        };
        let state = Arc::new(WriteState {
            prefix,
            held: Mutex::new(Held::default()),
            open: std::sync::atomic::AtomicUsize::new(0),
            parts: std::sync::atomic::AtomicUsize::new(0),
            closed: tokio::sync::Notify::new(),
            made_folder,
            fill: Mutex::new(None),
        });
        self.writes.lock().push(state.clone());
        PendingWrite {
            store: self.clone(),
            state,
            finished: false,
        }
    }

    /// The pending write a file at `location` belongs to: the one of the longest prefix, where
    /// two writes' targets nest.
    pub(super) fn deferring(&self, location: &Path) -> Option<Arc<WriteState>> {
        self.writes
            .lock()
            .iter()
            .filter(|w| location.prefix_matches(&w.prefix))
            .max_by_key(|w| w.prefix.as_ref().len())
            .cloned()
    }

    fn end(&self, state: &Arc<WriteState>) {
        self.writes.lock().retain(|w| !Arc::ptr_eq(w, state));
    }

    /// Discards what a write held: uploads aborted (those its cancelled writers let go of
    /// too), hidden files and a folder it made removed.
    async fn discard(&self, state: &WriteState) {
        state.settled().await;
        let held = state.take();
        abort_all(held.uploads.into_iter().map(|(upload, _)| upload).collect()).await;
        abort_all(held.abandoned).await;
        for (hidden, _) in held.staged {
            let _ = self.inner.delete(&hidden).await;
        }
        if let Some(folder) = &state.made_folder {
            remove_empty_folders(folder);
        }
    }
}

impl PendingWrite {
    /// Fills the write's files at commit: each holds `fill`'s placeholder, overwritten then
    /// ([`super::fill`]). Set before anything is written.
    pub fn fill_at_commit(&self, fill: Fill) {
        *self.state.fill.lock() = Some(Arc::new(fill));
    }

    /// Makes every file of the write visible; how many there are. Should a completion or a
    /// rename fail, the files not yet made visible are discarded and the error returned.
    pub async fn commit(mut self) -> object_store::Result<usize> {
        self.finished = true;
        self.store.end(&self.state);
        let Held {
            mut uploads,
            mut staged,
            abandoned,
        } = self.state.take();
        // None once the statement succeeded; any there would be parts of nothing.
        abort_all(abandoned).await;
        let fill = self.state.fill.lock().clone();
        let filled = fill.as_ref().and_then(|f| f.padded());
        let count = uploads.len() + staged.len();
        // Every held end is sent before any upload is completed: one that fails leaves none.
        if let Err(e) = send_tails(&mut uploads, filled.as_deref()).await {
            abort_all(uploads.into_iter().map(|(upload, _)| upload).collect()).await;
            return Err(e);
        }
        while let Some((mut upload, _)) = uploads.pop() {
            if let Err(e) = upload.complete().await {
                let _ = upload.abort().await;
                abort_all(uploads.into_iter().map(|(upload, _)| upload).collect()).await;
                return Err(e);
            }
        }
        // Every local file is filled before any is renamed.
        if let (Some(fill), Some(value), CommitKind::StageAndRename(local)) =
            (&fill, &filled, &self.store.kind)
        {
            for (hidden, _) in &staged {
                let done = local.path_to_filesystem(hidden).and_then(|path| {
                    fill_local_file(&path, &fill.placeholder(), value).map_err(|e| {
                        object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source: Box::new(e),
                        }
                    })
                });
                if let Err(e) = done {
                    for (hidden, _) in staged {
                        let _ = self.store.inner.delete(&hidden).await;
                    }
                    return Err(e);
                }
            }
        }
        while let Some((hidden, target)) = staged.pop() {
            if let Err(e) = self.store.inner.rename(&hidden, &target).await {
                let _ = self.store.inner.delete(&hidden).await;
                for (hidden, _) in staged {
                    let _ = self.store.inner.delete(&hidden).await;
                }
                return Err(e);
            }
        }
        Ok(count)
    }

    /// Discards the write: no file of it will appear.
    pub async fn abort(mut self) {
        self.finished = true;
        self.store.end(&self.state);
        self.store.discard(&self.state).await;
    }
}

/// Sends the ends uploads held back, filled with `value` ([`super::fill`]), a few uploads at a
/// time, each one's parts in order.
async fn send_tails(
    uploads: &mut [(Box<dyn MultipartUpload>, Option<Tail>)],
    value: Option<&[u8]>,
) -> object_store::Result<()> {
    use futures::StreamExt;
    let mut sends: Vec<futures::future::BoxFuture<'_, object_store::Result<()>>> = Vec::new();
    for (upload, tail) in uploads.iter_mut() {
        let Some(tail) = tail.take() else {
            continue;
        };
        // Read back (from disk) only when its turn comes.
        sends.push(Box::pin(async move {
            let parts = tail
                .finish(value)
                .map_err(|e| object_store::Error::Generic {
                    store: "batchinfer",
                    source: Box::new(e),
                })?;
            let sent: Vec<_> = parts
                .into_iter()
                .map(|part| upload.put_part(part.into()))
                .collect();
            futures::future::try_join_all(sent).await.map(|_| ())
        }));
    }
    let mut sends = futures::stream::iter(sends).buffer_unordered(TAILS_AT_ONCE);
    while let Some(sent) = sends.next().await {
        sent?;
    }
    Ok(())
}

/// Uploads whose ends are sent at once at commit.
const TAILS_AT_ONCE: usize = 8;

/// The outermost of `path` and its folders that does not exist yet: what a write to `path` may
/// create.
fn first_missing(path: &std::path::Path) -> Option<std::path::PathBuf> {
    let mut missing = None;
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| !p.exists()) {
        missing = Some(p.to_path_buf());
        at = p.parent();
    }
    missing
}

/// Removes `folder` and the folders under it that hold no file (a discarded write made them;
/// anything with a file in it was put there by someone else and stays).
fn remove_empty_folders(folder: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(folder) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_folders(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(folder);
}

/// Best effort: an upload that cannot be aborted (the server is gone) is never completed either,
/// and S3 lifecycle rules (`AbortIncompleteMultipartUpload`) reclaim its parts.
async fn abort_all(uploads: Vec<Box<dyn MultipartUpload>>) {
    for mut upload in uploads {
        let _ = upload.abort().await;
    }
}

/// Discards of writes dropped without commit, running in the background.
/// Per process: a process about to exit waits for every one of them.
static DISCARDS: Mutex<Vec<tokio::task::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits for the writes dropped so far (cancelled statements) to be discarded: a process about to
/// exit after a cancellation calls this, so that it leaves no upload open and no hidden file.
pub async fn discards_done() {
    let pending = std::mem::take(&mut *DISCARDS.lock());
    for discard in pending {
        let _ = discard.await;
    }
}

/// The writes of one statement that committed although it was cancelled (the cancellation came
/// after the word to commit): what its cancellation then says was kept. Kept in the statement's
/// own ledger: another statement's, of this session or another, is never said.
#[derive(Default)]
struct KeptDespiteCancel(parking_lot::Mutex<Vec<String>>);

/// Records that `what` was committed by the statement whose ledger is `ledger`, being
/// cancelled.
pub fn kept_despite_cancel(ledger: &Ledger, what: String) {
    ledger.get::<KeptDespiteCancel>().0.lock().push(what);
}

/// What `statement`, cancelled, committed all the same (after [`discards_done`]).
pub fn take_kept_despite_cancel(statement: &StatementContext) -> Vec<String> {
    std::mem::take(&mut *statement.ledger.get::<KeptDespiteCancel>().0.lock())
}

/// Runs `discard` (undoing a write dropped without commit) in the background, for
/// [`discards_done`] to wait for; with no runtime left, nothing can wait for it.
pub fn discard_in_background(discard: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        let discard = handle.spawn(discard);
        let mut discards = DISCARDS.lock();
        discards.retain(|d| !d.is_finished());
        discards.push(discard);
    }
}

impl Drop for PendingWrite {
    /// A write dropped without commit (a cancelled statement) is discarded in the background
    /// ([`discards_done`] waits for it).
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.store.end(&self.state);
        let (store, state) = (self.store.clone(), self.state.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(_) => discard_in_background(async move { store.discard(&state).await }),
            Err(_) => {
                // No runtime left to abort uploads on; local files can still go.
                for (hidden, _) in state.take().staged {
                    if let CommitKind::StageAndRename(local) = &store.kind
                        && let Ok(path) = local.path_to_filesystem(&hidden)
                    {
                        let _ = std::fs::remove_file(path);
                    }
                }
            }
        }
    }
}
