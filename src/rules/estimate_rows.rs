//! What an estimate of a statement reads (`EXPLAIN COST`, `max_cost` checked before it runs):
//! a condition that calls a model keeps every row it is asked about, so that what the rows
//! reaching a later call (or the statement's end) are counted at most, whatever the model
//! would answer. The condition is still evaluated, so its own requests are counted.

use std::sync::Arc;

use datafusion::arrow::array::BooleanArray;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::Result;
use datafusion::common::tree_node::Transformed;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    ColumnarValue, Expr, Filter, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};

use super::late_calls::calls_a_model;

/// `plan` with each filter condition that calls a model made one that keeps every row.
pub fn keeping_rows(plan: LogicalPlan) -> Result<LogicalPlan> {
    let keep = Arc::new(ScalarUDF::from(KeepRows::default()));
    plan.transform_up_with_subqueries(|node| {
        let LogicalPlan::Filter(filter) = &node else {
            return Ok(Transformed::no(node));
        };
        let conditions = split_conjunction(&filter.predicate);
        if !conditions.iter().any(|c| calls_a_model(c)) {
            return Ok(Transformed::no(node));
        }
        let kept = conditions.into_iter().map(|c| match calls_a_model(c) {
            true => Expr::ScalarFunction(ScalarFunction::new_udf(keep.clone(), vec![c.clone()])),
            false => c.clone(),
        });
        let Some(predicate) = conjunction(kept) else {
            return Ok(Transformed::no(node));
        };
        let kept = Filter::try_new(predicate, filter.input.clone())?;
        Ok(Transformed::yes(LogicalPlan::Filter(kept)))
    })
    .map(|t| t.data)
}

/// `TRUE` for every row, after its argument (a model's condition) is evaluated.
#[derive(Debug, PartialEq, Eq, Hash)]
struct KeepRows {
    signature: Signature,
}

impl Default for KeepRows {
    fn default() -> Self {
        KeepRows {
            signature: Signature::any(1, Volatility::Volatile),
        }
    }
}

impl ScalarUDFImpl for KeepRows {
    fn name(&self) -> &str {
        "batchinfer_estimate_keeps"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(vec![
            true;
            args.number_rows
        ]))))
    }
}
