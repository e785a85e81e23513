//! `ai_agg('model', 'instruction', text)` planned as `ai_reduce` over the group's texts: an
//! aggregate's accumulator is given nothing of the statement (its budget, its cache, its
//! rejects), so the group's texts are gathered by `array_agg` (in the order `ai_agg`'s `ORDER
//! BY` gives, else by text, so that the same group makes the same requests and the cache
//! answers them again), and `ai_reduce` (an async function, which has the statement) asks the
//! model in a projection above the aggregate, under the same column name.

use std::sync::Arc;

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result, plan_err};
use datafusion::functions_aggregate::array_agg::array_agg_udaf;
use datafusion::logical_expr::expr::{AggregateFunction, ScalarFunction};
use datafusion::logical_expr::{Aggregate, Expr, LogicalPlan, Projection};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// The optimizer rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct AiAggAsReduce;

impl OptimizerRule for AiAggAsReduce {
    fn name(&self) -> &str {
        "batchinfer_ai_agg_as_reduce"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(aggregate) = &plan else {
            return Ok(Transformed::no(plan));
        };
        if !aggregate.aggr_expr.iter().any(|e| ai_agg_of(e).is_some()) {
            return Ok(Transformed::no(plan));
        }
        let Some(reduce) = config
            .function_registry()
            .and_then(|r| r.udf("ai_reduce").ok())
        else {
            return plan_err!("ai_agg needs ai_reduce, which this session does not have");
        };
        let mut gathered = Vec::with_capacity(aggregate.aggr_expr.len());
        // (name, model, instruction) of each ai_agg, by its place among the aggregates.
        let mut reduced: Vec<Option<(Expr, Expr)>> = Vec::new();
        for expr in &aggregate.aggr_expr {
            let Some(call) = ai_agg_of(expr) else {
                gathered.push(expr.clone());
                reduced.push(None);
                continue;
            };
            let name = expr.schema_name().to_string();
            let [
                model @ Expr::Literal(..),
                instruction @ Expr::Literal(..),
                text,
            ] = &call.params.args[..]
            else {
                return plan_err!(
                    "ai_agg takes an endpoint model's name, an instruction (both literals) and \
                     the texts: ai_agg('writer', 'Summarize the complaints', body)"
                );
            };
            let order_by = match call.params.order_by.is_empty() {
                false => call.params.order_by.clone(),
                true => vec![text.clone().sort(true, false)],
            };
            let texts = Expr::AggregateFunction(AggregateFunction::new_udf(
                array_agg_udaf(),
                vec![text.clone()],
                call.params.distinct,
                call.params.filter.clone(),
                order_by,
                None,
            ));
            gathered.push(texts.alias(name));
            reduced.push(Some((model.clone(), instruction.clone())));
        }
        let texts = Aggregate::try_new(
            aggregate.input.clone(),
            aggregate.group_expr.clone(),
            gathered,
        )?;
        // The grouping columns (and a grouping set's id) come before the aggregates.
        let groups = texts.schema.fields().len() - texts.aggr_expr.len();
        let schema = texts.schema.clone();
        let exprs: Vec<Expr> = schema
            .iter()
            .enumerate()
            .map(|(i, (qualifier, field))| {
                let column = Expr::Column(Column::from((qualifier, field)));
                match i
                    .checked_sub(groups)
                    .and_then(|k| reduced.get(k).cloned().flatten())
                {
                    Some((model, instruction)) => Expr::ScalarFunction(ScalarFunction::new_udf(
                        reduce.clone(),
                        vec![model, instruction, column],
                    ))
                    .alias(field.name()),
                    None => column,
                }
            })
            .collect();
        let reducing = Projection::try_new(exprs, Arc::new(LogicalPlan::Aggregate(texts)))?;
        Ok(Transformed::yes(LogicalPlan::Projection(reducing)))
    }
}

/// The `ai_agg` call `expr` is (under its alias), if it is one.
fn ai_agg_of(expr: &Expr) -> Option<&AggregateFunction> {
    match expr {
        Expr::Alias(alias) => ai_agg_of(&alias.expr),
        Expr::AggregateFunction(f) if f.func.name() == "ai_agg" => Some(f),
        _ => None,
    }
}
