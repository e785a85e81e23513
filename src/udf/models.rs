//! `models()`: the registered models as a table, as SHOW MODELS lists them.

use std::sync::Arc;

use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::MemTable;

use crate::model::ModelRegistry;
use crate::model::listing::models_batch;

/// `SELECT * FROM models()`: the registered models as a table.
#[derive(Debug)]
pub struct ModelsFunction {
    pub registry: Arc<ModelRegistry>,
}

impl TableFunctionImpl for ModelsFunction {
    fn call_with_args(
        &self,
        _args: TableFunctionArgs,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        let batch = models_batch(&self.registry)?;
        Ok(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?))
    }
}
