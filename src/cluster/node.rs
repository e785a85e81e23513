//! What a scheduler or an executor holds: its object stores and its models.

use std::sync::Arc;

use crate::config::EngineConfig;
use crate::error::Result;
use crate::model::ModelRegistry;
use crate::storage::StoreRegistry;
use crate::warehouse::Warehouse;

/// A cluster process's object stores and models (from its own `--warehouse` and `--models`;
/// the client's come with each query).
pub(super) struct Node {
    pub(super) stores: Arc<StoreRegistry>,
    pub(super) registry: Arc<ModelRegistry>,
}

impl Node {
    pub(super) async fn new(config: &EngineConfig) -> Result<Self> {
        let stores = Arc::new(StoreRegistry::new());
        let registry = Arc::new(ModelRegistry::new(config, stores.clone()));
        if let Some(root) = &config.warehouse {
            let warehouse = Warehouse::new(root, stores.clone())?;
            registry.register_sources(&warehouse.models().await?)?;
        }
        if let Some(dir) = &config.models_dir {
            registry.register_dir(dir)?;
        }
        Ok(Node { stores, registry })
    }
}
