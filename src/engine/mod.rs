//! [`Engine`]: the library's entry point. A SessionContext with batchinfer's functions, the model
//! registry they read, and the warehouse where models and tables persist.
//!
//! ```no_run
//! # async fn run() -> batchinfer::Result<()> {
//! use batchinfer::{Engine, EngineConfig};
//! let engine = Engine::open(EngineConfig {
//!     models_dir: Some("data/models".into()),
//!     ..Default::default()
//! })
//! .await?;
//! let df = engine
//!     .sql("SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score \
//!           FROM 'data/sample/features.parquet'")
//!     .await?;
//! df.show().await?;
//! # Ok(()) }
//! ```

mod options;
mod route;

use std::sync::Arc;

pub use options::{EngineOptions, MAX_BATCH_ROWS, MAX_PARALLEL, check_count};

use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::Statement as SQLStatement;
use datafusion::sql::sqlparser::dialect::Dialect;

use self::route::SqlRoute;
use crate::catalog::Catalog;
use crate::cluster::Placement;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::llm::estimate::{Estimate, Estimates};
use crate::model::ModelRegistry;
use crate::session::Session;
use crate::statement_context::StatementContext;
use crate::statements::Statement;
use crate::storage::StoreRegistry;
use crate::udf::predict_table::tables_named;
use crate::view::{Refreshed, Views};
use crate::warehouse::Warehouse;
use crate::write::Writes;

/// A batchinfer engine: run SQL with `predict` over the models it knows. It parses statements
/// and routes each to the feature that runs it ([`crate::catalog`], [`crate::view`], the
/// writes here), over one [`Session`].
pub struct Engine {
    session: Session,
    config: EngineConfig,
    warehouse: Option<Warehouse>,
    /// The models and tables this process knows ([`Catalog`]).
    catalog: Catalog,
}

impl Engine {
    /// An engine with the models of `config.models_dir` registered (loaded on first use); the
    /// warehouse's models are registered before each statement, its tables by [`Engine::open`].
    pub fn new(config: EngineConfig) -> Result<Self> {
        let stores = Arc::new(StoreRegistry::new());
        let registry = Arc::new(ModelRegistry::new(&config, stores.clone()));
        let warehouse = config
            .warehouse
            .as_ref()
            .map(|root| Warehouse::new(root, stores))
            .transpose()?;
        let session = Session::new(&config, registry)?;
        if let Some(warehouse) = &warehouse {
            session.set_warehouse(warehouse.root());
        }
        let catalog = Catalog::new(&session, warehouse.as_ref(), config.models_dir.as_deref())?;
        Ok(Engine {
            session,
            config,
            warehouse,
            catalog,
        })
    }

    /// [`Engine::new`], with the warehouse's models read and what interrupted writes left of
    /// its tables removed.
    pub async fn open(config: EngineConfig) -> Result<Self> {
        let engine = Self::new(config)?;
        engine.catalog.refresh_models().await?;
        if let Some(warehouse) = &engine.warehouse {
            warehouse.remove_abandoned();
        }
        Ok(engine)
    }

    /// Another engine over this one's models (loaded once, shared), warehouse, object stores and
    /// memory pool, whose session has settings (`SET`) and tables of its own: a server's
    /// client session.
    pub fn session(&self) -> Result<Engine> {
        let session = self.session.beside(&self.config)?;
        // Confined as this one is (a server's clients as the server).
        let confined = self.session.batchinfer_options();
        session.update_options(|options| {
            options.read_only = confined.read_only;
            options.allowed_directories = confined.allowed_directories;
            options.allowed_urls = confined.allowed_urls;
            Ok(())
        })?;
        if let Some(warehouse) = &self.warehouse {
            session.set_warehouse(warehouse.root());
        }
        let catalog = self.catalog.beside(&session)?;
        Ok(Engine {
            session,
            config: self.config.clone(),
            warehouse: self.warehouse.clone(),
            catalog,
        })
    }

    /// Confines this engine's session, and the sessions opened beside it from now on, as `SET
    /// batchinfer.<key> = '<value>'` of each of `settings` would (`read_only`,
    /// `allowed_directories`, `allowed_urls`): only ever narrowed.
    pub fn confine(&self, settings: &[(&str, String)]) -> Result<()> {
        for (key, value) in settings {
            self.session.update_options(|options| {
                datafusion::common::config::ExtensionOptions::set(options, key, value)
            })?;
        }
        self.session.begin_statement();
        Ok(())
    }

    /// The DataFusion context, to register tables or run DataFrame code.
    pub fn context(&self) -> &SessionContext {
        self.session.ctx()
    }

    /// The models this engine knows.
    pub fn registry(&self) -> &Arc<ModelRegistry> {
        self.session.registry()
    }

    /// Where the engine's statements run.
    pub fn placement(&self) -> &Placement {
        self.session.placement()
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Runs one statement (DDL, COPY and model statements run here; queries when the frame is
    /// collected).
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let mut statements = self.statements(sql)?;
        if statements.len() != 1 {
            return Err(Error::Statement(format!(
                "expected one SQL statement, found {}; use Engine::statements for scripts",
                statements.len()
            )));
        }
        self.run(statements.remove(0)).await
    }

    /// Parses a script into statements (`;`-separated), in the session's SQL dialect.
    pub fn statements(&self, sql: &str) -> Result<Vec<Statement>> {
        self.session.statements(sql)
    }

    /// The session's SQL dialect (`SET datafusion.sql_parser.dialect`).
    pub fn dialect(&self) -> Result<Box<dyn Dialect>> {
        self.session.dialect()
    }

    /// Runs one statement of a script.
    pub async fn run(&self, statement: Statement) -> Result<DataFrame> {
        self.before_statement().await?;
        let reach = crate::confine::Reach {
            access: &self.session.access(),
            options: &self.session.batchinfer_options(),
            ctx: self.session.ctx(),
            warehouse: self.warehouse.as_ref(),
        };
        crate::confine::check_statement(&statement, &reach)?;
        match statement {
            Statement::Model(m) => self.catalog.run_model_statement(m, &self.session).await,
            Statement::View(v) => self.views().run(v).await,
            Statement::History(name) => {
                let history = crate::delta::history(self.session.ctx(), &name.to_string()).await?;
                self.session.result(history)
            }
            Statement::Vacuum { name, retain_hours } => {
                let ctx = self.session.ctx();
                let vacuumed =
                    crate::delta::maintenance::vacuum(ctx, &name.to_string(), retain_hours).await?;
                self.session.result(vacuumed)
            }
            Statement::Optimize(name) => {
                let ctx = self.session.ctx();
                let optimized = crate::delta::maintenance::optimize(ctx, &name.to_string()).await?;
                self.session.result(optimized)
            }
            Statement::ExplainCost(query) => {
                let (estimates, rows) = self.estimate(*query).await?;
                self.session.cost_table(&estimates, rows)
            }
            Statement::ExplainCostRefresh(name) => {
                self.refuse_estimate_on_a_cluster()?;
                let name = crate::warehouse::object_name("view", &name)?;
                let (estimates, rows) = self.views().estimate_refresh(&name).await?;
                self.session.cost_table(&estimates, rows)
            }
            Statement::Sql(statement) => {
                self.refuse_past_max_cost(&statement).await?;
                let result = self.run_sql(*statement).await;
                self.session.follow_device_option();
                result
            }
        }
    }

    /// What the query `statement` would ask each endpoint model, counted by running it without
    /// asking ([`crate::llm::estimate`]), and the rows it returns.
    async fn estimate(&self, mut statement: DFStatement) -> Result<(Vec<Estimate>, u64)> {
        self.refuse_estimate_on_a_cluster()?;
        let _connected = self.session.connect_stores(&mut statement)?;
        self.session
            .tag_statement(&statement, self.warehouse.as_ref())?;
        let estimates = Estimates::start(&self.session.statement());
        let plan = self.session.plan(statement).await?;
        let plan = crate::rules::estimate_rows::keeping_rows(plan)?;
        let df = self.session.run_plan(plan).await?;
        let mut stream = df.execute_stream().await?;
        let mut rows = 0;
        while let Some(batch) = futures::StreamExt::next(&mut stream).await {
            rows += batch?.num_rows() as u64;
        }
        Ok((estimates.estimates(), rows))
    }

    /// A cluster's executors would send what they count: an estimate is one process's.
    fn refuse_estimate_on_a_cluster(&self) -> Result<()> {
        if matches!(
            self.session.placement(),
            crate::cluster::Placement::Cluster(_)
        ) {
            return Err(Error::Statement(
                "EXPLAIN COST runs in one process, not on a cluster (--remote): run it without \
                 --remote over the same data"
                    .into(),
            ));
        }
        Ok(())
    }

    /// With `batchinfer.max_cost` set, a statement whose endpoint models would cost more (each
    /// reply at `max_tokens`) is refused before it sends anything, naming both figures.
    async fn refuse_past_max_cost(&self, statement: &DFStatement) -> Result<()> {
        let Some(max) = self.session.batchinfer_options().max_cost else {
            return Ok(());
        };
        // On a cluster, each executor stops at it as it runs ([`crate::llm`]'s cluster notes).
        if matches!(
            self.session.placement(),
            crate::cluster::Placement::Cluster(_)
        ) {
            return Ok(());
        }
        let Some(query) = crate::statements::query_of(statement) else {
            return Ok(());
        };
        let plan = self.session.plan(query.clone()).await?;
        if !crate::lineage::calls_endpoints(self.session.registry(), &plan) {
            return Ok(());
        }
        let (estimates, _) = self.estimate(query).await?;
        let cost: f64 = estimates.iter().map(Estimate::charged).sum();
        // What the estimate ran is done with: the statement begins again, as itself.
        self.before_statement().await?;
        if cost <= max {
            return Ok(());
        }
        let requests: u64 = estimates.iter().map(|e| e.requests).sum();
        let tokens: u64 = estimates
            .iter()
            .map(|e| e.prompt_tokens + e.completion_tokens)
            .sum();
        Err(crate::llm::LlmError::Budget(format!(
            "the statement would cost up to ${cost:.6} ({requests} requests, about {tokens} \
             tokens with each reply at max_tokens), over batchinfer.max_cost = '{max}' \
             (${max}): refused before sending anything (EXPLAIN COST shows the estimate by \
             model)"
        ))
        .into())
    }

    /// What each statement begins with: the warehouse's models and tables (and views) as they
    /// are now, and the models shared with a cluster.
    async fn before_statement(&self) -> Result<()> {
        self.session.begin_statement();
        self.catalog.refresh_models().await?;
        // The files of a table are listed again by each statement (one replaced or added to
        // elsewhere is read as it is now).
        let ctx = self.session.ctx();
        if let Some(listings) = ctx.runtime_env().cache_manager.get_list_files_cache() {
            listings.clear();
        }
        self.session
            .placement()
            .share_models(ctx, self.session.registry())
    }

    async fn run_sql(&self, mut statement: DFStatement) -> Result<DataFrame> {
        let connected = self.session.connect_stores(&mut statement)?;
        let result = self.run_connected(statement).await;
        if result.is_err() {
            for key in connected {
                self.session.registry().stores().forget(&key);
            }
        }
        result
    }

    /// [`Engine::run_sql`] once the statement's stores are connected.
    async fn run_connected(&self, statement: DFStatement) -> Result<DataFrame> {
        self.session
            .tag_statement(&statement, self.warehouse.as_ref())?;
        // The views it reads answer with all of their rows, or the statement fails.
        let references = self
            .session
            .ctx()
            .state()
            .resolve_table_references(&statement)?;
        let mut read: Vec<String> = references
            .iter()
            // Views are registered in the default schema: `v`, `public.v`, `datafusion.public.v`.
            .filter(|t| {
                matches!(t.schema(), None | Some("public"))
                    && matches!(t.catalog(), None | Some("datafusion"))
            })
            .map(|t| t.table().to_string())
            .collect();
        if asks_for_names(&statement, &references) {
            self.catalog.list_tables().await?;
        }
        read.extend(tables_named(&statement));
        read.sort();
        read.dedup();
        for table in &read {
            self.views().check_view_files(table).await?;
        }
        for table in tables_named(&statement) {
            let reference = datafusion::common::TableReference::bare(table.as_str());
            if let Ok(provider) = self.session.ctx().table_provider(reference).await {
                self.session.predict_tables().insert(&table, provider);
            }
        }
        match SqlRoute::of(statement, self.warehouse.as_ref()) {
            SqlRoute::Write(statement) => self.writes().write_committed(statement).await,
            SqlRoute::CreateTableAs(warehouse, create) => {
                self.writes().create_table_as(warehouse, &create).await
            }
            SqlRoute::DropTables(warehouse, names, statement) => {
                (self.catalog)
                    .drop_tables(&self.session, warehouse, names, statement)
                    .await
            }
            SqlRoute::ExplainAnalyze(statement) => {
                let df = self.execute(statement).await?;
                self.session.explain_analyzed(df).await
            }
            SqlRoute::Plan(statement) => self.execute(statement).await,
        }
    }

    /// Plans (and for DDL, runs) one parsed DataFusion statement.
    pub async fn execute(&self, statement: DFStatement) -> Result<DataFrame> {
        self.catalog.execute(&self.session, statement).await
    }

    /// Runs REFRESH MATERIALIZED VIEW `name` as a statement of its own (as [`Engine::run`]
    /// does): for `batchinfer refresh`.
    pub async fn refresh(&self, name: &str) -> Result<Refreshed> {
        crate::warehouse::check_name("view", name)?;
        self.before_statement().await?;
        (self.session.access())
            .check_writes("REFRESH MATERIALIZED VIEW")
            .map_err(|e| crate::error::Error::Statement(e.0))?;
        self.views().refresh_view(name).await
    }

    /// Whether materialized view `name` exists.
    pub async fn view_exists(&self, name: &str) -> Result<bool> {
        self.views().view_exists(name).await
    }

    /// Lists the warehouse's tables and views for a statement that asks for every name.
    pub async fn list_tables(&self) -> Result<()> {
        self.catalog.list_tables().await
    }

    /// The statement at hand (the one that just ran, once it ran): what it counts is its own,
    /// whatever other statements or sessions run beside it.
    pub fn statement(&self) -> StatementContext {
        self.session.statement()
    }

    /// The rows `statement` rejected, per model, and the folder they are in (nothing unless
    /// `on_error = 'reject'`): counted from the files, wherever they were written.
    pub async fn rejects_of(
        &self,
        statement: &StatementContext,
    ) -> Result<(Vec<(String, u64)>, String)> {
        crate::rejects::rejected(self.registry().stores(), statement).await
    }

    /// The materialized views, over this engine's session, warehouse and catalog.
    fn views(&self) -> Views<'_> {
        Views::new(&self.session, self.warehouse.as_ref(), &self.catalog)
    }

    /// The writes that appear whole, over this engine's session and catalog.
    fn writes(&self) -> Writes<'_> {
        Writes::new(&self.session, &self.catalog)
    }
}

/// Whether planning `statement` asks for the name of every table (`SHOW TABLES`,
/// `information_schema`) or whether a name is taken (the DDL of external tables and views).
fn asks_for_names(statement: &DFStatement, references: &[TableReference]) -> bool {
    let ddl = match statement {
        DFStatement::CreateExternalTable(_) => true,
        DFStatement::Statement(s) => matches!(
            s.as_ref(),
            SQLStatement::CreateView { .. } | SQLStatement::CreateTable(_)
        ),
        _ => false,
    };
    ddl || references
        .iter()
        .any(|t| t.schema() == Some("information_schema"))
}
