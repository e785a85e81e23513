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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::Schema;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::config::TableParquetOptions;
use datafusion::dataframe::{DataFrame, DataFrameWriteOptions};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::prelude::ParquetReadOptions;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::{DFParserBuilder, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    CreateTable, ObjectName, ObjectType, Statement as SQLStatement,
};
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use crate::config::EngineConfig;
use crate::context::build_context;
use crate::error::{Error, Result};
use crate::model::listing::{describe_batch, models_batch};
use crate::model::{Model, ModelRegistry};
use crate::statements::{ModelStatement, Statement, split};
use crate::warehouse::Warehouse;

/// A batchinfer engine: run SQL with `predict` over the models it knows.
pub struct Engine {
    ctx: SessionContext,
    registry: Arc<ModelRegistry>,
    config: EngineConfig,
    warehouse: Option<Warehouse>,
}

impl Engine {
    /// An engine with the models of `config.models_dir` and of the warehouse registered (loaded on
    /// first use). Warehouse tables are attached by [`Engine::open`].
    pub fn new(config: EngineConfig) -> Result<Self> {
        let registry = Arc::new(ModelRegistry::new(&config));
        let warehouse = config.warehouse.as_ref().map(Warehouse::new);
        if let Some(warehouse) = &warehouse {
            for (name, source) in warehouse.models()? {
                registry.register(&name, Path::new(&source));
            }
        }
        // Models of --models DIR win over the warehouse's of the same name.
        if let Some(dir) = &config.models_dir {
            registry.register_dir(dir)?;
        }
        let ctx = build_context(&config, registry.clone())?;
        Ok(Engine {
            ctx,
            registry,
            config,
            warehouse,
        })
    }

    /// [`Engine::new`], with the warehouse's tables registered by name.
    pub async fn open(config: EngineConfig) -> Result<Self> {
        let engine = Self::new(config)?;
        if let Some(warehouse) = &engine.warehouse {
            warehouse.remove_abandoned_staging();
            for name in warehouse.tables()? {
                let dir = warehouse.table_dir(&name);
                engine
                    .ctx
                    .register_parquet(&name, &dir_url(&dir), ParquetReadOptions::default())
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

    /// Splits a script into statements (`;`-separated).
    pub fn statements(&self, sql: &str) -> Result<Vec<Statement>> {
        split(sql)
    }

    /// Runs one statement of a script.
    pub async fn run(&self, statement: Statement) -> Result<DataFrame> {
        match statement {
            Statement::Model(m) => self.run_model_statement(m).await,
            Statement::Sql(sql) => self.run_sql(&sql).await,
        }
    }

    /// Parses one statement with DataFusion's parser, in the session's dialect.
    fn parse_sql(&self, sql: &str) -> Result<Option<DFStatement>> {
        let dialect_name = self
            .ctx
            .state()
            .config()
            .options()
            .sql_parser
            .dialect
            .to_string();
        let dialect = dialect_from_str(&dialect_name)
            .ok_or_else(|| Error::Usage(format!("unknown SQL dialect {dialect_name}")))?;
        let mut parsed = DFParserBuilder::new(sql)
            .with_dialect(dialect.as_ref())
            .build()?
            .parse_statements()?;
        Ok(parsed.pop_front())
    }

    async fn run_sql(&self, sql: &str) -> Result<DataFrame> {
        let Some(statement) = self.parse_sql(sql)? else {
            return self.empty();
        };
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
                    let names: Vec<String> = names.iter().map(table_name).collect::<Result<_>>()?;
                    let df = self.execute(statement).await?;
                    for name in names {
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
        Ok(self.ctx.read_batches(batches)?)
    }

    /// Plans (and for DDL, runs) one parsed DataFusion statement.
    pub async fn execute(&self, statement: DFStatement) -> Result<DataFrame> {
        let plan = self.ctx.state().statement_to_plan(statement).await?;
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }

    fn empty(&self) -> Result<DataFrame> {
        Ok(self
            .ctx
            .read_batch(RecordBatch::new_empty(Arc::new(Schema::empty())))?)
    }

    /// CREATE TABLE name AS query, into the warehouse: written to a staging folder, with the
    /// models and model hashes that produced it in each file's metadata, then committed by rename.
    async fn create_table_as(&self, warehouse: &Warehouse, ct: &CreateTable) -> Result<DataFrame> {
        let name = table_name(&ct.name)?;
        if self.ctx.table_exist(name.as_str())? {
            if ct.if_not_exists {
                return self.empty();
            }
            if !ct.or_replace {
                return Err(Error::Usage(format!(
                    "table '{name}' already exists (use CREATE OR REPLACE TABLE)"
                )));
            }
        }
        let query = ct
            .query
            .clone()
            .ok_or_else(|| Error::Usage("CREATE TABLE AS needs a query".into()))?;
        let df = self
            .execute(DFStatement::Statement(Box::new(SQLStatement::Query(query))))
            .await?;
        let models = self.models_used(df.logical_plan())?;
        let mut options = TableParquetOptions::default();
        options
            .key_value_metadata
            .insert("batchinfer.models".to_string(), Some(models.clone()));
        let schema = df.schema().inner().clone();
        let staging = warehouse.staging_dir(&name)?;
        let written = df
            .write_parquet(
                &dir_url(&staging),
                DataFrameWriteOptions::new(),
                Some(options),
            )
            .await
            .map_err(Error::from)
            .and_then(|_| write_schema_if_empty(&staging, schema, &models));
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
        if self.ctx.table_exist(name.as_str())? {
            self.ctx.deregister_table(name.as_str())?;
        }
        let dir = warehouse.commit(&staging, &name)?;
        self.ctx
            .register_parquet(&name, &dir_url(&dir), ParquetReadOptions::default())
            .await?;
        self.empty()
    }

    /// JSON naming each model a plan calls (by literal name) with its file's sha256.
    fn models_used(&self, plan: &LogicalPlan) -> Result<String> {
        let mut names = BTreeMap::new();
        plan.apply(|node| {
            node.apply_expressions(|expr| {
                expr.apply(|e| {
                    if let Expr::ScalarFunction(f) = e
                        && matches!(f.name(), "predict" | "embed")
                        && let Some(Expr::Literal(
                            ScalarValue::Utf8(Some(n)) | ScalarValue::Utf8View(Some(n)),
                            _,
                        )) = f.args.first()
                    {
                        names.insert(n.clone(), ());
                    }
                    Ok(TreeNodeRecursion::Continue)
                })
            })
        })?;
        let models: Vec<serde_json::Value> = names
            .keys()
            .filter_map(|n| self.registry.get(n).ok())
            .map(|m| serde_json::json!({"name": m.name, "sha256": m.sha256, "source": m.path.display().to_string()}))
            .collect();
        Ok(serde_json::Value::Array(models).to_string())
    }

    async fn run_model_statement(&self, statement: ModelStatement) -> Result<DataFrame> {
        match statement {
            ModelStatement::Create {
                name,
                source,
                or_replace,
            } => {
                if self.registry.contains(&name) && !or_replace {
                    return Err(Error::Usage(format!(
                        "model '{name}' already exists (use CREATE OR REPLACE MODEL, or DROP MODEL {name})"
                    )));
                }
                let path = model_file(&source)?;
                let model = Model::load(&name, &path, self.registry.session_options())?;
                self.registry.insert_loaded(&name, Arc::new(model));
                self.persist_models(|models| {
                    models.insert(name.clone(), path.display().to_string());
                })?;
                self.empty()
            }
            ModelStatement::Drop { name, if_exists } => {
                if !self.registry.unregister(&name) && !if_exists {
                    return Err(Error::UnknownModel {
                        name,
                        available: format!("the models are: {}", self.registry.names().join(", ")),
                    });
                }
                self.persist_models(|models| {
                    models.remove(&name);
                })?;
                self.empty()
            }
            ModelStatement::Show => Ok(self.ctx.read_batch(models_batch(&self.registry)?)?),
            ModelStatement::Describe { name } => {
                let model = self.registry.get(&name)?;
                Ok(self.ctx.read_batch(describe_batch(&model)?)?)
            }
        }
    }

    fn persist_models(&self, change: impl FnOnce(&mut BTreeMap<String, String>)) -> Result<()> {
        if let Some(warehouse) = &self.warehouse {
            let mut models = warehouse.models()?;
            change(&mut models);
            warehouse.save_models(&models)?;
        }
        Ok(())
    }
}

/// The model file a CREATE MODEL source names: a `.onnx` file, or a folder with `model.onnx`;
/// made absolute so that the definition means the same in a process started elsewhere.
fn model_file(source: &str) -> Result<PathBuf> {
    let path = PathBuf::from(source);
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

/// A table name without schema, normalized as DataFusion does (lower case unless quoted).
fn table_name(name: &ObjectName) -> Result<String> {
    use datafusion::sql::sqlparser::ast::ObjectNamePart;
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => Ok(match ident.quote_style {
            Some(_) => ident.value.clone(),
            None => ident.value.to_lowercase(),
        }),
        _ => Err(Error::Usage(format!(
            "warehouse tables are named without a schema, not '{name}'"
        ))),
    }
}

/// An empty result writes no file; a table needs one to carry its schema.
fn write_schema_if_empty(
    dir: &Path,
    schema: datafusion::arrow::datatypes::SchemaRef,
    models: &str,
) -> Result<()> {
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::metadata::KeyValue;
    use datafusion::parquet::file::properties::WriterProperties;
    let has_files = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
        .next()
        .is_some();
    if has_files {
        return Ok(());
    }
    let path = dir.join("part-0.parquet");
    let file = std::fs::File::create(&path)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(vec![KeyValue::new(
            "batchinfer.models".to_string(),
            models.to_string(),
        )]))
        .build();
    let writer =
        ArrowWriter::try_new(file, schema, Some(props)).map_err(|e| Error::Usage(e.to_string()))?;
    writer.close().map_err(|e| Error::Usage(e.to_string()))?;
    Ok(())
}

/// A folder as a listing-table location (trailing slash: every file in it).
fn dir_url(dir: &Path) -> String {
    let mut s = dir.display().to_string();
    if !s.ends_with('/') {
        s.push('/');
    }
    s
}
