//! A bytes model's files read at their ends alone: where the only use a projection makes of
//! `read_blob`'s `content` is as the file of models that read the first and last blocks of it
//! (batchinfer.json's `"bytes"`, as magika's), the scan below reads those blocks of each file
//! and no more ([`crate::blob::BlobTable::of_ends`]). magika over a bucket of 1 GiB files reads
//! 8 KiB of each, and a file over `batchinfer.max_blob_bytes` is scored rather than refused.
//!
//! The content such a scan gives is not the file's (its middle is left out), so the rule
//! applies only where nothing else can see it: a projection over the scan (through filters and
//! an alias of the table: `FROM read_blob(...) AS f WHERE ...`), where every use of `content`,
//! the filters' and the projection's, is in those calls alone, each of the same block, and the
//! projection passes on no `content` of its own.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::{Expr, Filter, LogicalPlan, Projection, SubqueryAlias, TableScan};
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
        // The filters and the alias between the projection and the scan, top first.
        let mut between = Vec::new();
        let mut node = projection.input.as_ref();
        let scan = loop {
            match node {
                LogicalPlan::TableScan(scan) => break scan,
                LogicalPlan::Filter(Filter { input, .. })
                | LogicalPlan::SubqueryAlias(SubqueryAlias { input, .. }) => {
                    between.push(node);
                    node = input.as_ref();
                }
                _ => return Ok(Transformed::no(plan)),
            }
        };
        let Ok(provider) = source_as_provider(&scan.source) else {
            return Ok(Transformed::no(plan));
        };
        let Some(table) = provider.downcast_ref::<BlobTable>() else {
            return Ok(Transformed::no(plan));
        };
        let Some(mut content) = scan
            .projected_schema
            .columns()
            .into_iter()
            .find(|c| c.name == "content")
        else {
            return Ok(Transformed::no(plan));
        };
        if table.ends().is_some() {
            return Ok(Transformed::no(plan));
        }
        // Every use of `content`, from the scan up, by the name it has there.
        let mut uses = Uses::default();
        for node in between.iter().rev() {
            match node {
                LogicalPlan::Filter(filter) => {
                    uses.add(std::slice::from_ref(&filter.predicate), &content, config)?
                }
                LogicalPlan::SubqueryAlias(alias) => {
                    content = Column::new(Some(alias.alias.clone()), "content")
                }
                _ => {}
            }
        }
        uses.add(&projection.expr, &content, config)?;
        let Some(ends) = uses.block().and_then(|block| table.of_ends(block)) else {
            return Ok(Transformed::no(plan));
        };
        let mut input = LogicalPlan::TableScan(TableScan {
            source: provider_as_source(Arc::new(ends)),
            ..scan.clone()
        });
        for node in between.iter().rev() {
            input = match node {
                LogicalPlan::Filter(filter) => {
                    LogicalPlan::Filter(Filter::try_new(filter.predicate.clone(), Arc::new(input))?)
                }
                LogicalPlan::SubqueryAlias(alias) => LogicalPlan::SubqueryAlias(
                    SubqueryAlias::try_new(Arc::new(input), alias.alias.clone())?,
                ),
                _ => input,
            };
        }
        let projection = Projection::try_new_with_schema(
            projection.expr.clone(),
            Arc::new(input),
            projection.schema.clone(),
        )?;
        Ok(Transformed::yes(LogicalPlan::Projection(projection)))
    }
}

/// The blocks of the bytes models that read `content`, and whether anything else does.
#[derive(Default)]
struct Uses {
    blocks: BTreeSet<u64>,
    other: bool,
}

impl Uses {
    /// The uses of `content` in `exprs`: as the file of a bytes model's `predict`, or other.
    fn add(
        &mut self,
        exprs: &[Expr],
        content: &Column,
        config: &dyn OptimizerConfig,
    ) -> Result<()> {
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
                            self.blocks.insert(block);
                        }
                        None => self.other = true,
                    }
                    return Ok(TreeNodeRecursion::Jump);
                }
                if matches!(e, Expr::Column(c) if c == content) {
                    self.other = true;
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(())
    }

    /// The one block read at each end, where bytes models alone read `content`, all alike.
    fn block(&self) -> Option<u64> {
        match (self.other, self.blocks.len()) {
            (false, 1) => self.blocks.first().copied(),
            _ => None,
        }
    }
}
