//! A version's scan, once every file it names is known to be the table's own and readable.

use super::*;

/// The scan of `table` as loaded, once every file its version names is known to be its own: a
/// path relative to its folder (no `..`, no absolute path or URL, which would read files of
/// another folder, store or host), and no deletion vector (not read yet); and a column mapping
/// batchinfer knows.
pub(super) async fn checked_scan(
    table: &DeltaTable,
    name: &str,
    location: &str,
    pinned: Option<Version>,
) -> Result<DeltaScan> {
    let refuse = |problem: String| {
        Error::table(
            name,
            format!("Delta table '{name}' at {location}: {problem}"),
        )
    };
    let state = table
        .snapshot()
        .map_err(|e| delta_error(name, location, e))?;
    let mapping = state
        .metadata()
        .configuration()
        .get("delta.columnMapping.mode");
    if let Some(mode) = mapping.filter(|m| !["none", "name", "id"].contains(&m.as_str())) {
        return Err(refuse(format!(
            "its column mapping mode is {mode:?}; Delta's modes are 'none', 'name' and 'id'"
        )));
    }
    let log_store = table.log_store();
    let mut named = Vec::new();
    let mut files = state.snapshot().file_views(log_store.as_ref(), None);
    while let Some(file) = files
        .try_next()
        .await
        .map_err(|e| delta_error(name, location, e))?
    {
        let path = file.path();
        if !is_own_file(&path) {
            return Err(refuse(format!(
                "its log names the file {path:?}, which is not in the table's folder; \
                 batchinfer reads a Delta table's own files only"
            )));
        }
        // delta-rs panics on a vector of a kind it does not know: refused as one, too.
        let vector = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            file.deletion_vector_descriptor().is_some()
        }));
        if vector.unwrap_or_else(|panic| {
            let _ = crate::error::panic_message(panic.as_ref());
            true
        }) {
            return Err(refuse(format!(
                "its file {path:?} has a deletion vector, which batchinfer does not read yet \
                 (rewrite the table without them: OPTIMIZE or REORG ... APPLY (PURGE) in Spark)"
            )));
        }
        if pinned.is_some() {
            named.push(path.to_string());
        }
    }
    if let Some(version) = pinned
        && let Some(missing) = first_missing(&log_store, &named).await
    {
        return Err(refuse(format!(
            "version {version} can no longer be read: its file {missing:?} is gone (VACUUM \
                 deletes the files of versions older than its retention); read a newer version"
        )));
    }
    Ok(TableProviderBuilder::default()
        .with_log_store(log_store)
        .with_eager_snapshot(state.snapshot().clone())
        .build()
        .await?)
}

/// The first file of `paths` (a version's, as its log names them) found missing, None where
/// all are there. An old version's counts come from its log alone, so a version VACUUM emptied
/// would answer `count(*)` without a file read.
pub(super) async fn first_missing(log_store: &LogStoreRef, paths: &[String]) -> Option<String> {
    use futures::StreamExt;
    let store = log_store.object_store(None);
    let mut heads = futures::stream::iter(paths.iter().cloned())
        .map(|path| {
            let store = store.clone();
            async move {
                let found = store
                    .head(&object_store::path::Path::from(path.as_str()))
                    .await;
                (path, found)
            }
        })
        .buffer_unordered(16);
    while let Some((path, found)) = heads.next().await {
        if let Err(object_store::Error::NotFound { .. }) = found {
            return Some(path);
        }
    }
    None
}

/// Whether a data file's path (as the log names it, URL-decoded) is a file of the table's own
/// folder: relative, with no `.` or `..` part, no backslash, and no URL scheme.
pub(super) fn is_own_file(path: &str) -> bool {
    // A URL parser (which delta-rs resolves paths with) drops tabs and newlines, trims spaces and
    // control characters, reads `\\` as `/`, `|` as a drive's `:`, and ends a path at `?`, `#`.
    !path.is_empty()
        && !path
            .chars()
            .any(|c| c.is_control() || matches!(c, '\\' | '|' | '?' | '#'))
        && Url::parse(path).is_err()
        && path
            .split('/')
            .all(|part| !part.is_empty() && part.trim() == part && part != "." && part != "..")
}
