//! Tables whose lists claim more values per row than any batch could hold are refused, naming
//! the table and the column: an analyzer rule, which runs before DataFusion builds anything from
//! a table's types.

use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::config::ConfigOptions;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::AnalyzerRule;

use crate::statements::limits::MAX_LIST_VALUES_PER_ROW;

/// Refuses a query over a table with a list column of more than [`MAX_LIST_VALUES_PER_ROW`]
/// values per row, naming the table and the column.
#[derive(Debug, Default)]
pub struct TableSchemaLimits;

impl AnalyzerRule for TableSchemaLimits {
    fn analyze(
        &self,
        plan: LogicalPlan,
        _config: &ConfigOptions,
    ) -> datafusion::error::Result<LogicalPlan> {
        // Subqueries too: a table read only inside `IN (...)`, `EXISTS (...)` or a scalar
        // subquery is refused as one in FROM is (and as a cluster's scheduler, which sees them as
        // joins, refuses it).
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(scan) = node {
                for field in scan.source.schema().fields() {
                    if let Some(values) = oversized(field) {
                        return Err(DataFusionError::Plan(format!(
                            "table {}: column '{}' is {} ({values} values per row); batchinfer \
                             reads lists of at most {MAX_LIST_VALUES_PER_ROW} values per row",
                            scan.table_name,
                            field.name(),
                            field.data_type()
                        )));
                    }
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "input limits"
    }
}

/// The values per row of `field` when a fixed-size list in it holds more than the limit.
fn oversized(field: &Field) -> Option<i64> {
    fn values(data_type: &DataType) -> i64 {
        match data_type {
            DataType::FixedSizeList(item, n) => {
                i64::from(*n).saturating_mul(values(item.data_type()).max(1))
            }
            DataType::List(item) | DataType::LargeList(item) | DataType::ListView(item) => {
                values(item.data_type())
            }
            DataType::Struct(fields) => fields
                .iter()
                .map(|f| values(f.data_type()))
                .fold(0i64, i64::saturating_add),
            DataType::Map(entry, _) => values(entry.data_type()),
            _ => 1,
        }
    }
    let n = values(field.data_type());
    (n > MAX_LIST_VALUES_PER_ROW).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_table_read_only_in_a_subquery_is_checked_too() {
        use datafusion::arrow::datatypes::Schema;
        use datafusion::datasource::MemTable;
        use datafusion::prelude::SessionContext;
        let float = Arc::new(Field::new_list_field(DataType::Float32, true));
        let wide = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::FixedSizeList(float, 1 << 23), true),
        ]));
        let small = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let ctx = SessionContext::new();
        for (name, schema) in [("wide", wide), ("small", small)] {
            let table = MemTable::try_new(schema, vec![vec![]]).unwrap();
            ctx.register_table(name, Arc::new(table)).unwrap();
        }
        for sql in [
            "SELECT id FROM wide",
            "SELECT * FROM small WHERE id IN (SELECT id FROM wide)",
            "SELECT * FROM small WHERE EXISTS (SELECT 1 FROM wide)",
            "SELECT (SELECT max(id) FROM wide) FROM small",
        ] {
            let plan = ctx.state().create_logical_plan(sql).await.unwrap();
            let e = TableSchemaLimits
                .analyze(plan, &ConfigOptions::default())
                .expect_err(sql);
            assert!(e.to_string().contains("column 'v'"), "{sql}: {e}");
        }
        let plan = ctx
            .state()
            .create_logical_plan("SELECT id FROM small")
            .await
            .unwrap();
        assert!(
            TableSchemaLimits
                .analyze(plan, &ConfigOptions::default())
                .is_ok()
        );
    }

    #[test]
    fn lists_are_counted_per_row_through_nesting() {
        let float = Arc::new(Field::new_list_field(DataType::Float32, true));
        let fsl = |n: i32, item: Arc<Field>| DataType::FixedSizeList(item, n);
        assert_eq!(
            oversized(&Field::new("v", fsl(384, float.clone()), true)),
            None
        );
        assert_eq!(
            oversized(&Field::new("v", fsl(i32::MAX, float.clone()), true)),
            Some(i64::from(i32::MAX))
        );
        let inner = Arc::new(Field::new_list_field(fsl(4096, float), true));
        assert_eq!(
            oversized(&Field::new("v", fsl(4096, inner), true)),
            Some(4096 * 4096)
        );
    }
}
