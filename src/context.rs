//! The one place that builds DataFusion sessions for batchinfer, for every role: the
//! configuration, the runtime (object stores, memory pool) and the functions of the engine
//! ([`build_context`]), and of a cluster's scheduler and executors ([`cluster_session_config`],
//! [`cluster_state`], [`runtime_env`], [`scalar_functions`]). Where a statement runs (this
//! process or a cluster) is the caller's to finish: see [`crate::cluster::Placement`].

use std::num::NonZeroUsize;
use std::sync::Arc;

use ballista_core::extension::{
    SessionConfigExt, ballista_aggregate_functions, ballista_scalar_functions,
    ballista_window_functions,
};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::{SessionContext, SessionState};
use datafusion::execution::memory_pool::{FairSpillPool, TrackConsumersPool};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;
use datafusion_cli::object_storage::AwsOptions;

use crate::config::{BatchInferOptions, EngineConfig};
use crate::database::DatabaseFactory;
use crate::error::Result;
use crate::model::ModelRegistry;
use crate::rules::{
    AiAggAsReduce, FileEndsOnly, FileNamesBeside, ModelCallsLate, ModelCallsOnce, TableSchemaLimits,
};
use crate::statement_context::StatementContext;
use crate::storage::{Azure, Gcp, SessionLimits, SessionStores, SqlStoreOptions, StoreRegistry};
use crate::udf::predict_table::ResolvedTables;
use crate::udf::{
    AiAggUdf, AiReduceUdf, AiUdf, ChunkUdf, CosineSimilarity, EmbedUdf, GenerateUdf,
    ModelsFunction, PredictTableFunction, PredictUdf, Question, RejectsFunction,
};

/// A context whose `predict` reads `registry`, and whose queries can name Parquet, CSV and JSON
/// files or folders directly (`FROM 'data/sample/features.parquet'`), local or in S3 (the
/// registry's object stores). `place` finishes the state for where statements run.
pub fn build_context(
    config: &EngineConfig,
    registry: Arc<ModelRegistry>,
    tables: Arc<ResolvedTables>,
    runtime: Arc<RuntimeEnv>,
    place: impl FnOnce(SessionStateBuilder) -> Result<SessionState>,
) -> Result<SessionContext> {
    let mut session_config = session_config(config);
    if let Some(limit) = config.memory_limit {
        // A sort reserves this much up front for its merge; DataFusion's 10 MB would exceed a
        // small limit by itself and turn a sort that could spill into an error.
        let execution = &mut session_config.options_mut().execution;
        execution.sort_spill_reservation_bytes =
            execution.sort_spill_reservation_bytes.min(limit / 8);
    }
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(session_config)
        .with_runtime_env(runtime);
    let state = with_rules(state);
    let ctx = SessionContext::new_with_state(place(state)?).enable_url_table();
    // `OPTIONS ('aws.region' ...)` on CREATE EXTERNAL TABLE and COPY, as in datafusion-cli, and
    // `'gcp.*'`, `'azure.*'` alike.
    ctx.register_table_options_extension(AwsOptions::default());
    ctx.register_table_options_extension(SqlStoreOptions::<Gcp>::default());
    ctx.register_table_options_extension(SqlStoreOptions::<Azure>::default());
    // `STORED AS POSTGRES | SQLITE | DELTATABLE` beside DataFusion's file formats.
    {
        let state = ctx.state_ref();
        let mut state = state.write();
        for (name, factory) in DatabaseFactory::all() {
            state
                .table_factories_mut()
                .insert(name.to_string(), factory);
        }
        for name in crate::delta::STORED_AS {
            state
                .table_factories_mut()
                .insert(name.to_string(), Arc::new(crate::delta::DeltaFactory));
        }
    }
    // After the placement, whose Ballista session upgrade replaces the function list.
    for function in scalar_functions(&registry) {
        ctx.register_udf(function.as_ref().clone());
    }
    ctx.register_udaf(datafusion::logical_expr::AggregateUDF::from(
        AiAggUdf::default(),
    ));
    ctx.register_udtf(
        "models",
        Arc::new(ModelsFunction {
            registry: registry.clone(),
        }),
    );
    ctx.register_udtf(
        "batchinfer_rejects",
        Arc::new(RejectsFunction {
            stores: registry.stores().clone(),
        }),
    );
    for form in [
        crate::blob::Form::Blob,
        crate::blob::Form::Text,
        crate::blob::Form::Document,
        crate::blob::Form::Frames(crate::video::Sampling::All),
    ] {
        ctx.register_udtf(
            form.function(),
            Arc::new(crate::blob::BlobFunction { form }),
        );
    }
    ctx.register_udtf(
        "predict_table",
        Arc::new(PredictTableFunction { registry, tables }),
    );
    Ok(ctx)
}

/// The configuration of an engine's sessions.
fn session_config(config: &EngineConfig) -> SessionConfig {
    SessionConfig::new()
        .with_target_partitions(config.partitions())
        .with_batch_size(config.batch_size)
        .with_information_schema(true)
        .with_option_extension(BatchInferOptions::default())
        .with_option_extension(StatementContext::default())
        .set_bool(LEAF_PUSHDOWN, false)
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
        // up on unique columns sooner: COPY of 10M scores 15% faster (`cargo bench --bench pipeline`).
        .set_usize(
            "datafusion.execution.parquet.dictionary_page_size_limit",
            64 * 1024,
        )
        // Row groups of 256Ki rows (DataFusion: 1Mi). The parallel writer holds the row group it
        // is encoding and the one it is writing out, so this bounds a write's memory: a 10M-row
        // COPY of scores peaks 12 MiB lower, as fast (`cargo bench --bench pipeline`), and readers still get
        // row groups big enough to scan well.
        .set_usize(
            "datafusion.execution.parquet.max_row_group_size",
            ROW_GROUP_ROWS,
        )
}

/// DataFusion 55 moves struct field accesses (`predict(...)['label']`) towards the scan. It then
/// copies the expression under them into each access, a model call among them, and fails to
/// plan a subquery that renames columns (`SELECT p['a'], p['b'] FROM (SELECT x AS y, y AS x
/// ...)`: "ambiguous field"). What it gains, reading one leaf of a struct column, batchinfer's
/// reader does not use.
const LEAF_PUSHDOWN: &str = "datafusion.optimizer.enable_leaf_expression_pushdown";

/// Rows per Parquet row group written, unless set otherwise (DataFusion: 1Mi); fewer for wide
/// rows (see `engine/write.rs`).
pub const ROW_GROUP_ROWS: usize = 256 * 1024;

/// The configuration every process of a cluster starts from (the scheduler's and executors'
/// sessions, before the client's settings are applied).
pub fn cluster_session_config() -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_information_schema(true)
        .with_option_extension(BatchInferOptions::default())
        .with_option_extension(StatementContext::default())
        .set_bool(LEAF_PUSHDOWN, false)
}

/// The runtime of a session: `stores` for every path, and with a memory limit a fair pool of
/// that size for the operators that buffer (sorts, aggregations, joins), which then spill to
/// temporary files, or fail with "Resources exhausted" naming the biggest consumers, rather than
/// let the process be killed.
pub fn runtime_env(
    stores: &Arc<StoreRegistry>,
    memory_limit: Option<usize>,
    limits: Arc<SessionLimits>,
) -> datafusion::error::Result<Arc<RuntimeEnv>> {
    let mut runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(SessionStores::new(stores.clone(), limits)));
    if let Some(limit) = memory_limit {
        let pool = TrackConsumersPool::new(
            FairSpillPool::new(limit),
            NonZeroUsize::new(5).expect("5 > 0"),
        );
        runtime = runtime.with_memory_pool(Arc::new(pool));
    }
    runtime.build_arc()
}

/// `runtime`'s memory pool, spill files and caches, with the stores read under `limits`: the
/// runtime of a session beside another.
pub fn runtime_beside(
    runtime: &RuntimeEnv,
    stores: &Arc<StoreRegistry>,
    limits: Arc<SessionLimits>,
) -> datafusion::error::Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::from_runtime_env(runtime)
        .with_object_store_registry(Arc::new(SessionStores::new(stores.clone(), limits)))
        .build_arc()
}

/// A cluster scheduler's state for one client session (`config`): Ballista's functions and
/// batchinfer's, over `registry` (the models as that client defines them).
pub fn cluster_state(
    config: SessionConfig,
    stores: &Arc<StoreRegistry>,
    registry: &Arc<ModelRegistry>,
) -> datafusion::error::Result<SessionState> {
    let mut scalar = ballista_scalar_functions();
    scalar.extend(scalar_functions(registry));
    // The footer cap and confinement of the client's session, as its options say.
    let limits = SessionLimits::of(config.options().extensions.get::<BatchInferOptions>());
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime_env(stores, None, Arc::new(limits))?)
        .with_scalar_functions(scalar)
        .with_aggregate_functions({
            let mut aggregates = ballista_aggregate_functions();
            aggregates.push(Arc::new(datafusion::logical_expr::AggregateUDF::from(
                AiAggUdf::default(),
            )));
            aggregates
        })
        .with_window_functions(ballista_window_functions());
    Ok(with_rules(state).build())
}

/// batchinfer's logical rules, as every state that plans a statement has them (an engine's, and
/// a cluster scheduler's for each client session): the checks of what a query may read, and the
/// rewrites that call a model once per row and read only the ends of files asked for. The
/// physical rules are the placement's ([`crate::cluster::Placement::finish`]).
pub fn with_rules(state: SessionStateBuilder) -> SessionStateBuilder {
    state
        .with_analyzer_rule(Arc::new(TableSchemaLimits))
        .with_analyzer_rule(Arc::new(FileNamesBeside))
        .with_optimizer_rule(Arc::new(AiAggAsReduce))
        .with_optimizer_rule(Arc::new(ModelCallsLate))
        .with_optimizer_rule(Arc::new(ModelCallsOnce))
        .with_optimizer_rule(Arc::new(FileEndsOnly))
}

/// batchinfer's scalar functions over `registry`: every process of a cluster registers these.
pub fn scalar_functions(registry: &Arc<ModelRegistry>) -> Vec<Arc<ScalarUDF>> {
    let mut functions = vec![
        Arc::new(ScalarUDF::from(PredictUdf::new(registry.clone()))),
        Arc::new(ScalarUDF::from(EmbedUdf::new(registry.clone()))),
        Arc::new(ScalarUDF::from(ChunkUdf::new(registry.clone()))),
        Arc::new(ScalarUDF::from(CosineSimilarity::default())),
        Arc::new(
            datafusion::logical_expr::async_udf::AsyncScalarUDF::new(Arc::new(GenerateUdf::new(
                registry.clone(),
            )))
            .into_scalar_udf(),
        ),
        Arc::new(
            datafusion::logical_expr::async_udf::AsyncScalarUDF::new(Arc::new(
                GenerateUdf::details(registry.clone()),
            ))
            .into_scalar_udf(),
        ),
    ];
    functions.push(Arc::new(
        datafusion::logical_expr::async_udf::AsyncScalarUDF::new(Arc::new(AiReduceUdf::new(
            registry.clone(),
        )))
        .into_scalar_udf(),
    ));
    for question in [Question::Filter, Question::FilterScore, Question::Classify] {
        functions.push(Arc::new(
            datafusion::logical_expr::async_udf::AsyncScalarUDF::new(Arc::new(AiUdf::new(
                registry.clone(),
                question,
            )))
            .into_scalar_udf(),
        ));
    }
    functions
}
