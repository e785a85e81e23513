//! The one place that builds a DataFusion `SessionContext` for batchinfer: its functions, its
//! configuration and the tables it can read by path.

use std::num::NonZeroUsize;
use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionContext;
use datafusion::execution::memory_pool::{FairSpillPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use ballista_core::extension::SessionStateExt;
use datafusion_cli::object_storage::AwsOptions;

use crate::cluster::scheduler_url;
use crate::config::{BatchInferOptions, EngineConfig};
use crate::error::Result;
use crate::limits::TableSchemaLimits;
use crate::model::ModelRegistry;
use crate::model::listing::ModelsFunction;
use crate::scan::StreamingParquetRule;
use crate::udf::predict_table::ResolvedTables;
use crate::udf::{EmbedUdf, PredictTableFunction, PredictUdf, Similarity, SimilarityUdf};

/// A context whose `predict` reads `registry`, and whose queries can name Parquet, CSV and JSON
/// files or folders directly (`FROM 'data/sample/features.parquet'`), local or in S3 (the
/// registry's object stores).
///
/// With a memory limit, operators that buffer (sorts, aggregations, joins) share a fair pool of
/// that size and spill to temporary files, or fail with "Resources exhausted" naming the biggest
/// consumers, rather than let the process be killed.
pub fn build_context(
    config: &EngineConfig,
    registry: Arc<ModelRegistry>,
    tables: Arc<ResolvedTables>,
) -> Result<SessionContext> {
    let mut session_config = SessionConfig::new()
        .with_target_partitions(config.partitions())
        .with_batch_size(config.batch_size)
        .with_information_schema(true)
        .with_option_extension(BatchInferOptions::default())
        // Files a COPY to a folder writes at once. Each holds a row group being encoded and, on
        // S3, up to 8 parts of 10 MiB in flight (object_store's `BufWriter`), so this number sets
        // the memory of a large write; one file per partition keeps every core busy.
        .set_usize(
            "datafusion.execution.minimum_parallel_output_files",
            config.partitions().clamp(1, 4),
        )
        // Model outputs are mostly unique values (ids, scores, vectors): the Parquet writer tries a
        // dictionary for each column chunk and gives up only when it passes this size. 64 KiB
        // (DataFusion: 1 MiB) still holds the dictionary of a label or category column, and gives
        // up on unique columns sooner: COPY of 10M scores 15% faster (README, Performance).
        .set_usize(
            "datafusion.execution.parquet.dictionary_page_size_limit",
            64 * 1024,
        )
        // Row groups of 256Ki rows (DataFusion: 1Mi). The parallel writer holds the row group it
        // is encoding and the one it is writing out, so this bounds a write's memory: a 10M-row
        // COPY of scores peaks 12 MiB lower, as fast (README, Performance), and readers still get
        // row groups big enough to scan well.
        .set_usize(
            "datafusion.execution.parquet.max_row_group_size",
            256 * 1024,
        );
    let mut runtime =
        RuntimeEnvBuilder::new().with_object_store_registry(registry.stores().clone());
    if let Some(limit) = config.memory_limit {
        // A sort reserves this much up front for its merge; DataFusion's 10 MB would exceed a
        // small limit by itself and turn a sort that could spill into an error.
        let execution = &mut session_config.options_mut().execution;
        execution.sort_spill_reservation_bytes =
            execution.sort_spill_reservation_bytes.min(limit / 8);
        let pool = TrackConsumersPool::new(
            FairSpillPool::new(limit),
            NonZeroUsize::new(5).expect("5 > 0"),
        );
        runtime = runtime.with_memory_pool(Arc::new(pool));
    }
    let mut ctx = SessionContext::new_with_config_rt(session_config, runtime.build_arc()?);
    let mut state = SessionStateBuilder::new_from_existing(ctx.state())
        .with_analyzer_rule(Arc::new(TableSchemaLimits));
    if let Some(remote) = &config.remote {
        // Queries are planned here and run by the cluster's scheduler and executors.
        state = SessionStateBuilder::new_from_existing(
            state.build().upgrade_for_ballista(scheduler_url(remote)?)?,
        );
    } else {
        // Local Parquet read page by page (src/scan.rs); in a cluster, plans travel between
        // processes and keep DataFusion's scan.
        state = state.with_physical_optimizer_rule(Arc::new(StreamingParquetRule));
    }
    ctx = SessionContext::new_with_state(state.build());
    let ctx = ctx.enable_url_table();
    // `OPTIONS ('aws.region' ...)` on CREATE EXTERNAL TABLE and COPY, as in datafusion-cli.
    ctx.register_table_options_extension(AwsOptions::default());
    // After the Ballista upgrade, which replaces the function list.
    for function in scalar_functions(&registry) {
        ctx.register_udf(function.as_ref().clone());
    }
    ctx.register_udtf(
        "models",
        Arc::new(ModelsFunction {
            registry: registry.clone(),
        }),
    );
    ctx.register_udtf(
        "predict_table",
        Arc::new(PredictTableFunction { registry, tables }),
    );
    Ok(ctx)
}

/// batchinfer's scalar functions over `registry`: every process of a cluster registers these.
pub fn scalar_functions(registry: &Arc<ModelRegistry>) -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::from(PredictUdf::new(registry.clone()))),
        Arc::new(ScalarUDF::from(EmbedUdf::new(registry.clone()))),
        Arc::new(ScalarUDF::from(SimilarityUdf::new(Similarity::Cosine))),
        Arc::new(ScalarUDF::from(SimilarityUdf::new(Similarity::Dot))),
    ]
}
