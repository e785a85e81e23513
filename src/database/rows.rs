//! What batchinfer adds to a database table's provider: a scan that reads no column (`SELECT
//! count(*)`) asks the database for one and drops it (the providers return a column there,
//! which DataFusion refuses), and an INSERT whose input fails reports that failure, not what
//! the provider makes of it ("Query is not read-only" when SQLite rolls back).

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Constraints, DataFusionError, Result};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::Database;

/// A database table's provider, as batchinfer hands it to DataFusion.
#[derive(Debug)]
pub(super) struct DatabaseTable {
    pub(super) inner: Arc<dyn TableProvider>,
    pub(super) database: Database,
}

impl DatabaseTable {
    /// Whether the database would answer `filter` otherwise than DataFusion: SQLite's `LIKE`
    /// ignores the case of ASCII letters and has no `ILIKE`; PostgreSQL compares a `real`
    /// column with a literal in double precision (`r = 20.1` is false for the real 20.1).
    fn answers_otherwise(&self, filter: &Expr) -> bool {
        let schema = self.schema();
        filter
            .exists(|e| {
                Ok(match (self.database, e) {
                    (Database::Sqlite, Expr::Like(_) | Expr::SimilarTo(_)) => true,
                    (Database::Postgres, Expr::Literal(value, _)) => {
                        value.data_type() == DataType::Float32
                    }
                    (Database::Postgres, Expr::Column(column)) => schema
                        .field_with_name(&column.name)
                        .is_ok_and(|f| f.data_type() == &DataType::Float32),
                    _ => false,
                })
            })
            .unwrap_or(true)
    }
}

#[async_trait]
impl TableProvider for DatabaseTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.inner.constraints()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        let mut pushed = self.inner.supports_filters_pushdown(filters)?;
        for (filter, pushed) in filters.iter().zip(pushed.iter_mut()) {
            if self.answers_otherwise(filter) {
                *pushed = TableProviderFilterPushDown::Unsupported;
            }
        }
        Ok(pushed)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let scan: Arc<dyn ExecutionPlan> = match projection {
            Some(columns) if columns.is_empty() && !self.schema().fields().is_empty() => {
                let one = self
                    .inner
                    .scan(state, Some(&vec![0]), filters, limit)
                    .await?;
                let none: Vec<(Arc<dyn PhysicalExpr>, String)> = Vec::new();
                Arc::new(ProjectionExec::try_new(none, one)?)
            }
            projection => self.inner.scan(state, projection, filters, limit).await?,
        };
        // The filters the database may run reached it above; the others stay where DataFusion
        // put them (the providers' scans also take filters pushed down the physical plan).
        Ok(Arc::new(Fence { scan }))
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let failure = Arc::new(Mutex::new(None));
        let input = Arc::new(Witness {
            input,
            failure: failure.clone(),
        });
        let insert = self.inner.insert_into(state, input, insert_op).await?;
        Ok(Arc::new(Reported { insert, failure }))
    }
}

/// The database's own error with what it says under it: the providers' messages stop at "db
/// error" or "Unable to insert", the server's reason (a constraint, a value) is a source of
/// theirs.
fn with_causes(err: DataFusionError) -> DataFusionError {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    DataFusionError::Execution(text)
}

/// A database scan that takes no filter pushed down the physical plan: those that reach it
/// went through [`DatabaseTable::supports_filters_pushdown`].
#[derive(Debug)]
struct Fence {
    scan: Arc<dyn ExecutionPlan>,
}

impl DisplayAs for Fence {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DatabaseScan")
    }
}

impl ExecutionPlan for Fence {
    fn name(&self) -> &str {
        "DatabaseScan"
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.scan.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.scan]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Fence {
            scan: children.swap_remove(0),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.scan.execute(partition, context)
    }
}

/// The first error of an INSERT's input, kept for the statement's message.
type Failure = Arc<Mutex<Option<DataFusionError>>>;

/// An INSERT's input, whose first error is kept (the provider gets a stand-in).
#[derive(Debug)]
struct Witness {
    input: Arc<dyn ExecutionPlan>,
    failure: Failure,
}

/// The INSERT, whose error is that of its input where the input failed.
#[derive(Debug)]
struct Reported {
    insert: Arc<dyn ExecutionPlan>,
    failure: Failure,
}

impl DisplayAs for Witness {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "InsertInput")
    }
}

impl DisplayAs for Reported {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "DatabaseInsert")
    }
}

impl ExecutionPlan for Witness {
    fn name(&self) -> &str {
        "InsertInput"
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Witness {
            input: children.swap_remove(0),
            failure: self.failure.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let failure = self.failure.clone();
        let stream = self.input.execute(partition, context)?;
        let schema = stream.schema();
        let kept = stream.map(move |batch| {
            batch.map_err(|e| {
                let mut first = failure.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert(e);
                DataFusionError::Execution("the rows to insert failed".into())
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, kept)))
    }
}

impl ExecutionPlan for Reported {
    fn name(&self) -> &str {
        "DatabaseInsert"
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.insert.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.insert]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Reported {
            insert: children.swap_remove(0),
            failure: self.failure.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let failure = self.failure.clone();
        let stream = self.insert.execute(partition, context)?;
        let schema = stream.schema();
        let reported = stream.map(move |batch| {
            batch.map_err(|e| {
                failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_else(|| with_causes(e))
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, reported)))
    }
}
