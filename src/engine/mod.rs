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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Schema;
use datafusion::config::ExtensionOptions;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::ParquetReadOptions;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    ObjectName, ObjectType, Statement as SQLStatement, Value as SqlValue,
};
use datafusion::sql::sqlparser::dialect::{Dialect, dialect_from_str};
use datafusion_cli::object_storage::AwsOptions;
use futures::StreamExt;
use object_store::ObjectStoreExt;
use url::Url;

use crate::cluster::Placement;
use crate::config::{BatchInferOptions, EngineConfig};
use crate::context::build_context;
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::model::listing::{describe_batch, models_batch};
use crate::model::{Model, ModelRegistry, ModelSource};
use crate::statements::{ModelStatement, Statement, parse};
use crate::storage::{StoreRegistry, is_object_store_url, location_url, object_path};
use crate::udf::predict_table::{ResolvedTables, tables_named};
use crate::warehouse::{Warehouse, check_name};

mod write;

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
}

impl Engine {
    /// An engine with the models of `config.models_dir` and of the warehouse registered (loaded on
    /// first use). Warehouse tables are attached by [`Engine::open`].
    pub fn new(config: EngineConfig) -> Result<Self> {
        let stores = Arc::new(StoreRegistry::new());
        let registry = Arc::new(ModelRegistry::new(&config, stores.clone()));
        let warehouse = config
            .warehouse
            .as_ref()
            .map(|root| Warehouse::new(root, stores))
            .transpose()?;
        if let Some(warehouse) = &warehouse {
            warehouse.move_legacy_models()?;
            registry.register_sources(&warehouse.models()?)?;
        }
        // Models of --models DIR win over the warehouse's of the same name.
        if let Some(dir) = &config.models_dir {
            registry.register_dir(dir)?;
        }
        let tables = Arc::new(ResolvedTables::default());
        let placement = Placement::new(config.remote.as_ref());
        let ctx = build_context(&config, registry.clone(), tables.clone(), |state| {
            placement.finish(state)
        })?;
        Ok(Engine {
            ctx,
            placement,
            tables,
            results: SessionContext::new(),
            registry,
            config,
            warehouse,
        })
    }

    /// [`Engine::new`], with the warehouse's tables registered by name.
    pub async fn open(config: EngineConfig) -> Result<Self> {
        let engine = Self::new(config)?;
        if let Some(warehouse) = &engine.warehouse {
            if warehouse.bucket().is_none() {
                warehouse.remove_abandoned_staging();
            }
            for name in warehouse.tables()? {
                engine
                    .ctx
                    .register_parquet(
                        &name,
                        &warehouse.table_location(&name)?,
                        ParquetReadOptions::default(),
                    )
                    .await?;
            }
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
            return Err(Error::Usage(format!(
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
        dialect_from_str(&name).ok_or_else(|| Error::Usage(format!("unknown SQL dialect {name}")))
    }

    /// Runs one statement of a script.
    pub async fn run(&self, statement: Statement) -> Result<DataFrame> {
        self.placement.share_models(&self.ctx, &self.registry)?;
        match statement {
            Statement::Model(m) => self.run_model_statement(m).await,
            Statement::Sql(statement) => {
                let result = self.run_sql(*statement).await;
                self.follow_device_option();
                result
            }
        }
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
            .and_then(BatchInferOptions::device);
        if let Some(device) = device
            && device != self.registry.device()
        {
            self.registry.set_device(device);
        }
    }

    async fn run_sql(&self, mut statement: DFStatement) -> Result<DataFrame> {
        self.connect_stores(&mut statement)?;
        for table in tables_named(&statement) {
            let reference = datafusion::common::TableReference::bare(table.as_str());
            if let Ok(provider) = self.ctx.table_provider(reference).await {
                self.tables.insert(&table, provider);
            }
        }
        match &statement {
            DFStatement::CopyTo(_) => return self.copy_committed(statement).await,
            DFStatement::Statement(s) => {
                if let SQLStatement::Insert(insert) = s.as_ref() {
                    let targets = self.insert_targets(insert).await?;
                    return self.write_committed(statement, &targets).await;
                }
            }
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
                } => {
                    let mut owned = Vec::new();
                    for name in names {
                        let name = table_name(name)?;
                        if self.is_warehouse_table(warehouse, &name).await? {
                            owned.push(name);
                        }
                    }
                    let df = self.execute(statement).await?;
                    for name in owned {
                        warehouse.remove_table(&name)?;
                    }
                    return Ok(df);
                }
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

    /// Connects the buckets a statement names with its `OPTIONS`, then blanks the values of the
    /// options that are secrets (keys, tokens, passwords) in the statement, so that no plan,
    /// table definition or error printed from it shows them.
    fn connect_stores(&self, statement: &mut DFStatement) -> Result<()> {
        match statement {
            DFStatement::CopyTo(copy) => {
                self.connect_with_options(&copy.target, &copy.options)?;
                redact(&mut copy.options);
            }
            DFStatement::CreateExternalTable(table) => {
                for location in &table.locations {
                    self.connect_with_options(location, &table.options)?;
                }
                redact(&mut table.options);
            }
            DFStatement::Explain(explain) => self.connect_stores(&mut explain.statement)?,
            _ => {}
        }
        Ok(())
    }

    /// `OPTIONS ('aws.region' '...', 'aws.endpoint' '...')` on an `s3://` location: the bucket
    /// is connected with them (over the environment's settings).
    fn connect_with_options(&self, location: &str, options: &[(String, SqlValue)]) -> Result<()> {
        let aws: Vec<(&String, String)> = options
            .iter()
            .filter(|(key, _)| key.starts_with("aws."))
            .map(|(key, value)| (key, option_text(value)))
            .collect();
        if aws.is_empty() || !is_object_store_url(location) {
            return Ok(());
        }
        let mut options = AwsOptions::default();
        for (key, value) in aws {
            options.set(key, &value)?;
        }
        self.registry
            .stores()
            .connect_s3(&parse_url(location)?, &options)?;
        Ok(())
    }

    /// EXPLAIN ANALYZE, with a row per model: rows scored, calls, and time inside the model.
    async fn explain_analyze(&self, statement: DFStatement) -> Result<DataFrame> {
        let df = self.execute(statement).await?;
        let before = self.registry.stats_by_model();
        let mut batches = df.collect().await?;
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return self.empty();
        };
        let mut kinds = Vec::new();
        let mut lines = Vec::new();
        for (name, rows, nanos, calls) in self.registry.stats_by_model() {
            let (r0, n0, c0) = before
                .iter()
                .find(|b| b.0 == name)
                .map_or((0, 0, 0), |b| (b.1, b.2, b.3));
            if calls > c0 {
                kinds.push("batchinfer_model".to_string());
                lines.push(format!(
                    "model '{name}': {} rows scored in {} calls, {:.3} ms inside ONNX Runtime (summed over parallel calls)",
                    rows - r0,
                    calls - c0,
                    (nanos - n0) as f64 / 1e6
                ));
            }
        }
        if !lines.is_empty() {
            let columns = [kinds, lines]
                .into_iter()
                .zip(schema.fields())
                .map(|(values, field)| {
                    let array: datafusion::arrow::array::ArrayRef =
                        Arc::new(datafusion::arrow::array::StringArray::from(values));
                    datafusion::arrow::compute::cast(&array, field.data_type())
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            batches.push(RecordBatch::try_new(schema.clone(), columns)?);
        }
        Ok(self.results.read_batches(batches)?)
    }

    /// Plans (and for DDL, runs) one parsed DataFusion statement.
    pub async fn execute(&self, statement: DFStatement) -> Result<DataFrame> {
        let plan = match self.ctx.state().statement_to_plan(statement).await {
            Ok(plan) => plan,
            Err(e) => return Err(self.explain_missing_table(e).await),
        };
        // Again now that planning loaded the query's models: with their hashes.
        self.placement.share_models(&self.ctx, &self.registry)?;
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }

    /// DataFusion reports any failure to open `FROM 's3://...'` as "table not found"; the object
    /// store says why (no such object or bucket, credentials refused, endpoint unreachable).
    async fn explain_missing_table(&self, err: DataFusionError) -> Error {
        let message = err.to_string();
        let Some(name) = message
            .split_once("table '")
            .and_then(|(_, rest)| rest.split_once("' not found"))
            .map(|(name, _)| name.trim_start_matches("datafusion.public."))
            .filter(|name| is_object_store_url(name))
        else {
            return err.into();
        };
        let Ok(url) = parse_url(name) else {
            return err.into();
        };
        let probe = async {
            let store = self.registry.stores().store_for(&url)?;
            let path = object_path(&url)?;
            match store.head(&path).await {
                Ok(_) => return Ok(true),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::from(e)),
            }
            Ok(store.list(Some(&path)).next().await.transpose()?.is_some())
        };
        match probe.await {
            Ok(true) => err.into(),
            Ok(false) => Error::Usage(format!(
                "no object at {name}: nothing is stored under that key"
            )),
            Err(e) => Error::Usage(format!("cannot read {name}: {}", display_error(&e))),
        }
    }

    fn empty(&self) -> Result<DataFrame> {
        Ok(self
            .results
            .read_batch(RecordBatch::new_empty(Arc::new(Schema::empty())))?)
    }

    async fn run_model_statement(&self, statement: ModelStatement) -> Result<DataFrame> {
        match statement {
            ModelStatement::Create {
                name,
                source,
                or_replace,
            } => {
                check_name("model", &name)?;
                if self.registry.contains(&name) && !or_replace {
                    return Err(Error::Usage(format!(
                        "model '{name}' already exists (use CREATE OR REPLACE MODEL, or DROP MODEL {name})"
                    )));
                }
                let source = model_source(&source)?;
                let model = Model::load(
                    &name,
                    &source,
                    self.registry.session_options(),
                    self.registry.stores(),
                )?;
                self.registry.insert_loaded(&name, Arc::new(model));
                self.persist_models(&name, Some(&source))?;
                self.empty()
            }
            ModelStatement::Drop { name, if_exists } => {
                if !self.registry.unregister(&name) && !if_exists {
                    return Err(Error::UnknownModel {
                        name,
                        available: format!("the models are: {}", self.registry.names().join(", ")),
                    });
                }
                self.persist_models(&name, None)?;
                self.empty()
            }
            ModelStatement::Show => Ok(self.results.read_batch(models_batch(&self.registry)?)?),
            ModelStatement::Describe { name } => {
                let model = self.registry.get(&name)?;
                Ok(self.results.read_batch(describe_batch(&model)?)?)
            }
        }
    }

    fn persist_models(&self, name: &str, source: Option<&ModelSource>) -> Result<()> {
        match (&self.warehouse, source) {
            (Some(warehouse), Some(source)) => warehouse.save_model(name, &source.to_string()),
            (Some(warehouse), None) => warehouse.remove_model(name),
            (None, _) => Ok(()),
        }
    }

    /// Whether `name` is registered as the warehouse's table of that name (not an external
    /// table that happens to share it), so that DROP TABLE deletes only files the warehouse owns.
    async fn is_warehouse_table(&self, warehouse: &Warehouse, name: &str) -> Result<bool> {
        use datafusion::datasource::listing::ListingTable;
        let Ok(provider) = self.ctx.table_provider(name).await else {
            return Ok(false);
        };
        let Some(listing) = provider.downcast_ref::<ListingTable>() else {
            return Ok(false);
        };
        let owned = location_url(&warehouse.table_location(name)?)?;
        Ok(listing
            .table_paths()
            .iter()
            .any(|path| path.get_url() == &owned))
    }

    /// The folders an INSERT writes into: the locations of its target table.
    async fn insert_targets(
        &self,
        insert: &datafusion::sql::sqlparser::ast::Insert,
    ) -> Result<Vec<String>> {
        use datafusion::datasource::listing::ListingTable;
        use datafusion::sql::sqlparser::ast::TableObject;
        let TableObject::TableName(name) = &insert.table else {
            return Ok(Vec::new());
        };
        let Ok(provider) = self.ctx.table_provider(name.to_string()).await else {
            return Ok(Vec::new());
        };
        Ok(provider
            .downcast_ref::<ListingTable>()
            .map(|listing| {
                listing
                    .table_paths()
                    .iter()
                    .map(|path| path.get_url().to_string())
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// The model file a CREATE MODEL source names: a `.onnx` file, or a folder with `model.onnx`,
/// local or in S3; a local path is made absolute so that the definition means the same in a
/// process started elsewhere.
fn model_source(source: &str) -> Result<ModelSource> {
    let mut url = match ModelSource::parse(source).map_err(Error::Usage)? {
        ModelSource::Object(url) => url,
        ModelSource::File(path) => return model_file(&path, source).map(ModelSource::File),
    };
    if !url.path().ends_with(".onnx") {
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        url = url
            .join("model.onnx")
            .map_err(|e| Error::Usage(format!("{source}: {e}")))?;
    }
    Ok(ModelSource::Object(url))
}

fn model_file(path: &Path, source: &str) -> Result<PathBuf> {
    let path = path.to_path_buf();
    let path = if path.is_dir() {
        path.join("model.onnx")
    } else {
        path
    };
    if !path.is_file() {
        return Err(Error::Usage(format!(
            "no model at '{source}': expected an .onnx file or a folder holding model.onnx"
        )));
    }
    std::path::absolute(&path).map_err(|e| Error::io(format!("resolving {source}"), e))
}

/// A warehouse table's name: without schema, normalized as DataFusion does (lower case unless
/// quoted), and a plain name ([`check_name`]).
fn table_name(name: &ObjectName) -> Result<String> {
    use datafusion::sql::sqlparser::ast::ObjectNamePart;
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => {
            let name = match ident.quote_style {
                Some(_) => ident.value.clone(),
                None => ident.value.to_lowercase(),
            };
            check_name("table", &name)?;
            Ok(name)
        }
        _ => Err(Error::Usage(format!(
            "warehouse tables are named without a schema, not '{name}'"
        ))),
    }
}

/// An `s3://` location as a URL.
fn parse_url(location: &str) -> Result<Url> {
    Url::parse(location).map_err(|e| Error::Usage(format!("'{location}' is not a valid URL: {e}")))
}

/// What a secret option's value reads as once the statement has used it.
const REDACTED: &str = "<redacted>";

/// Blanks the values of the options whose name says they are secret.
fn redact(options: &mut [(String, SqlValue)]) {
    for (key, value) in options {
        let key = key.to_ascii_lowercase();
        if ["secret", "token", "password", "key"]
            .iter()
            .any(|word| key.contains(word))
        {
            *value = SqlValue::SingleQuotedString(REDACTED.to_string());
        }
    }
}

/// The text of a SQL option's value (`'us-east-1'`, `true`, `9000`).
fn option_text(value: &SqlValue) -> String {
    match value {
        SqlValue::SingleQuotedString(s) | SqlValue::DoubleQuotedString(s) => s.clone(),
        other => other.to_string(),
    }
}
