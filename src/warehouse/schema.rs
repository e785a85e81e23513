//! The session's default schema over a warehouse: its tables and materialized views are looked
//! up by name when a statement names them, as they are in the warehouse then (created, replaced
//! or dropped by another process, or by this one), and the tables this process registers itself
//! (`CREATE EXTERNAL TABLE`, a table registered on the context) are kept here and come first.
//!
//! A table or view is opened once per version (a table's [`Warehouse::table_version`], a
//! view's newest manifest): a lookup costs one request to see that it is still that version.
//! The names of all of them are listed only for the statements that ask for every name
//! ([`WarehouseSchema::list`]: `SHOW TABLES`, `information_schema`, the DDL that asks whether a
//! name is taken).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use datafusion::catalog::{MemorySchemaProvider, SchemaProvider, TableProvider};
use datafusion::datasource::file_format::options::ReadOptions;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionState;
use datafusion::prelude::ParquetReadOptions;
use parking_lot::Mutex;
use parking_lot::RwLock;

use super::view_manifest::Manifest;
use super::{Warehouse, check_name};
use crate::error::{Error, Result};
use crate::message::{Warnings, display_error};

/// What a name of the schema is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A table this process registered (an external table, a DataFrame's).
    Registered,
    /// A table of the warehouse.
    Table,
    /// A materialized view of the warehouse.
    View,
}

/// A table or view of the warehouse as opened, at the version it was opened at.
#[derive(Clone)]
struct Opened {
    kind: Kind,
    version: Option<String>,
    provider: Arc<dyn TableProvider>,
}

/// The default schema of a session with a warehouse (see the module's text).
pub struct WarehouseSchema {
    warehouse: Warehouse,
    registered: MemorySchemaProvider,
    /// The session, whose settings read a table's files to learn its columns.
    state: Weak<RwLock<SessionState>>,
    opened: Mutex<BTreeMap<String, Opened>>,
    /// The names the last [`WarehouseSchema::list`] found, with the tables written and dropped
    /// since by this process: what `table_exist` and `table_names` answer from.
    listed: Mutex<BTreeSet<String>>,
    warnings: Warnings,
    /// Whether Delta tables are opened as tables of their files (statements run on a cluster,
    /// whose executors are sent listing tables' scans).
    files_only: bool,
}

impl std::fmt::Debug for WarehouseSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarehouseSchema")
            .field("warehouse", &self.warehouse)
            .finish_non_exhaustive()
    }
}

impl WarehouseSchema {
    /// The schema of `warehouse` for the session `state` refers to.
    /// The schema of `warehouse` for the session `state` refers to; `files_only` where its
    /// statements run on a cluster.
    pub fn new(warehouse: Warehouse, state: Weak<RwLock<SessionState>>, files_only: bool) -> Self {
        WarehouseSchema {
            warehouse,
            registered: MemorySchemaProvider::new(),
            state,
            opened: Mutex::default(),
            listed: Mutex::default(),
            warnings: Warnings::default(),
            files_only,
        }
    }

    /// Delta table `name` of the warehouse as a Delta table, whatever this session reads it as
    /// (on a cluster, a table of its files): for a write to it. None where it is not one, or
    /// where a table this process registered takes its name.
    pub async fn delta_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        if self.registered.table_exist(name) || check_name("table", name).is_err() {
            return Ok(None);
        }
        if !self.files_only {
            return Ok(self.open_table(name).await?.map(|opened| opened.provider));
        }
        let Some((version, _)) = self.warehouse.delta_version(name).await? else {
            return Ok(None);
        };
        let (url, store) = self.warehouse.table_folder(name)?;
        let table = crate::delta::DeltaTableProvider::of_warehouse(name, &url, store, version);
        Ok(Some(Arc::new(table.await?)))
    }

    /// Lists the warehouse's tables and views, for a statement that asks for every name.
    pub async fn list(&self) -> Result<()> {
        let mut names: BTreeSet<String> =
            self.warehouse.table_folders().await?.into_iter().collect();
        names.extend(self.warehouse.view_names().await?);
        *self.listed() = names;
        Ok(())
    }

    /// Table `name` as this process has just committed it: a table this process registered
    /// under that name gives way to it, and the next statement that names it opens its newest
    /// version.
    pub fn committed(&self, name: &str) {
        let _ = self.registered.deregister_table(name);
        self.listed().insert(name.to_string());
        self.opened().remove(name);
    }

    /// Forgets `name` (its table was dropped).
    pub fn forget(&self, name: &str) {
        self.opened().remove(name);
        self.listed().remove(name);
    }

    /// What `name` is now, if anything: a table this process registered, else a table or view
    /// of the warehouse, readable or not (a name is taken by a table being created, or one
    /// that cannot be read, too).
    pub async fn kind(&self, name: &str) -> Result<Option<Kind>> {
        if self.registered.table_exist(name) {
            return Ok(Some(Kind::Registered));
        }
        if check_name("table", name).is_err() {
            return Ok(None);
        }
        if self.warehouse.table_version(name).await?.is_some() {
            return Ok(Some(Kind::Table));
        }
        let latest = self.warehouse.view_manifests(name)?.latest().await?;
        Ok(super::view_manifest::live(latest).map(|_| Kind::View))
    }

    async fn lookup(&self, name: &str) -> Result<Option<Opened>> {
        if let Some((table, at)) = crate::delta::At::of_name(name) {
            return self.travel(table, name, &at?).await;
        }
        if let Some(provider) = self.registered.table(name).await? {
            let kind = Kind::Registered;
            return Ok(Some(Opened {
                kind,
                version: None,
                provider,
            }));
        }
        if check_name("table", name).is_err() {
            return Ok(None);
        }
        if let Some(table) = self.open_table(name).await? {
            return Ok(Some(table));
        }
        match self.open_view(name).await {
            Ok(view) => Ok(view),
            Err(e) => {
                // One view that cannot be read does not take the others, or the warehouse,
                // with it: DROP MATERIALIZED VIEW still removes it.
                self.forget(name);
                self.warnings.say_once(format!(
                    "materialized view '{name}' cannot be read and is left out: {}",
                    display_error(&e)
                ));
                Ok(None)
            }
        }
    }

    /// Delta table `table` (of the warehouse, or one this process registered) at `at`, as the
    /// table `name` (time travel: [`crate::statements::time_travel`]).
    async fn travel(
        &self,
        table: &str,
        name: &str,
        at: &crate::delta::At,
    ) -> Result<Option<Opened>> {
        let Some(found) = Box::pin(self.lookup(table)).await? else {
            return Ok(None);
        };
        let Some(delta) = found
            .provider
            .downcast_ref::<crate::delta::DeltaTableProvider>()
        else {
            return Err(Error::table(
                table,
                format!(
                    "'{table}' is not a Delta table: VERSION AS OF and TIMESTAMP AS OF read a \
                     Delta table's older versions"
                ),
            ));
        };
        let provider = Arc::new(delta.as_of(name, at).await?);
        Ok(Some(Opened {
            kind: Kind::Registered,
            version: None,
            provider,
        }))
    }

    /// Table `name` of the warehouse, once it is complete (not while its first CREATE runs): a
    /// Delta table at its newest version now (each statement that names it reads that one), or
    /// a folder of Parquet files written before tables were Delta tables.
    async fn open_table(&self, name: &str) -> Result<Option<Opened>> {
        if let Some((number, commit)) = self.warehouse.delta_version(name).await? {
            use crate::delta::DeltaTableProvider;
            let version = Some(super::delta_key(number, &commit));
            if let Some(opened) = self.opened_at(name, Kind::Table, &version) {
                return Ok(Some(opened));
            }
            let (url, store) = self.warehouse.table_folder(name)?;
            let provider: Arc<dyn TableProvider> = match self.files_only {
                true => DeltaTableProvider::files_of_warehouse(name, &url, store, number).await?,
                false => {
                    Arc::new(DeltaTableProvider::of_warehouse(name, &url, store, number).await?)
                }
            };
            return Ok(Some(self.keep(name, Kind::Table, version, provider)));
        }
        let Some(version) = self.warehouse.files_version(name).await? else {
            return Ok(None);
        };
        let version = Some(version);
        if let Some(opened) = self.opened_at(name, Kind::Table, &version) {
            return Ok(Some(opened));
        }
        match self.listing(name).await {
            Ok(provider) => Ok(Some(self.keep(name, Kind::Table, version, provider))),
            Err(e) => {
                self.warnings.say_once(format!(
                    "the warehouse's table '{name}' cannot be read and is left out: {}",
                    display_error(&e)
                ));
                Ok(None)
            }
        }
    }

    /// The table of `name`'s files, its columns read from them as `register_parquet` reads
    /// them, with the session's Parquet settings.
    async fn listing(&self, name: &str) -> Result<Arc<dyn TableProvider>> {
        let state = match self.state.upgrade() {
            Some(state) => state.read().clone(),
            None => return Err(Error::Internal("the session has ended".to_string())),
        };
        let url = ListingTableUrl::parse(self.warehouse.table_location(name)?)?;
        let options = ParquetReadOptions::default()
            .to_listing_options(state.config(), state.default_table_options().clone());
        let schema = options.infer_schema(&state, &url).await?;
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(schema);
        Ok(Arc::new(ListingTable::try_new(config)?))
    }

    /// View `name` as its newest manifest has it, once it has been refreshed to the end once.
    async fn open_view(&self, name: &str) -> Result<Option<Opened>> {
        let manifests = self.warehouse.view_manifests(name)?;
        let Some(newest) = manifests.newest().await? else {
            return Ok(None);
        };
        let version = Some(newest);
        if let Some(opened) = self.opened_at(name, Kind::View, &version) {
            return Ok(Some(opened));
        }
        let Some((_, bytes)) = manifests.latest().await? else {
            return Ok(None);
        };
        let manifest = Manifest::from_bytes(&bytes, &format!("view '{name}''s manifest"))?;
        let Some(current) = manifest.current.as_ref().filter(|_| !manifest.dropped) else {
            self.forget(name);
            return Ok(None);
        };
        let folder = self.warehouse.view_folder(name)?;
        let provider = super::view_files::table(name, &folder, current)?;
        Ok(Some(self.keep(name, Kind::View, version, provider)))
    }

    /// What was opened of `name` as `kind` at `version`, if that is what it is now.
    fn opened_at(&self, name: &str, kind: Kind, version: &Option<String>) -> Option<Opened> {
        let opened = self.opened();
        let found = opened.get(name)?;
        (found.kind == kind && found.version == *version).then(|| found.clone())
    }

    fn keep(
        &self,
        name: &str,
        kind: Kind,
        version: Option<String>,
        provider: Arc<dyn TableProvider>,
    ) -> Opened {
        let opened = Opened {
            kind,
            version,
            provider,
        };
        self.opened().insert(name.to_string(), opened.clone());
        opened
    }

    fn opened(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Opened>> {
        self.opened.lock()
    }

    fn listed(&self) -> parking_lot::MutexGuard<'_, BTreeSet<String>> {
        self.listed.lock()
    }
}

#[async_trait]
impl SchemaProvider for WarehouseSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names: BTreeSet<String> = self.registered.table_names().into_iter().collect();
        names.extend(self.listed().iter().cloned());
        names.into_iter().collect()
    }

    async fn table(&self, name: &str) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        let found = self.lookup(name).await.map_err(DataFusionError::from)?;
        Ok(found.map(|opened| opened.provider))
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        self.registered.register_table(name, table)
    }

    /// A table this process registered is deregistered; a warehouse table is forgotten here
    /// (DROP TABLE then removes its files).
    fn deregister_table(
        &self,
        name: &str,
    ) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        if let Some(table) = self.registered.deregister_table(name)? {
            return Ok(Some(table));
        }
        Ok(self.opened().remove(name).map(|opened| opened.provider))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.registered.table_exist(name) || self.listed().contains(name)
    }
}
