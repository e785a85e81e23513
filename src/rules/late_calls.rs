//! Model calls after the rows are chosen: the optimizer rule that moves a top-N (a sort with a
//! limit) below the projection that calls a model, when the sort reads none of its calls.
//!
//! `SELECT id, generate('writer', body) FROM docs ORDER BY id LIMIT 5` is planned by
//! DataFusion as a projection (the calls) under the sort: every row of `docs` is sent to the
//! endpoint, and all but five answers are thrown away. Here the sort moves below the
//! projection, its keys read as the projection computes them (`id` is `docs.id`), so that only
//! the rows it keeps are scored: five requests. The same for `predict`'s compute and `embed`'s.
//!
//! Only where the result is the same: the sort's keys read columns of the projection that are
//! no model call and nothing volatile (a key that is `random()` would be drawn again), and the
//! sort has a limit (a sort without one keeps every row, so nothing is saved). Plain limits,
//! and filters that read no call, need no rule: DataFusion pushes them below projections
//! itself. A filter whose conditions call a model in some (`WHERE page = 1 AND
//! ai_filter(...)`) is split, the others first, so that the model is asked only about the rows
//! they keep. EXPLAIN shows where the calls sit.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, Projection, Sort, SortExpr};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};
use datafusion::physical_expr::{self, PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};

/// The prefix of the columns a moved sort's keys are computed in.
const KEY: &str = "__batchinfer_key";

/// The optimizer rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct ModelCallsLate;

impl OptimizerRule for ModelCallsLate {
    fn name(&self) -> &str {
        "batchinfer_model_calls_late"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if let LogicalPlan::Filter(filter) = &plan {
            return filtered_first(filter);
        }
        let LogicalPlan::Sort(sort) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let (Some(_), LogicalPlan::Projection(projection)) = (sort.fetch, sort.input.as_ref())
        else {
            return Ok(Transformed::no(plan));
        };
        if !projection.expr.iter().any(calls_a_model) {
            return Ok(Transformed::no(plan));
        }
        let Some(keys) = keys_below(&sort.expr, projection)? else {
            return Ok(Transformed::no(plan));
        };
        // The keys are computed below the sort as columns of their own, which the projection
        // above does not pass on: so DataFusion's physical planning, which moves a projection
        // that narrows its input below a sort on columns it passes on, leaves it above.
        let mut below: Vec<Expr> = projection
            .input
            .schema()
            .iter()
            .map(|(qualifier, field)| Expr::Column(Column::from((qualifier, field))))
            .collect();
        let mut sorted_by = Vec::with_capacity(keys.len());
        for key in keys {
            let name = config.alias_generator().next(KEY);
            below.push(key.expr.alias(name.as_str()));
            sorted_by.push(SortExpr::new(
                Expr::Column(Column::new_unqualified(name)),
                key.asc,
                key.nulls_first,
            ));
        }
        let keyed = Projection::try_new(below, projection.input.clone())?;
        let sorted = Sort {
            expr: sorted_by,
            input: Arc::new(LogicalPlan::Projection(keyed)),
            fetch: sort.fetch,
        };
        let above = Projection::try_new_with_schema(
            projection.expr.clone(),
            Arc::new(LogicalPlan::Sort(sorted)),
            projection.schema.clone(),
        )?;
        Ok(Transformed::yes(LogicalPlan::Projection(above)))
    }
}

/// A filter whose conditions (`a AND b AND ...`) call a model in some and not in others, as
/// the filter of the others under the filter of the rest: a model is called only on the rows
/// the other conditions keep (DataFusion evaluates a filter's whole condition on every row it
/// reads).
fn filtered_first(filter: &Filter) -> Result<Transformed<LogicalPlan>> {
    let conditions = split_conjunction(&filter.predicate);
    let (calling, plain): (Vec<&Expr>, Vec<&Expr>) =
        conditions.into_iter().partition(|c| calls_a_model(c));
    if calling.is_empty() || plain.is_empty() {
        return Ok(Transformed::no(LogicalPlan::Filter(filter.clone())));
    }
    let (Some(plain), Some(calling)) = (
        conjunction(plain.into_iter().cloned()),
        conjunction(calling.into_iter().cloned()),
    ) else {
        return Ok(Transformed::no(LogicalPlan::Filter(filter.clone())));
    };
    let first = Filter::try_new(plain, filter.input.clone())?;
    let then = Filter::try_new(calling, Arc::new(LogicalPlan::Filter(first)))?;
    Ok(Transformed::yes(LogicalPlan::Filter(then)))
}

/// The sort's keys as the projection's input reads them, if each reads only columns of the
/// projection that are no model call and nothing volatile.
fn keys_below(keys: &[SortExpr], projection: &Projection) -> Result<Option<Vec<SortExpr>>> {
    let schema = &projection.schema;
    let mut below = Vec::with_capacity(keys.len());
    for key in keys {
        let mut usable = true;
        let expr = key
            .expr
            .clone()
            .transform_up(|e| {
                let Expr::Column(column) = &e else {
                    return Ok(Transformed::no(e));
                };
                let Some(i) = schema.maybe_index_of_column(column) else {
                    usable = false;
                    return Ok(Transformed::no(e));
                };
                let computed = unaliased(&projection.expr[i]);
                if calls_a_model(computed) || computed.is_volatile() {
                    usable = false;
                }
                Ok(Transformed::yes(computed.clone()))
            })?
            .data;
        if !usable || calls_a_model(&expr) || expr.is_volatile() {
            return Ok(None);
        }
        below.push(SortExpr::new(expr, key.asc, key.nulls_first));
    }
    Ok(Some(below))
}

/// `expr` without the aliases on top of it.
fn unaliased(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(alias) => unaliased(&alias.expr),
        expr => expr,
    }
}

/// Whether `expr` calls a model anywhere in it ([`crate::model::MODEL_FUNCTIONS`]).
pub(crate) fn calls_a_model(expr: &Expr) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e
            && crate::model::MODEL_FUNCTIONS.contains(&f.func.name())
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The physical half of [`ModelCallsLate`]'s split of filters: DataFusion's physical planning
/// merges a filter over a filter back into one (and may put the model's condition first), so a
/// filter whose conditions call a model in some and not in others is split again here, the
/// others first, after every rule of DataFusion's.
#[derive(Debug, Default)]
pub struct ModelFiltersLast;

impl PhysicalOptimizerRule for ModelFiltersLast {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(filter) = node.downcast_ref::<FilterExec>() else {
                return Ok(Transformed::no(node));
            };
            let conditions = physical_expr::split_conjunction(filter.predicate());
            let (calling, plain): (Vec<_>, Vec<_>) = conditions
                .into_iter()
                .partition(|c| physical_calls_a_model(c));
            if calling.is_empty() || plain.is_empty() {
                return Ok(Transformed::no(node));
            }
            let first = FilterExecBuilder::new(
                physical_expr::conjunction(plain.into_iter().cloned()),
                filter.input().clone(),
            )
            .with_default_selectivity(filter.default_selectivity())
            .with_batch_size(filter.batch_size())
            .build()?;
            let then = FilterExecBuilder::new(
                physical_expr::conjunction(calling.into_iter().cloned()),
                Arc::new(first),
            )
            .apply_projection_by_ref(filter.projection().as_ref())?
            .with_default_selectivity(filter.default_selectivity())
            .with_batch_size(filter.batch_size())
            .with_fetch(filter.fetch())
            .build()?;
            Ok(Transformed::yes(Arc::new(then) as Arc<dyn ExecutionPlan>))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "batchinfer_model_filters_last"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether a physical expression calls a model anywhere in it.
fn physical_calls_a_model(expr: &Arc<dyn PhysicalExpr>) -> bool {
    let mut found = false;
    let _ = expr.apply(|e| {
        if let Some(f) = e.downcast_ref::<ScalarFunctionExpr>()
            && crate::model::MODEL_FUNCTIONS.contains(&f.name())
        {
            found = true;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The order of a top-N that [`ModelCallsLate`] moved below a model's calls, kept: the calls'
/// projection does not pass the sort's keys on (so that DataFusion does not move it back below
/// the sort), and a plan whose top reads no ordering gets a round robin between the sort and
/// the calls, which would hand the rows out of order once they are more than a batch. Such a
/// round robin is removed, after every rule of DataFusion's: the calls read the sorted rows in
/// one partition (an endpoint's requests of a batch are sent at once all the same).
#[derive(Debug, Default)]
pub struct TopNOrderKept;

impl PhysicalOptimizerRule for TopNOrderKept {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let Some(repartition) = node.downcast_ref::<RepartitionExec>() else {
                return Ok(Transformed::no(node));
            };
            let input = repartition.input();
            // Rows sorted by a moved top-N's keys, which pass through here under their names.
            let keyed = input.output_ordering().is_some()
                && input
                    .schema()
                    .fields()
                    .iter()
                    .any(|f| f.name().starts_with(KEY));
            if keyed && input.output_partitioning().partition_count() == 1 {
                return Ok(Transformed::yes(input.clone()));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "batchinfer_top_n_order_kept"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
