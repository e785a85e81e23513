//! What `embed` reads: record batches gathered across batch and file boundaries, so that its
//! length sort and token budget work over thousands of texts even when the input comes in
//! small pieces (many small files, small row groups, a selective filter).
//!
//! `embed` sorts the texts of the batch it is given by token count and cuts them into
//! micro-batches of similar lengths; it puts the vectors back in the batch's order. Over a batch
//! of 250 texts the sort has little to choose from, and the calls pad more. The plan rule
//! [`EmbedBufferRule`] puts an [`EmbedBufferExec`] under each plan node that computes `embed`
//! of a column: it concatenates consecutive batches of its partition, in order, until they
//! hold [`BUFFER_ROWS`] rows or [`BUFFER_BYTES`] of data, and passes larger batches through.
//! Row order is kept: the batches are joined, never reordered, and `embed` restores the order
//! of what it sorted. Memory is bounded by the caps.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::concat_batches;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateInputMode};
use datafusion::physical_plan::execution_plan::{CardinalityEffect, replace_children_if_necessary};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream,
};
use futures::StreamExt;

/// Rows gathered before `embed` is called: enough for the length sort to find texts of similar
/// lengths; a batch already this large passes through.
pub const BUFFER_ROWS: usize = 4_096;

/// The most memory gathered (the batches' buffers): long texts make fewer rows.
pub const BUFFER_BYTES: usize = 16 << 20;

/// The plan rule: an [`EmbedBufferExec`] under each node that embeds a column.
#[derive(Debug, Default)]
pub struct EmbedBufferRule;

impl EmbedBufferRule {
    /// DataFusion's physical optimizer rules with this one before the projections are pushed
    /// into the scans: a projection that embeds then stays above its buffer, where the rule
    /// put it, instead of running inside the scan, batch by batch.
    pub fn among_default_rules() -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
        let mut rules = PhysicalOptimizer::new().rules;
        let at = rules
            .iter()
            .position(|r| r.name() == "ProjectionPushdown")
            .unwrap_or(rules.len());
        rules.insert(at, Arc::new(EmbedBufferRule));
        rules
    }
}

impl PhysicalOptimizerRule for EmbedBufferRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let [input] = node.children()[..] else {
                return Ok(Transformed::no(node));
            };
            if input.downcast_ref::<EmbedBufferExec>().is_some() || !embeds_a_column(&node)? {
                return Ok(Transformed::no(node));
            }
            let buffered = Arc::new(EmbedBufferExec::new(input.clone()));
            let node = replace_children_if_necessary(node, vec![buffered])?;
            Ok(Transformed::yes(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "batchinfer_embed_buffer"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether one of `node`'s own expressions calls `embed` on something other than a constant
/// (an aggregation's later stages combine states: they call nothing).
fn embeds_a_column(node: &Arc<dyn ExecutionPlan>) -> Result<bool> {
    if let Some(aggregate) = node.downcast_ref::<AggregateExec>()
        && aggregate.mode().input_mode() != AggregateInputMode::Raw
    {
        return Ok(false);
    }
    let mut found = false;
    node.apply_expressions(&mut |expr| {
        expr.apply(|e| {
            if let Some(call) = e.downcast_ref::<ScalarFunctionExpr>()
                && call.name() == "embed"
                && call.args().iter().any(|a| !is_constant(a))
            {
                found = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })
    })?;
    Ok(found)
}

fn is_constant(expr: &Arc<dyn PhysicalExpr>) -> bool {
    expr.downcast_ref::<datafusion::physical_expr::expressions::Literal>()
        .is_some()
}

/// Gathers its input's batches, in order, up to [`BUFFER_ROWS`] rows or [`BUFFER_BYTES`].
#[derive(Debug)]
pub struct EmbedBufferExec {
    input: Arc<dyn ExecutionPlan>,
}

impl EmbedBufferExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        EmbedBufferExec { input }
    }
}

impl DisplayAs for EmbedBufferExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "EmbedBufferExec: rows={BUFFER_ROWS}, bytes={BUFFER_BYTES}"
        )
    }
}

impl ExecutionPlan for EmbedBufferExec {
    fn name(&self) -> &str {
        "EmbedBufferExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    // Rows pass through, as many as come in: limits and filters go on down to the scan.
    fn supports_limit_pushdown(&self) -> bool {
        true
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Equal
    }

    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(FilterPushdownPropagation::if_all(child_pushdown_result))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match (children.pop(), children.is_empty()) {
            (Some(input), true) => Ok(Arc::new(EmbedBufferExec::new(input))),
            _ => datafusion::common::internal_err!("EmbedBufferExec has one input"),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.input.schema();
        let input = self.input.execute(partition, context)?;
        let gathered = futures::stream::unfold(
            (input, None::<RecordBatch>, false),
            |(mut input, mut next, mut ended)| async move {
                let mut held: Vec<RecordBatch> = next.take().into_iter().collect();
                let (mut rows, mut bytes) = held.iter().fold((0, 0), |(r, b), batch| {
                    (r + batch.num_rows(), b + batch.get_array_memory_size())
                });
                while !ended && rows < BUFFER_ROWS && bytes < BUFFER_BYTES {
                    match input.next().await {
                        Some(Ok(batch)) if batch.num_rows() == 0 => {}
                        Some(Ok(batch)) => {
                            // A batch that would pass the caps goes on its own, after those held.
                            let size = batch.get_array_memory_size();
                            if !held.is_empty()
                                && (rows + batch.num_rows() > BUFFER_ROWS
                                    || bytes + size > BUFFER_BYTES)
                            {
                                next = Some(batch);
                                break;
                            }
                            rows += batch.num_rows();
                            bytes += size;
                            held.push(batch);
                        }
                        Some(Err(e)) => return Some((Err(e), (input, None, true))),
                        None => ended = true,
                    }
                }
                let joined = match held.len() {
                    0 => return None,
                    1 => Ok(held.pop().expect("one batch")),
                    _ => concat_batches(&held[0].schema(), &held).map_err(Into::into),
                };
                Some((joined, (input, next, ended)))
            },
        );
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, gathered)))
    }
}
