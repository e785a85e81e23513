//! [`Session`]: the handle every feature gets on the SQL session: DataFusion's context with
//! batchinfer's functions, the model registry they read, where statements run, and the
//! statement at hand (its id, text and rejects, [`crate::statement_context`]). Features plan and
//! run their queries through it; the Engine routes statements to them.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::Schema;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::dialect::{Dialect, dialect_from_str};

use crate::cluster::Placement;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::model::ModelRegistry;
use crate::statements::{Statement, parse};
use crate::storage::SessionLimits;
use crate::udf::predict_table::ResolvedTables;

mod cost;
mod explain;
mod settings;
mod stores;
mod tables;
mod tag;

pub use stores::shown;
pub use tables::{Registered, row_group_rows, rows_in};

/// The SQL session and what its statements read.
pub struct Session {
    ctx: SessionContext,
    /// Where results computed here (model listings, COPY counts, DDL) are handed out from: a
    /// plain context, so that on a cluster they are not sent to the scheduler.
    results: SessionContext,
    registry: Arc<ModelRegistry>,
    /// The tables `predict_table` calls name, resolved before their statement is planned.
    tables: Arc<ResolvedTables>,
    /// Where statements run: this process, or a cluster.
    placement: Placement,
    /// The limits the session's reads are under, from its options ([`Session::begin_statement`]).
    limits: Arc<SessionLimits>,
}

impl Session {
    /// A session over `registry`'s models, placed as `config.remote` says.
    pub fn new(config: &EngineConfig, registry: Arc<ModelRegistry>) -> Result<Self> {
        let limits = Arc::new(SessionLimits::default());
        let runtime =
            crate::context::runtime_env(registry.stores(), config.memory_limit, limits.clone())?;
        Self::with_runtime(config, registry, runtime, limits)
    }

    /// Another session over this one's models, object stores and memory pool (its
    /// `--memory-limit` shared), with settings of its own.
    pub fn beside(&self, config: &EngineConfig) -> Result<Self> {
        let limits = Arc::new(SessionLimits::default());
        let runtime = crate::context::runtime_beside(
            &self.ctx.runtime_env(),
            self.registry.stores(),
            limits.clone(),
        )?;
        Self::with_runtime(config, self.registry.clone(), runtime, limits)
    }

    fn with_runtime(
        config: &EngineConfig,
        registry: Arc<ModelRegistry>,
        runtime: Arc<RuntimeEnv>,
        limits: Arc<SessionLimits>,
    ) -> Result<Self> {
        let tables = Arc::new(ResolvedTables::default());
        let placement = Placement::new(config.remote.as_ref());
        let ctx = crate::context::build_context(
            config,
            registry.clone(),
            tables.clone(),
            runtime,
            |state| placement.finish(state),
        )?;
        Ok(Session {
            ctx,
            results: SessionContext::new(),
            registry,
            tables,
            placement,
            limits,
        })
    }

    /// The DataFusion context.
    pub fn ctx(&self) -> &SessionContext {
        &self.ctx
    }

    /// The models the session's functions score with.
    pub fn registry(&self) -> &Arc<ModelRegistry> {
        &self.registry
    }

    /// Where the session's statements run.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The tables the `predict_table` calls of the statement at hand name.
    pub fn predict_tables(&self) -> &ResolvedTables {
        &self.tables
    }

    /// Parses a script into statements (`;`-separated), in the session's SQL dialect.
    pub fn statements(&self, sql: &str) -> Result<Vec<Statement>> {
        parse(sql, self.dialect()?.as_ref())
    }

    /// The session's SQL dialect (`SET datafusion.sql_parser.dialect`).
    pub fn dialect(&self) -> Result<Box<dyn Dialect>> {
        let name = self
            .ctx
            .state()
            .config()
            .options()
            .sql_parser
            .dialect
            .to_string();
        dialect_from_str(&name).ok_or_else(|| {
            Error::setting(
                "datafusion.sql_parser.dialect",
                format!("unknown SQL dialect {name}"),
            )
        })
    }

    /// Plans one parsed statement: its model calls bound to their models' inputs by name, and
    /// their result columns named. A planning error is DataFusion's, as it reported it.
    pub async fn plan(&self, mut statement: DFStatement) -> Result<LogicalPlan> {
        crate::udf::by_name::bind_by_name(&mut statement, &self.registry)?;
        crate::udf::names::name_model_columns(&mut statement);
        Ok(self.ctx.state().statement_to_plan(statement).await?)
    }

    /// Runs a planned statement (DDL at once, a query when its frame is collected), with the
    /// models planning loaded shared with the cluster it runs on.
    pub async fn run_plan(&self, plan: LogicalPlan) -> Result<DataFrame> {
        self.placement.share_models(&self.ctx, &self.registry)?;
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }

    /// A result of no columns and no rows.
    pub fn empty(&self) -> Result<DataFrame> {
        self.result(RecordBatch::new_empty(Arc::new(Schema::empty())))
    }

    /// A result computed here: `batch`, handed out by a plain context.
    pub fn result(&self, batch: RecordBatch) -> Result<DataFrame> {
        Ok(self.results.read_batch(batch)?)
    }

    /// A result computed here, of several batches.
    pub fn results(&self, batches: Vec<RecordBatch>) -> Result<DataFrame> {
        Ok(self.results.read_batches(batches)?)
    }

    /// A result of no columns and `rows` rows: what a write that wrote `rows` returns.
    pub fn rows_result(&self, rows: u64) -> Result<DataFrame> {
        let rows = usize::try_from(rows).unwrap_or(usize::MAX);
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        self.result(batch)
    }

    /// A result of no columns whose rows are the rows a write reports in `counts` (its
    /// `count`): nothing to print, and the summary of the statement says how many.
    pub fn rows_written(&self, counts: &[RecordBatch]) -> Result<DataFrame> {
        self.rows_result(rows_in(counts))
    }
}
