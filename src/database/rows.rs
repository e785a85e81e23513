//! What batchinfer adds to a database table's provider: a scan that reads no column (`SELECT
//! count(*)`) asks the database for one and drops it (the providers return a column there,
//! which DataFusion refuses), and an INSERT whose input fails reports that failure, not what
//! the provider makes of it ("Query is not read-only" when SQLite rolls back).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Constraints, DataFusionError, Result, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;
use parking_lot::Mutex;

use super::Database;

/// A database table's provider, as batchinfer hands it to DataFusion.
#[derive(Debug)]
pub(super) struct DatabaseTable {
    pub(super) inner: Arc<dyn TableProvider>,
    pub(super) database: Database,
    /// A SQLite table's file and name: its INSERTs are batchinfer's own
    /// ([`super::sqlite_insert`]), the provider only reads.
    pub(super) sqlite: Option<super::sqlite_insert::SqliteTarget>,
}

impl DatabaseTable {
    /// Whether the database answers `filter` as DataFusion does, so that it may run there. Only
    /// what is known to agree is sent: comparisons, `BETWEEN`, `IN` and `IS [NOT] NULL` of a
    /// column with finite literals, combined with `AND`, `OR`, `NOT`, over numbers, dates,
    /// timestamps and booleans. The rest runs in DataFusion, on the rows read: text (databases
    /// compare it by their collations, `NOCASE` columns, `char(n)` padding, enums, SQLite's
    /// case-insensitive `LIKE`), PostgreSQL's `real` (compared with literals in double
    /// precision), casts, functions and arithmetic (time zones, text formats, division by zero).
    fn agrees_on(&self, filter: &Expr) -> bool {
        let schema = self.schema();
        let column = |e: &Expr| match e {
            Expr::Column(column) => schema
                .field_with_name(&column.name)
                .is_ok_and(|f| self.comparable(f.data_type())),
            _ => false,
        };
        let literal = |e: &Expr| match e {
            Expr::Literal(value, _) if !value.is_null() => {
                let data_type = value.data_type();
                self.comparable(&data_type)
                    && match value {
                        ScalarValue::Float64(Some(v)) => v.is_finite(),
                        _ => true,
                    }
            }
            _ => false,
        };
        match filter {
            Expr::BinaryExpr(binary) => match binary.op {
                Operator::And | Operator::Or => {
                    self.agrees_on(&binary.left) && self.agrees_on(&binary.right)
                }
                Operator::Eq
                | Operator::NotEq
                | Operator::Lt
                | Operator::LtEq
                | Operator::Gt
                | Operator::GtEq => {
                    (column(&binary.left) && literal(&binary.right))
                        || (literal(&binary.left) && column(&binary.right))
                }
                _ => false,
            },
            Expr::Not(inner) => self.agrees_on(inner),
            Expr::Between(between) => {
                column(&between.expr) && literal(&between.low) && literal(&between.high)
            }
            Expr::InList(list) => column(&list.expr) && list.list.iter().all(literal),
            Expr::IsNull(inner) | Expr::IsNotNull(inner) => matches!(**inner, Expr::Column(_)),
            _ => false,
        }
    }

    /// The types whose comparisons the database makes as DataFusion does.
    fn comparable(&self, data_type: &DataType) -> bool {
        use DataType::*;
        match data_type {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float64 | Boolean
            | Date32 | Date64 => true,
            Timestamp(_, _) => true,
            // PostgreSQL compares a real with a literal in double precision.
            Float32 => self.database == Database::Sqlite,
            _ => false,
        }
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
            if !self.agrees_on(filter) {
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
        Ok(Arc::new(Around::new("DatabaseScan", scan, None)))
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The input's first error, kept for the statement's message.
        let failure: Arc<Mutex<Option<DataFusionError>>> = Arc::new(Mutex::new(None));
        let kept = failure.clone();
        let keep: OnError = Arc::new(move |e| {
            kept.lock().get_or_insert(e);
            DataFusionError::Execution("the rows to insert failed".into())
        });
        let input = Arc::new(Around::new("InsertInput", input, Some(keep)));
        let insert = match &self.sqlite {
            Some(target) => {
                super::sqlite_insert::insert_into(target, self.schema(), input, insert_op)?
            }
            None => self.inner.insert_into(state, input, insert_op).await?,
        };
        let report: OnError =
            Arc::new(move |e| failure.lock().take().unwrap_or_else(|| with_causes(e)));
        Ok(Arc::new(Around::new(
            "DatabaseInsert",
            insert,
            Some(report),
        )))
    }
}

/// The database's own error with what it says under it: the providers' messages stop at "db
/// error" or "Unable to insert", the server's reason (a constraint, a value) is a source of
/// theirs.
fn with_causes(err: DataFusionError) -> DataFusionError {
    DataFusionError::Execution(crate::message::with_causes(&err))
}

/// What [`Around`] does to the errors of the plan it wraps.
type OnError = Arc<dyn Fn(DataFusionError) -> DataFusionError + Send + Sync>;

/// A plan around another, which it runs as it is, its errors mapped. Around a database's scan it
/// takes no filter pushed down the physical plan (an `ExecutionPlan`'s default): the filters
/// that reach the scan went through [`DatabaseTable::supports_filters_pushdown`]. Around an
/// INSERT's input it keeps the input's first error; around the INSERT it reports that one.
struct Around {
    plan: Arc<dyn ExecutionPlan>,
    name: &'static str,
    on_error: Option<OnError>,
}

impl Around {
    fn new(name: &'static str, plan: Arc<dyn ExecutionPlan>, on_error: Option<OnError>) -> Self {
        Around {
            plan,
            name,
            on_error,
        }
    }
}

impl fmt::Debug for Around {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.name).field("plan", &self.plan).finish()
    }
}

impl DisplayAs for Around {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

impl ExecutionPlan for Around {
    fn name(&self) -> &str {
        self.name
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.plan.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.plan]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (Some(plan), None) = (children.pop(), children.pop()) else {
            return Err(DataFusionError::Internal(format!(
                "{} wraps one plan",
                self.name
            )));
        };
        Ok(Arc::new(Around::new(
            self.name,
            plan,
            self.on_error.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let stream = self.plan.execute(partition, context)?;
        let Some(on_error) = self.on_error.clone() else {
            return Ok(stream);
        };
        let schema = stream.schema();
        let mapped = stream.map(move |batch| batch.map_err(|e| on_error(e)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, mapped)))
    }
}
