//! [`Engine`]: the library's entry point. A SessionContext with batchinfer's functions, and the
//! model registry they read.
//!
//! ```no_run
//! # async fn run() -> batchinfer::Result<()> {
//! use batchinfer::{Engine, EngineConfig};
//! let engine = Engine::new(EngineConfig {
//!     models_dir: Some("data/models".into()),
//!     ..Default::default()
//! })?;
//! let df = engine
//!     .sql("SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score \
//!           FROM 'data/sample/features.parquet'")
//!     .await?;
//! df.show().await?;
//! # Ok(()) }
//! ```

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::sql::parser::{DFParserBuilder, Statement};
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use crate::config::EngineConfig;
use crate::context::build_context;
use crate::error::{Error, Result};
use crate::model::ModelRegistry;

/// A batchinfer engine: run SQL with `predict` over the models it knows.
pub struct Engine {
    ctx: SessionContext,
    registry: Arc<ModelRegistry>,
    config: EngineConfig,
}

impl Engine {
    /// An engine with every model in `config.models_dir` registered (loaded on first use).
    pub fn new(config: EngineConfig) -> Result<Self> {
        let registry = Arc::new(ModelRegistry::new(&config));
        if let Some(dir) = &config.models_dir {
            registry.register_dir(dir)?;
        }
        let ctx = build_context(&config, registry.clone())?;
        Ok(Engine {
            ctx,
            registry,
            config,
        })
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

    /// Plans one SQL statement. DDL and `COPY` run here; queries run when the frame is collected.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let mut statements = self.parse(sql)?;
        if statements.len() != 1 {
            return Err(Error::Usage(format!(
                "expected one SQL statement, found {}; use Engine::statements for scripts",
                statements.len()
            )));
        }
        self.execute(statements.remove(0)).await
    }

    /// Splits a script into statements (`;`-separated), with DataFusion's parser.
    pub fn parse(&self, sql: &str) -> Result<Vec<Statement>> {
        let state = self.ctx.state();
        let dialect_name = state.config().options().sql_parser.dialect.to_string();
        let dialect = dialect_from_str(&dialect_name)
            .ok_or_else(|| Error::Usage(format!("unknown SQL dialect {dialect_name}")))?;
        let statements = DFParserBuilder::new(sql)
            .with_dialect(dialect.as_ref())
            .build()?
            .parse_statements()?;
        Ok(statements.into_iter().collect())
    }

    /// Plans (and for DDL, runs) one parsed statement.
    pub async fn execute(&self, statement: Statement) -> Result<DataFrame> {
        let plan = self.ctx.state().statement_to_plan(statement).await?;
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }
}
