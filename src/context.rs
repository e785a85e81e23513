//! The one place that builds a DataFusion `SessionContext` for batchinfer: its functions, its
//! configuration and the tables it can read by path.

use std::sync::Arc;

use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use crate::config::{BatchInferOptions, EngineConfig};
use crate::model::ModelRegistry;
use crate::udf::PredictUdf;

/// A context whose `predict` reads `registry`, and whose queries can name Parquet, CSV and JSON
/// files or folders directly (`FROM 'data/sample/features.parquet'`).
pub fn build_context(config: &EngineConfig, registry: Arc<ModelRegistry>) -> SessionContext {
    let session_config = SessionConfig::new()
        .with_target_partitions(config.partitions())
        .with_batch_size(config.batch_size)
        .with_information_schema(true)
        .with_option_extension(BatchInferOptions::default());
    let ctx = SessionContext::new_with_config(session_config).enable_url_table();
    ctx.register_udf(ScalarUDF::from(PredictUdf::new(registry)));
    ctx
}
