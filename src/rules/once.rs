//! One model call per row: the optimizer rule that computes each distinct `predict`, `embed`
//! or endpoint model call of a plan node once, however many of its fields the node reads.
//!
//! DataFusion treats `get_field` as free and copies the expression under it wherever a field
//! is read: `predict(..)['label']` and `predict(..)['probabilities']` become two calls
//! (common-subexpression elimination skips field accesses; the rules that push field accesses
//! towards the scan, which inline the call into each one, are off: see `crate::context`), and a
//! filter pushed below the projection that computes a call computes it a second time. Scoring twice doubles the time
//! and, for a model that costs money per call, the bill.
//!
//! A sort evaluates its keys again where it merges partitions and in a top-k, and an aggregate
//! its arguments in each phase, so a call there runs several times per row too.
//!
//! This rule runs after DataFusion's own, in every pass, so the plan it leaves is the one that
//! runs. A call that a node computes more than once, that a node below computes too (through
//! projections, filters, sorts, limits and aliases), or that a sort, window or aggregate
//! computes, becomes one column of a projection below (`__batchinfer_call_N`), which the rest
//! reads. DataFusion's physical planning keeps such a column computed once: projections, and a
//! projection and a scan, are not merged where that would copy a costly expression.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, Result};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection, SubqueryAlias};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use crate::udf::{EmbedUdf, PredictUdf};

/// The optimizer rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct ModelCallsOnce;

impl OptimizerRule for ModelCallsOnce {
    fn name(&self) -> &str {
        "batchinfer_model_calls_once"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let reads_rows = matches!(
            plan,
            LogicalPlan::Projection(_)
                | LogicalPlan::Filter(_)
                | LogicalPlan::Sort(_)
                | LogicalPlan::Aggregate(_)
                | LogicalPlan::Window(_)
        );
        // A sort (its merge and top-k too), a window's ordering and an aggregate's phases
        // evaluate their expressions more than once per row: a call there is computed below.
        let evaluates_again = matches!(
            plan,
            LogicalPlan::Sort(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)
        );
        let (true, [input]) = (reads_rows, &plan.inputs()[..]) else {
            return Ok(Transformed::no(plan));
        };
        // Grouping sets name their columns after the whole set: left as DataFusion plans them.
        if let LogicalPlan::Aggregate(aggregate) = &plan
            && aggregate
                .group_expr
                .iter()
                .any(|e| matches!(e, Expr::GroupingSet(_)))
        {
            return Ok(Transformed::no(plan));
        }
        let here = calls_in(&plan.expressions());
        let mut input = (*input).clone();
        let mut read: Vec<(Expr, Column)> = Vec::new();
        let mut own: Vec<(Expr, Column)> = Vec::new();
        for call in &here {
            if read.iter().chain(&own).any(|(c, _)| c == call) {
                continue;
            }
            // Computed below already (the plan is rewritten from the leaves up): read from there.
            if let Some((exposing, column)) = expose(&input, call, config)? {
                input = exposing;
                read.push((call.clone(), column));
            } else if evaluates_again || here.iter().filter(|c| *c == call).count() > 1 {
                own.push((call.clone(), fresh_column(config)));
            }
        }
        if read.is_empty() && own.is_empty() {
            return Ok(Transformed::no(plan));
        }
        if !own.is_empty() {
            input = computing(&own, Arc::new(input))?;
        }
        read.extend(own);
        let schema = plan.schema().clone();
        let keep_names = matches!(
            plan,
            LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_) | LogicalPlan::Window(_)
        );
        let exprs = reading_all(&plan, plan.expressions(), &read, keep_names)?;
        let node = plan.with_new_exprs(exprs, vec![input])?;
        if node.schema().fields().len() == schema.fields().len() {
            return Ok(Transformed::yes(node));
        }
        // A filter or a sort passes the new columns up: the columns it had are selected again.
        Projection::try_new(columns_of(&schema), Arc::new(node))
            .map(|p| Transformed::yes(LogicalPlan::Projection(p)))
    }
}

/// `plan` rewritten so that its output has a column holding `call`, where it (or a node below,
/// through projections, filters, sorts, limits and aliases) computes the call; None otherwise.
fn expose(
    plan: &LogicalPlan,
    call: &Expr,
    config: &dyn OptimizerConfig,
) -> Result<Option<(LogicalPlan, Column)>> {
    let computes = calls_in(&plan.expressions()).contains(call);
    Ok(match plan {
        LogicalPlan::Projection(p) => {
            if let Some(i) = p.expr.iter().position(|e| bare(e) == call) {
                let column = Column::from(p.schema.qualified_field(i));
                return Ok(Some((plan.clone(), column)));
            }
            let (input, column, exprs) = if computes {
                let column = fresh_column(config);
                let computed = [(call.clone(), column.clone())];
                let input = computing(&computed, p.input.clone())?;
                (
                    input,
                    column.clone(),
                    reading_all(plan, p.expr.clone(), &computed, true)?,
                )
            } else {
                let Some((input, column)) = expose(&p.input, call, config)? else {
                    return Ok(None);
                };
                (input, column, p.expr.clone())
            };
            let mut exprs = exprs;
            if !exprs.contains(&Expr::Column(column.clone())) {
                exprs.push(Expr::Column(column.clone()));
            }
            // A name taken above the call's column: the call is left where it is.
            Projection::try_new(exprs, Arc::new(input))
                .ok()
                .map(|p| (LogicalPlan::Projection(p), column))
        }
        // Nodes that pass their input's columns up (a window adds its own after them).
        LogicalPlan::Filter(_)
        | LogicalPlan::Sort(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Window(_) => {
            let [input] = plan.inputs()[..] else {
                return Ok(None);
            };
            if computes {
                let column = fresh_column(config);
                let computed = [(call.clone(), column.clone())];
                let inner = computing(&computed, Arc::new(input.clone()))?;
                let keep_names = matches!(plan, LogicalPlan::Window(_));
                let exprs = reading_all(plan, plan.expressions(), &computed, keep_names)?;
                Some((plan.with_new_exprs(exprs, vec![inner])?, column))
            } else {
                match expose(input, call, config)? {
                    Some((input, column)) => Some((
                        plan.with_new_exprs(plan.expressions(), vec![input])?,
                        column,
                    )),
                    None => None,
                }
            }
        }
        // Below an alias the call reads the columns under their own names (a filter pushed
        // below `FROM t AS x` reads `t.a` where the select list reads `x.a`).
        LogicalPlan::SubqueryAlias(alias) => {
            match expose(&alias.input, &unaliased(call, alias)?, config)? {
                Some((input, column)) => {
                    let aliased = SubqueryAlias::try_new(Arc::new(input), alias.alias.clone())?;
                    let column = Column::new(Some(alias.alias.clone()), column.name);
                    Some((LogicalPlan::SubqueryAlias(aliased), column))
                }
                None => None,
            }
        }
        _ => None,
    })
}

/// `call` as the input of `alias` names its columns: each column of the alias's schema read as
/// the input's column at the same place.
fn unaliased(call: &Expr, alias: &SubqueryAlias) -> Result<Expr> {
    let inner = alias.input.schema();
    call.clone()
        .transform(|e| match &e {
            Expr::Column(c) => match alias.schema.maybe_index_of_column(c) {
                Some(i) => Ok(Transformed::yes(Expr::Column(Column::from(
                    inner.qualified_field(i),
                )))),
                None => Ok(Transformed::no(e)),
            },
            _ => Ok(Transformed::no(e)),
        })
        .map(|t| t.data)
}

/// `expr` without its aliases.
fn bare(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(alias) => bare(&alias.expr),
        expr => expr,
    }
}

/// A column name no query uses.
fn fresh_column(config: &dyn OptimizerConfig) -> Column {
    Column::new_unqualified(config.alias_generator().next("__batchinfer_call"))
}

/// The columns of `schema`, as expressions.
fn columns_of(schema: &DFSchema) -> Vec<Expr> {
    schema
        .iter()
        .map(|(qualifier, field)| Expr::Column(Column::from((qualifier, field))))
        .collect()
}

/// `exprs` of `node`, each call of `computed` read from its column; with `keep_names`, each
/// expression keeps its output name.
fn reading_all(
    node: &LogicalPlan,
    exprs: Vec<Expr>,
    computed: &[(Expr, Column)],
    keep_names: bool,
) -> Result<Vec<Expr>> {
    let names = NamePreserver::new(node);
    exprs
        .into_iter()
        .map(|expr| {
            let name = names.save(&expr);
            let read = reading(expr, computed)?;
            Ok(if keep_names { name.restore(read) } else { read })
        })
        .collect()
}

/// Whether `expr` is a call of a model function: `predict`, `embed`, or an asynchronous one
/// (an endpoint model's: `generate`, the `ai_*` operators). DataFusion 55 plans the
/// asynchronous calls of an aggregate's arguments under one name per aggregate, so that two
/// aggregates' calls would read one call's column: computed in a projection below, each is its
/// own column.
fn is_model_call(expr: &Expr) -> bool {
    matches!(expr, Expr::ScalarFunction(f)
        if f.func.inner().is::<PredictUdf>()
            || f.func.inner().is::<EmbedUdf>()
            || f.func.as_async().is_some())
}

/// The model calls in `exprs`, each occurrence once (calls inside a call's arguments are the
/// outer call's business), in order.
fn calls_in(exprs: &[Expr]) -> Vec<Expr> {
    let mut calls = Vec::new();
    for expr in exprs {
        let _ = expr.apply(|e| {
            if is_model_call(e) {
                calls.push(e.clone());
                return Ok(TreeNodeRecursion::Jump);
            }
            Ok(TreeNodeRecursion::Continue)
        });
    }
    calls
}

/// A projection of every column of `input`, and each call of `computed` as its column.
fn computing(computed: &[(Expr, Column)], input: Arc<LogicalPlan>) -> Result<LogicalPlan> {
    let mut exprs = columns_of(input.schema());
    exprs.extend(
        computed
            .iter()
            .map(|(call, column)| call.clone().alias(column.name.as_str())),
    );
    Projection::try_new(exprs, input).map(LogicalPlan::Projection)
}

/// `expr` with each call of `computed` read from its column.
fn reading(expr: Expr, computed: &[(Expr, Column)]) -> Result<Expr> {
    expr.transform_down(|e| match computed.iter().find(|(call, _)| *call == e) {
        Some((_, column)) => Ok(Transformed::new(
            Expr::Column(column.clone()),
            true,
            TreeNodeRecursion::Jump,
        )),
        None => Ok(Transformed::no(e)),
    })
    .map(|t| t.data)
}
