//! A bytes model's files read at their ends alone: where the only use a projection makes of
//! `read_blob`'s `content` is as the file of models that read the first and last blocks of it
//! (batchinfer.json's `"bytes"`, as magika's), the scan below reads those blocks of each file
//! and no more ([`crate::blob::BlobTable::of_ends`]). magika over a bucket of 1 GiB files reads
//! 8 KiB of each, and a file over `batchinfer.max_blob_bytes` is scored rather than refused.
//!
//! The content such a scan gives is not the file's (its middle is left out), so the rule
//! applies only where nothing else can see it: the projection right above the scan (or above a
//! filter of it that does not read `content`) uses `content` in those calls alone, each of the
//! same block, and passes on no `content` of its own.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, Projection, TableScan};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use crate::blob::BlobTable;
use crate::udf::PredictUdf;

/// The optimizer rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct FileEndsOnly;

impl OptimizerRule for FileEndsOnly {
    fn name(&self) -> &str {
        "batchinfer_file_ends_only"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Projection(projection) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let (scan, filter) = match projection.input.as_ref() {
            LogicalPlan::TableScan(scan) => (scan, None),
            LogicalPlan::Filter(filter) => match filter.input.as_ref() {
                LogicalPlan::TableScan(scan) => (scan, Some(filter)),
                _ => return Ok(Transformed::no(plan)),
            },
            _ => return Ok(Transformed::no(plan)),
        };
        let Ok(provider) = source_as_provider(&scan.source) else {
            return Ok(Transformed::no(plan));
        };
        let Some(table) = provider.downcast_ref::<BlobTable>() else {
            return Ok(Transformed::no(plan));
        };
        let Some(content) = scan
            .projected_schema
            .columns()
            .into_iter()
            .find(|c| c.name == "content")
        else {
            return Ok(Transformed::no(plan));
        };
        if table.ends().is_some()
            || filter.is_some_and(|f| f.predicate.column_refs().contains(&content))
        {
            return Ok(Transformed::no(plan));
        }
        let Some(block) = ends_read(&projection.expr, &content, config)? else {
            return Ok(Transformed::no(plan));
        };
        let Some(ends) = table.of_ends(block) else {
            return Ok(Transformed::no(plan));
        };
        let scan = LogicalPlan::TableScan(TableScan {
            source: provider_as_source(Arc::new(ends)),
            ..scan.clone()
        });
        let input = match filter {
            Some(filter) => {
                LogicalPlan::Filter(Filter::try_new(filter.predicate.clone(), Arc::new(scan))?)
            }
            None => scan,
        };
        let projection = Projection::try_new_with_schema(
            projection.expr.clone(),
            Arc::new(input),
            projection.schema.clone(),
        )?;
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    }
}

/// The block each end of a file `exprs` read, where they use `content` only as the file of
/// bytes models' `predict` calls, of one block; None where they use it otherwise, or not.
fn ends_read(
    exprs: &[Expr],
    content: &Column,
    config: &dyn OptimizerConfig,
) -> Result<Option<u64>> {
    let mut blocks = BTreeSet::new();
    let mut other_use = false;
    for expr in exprs {
        expr.apply(|e| {
            if let Expr::ScalarFunction(call) = e
                && let Some(predict) = call.func.inner().downcast_ref::<PredictUdf>()
                && let [
                    Expr::Literal(ScalarValue::Utf8(Some(name)), _),
                    Expr::Column(c),
                    rest @ ..,
                ] = call.args.as_slice()
                && c == content
                && rest.len() <= 1
                && rest
                    .iter()
                    .all(|r| matches!(r, Expr::Column(n) if n != content))
            {
                match predict.bytes_block(name, Some(&config.options())) {
                    Some(block) => {
                        blocks.insert(block);
                    }
                    None => other_use = true,
                }
                return Ok(TreeNodeRecursion::Jump);
            }
            if matches!(e, Expr::Column(c) if c == content) {
                other_use = true;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    Ok(match (other_use, blocks.len()) {
        (false, 1) => blocks.pop_first(),
        _ => None,
    })
}
