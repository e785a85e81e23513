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

mod at;
mod checked;
mod history;
mod log;
pub mod maintenance;
#[cfg(test)]
mod tests;
pub mod write;

pub use at::At;
use checked::checked_scan;
pub use history::{history, history_schema};
use log::load_at;
pub(crate) use log::log_store;
pub use log::{newest_commit, open};

/// The names `STORED AS` gives a Delta table.
pub const STORED_AS: [&str; 2] = ["DELTATABLE", "DELTA"];

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
