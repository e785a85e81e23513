//! The catalog: the models a session knows (its `--models` files and the warehouse's
//! definitions, [`models`]) and its tables (those it registered, and the warehouse's tables and
//! views through [`WarehouseSchema`]). It keeps what this process has seen of them, so that each
//! statement registers only the models that changed, and says each warning once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::execution::context::SessionContext;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::message::Warnings;
use crate::model::ModelRegistry;
use crate::session::Session;
use crate::warehouse::schema::WarehouseSchema;
use crate::warehouse::{Definition, Warehouse};

mod definitions;
mod drop_model;
mod endpoint_models;
mod llm_cache;
mod models;
mod names;
mod tables;

/// The models and tables of a session (see the module's text).
pub struct Catalog {
    registry: Arc<ModelRegistry>,
    warehouse: Option<Warehouse>,
    /// The folder of `--models`, named in warnings.
    models_dir: Option<PathBuf>,
    /// The models of `--models`: files, which every process reads again, so not redefined by
    /// statements (a definition kept in the warehouse would be hidden by the file in the next).
    folder_models: BTreeSet<String>,
    /// The warehouse's model definitions as this process last read or wrote them.
    models: Mutex<BTreeMap<String, Definition>>,
    /// The warnings already given.
    warned: Warnings,
    /// Set once the warehouse has been opened: its legacy layout moved.
    opened: tokio::sync::OnceCell<()>,
    /// The session's default schema, over the warehouse's tables and views (with a warehouse).
    tables: Option<Arc<WarehouseSchema>>,
    /// The file version of each `--models` model a refresh used, as first seen.
    folder_versions: Mutex<BTreeMap<String, Option<String>>>,
}

impl Catalog {
    /// The catalog of `session`: the models of `models_dir` registered (loaded on first use),
    /// and the warehouse's tables and views made the session's default schema.
    pub fn new(
        session: &Session,
        warehouse: Option<&Warehouse>,
        models_dir: Option<&std::path::Path>,
    ) -> Result<Self> {
        let registry = session.registry().clone();
        // Models of --models DIR win over the warehouse's of the same name.
        let folder_models: BTreeSet<String> = match models_dir {
            Some(dir) => registry.register_dir(dir)?.into_iter().collect(),
            None => BTreeSet::new(),
        };
        let tables = warehouse_schema(session, warehouse)?;
        Ok(Catalog {
            registry,
            warehouse: warehouse.cloned(),
            models_dir: models_dir.map(PathBuf::from),
            folder_models,
            models: Mutex::default(),
            warned: Warnings::default(),
            opened: tokio::sync::OnceCell::new(),
            tables,
            folder_versions: Mutex::default(),
        })
    }

    /// The catalog of another session of this process ([`Session::beside`]): the same models,
    /// as this catalog has seen them (none registered again, none loaded again), and the
    /// warehouse's tables made that session's default schema.
    pub fn beside(&self, session: &Session) -> Result<Self> {
        let tables = warehouse_schema(session, self.warehouse.as_ref())?;
        Ok(Catalog {
            registry: self.registry.clone(),
            warehouse: self.warehouse.clone(),
            models_dir: self.models_dir.clone(),
            folder_models: self.folder_models.clone(),
            models: Mutex::new(copied(&self.models)),
            warned: Warnings::default(),
            opened: self.opened.clone(),
            tables,
            folder_versions: Mutex::new(copied(&self.folder_versions)),
        })
    }

    /// Says `warning` on standard error, unless it was said before.
    pub fn warn_once(&self, warning: String) {
        self.warned.say_once(warning);
    }

    /// The warehouse's tables and views, as the session's default schema.
    pub fn warehouse(&self) -> Option<&Warehouse> {
        self.warehouse.as_ref()
    }

    pub fn warehouse_tables(&self) -> Option<&WarehouseSchema> {
        self.tables.as_deref()
    }
}

/// What `map` holds now.
fn copied<K: Clone, V: Clone>(map: &Mutex<BTreeMap<K, V>>) -> BTreeMap<K, V> {
    map.lock().clone()
}

/// The session's default schema made the warehouse's, where there is one; on a cluster, of
/// the tables' files alone.
fn warehouse_schema(
    session: &Session,
    warehouse: Option<&Warehouse>,
) -> Result<Option<Arc<WarehouseSchema>>> {
    let Some(warehouse) = warehouse else {
        return Ok(None);
    };
    let files_only = !matches!(session.placement(), crate::Placement::InProcess);
    default_schema(session.ctx(), warehouse, files_only).map(Some)
}

/// The session's default schema made the warehouse's ([`WarehouseSchema`]).
fn default_schema(
    ctx: &SessionContext,
    warehouse: &Warehouse,
    files_only: bool,
) -> Result<Arc<WarehouseSchema>> {
    let state = ctx.state();
    let names = &state.config().options().catalog;
    let catalog = ctx
        .catalog(&names.default_catalog)
        .ok_or_else(|| Error::Internal(format!("no catalog '{}'", names.default_catalog)))?;
    let schema = Arc::new(WarehouseSchema::new(
        warehouse.clone(),
        ctx.state_weak_ref(),
        files_only,
    ));
    catalog.register_schema(&names.default_schema, schema.clone())?;
    Ok(schema)
}
