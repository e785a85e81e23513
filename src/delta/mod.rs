//! Delta Lake tables, read through delta-rs (`deltalake-core`) over batchinfer's own stores:
//!
//! ```sql
//! CREATE EXTERNAL TABLE customers STORED AS DELTATABLE LOCATION 'data/sample/customers_delta/';
//! CREATE EXTERNAL TABLE customers_v0 STORED AS DELTATABLE LOCATION 'data/sample/customers_delta/'
//! OPTIONS ('version' '0');
//! ```
//!
//! A table reads the version its `_delta_log` holds when a query is planned: each query plans
//! over the newest commit, and reads that one to its end whatever is committed meanwhile (its
//! files are those of the version it planned). `OPTIONS ('version' 'N')` or `('timestamp'
//! 'RFC 3339')` pins one version instead (time travel). The table's columns are those of the
//! version read at CREATE; a query over a later version whose columns changed is refused.
//!
//! The log and the data files are read through the store of the location (local, S3, Google
//! Cloud Storage, Azure, HTTP), with the settings and credentials of every other path.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::TableType;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::{CreateExternalTable, Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use deltalake_core::delta_datafusion::{DeltaScanNext as DeltaScan, TableProviderBuilder};
use deltalake_core::kernel::Version;
use deltalake_core::logstore::{LogStoreRef, StorageConfig, default_logstore};
use deltalake_core::{DeltaTable, DeltaTableError};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{blank_passwords, folder_location, local_path};

pub mod maintenance;
pub mod write;

/// The names `STORED AS` gives a Delta table.
pub const STORED_AS: [&str; 2] = ["DELTATABLE", "DELTA"];

/// Which version of a table a definition reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum At {
    /// The newest, as each query is planned.
    Newest,
    /// Version N (`OPTIONS ('version' 'N')`).
    Version(Version),
    /// The version current at a time (`OPTIONS ('timestamp' '2026-12-01T10:00:00Z')`).
    Time(chrono::DateTime<chrono::Utc>),
}

impl At {
    /// The version the `OPTIONS` of table `name` ask for; an option Delta tables do not take is
    /// refused, naming it.
    pub fn from_options(name: &str, options: &BTreeMap<String, String>) -> Result<At> {
        let mut at = At::Newest;
        for (key, value) in options {
            let setting =
                |problem: String| Error::setting(key, format!("table '{name}': {problem}"));
            match key.as_str() {
                "version" if at != At::Newest => {
                    return Err(setting("give 'version' or 'timestamp', not both".into()));
                }
                "version" => {
                    let version = value.trim().parse::<Version>().map_err(|_| {
                        setting(format!(
                            "'version' is {value:?}; expected a version number (0, 1, ...)"
                        ))
                    })?;
                    at = At::Version(version);
                }
                "timestamp" if at != At::Newest => {
                    return Err(setting("give 'version' or 'timestamp', not both".into()));
                }
                "timestamp" => {
                    let time = chrono::DateTime::parse_from_rfc3339(value.trim()).map_err(|e| {
                        setting(format!(
                            "'timestamp' is {value:?} ({e}); expected a time as RFC 3339 \
                             ('2026-12-01T10:00:00Z')"
                        ))
                    })?;
                    at = At::Time(time.with_timezone(&chrono::Utc));
                }
                other => {
                    return Err(setting(format!(
                        "a Delta table takes the options 'version' and 'timestamp' (and a \
                         store's settings), not '{other}'"
                    )));
                }
            }
        }
        Ok(at)
    }
}

impl At {
    /// The table and version a name of time travel gives (`t@v3`, `t@2026-12-03T10:00:00Z`:
    /// [`crate::statements::time_travel`]); None for any other name.
    pub fn of_name(name: &str) -> Option<(&str, Result<At>)> {
        let (table, at) = name.split_once('@')?;
        // A path or URL with an `@` in it is not a table's version.
        crate::storage::check_name("table", table).ok()?;
        let parsed = match at.strip_prefix('v') {
            Some(version) if version.bytes().all(|b| b.is_ascii_digit()) => version
                .parse::<Version>()
                .map(At::Version)
                .map_err(|_| Error::table(table, format!("'{version}' is not a version number"))),
            _ => chrono::DateTime::parse_from_rfc3339(at.trim())
                .map(|time| At::Time(time.with_timezone(&chrono::Utc)))
                .map_err(|e| {
                    Error::table(
                        table,
                        format!(
                            "TIMESTAMP AS OF '{at}' ({e}): expected a time as RFC 3339 \
                             ('2026-12-01T10:00:00Z')"
                        ),
                    )
                }),
        };
        Some((table, parsed))
    }
}

/// `STORED AS DELTATABLE | DELTA`, among the session's table factories.
#[derive(Debug, Default)]
pub struct DeltaFactory;

#[async_trait]
impl TableProviderFactory for DeltaFactory {
    async fn create(
        &self,
        session: &dyn Session,
        create: &CreateExternalTable,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        Ok(Arc::new(DeltaTableProvider::create(session, create).await?))
    }
}

/// A Delta table as a table of the session (see the module's text).
#[derive(Debug)]
pub struct DeltaTableProvider {
    name: String,
    /// Where the table is, as a person gave it (passwords blanked).
    location: String,
    log_store: LogStoreRef,
    /// The version every query reads, where one is pinned.
    version: Option<Version>,
    /// The columns as queries see them: those of its scan, vectors restored
    /// ([`write::restored`]).
    schema: SchemaRef,
    /// The columns of its scan, as the version read at CREATE has them.
    scanned: SchemaRef,
    /// Whether it is a table of the warehouse (INSERT INTO appends to it).
    warehouse: bool,
    /// The version a warehouse table reads, as loaded: what an INSERT into it begins on.
    loaded: Option<DeltaTable>,
    /// The scan of the query planned last, by when its planning began: every reference to the
    /// table in one query (a self-join, a union) reads the one version the first loaded.
    /// Held while a scan loads, so that references planned at once wait for the one load.
    planned: tokio::sync::Mutex<Option<(DateTime<Utc>, Arc<DeltaScan>)>>,
}

impl DeltaTableProvider {
    async fn create(session: &dyn Session, create: &CreateExternalTable) -> Result<Self> {
        let name = create.name.to_string();
        let [given] = create.locations.as_slice() else {
            return Err(Error::table(
                &name,
                format!("table '{name}': a Delta table needs one LOCATION (its folder)"),
            ));
        };
        let location = blank_passwords(given);
        if local_path(given)?.is_some_and(|path| path.is_file()) {
            return Err(Error::table(
                &name,
                format!("Delta table '{name}': {location} is a file; a Delta table is a folder"),
            ));
        }
        if !create.table_partition_cols.is_empty() || !create.schema.fields().is_empty() {
            return Err(Error::table(
                &name,
                format!(
                    "table '{name}': a Delta table's columns and partitions are those of its \
                     log; declare none"
                ),
            ));
        }
        let options = delta_options(create);
        let at = At::from_options(&name, &options)?;
        let url = folder_location(given)?;
        let store = session
            .runtime_env()
            .object_store(ObjectStoreUrl::parse(&url[..url::Position::BeforePath])?)?;
        let table = open(&url, store, &at)
            .await
            .map_err(|e| delta_error(&name, &location, e))?;
        let version = match at {
            At::Newest => None,
            _ => table.version(),
        };
        Self::of(name, location, &table, version, false).await
    }

    /// The table `name` of a warehouse, at `url` (its folder) in `store`, at `version`: every
    /// query reads that version.
    pub async fn of_warehouse(
        name: &str,
        url: &Url,
        store: Arc<dyn ObjectStore>,
        version: Version,
    ) -> Result<Self> {
        let location = crate::storage::display_location(url);
        let table = open(url, store, &At::Version(version))
            .await
            .map_err(|e| delta_error(name, &location, e))?;
        Self::of(name.to_string(), location, &table, Some(version), true).await
    }

    /// The table `name` of a warehouse at `version` as a table of its files (a listing table over
    /// exactly the files that version names), for a cluster: Ballista sends a listing table's
    /// scan to its executors, not a Delta scan. A version whose rows are not all in its files
    /// (partition columns, column mapping) is refused: it is read in one process.
    pub async fn files_of_warehouse(
        name: &str,
        url: &Url,
        store: Arc<dyn ObjectStore>,
        version: Version,
    ) -> Result<Arc<dyn TableProvider>> {
        use datafusion::datasource::file_format::parquet::ParquetFormat;
        use datafusion::datasource::listing::{
            ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
        };
        let location = crate::storage::display_location(url);
        let table = open(url, store, &At::Version(version))
            .await
            .map_err(|e| delta_error(name, &location, e))?;
        let provider = Self::of(name.to_string(), location.clone(), &table, None, true).await?;
        let state = table
            .snapshot()
            .map_err(|e| delta_error(name, &location, e))?;
        let mapped = state
            .metadata()
            .configuration()
            .get("delta.columnMapping.mode")
            .is_some_and(|m| m != "none");
        if !state.metadata().partition_columns().is_empty() || mapped {
            return Err(Error::table(
                name,
                format!(
                    "table '{name}' has partition columns or column mapping: it is read in one \
                     process, not by a cluster (run batchinfer without --remote for it)"
                ),
            ));
        }
        let log_store = table.log_store();
        let mut paths = Vec::new();
        let mut files = state.snapshot().file_views(log_store.as_ref(), None);
        while let Some(file) = files
            .try_next()
            .await
            .map_err(|e| delta_error(name, &location, e))?
        {
            let file_url = url
                .join(&file.path())
                .map_err(|e| Error::table(name, format!("{location}: {e}")))?;
            paths.push(ListingTableUrl::parse(crate::storage::display_location(
                &file_url,
            ))?);
        }
        let options =
            ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(paths)
            .with_listing_options(options)
            .with_schema(provider.schema.clone());
        Ok(Arc::new(ListingTable::try_new(config)?))
    }

    async fn of(
        name: String,
        location: String,
        table: &DeltaTable,
        version: Option<Version>,
        warehouse: bool,
    ) -> Result<Self> {
        let scan = checked_scan(table, &name, &location, version).await?;
        let state = table
            .snapshot()
            .map_err(|e| delta_error(&name, &location, e))?;
        let schema = write::restored(&scan.schema(), &state.schema());
        Ok(DeltaTableProvider {
            name,
            location,
            log_store: table.log_store(),
            version,
            schema,
            scanned: scan.schema(),
            warehouse,
            loaded: warehouse.then(|| table.clone()),
            planned: Default::default(),
        })
    }

    /// This table at `at` (time travel), named `name`: every query reads that version.
    pub async fn as_of(&self, name: &str, at: &At) -> Result<Self> {
        let mut table = DeltaTable::new(self.log_store.clone());
        let loaded = load_at(&mut table, at).await;
        loaded.map_err(|e| delta_error(&self.name, &self.location, e))?;
        let version = table.version();
        let location = self.location.clone();
        Self::of(name.to_string(), location, &table, version, false).await
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is a table of the warehouse.
    pub fn is_warehouse_table(&self) -> bool {
        self.warehouse
    }

    /// Begins an append to this warehouse table, on the version it reads.
    pub async fn begin_append(&self) -> Result<write::TableWrite> {
        let Some(table) = self.loaded.clone() else {
            return Err(Error::table(
                &self.name,
                format!(
                    "INSERT INTO {}: only the warehouse's Delta tables take rows",
                    self.name
                ),
            ));
        };
        let url = self.log_store.root_url().clone();
        let store = self.log_store.root_object_store(None);
        write::TableWrite::at(&self.name, &url, store, self.log_store.clone(), Some(table))
    }

    /// The scan of the version a query whose planning began at `began` reads: the pinned one, or
    /// the newest now; the same scan for every reference to the table in that query.
    async fn scan_for(&self, began: Option<DateTime<Utc>>) -> Result<Arc<DeltaScan>> {
        let mut planned = self.planned.lock().await;
        if let (Some(began), Some((at, scan))) = (began, planned.as_ref())
            && *at == began
        {
            return Ok(scan.clone());
        }
        let mut table = DeltaTable::new(self.log_store.clone());
        let loaded = match self.version {
            Some(version) => table.load_version(version).await,
            None => table.load().await,
        };
        loaded.map_err(|e| delta_error(&self.name, &self.location, e))?;
        let scan = Arc::new(checked_scan(&table, &self.name, &self.location, self.version).await?);
        if scan.schema().fields() != self.scanned.fields() {
            return Err(Error::table(
                &self.name,
                format!(
                    "Delta table '{}' at {}: its columns changed since it was defined (now {}); \
                     define it again (CREATE OR REPLACE EXTERNAL TABLE)",
                    self.name,
                    self.location,
                    columns(&scan.schema())
                ),
            ));
        }
        if let Some(began) = began {
            *planned = Some((began, scan.clone()));
        }
        Ok(scan)
    }

    /// The version this table reads (None: the newest when a query is planned).
    pub fn version(&self) -> Option<Version> {
        self.version
    }
}

/// The options of a definition, without the stores' own (`aws.*`, `gcp.*`, `azure.*`, which
/// connect the store).
fn delta_options(create: &CreateExternalTable) -> BTreeMap<String, String> {
    let mut options = crate::statements::external_table_options(create);
    options.retain(|key, _| {
        !["aws.", "gcp.", "azure."]
            .iter()
            .any(|p| key.starts_with(p))
    });
    options
}

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
async fn load_at(table: &mut DeltaTable, at: &At) -> std::result::Result<(), DeltaTableError> {
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
async fn newest(table: &DeltaTable) -> std::result::Result<Version, DeltaTableError> {
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
async fn committed_by(
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

/// The scan of `table` as loaded, once every file its version names is known to be its own: a
/// path relative to its folder (no `..`, no absolute path or URL, which would read files of
/// another folder, store or host), and no deletion vector (not read yet); and a column mapping
/// batchinfer knows.
async fn checked_scan(
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
    if let Some(version) = pinned {
        all_there(&log_store, &named).await.map_err(|missing| {
            refuse(format!(
                "version {version} can no longer be read: its file {missing:?} is gone \
                     (VACUUM deletes the files of versions older than its retention); read a \
                     newer version"
            ))
        })?;
    }
    Ok(TableProviderBuilder::default()
        .with_log_store(log_store)
        .with_eager_snapshot(state.snapshot().clone())
        .build()
        .await?)
}

/// Whether every file of `paths` (a version's, as its log names them) is still there: the
/// first missing one otherwise. An old version's counts come from its log alone, so a version
/// VACUUM emptied would answer `count(*)` without a file read.
async fn all_there(log_store: &LogStoreRef, paths: &[String]) -> std::result::Result<(), String> {
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
            return Err(path);
        }
    }
    Ok(())
}

/// Whether a data file's path (as the log names it, URL-decoded) is a file of the table's own
/// folder: relative, with no `.` or `..` part, no backslash, and no URL scheme.
fn is_own_file(path: &str) -> bool {
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

/// A message of delta-rs or its kernel with what is not for a person cut: a backtrace (which
/// the kernel adds where `RUST_BACKTRACE` is set), a log segment's debug dump (which would show
/// a URL's user).
pub(crate) fn readable(message: &str) -> String {
    if message.contains("found gap") {
        return "its _delta_log has a gap: a commit file between two others is missing".into();
    }
    // The first line that starts a backtrace ("Stack backtrace:", "Backtrace", "   0: ...").
    let mut end = message.len();
    let mut at = 0;
    for line in message.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let frame = trimmed
            .split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if at > 0 && (frame || trimmed.to_ascii_lowercase().contains("backtrace")) {
            end = at;
            break;
        }
        at += line.len();
    }
    blank_passwords(message[..end].trim_end())
}

/// A delta-rs error as a person reads it: which table, where, and what is wrong.
fn delta_error(name: &str, location: &str, e: DeltaTableError) -> Error {
    let problem = match &e {
        DeltaTableError::NotATable(_) => {
            format!("{location} holds no Delta table (no commit in its _delta_log/)")
        }
        DeltaTableError::InvalidVersion(version) => {
            format!("{location} has no version {version}")
        }
        _ => format!("{location}: {}", readable(&e.to_string())),
    };
    Error::table(name, format!("Delta table '{name}': {problem}"))
}

#[async_trait]
impl TableProvider for DeltaTableProvider {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters are used to skip files by their statistics; every row is filtered again above.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    /// The scan of the version this query reads: the pinned one, or the newest now.
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let began = state.execution_props().query_execution_start_time;
        let scan = self.scan_for(began).await?;
        let plan = scan.scan(state, projection, filters, limit).await?;
        Ok(restore_vectors(plan, &self.schema)?)
    }
}

/// `plan` with each column `schema` has as a vector (a Delta array) cast back to it.
fn restore_vectors(
    plan: Arc<dyn ExecutionPlan>,
    schema: &SchemaRef,
) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
    use datafusion::physical_expr::expressions::{CastExpr, Column};
    use datafusion::physical_plan::projection::ProjectionExec;
    let scanned = plan.schema();
    let mut changed = false;
    let mut exprs: Vec<(Arc<dyn datafusion::physical_expr::PhysicalExpr>, String)> = Vec::new();
    for (i, field) in scanned.fields().iter().enumerate() {
        let column: Arc<dyn datafusion::physical_expr::PhysicalExpr> =
            Arc::new(Column::new(field.name(), i));
        let wanted = schema.field_with_name(field.name()).ok();
        match wanted.filter(|w| w.data_type() != field.data_type()) {
            Some(wanted) => {
                changed = true;
                let cast = CastExpr::new(column, wanted.data_type().clone(), None);
                exprs.push((Arc::new(cast), field.name().clone()));
            }
            None => exprs.push((column, field.name().clone())),
        }
    }
    if !changed {
        return Ok(plan);
    }
    Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
}

/// A schema's columns as a person reads them: `id Int64, p Float32`.
pub(crate) fn columns(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of `DESCRIBE HISTORY`, newest commit first.
pub fn history_schema() -> SchemaRef {
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    Arc::new(Schema::new(vec![
        Field::new("version", DataType::UInt64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("operation", DataType::Utf8, true),
        Field::new("operation_parameters", DataType::Utf8, true),
        Field::new("read_version", DataType::UInt64, true),
        Field::new("engine_info", DataType::Utf8, true),
        Field::new("info", DataType::Utf8, true),
    ]))
}

/// `DESCRIBE HISTORY name`: each commit of the Delta table `name` (a table of the session
/// `ctx`), newest first, with what its commit says of itself (Delta's commit info: the
/// operation and its parameters, the engine that wrote it, and the rest of what it recorded).
pub async fn history(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
) -> Result<datafusion::arrow::array::RecordBatch> {
    use datafusion::arrow::array::{
        RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
    };
    let provider = ctx.table_provider(name).await?;
    let Some(table) = provider.downcast_ref::<DeltaTableProvider>() else {
        return Err(Error::table(
            name,
            format!(
                "DESCRIBE HISTORY reads a Delta table's log; '{name}' is not a Delta table \
                 (CREATE EXTERNAL TABLE {name} STORED AS DELTATABLE LOCATION '...')"
            ),
        ));
    };
    let (versions, infos) =
        deltalake_core::logstore::get_all_versions_from(table.log_store.clone(), 0)
            .await
            .map_err(|e| delta_error(&table.name, &table.location, e))?;
    let mut rows: Vec<_> = versions.into_iter().zip(infos).collect();
    rows.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    let text = |map: &std::collections::HashMap<String, serde_json::Value>| {
        (!map.is_empty()).then(|| serde_json::to_string(&sorted(map)).unwrap_or_default())
    };
    let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(v, _)| *v))),
        Arc::new(
            TimestampMillisecondArray::from_iter(rows.iter().map(|(_, c)| c.timestamp))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| c.operation.clone()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter()
                .map(|(_, c)| c.operation_parameters.as_ref().and_then(text)),
        )),
        Arc::new(UInt64Array::from_iter(
            rows.iter().map(|(_, c)| c.read_version),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| c.engine_info.clone()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| text(&c.info)),
        )),
    ];
    Ok(RecordBatch::try_new(history_schema(), columns)?)
}

/// A JSON object's entries in key order (a `HashMap` has none), so that the text is the same
/// each time.
fn sorted(
    map: &std::collections::HashMap<String, serde_json::Value>,
) -> BTreeMap<&String, &serde_json::Value> {
    map.iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pairs: &[(&str, &str)]) -> Result<At> {
        let options = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        At::from_options("t", &options)
    }

    /// The table of `data/sample/customers_delta/` with its first commit only, in `dir`.
    fn first_version_in(dir: &std::path::Path) {
        let source = std::path::Path::new("data/sample/customers_delta");
        std::fs::create_dir_all(dir.join("_delta_log")).unwrap();
        for entry in std::fs::read_dir(source).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
            }
        }
        add_commit(dir, 0);
    }

    fn add_commit(dir: &std::path::Path, version: u64) {
        let name = format!("_delta_log/{version:020}.json");
        let source = std::path::Path::new("data/sample/customers_delta").join(&name);
        std::fs::copy(source, dir.join(name)).unwrap();
    }

    /// Every reference to a table in one query (one planning start) gets the one scan, even
    /// where a commit came between them; the next query gets a scan of its own.
    #[tokio::test]
    async fn one_query_reads_one_version_however_often_it_names_the_table() {
        let dir = tempfile::tempdir().unwrap();
        first_version_in(dir.path());
        let url = folder_location(&format!("{}/", dir.path().display())).unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
        let table = open(&url, store, &At::Newest).await.unwrap();
        let scan = checked_scan(&table, "t", "here", None).await.unwrap();
        let provider = DeltaTableProvider {
            name: "t".into(),
            location: "here".into(),
            log_store: table.log_store(),
            version: None,
            schema: scan.schema(),
            scanned: scan.schema(),
            warehouse: false,
            loaded: None,
            planned: Default::default(),
        };
        let began = Utc::now();
        let first = provider.scan_for(Some(began)).await.unwrap();
        add_commit(dir.path(), 1);
        let again = provider.scan_for(Some(began)).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let next = provider.scan_for(Some(Utc::now())).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &next));
    }

    #[test]
    fn messages_lose_backtraces_and_debug_dumps() {
        let kernel = "Invalid JSON in commit 2: EOF\n   0: buoyant_kernel::error::Error::with_backtrace\n   1: x";
        assert_eq!(readable(kernel), "Invalid JSON in commit 2: EOF");
        let stack = "bad schema\n\nStack backtrace:\n   0: x";
        assert_eq!(readable(stack), "bad schema");
        assert_eq!(readable("one line"), "one line");
        assert!(readable("found gap: ParsedLogPath { username: \"k\" }").contains("has a gap"));
    }

    #[test]
    fn data_files_are_the_tables_own() {
        for own in [
            "part-0.parquet",
            "city=lima/part-0.parquet",
            "a b/c:d.parquet",
        ] {
            assert!(is_own_file(own), "{own}");
        }
        for other in [
            "",
            "../x.parquet",
            "a/../../x.parquet",
            "./x.parquet",
            "/tmp/x.parquet",
            "a//x.parquet",
            "..\\x.parquet",
            "file:///tmp/x.parquet",
            "s3://bucket/x.parquet",
            "https://host/x.parquet",
            ".\t./x.parquet",
            " ../x.parquet",
            "\u{1f}../x.parquet",
            " /tmp/x.parquet",
            "c|/tmp/x.parquet",
            "..?x",
            "#/../x",
        ] {
            assert!(!is_own_file(other), "{other}");
        }
    }

    #[test]
    fn options_pin_a_version_or_a_time_and_refuse_the_rest() {
        assert_eq!(at(&[]).unwrap(), At::Newest);
        assert_eq!(at(&[("version", "3")]).unwrap(), At::Version(3));
        assert!(matches!(
            at(&[("timestamp", "2026-12-01T10:00:00Z")]).unwrap(),
            At::Time(_)
        ));
        let refused = |pairs: &[(&str, &str)], says: &str| {
            let message = at(pairs).unwrap_err().to_string();
            assert!(message.contains(says), "{message}");
        };
        refused(&[("version", "-1")], "expected a version number");
        refused(&[("version", "three")], "expected a version number");
        refused(&[("timestamp", "yesterday")], "RFC 3339");
        refused(
            &[("version", "1"), ("timestamp", "2026-12-01T10:00:00Z")],
            "not both",
        );
        refused(&[("path", "x")], "not 'path'");
    }
}
