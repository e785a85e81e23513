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

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Schema;
use datafusion::common::TableReference;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    ObjectName, ObjectType, Statement as SQLStatement, Value as SqlValue,
};
use datafusion::sql::sqlparser::dialect::{Dialect, dialect_from_str};

use crate::cluster::Placement;
use crate::config::{BatchInferOptions, EngineConfig};
use crate::context::build_context;
use crate::error::{Error, Result};
use crate::message::{Warnings, display_error};
use crate::model::listing::{describe_batch, models_batch};
use crate::model::{Model, ModelRegistry, ModelSource};
use crate::statement_context::StatementContext;
use crate::statements::{ModelStatement, Statement, parse};
use crate::storage::{StoreRegistry, is_object_store_url};
use crate::udf::predict_table::{ResolvedTables, tables_named};
use crate::warehouse::schema::{Kind, WarehouseSchema};
use crate::warehouse::{Definition, Warehouse, check_name};
use catalog::Seen;

mod catalog;
mod explain;
mod lineage;
mod options;
mod refresh;
mod rejects;
mod views;
mod write;

pub use refresh::Refreshed;

/// A batchinfer engine: run SQL with `predict` over the models it knows.
pub struct Engine {
    ctx: SessionContext,
    /// Where results computed here (model listings, COPY counts, DDL) are handed out from: a
    /// plain context, so that on a cluster they are not sent to the scheduler.
    results: SessionContext,
    registry: Arc<ModelRegistry>,
    config: EngineConfig,
    warehouse: Option<Warehouse>,
    /// The tables `predict_table` calls name, resolved before their statement is planned.
    tables: Arc<ResolvedTables>,
    /// Where statements run: this process, or a cluster.
    placement: Placement,
    /// What this process has seen of the warehouse's models, tables and views.
    seen: Seen,
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
        // Models of --models DIR win over the warehouse's of the same name.
        let folder_models: BTreeSet<String> = match &config.models_dir {
            Some(dir) => registry.register_dir(dir)?.into_iter().collect(),
            None => BTreeSet::new(),
        };
        let tables = Arc::new(ResolvedTables::default());
        let placement = Placement::new(config.remote.as_ref());
        let ctx = build_context(&config, registry.clone(), tables.clone(), |state| {
            placement.finish(state)
        })?;
        let schema = match &warehouse {
            Some(warehouse) => Some(warehouse_schema(&ctx, warehouse)?),
            None => None,
        };
        Ok(Engine {
            ctx,
            placement,
            tables,
            results: SessionContext::new(),
            registry,
            config,
            warehouse,
            seen: Seen {
                folder_models,
                tables: schema,
                ..Seen::default()
            },
        })
    }

    /// [`Engine::new`], with the warehouse's models read and what interrupted writes left of
    /// its tables removed.
    pub async fn open(config: EngineConfig) -> Result<Self> {
        let engine = Self::new(config)?;
        engine.refresh_models().await?;
        if let Some(warehouse) = &engine.warehouse {
            warehouse.remove_abandoned();
        }
        Ok(engine)
    }

    /// The DataFusion context, to register tables or run DataFrame code.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The models this engine knows.
    pub fn registry(&self) -> &Arc<ModelRegistry> {
        &self.registry
    }

    /// Where the engine's statements run.
    pub fn placement(&self) -> &Placement {
        &self.placement
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

    /// Runs one statement of a script.
    pub async fn run(&self, statement: Statement) -> Result<DataFrame> {
        self.before_statement().await?;
        match statement {
            Statement::Model(m) => self.run_model_statement(m).await,
            Statement::View(v) => self.run_view_statement(v).await,
            Statement::Sql(statement) => {
                let result = self.run_sql(*statement).await;
                self.follow_device_option();
                result
            }
        }
    }

    /// What each statement begins with: the warehouse's models and tables (and views) as they
    /// are now, and the models shared with a cluster.
    async fn before_statement(&self) -> Result<()> {
        // A statement of its own, which keeps no rejects until it is tagged, and whose scoring
        // stops at a signal that comes from now on, not at one that came before.
        self.update_statement(|statement| {
            *statement = StatementContext {
                stop_signals_before: crate::stop::signals(),
                ..StatementContext::default()
            }
        });
        crate::storage::footer::set_max_footer_bytes(self.batchinfer_options().max_footer_bytes);
        self.refresh_models().await?;
        // The files of a table are listed again by each statement (one replaced or added to
        // elsewhere is read as it is now).
        if let Some(listings) = self.ctx.runtime_env().cache_manager.get_list_files_cache() {
            listings.clear();
        }
        self.placement.share_models(&self.ctx, &self.registry)
    }

    /// After `SET batchinfer.device = '...'`, models of later statements (their planning too)
    /// load on that device.
    fn follow_device_option(&self) {
        let state = self.ctx.state_ref();
        let device = state
            .read()
            .config()
            .options()
            .extensions
            .get::<BatchInferOptions>()
            .and_then(|options| options.device.map(crate::device::Device::resolve));
        if let Some(device) = device
            && device != self.registry.device()
        {
            self.registry.set_device(device);
        }
    }

    /// CREATE EXTERNAL TABLE, of every kind (files, PostgreSQL, SQLite), by the session's table
    /// factories: the new table is made before the one it replaces (OR REPLACE) is
    /// deregistered, so that one that fails to connect or to read leaves the old one.
    async fn create_external_table(
        &self,
        create: &datafusion::logical_expr::CreateExternalTable,
    ) -> Result<DataFrame> {
        if let Some(database) = crate::database::Database::of(&create.file_type) {
            self.placement
                .reads_databases(&format!("a {} table", database.name()))?;
        }
        let name = create.name.clone();
        if create.temporary {
            return Err(Error::table(&name, "temporary tables are not supported"));
        }
        let exists = match &name {
            TableReference::Bare { table } => self.table_kind(table).await?.is_some(),
            _ => self.ctx.table_exist(name.clone())?,
        };
        if exists {
            if create.if_not_exists {
                return Ok(self.ctx.read_empty()?.limit(0, Some(0))?);
            }
            if !create.or_replace {
                return Err(Error::table(
                    &name,
                    format!(
                        "table '{name}' exists already (CREATE OR REPLACE EXTERNAL TABLE replaces it)"
                    ),
                ));
            }
        }
        let state = self.ctx.state();
        let kind = create.file_type.to_ascii_uppercase();
        let Some(factory) = state.table_factories().get(&kind) else {
            return Err(Error::table(
                &name,
                format!("table '{name}': no table is STORED AS {}", create.file_type),
            ));
        };
        let provider = factory.create(&state, create).await?;
        self.ctx.deregister_table(name.clone())?;
        self.ctx.register_table(name, provider)?;
        Ok(self.ctx.read_empty()?.limit(0, Some(0))?)
    }

    async fn run_sql(&self, mut statement: DFStatement) -> Result<DataFrame> {
        let connected = self.connect_stores(&mut statement)?;
        let result = self.run_connected(statement).await;
        if result.is_err() {
            for key in connected {
                self.registry.stores().forget(&key);
            }
        }
        result
    }

    /// [`Engine::run_sql`] once the statement's stores are connected.
    async fn run_connected(&self, statement: DFStatement) -> Result<DataFrame> {
        self.tag_statement(&statement)?;
        // The views it reads answer with all of their rows, or the statement fails.
        let references = self.ctx.state().resolve_table_references(&statement)?;
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
            self.list_tables().await?;
        }
        read.extend(tables_named(&statement));
        read.sort();
        read.dedup();
        for table in &read {
            self.check_view_files(table).await?;
        }
        for table in tables_named(&statement) {
            let reference = datafusion::common::TableReference::bare(table.as_str());
            if let Ok(provider) = self.ctx.table_provider(reference).await {
                self.tables.insert(&table, provider);
            }
        }
        let writes = |statement: &DFStatement| match statement {
            DFStatement::CopyTo(_) => true,
            DFStatement::Statement(s) => matches!(s.as_ref(), SQLStatement::Insert(_)),
            _ => false,
        };
        match &statement {
            DFStatement::Explain(e) if e.options.analyze && writes(&e.statement) => {
                return self.write_committed(statement).await;
            }
            statement_ if writes(statement_) => return self.write_committed(statement).await,
            _ => {}
        }
        if let (Some(warehouse), DFStatement::Statement(s)) = (&self.warehouse, &statement) {
            match s.as_ref() {
                SQLStatement::CreateTable(ct) if ct.query.is_some() => {
                    return self.create_table_as(warehouse, ct).await;
                }
                SQLStatement::Drop {
                    object_type: ObjectType::Table,
                    names,
                    ..
                } => return self.drop_tables(warehouse, names.clone(), statement).await,
                _ => {}
            }
        }
        if let DFStatement::Explain(explain) = &statement
            && explain.options.analyze
        {
            return self.explain_analyze(statement).await;
        }
        self.execute(statement).await
    }

    /// DROP TABLE: refused for a materialized view; a warehouse table's files are removed (one
    /// that cannot be read too) once DataFusion dropped the others named, the tables this
    /// process registered (an external table, which deletes nothing, even where it reads the
    /// warehouse's files).
    async fn drop_tables(
        &self,
        warehouse: &Warehouse,
        names: Vec<datafusion::sql::sqlparser::ast::ObjectName>,
        mut statement: DFStatement,
    ) -> Result<DataFrame> {
        let (mut owned, mut others) = (Vec::new(), Vec::new());
        for object in names {
            let name = table_name(&object)?;
            match self.table_kind(&name).await? {
                Some(Kind::View) => {
                    return Err(Error::table(
                        &name,
                        format!("'{name}' is a materialized view: DROP MATERIALIZED VIEW {name}"),
                    ));
                }
                Some(Kind::Table) => owned.push(name),
                Some(Kind::Registered) | None => others.push(object),
            }
        }
        let df = match others.is_empty() {
            true => self.empty()?,
            false => {
                if let DFStatement::Statement(s) = &mut statement
                    && let SQLStatement::Drop { names, .. } = s.as_mut()
                {
                    *names = others;
                }
                self.execute(statement).await?
            }
        };
        for name in owned {
            if let Some(schema) = &self.seen.tables {
                schema.forget(&name);
            }
            warehouse.remove_table(&name).await?;
        }
        Ok(df)
    }

    /// Plans (and for DDL, runs) one parsed DataFusion statement.
    pub async fn execute(&self, mut statement: DFStatement) -> Result<DataFrame> {
        crate::udf::by_name::bind_by_name(&mut statement, &self.registry)?;
        crate::udf::names::name_model_columns(&mut statement);
        let plan = match self.ctx.state().statement_to_plan(statement).await {
            Ok(plan) => plan,
            Err(e) => return Err(self.explain_missing_table(e).await),
        };
        if let LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)) = &plan {
            return self.create_external_table(create).await;
        }
        // Again now that planning loaded the query's models: with their hashes.
        self.placement.share_models(&self.ctx, &self.registry)?;
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }

    fn empty(&self) -> Result<DataFrame> {
        Ok(self
            .results
            .read_batch(RecordBatch::new_empty(Arc::new(Schema::empty())))?)
    }
}

/// The session's default schema made the warehouse's ([`WarehouseSchema`]).
fn warehouse_schema(ctx: &SessionContext, warehouse: &Warehouse) -> Result<Arc<WarehouseSchema>> {
    let state = ctx.state();
    let names = &state.config().options().catalog;
    let catalog = ctx
        .catalog(&names.default_catalog)
        .ok_or_else(|| Error::Internal(format!("no catalog '{}'", names.default_catalog)))?;
    let schema = Arc::new(WarehouseSchema::new(
        warehouse.clone(),
        ctx.state_weak_ref(),
    ));
    catalog.register_schema(&names.default_schema, schema.clone())?;
    Ok(schema)
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

/// A warehouse table's name: without schema, normalized as DataFusion does (lower case unless
/// quoted), and a plain name ([`check_name`]).
fn table_name(name: &ObjectName) -> Result<String> {
    object_name("table", name)
}

/// A warehouse object's name (`kind`: table, view), as [`table_name`].
fn object_name(kind: &str, name: &ObjectName) -> Result<String> {
    use datafusion::sql::sqlparser::ast::ObjectNamePart;
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => {
            // As DataFusion normalizes identifiers: ASCII lower case unless quoted.
            let name = match ident.quote_style {
                Some(_) => ident.value.clone(),
                None => ident.value.to_ascii_lowercase(),
            };
            check_name(kind, &name)?;
            Ok(name)
        }
        _ => Err(Error::table(
            name,
            format!("a warehouse {kind} is named without a schema, not '{name}'"),
        )),
    }
}
