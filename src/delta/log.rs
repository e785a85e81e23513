//! A table's log: its store, the table opened and loaded at the version asked for, and its
//! newest commit.

use super::*;

/// The log store of the Delta table at `url` (a folder URL) in `store` (the store of its scheme
/// and host: the table's paths are the URL's).
pub(crate) fn log_store(
    url: &Url,
    store: Arc<dyn ObjectStore>,
) -> std::result::Result<LogStoreRef, DeltaTableError> {
    let config = StorageConfig::default();
    let prefixed = Arc::from(config.decorate_store(store.clone(), url)?);
    Ok(default_logstore(prefixed, store, url, &config))
}

/// The table at `url` (a folder URL) in `store` (the store of its scheme and host), loaded at
/// `at`.
pub async fn open(
    url: &Url,
    store: Arc<dyn ObjectStore>,
    at: &At,
) -> std::result::Result<DeltaTable, DeltaTableError> {
    let mut table = DeltaTable::new(log_store(url, store)?);
    load_at(&mut table, at).await?;
    Ok(table)
}

/// Loads `table` at `at`: a version past the newest is named as such, a time before the first
/// commit refused.
pub(super) async fn load_at(
    table: &mut DeltaTable,
    at: &At,
) -> std::result::Result<(), DeltaTableError> {
    match at {
        At::Newest => table.load().await,
        At::Version(version) if *version > newest(table).await? => {
            Err(DeltaTableError::InvalidVersion(*version))
        }
        At::Version(version) => match table.load_version(*version).await {
            // The kernel's own word is about log segments.
            Err(e)
                if e.to_string()
                    .contains("not the same as the specified end version") =>
            {
                Err(DeltaTableError::InvalidVersion(*version))
            }
            loaded => loaded,
        },
        At::Time(time) => {
            table.load_with_datetime(*time).await?;
            committed_by(table, *time).await
        }
    }
}

/// The newest version of the table of `table`'s log (delta-rs looks for a version past it one
/// by one).
pub(super) async fn newest(table: &DeltaTable) -> std::result::Result<Version, DeltaTableError> {
    let store = table.log_store().object_store(None);
    let log = object_store::path::Path::from("_delta_log");
    let newest = newest_commit(store.as_ref(), &log).await?;
    Ok(newest.map(|(version, _)| version).unwrap_or(0))
}

/// The newest commit file of the log at `log` (a `_delta_log` folder) in `store`: its version
/// and what was listed of it. None where it has none.
pub async fn newest_commit(
    store: &dyn ObjectStore,
    log: &object_store::path::Path,
) -> object_store::Result<Option<(Version, object_store::ObjectMeta)>> {
    let listed = match store.list_with_delimiter(Some(log)).await {
        Ok(listed) => listed.objects,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(listed
        .into_iter()
        .filter_map(|object| {
            let version = object.location.filename()?.strip_suffix(".json")?;
            let digits = version.len() == 20 && version.bytes().all(|b| b.is_ascii_digit());
            Some((version.parse::<Version>().ok().filter(|_| digits)?, object))
        })
        .max_by_key(|(version, _)| *version))
}

/// Refuses a table loaded for `time` whose version was committed after it: no version existed
/// then (delta-rs reads its first version for any earlier time).
pub(super) async fn committed_by(
    table: &DeltaTable,
    time: DateTime<Utc>,
) -> std::result::Result<(), DeltaTableError> {
    let Some(version) = table.version() else {
        return Ok(());
    };
    let commit = object_store::path::Path::from(format!("_delta_log/{version:020}.json"));
    // A commit whose file a checkpoint replaced has no time to compare; delta-rs chose it.
    let Ok(meta) = table.log_store().object_store(None).head(&commit).await else {
        return Ok(());
    };
    if meta.last_modified > time {
        return Err(DeltaTableError::Generic(format!(
            "no version existed at {time}: version {version}, the oldest, was committed at {}",
            meta.last_modified
        )));
    }
    Ok(())
}
