//! Video frames kept in the record batches they are decoded in: above a `read_frames` scan, a
//! filter would otherwise gather thousands of rows (the session's batch size) before passing
//! them on: at 2.7 MB a 720p frame, gigabytes, and past Arrow's 2 GiB in one column; and a
//! round robin among partitions queues batches for a partition whose model is busy, as fast as
//! they are decoded. [`FrameBatchesRule`] makes each `FilterExec` over such a scan pass its
//! batches on as they come, and takes out the round robins (the scan has the session's
//! partitions already; one that follows a `LIMIT` scores in one partition, the model on every
//! core) ([`crate::blob`] bounds them: at most
//! 64 MiB of pixels), so memory stays flat and a `LIMIT` is answered from the first frames.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::repartition::RepartitionExec;

/// The batch size given to filters above frames: a batch of at least one row
/// (half of it) passes through whole.
const AS_THEY_COME: usize = 2;

/// The plan rule: see the module's documentation.
#[derive(Debug, Default)]
pub struct FrameBatchesRule;

impl PhysicalOptimizerRule for FrameBatchesRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if !over_frames(&node)? {
                return Ok(Transformed::no(node));
            }
            if let Some(repartition) = node.downcast_ref::<RepartitionExec>()
                && matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
            {
                return Ok(Transformed::yes(repartition.input().clone()));
            }
            if let Some(filter) = node.downcast_ref::<FilterExec>()
                && filter.batch_size() > AS_THEY_COME
            {
                return Ok(Transformed::yes(Arc::new(
                    filter.with_batch_size(AS_THEY_COME)?,
                )));
            }
            Ok(Transformed::no(node))
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "batchinfer_frame_batches"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `plan` reads video frames somewhere beneath it.
fn over_frames(plan: &Arc<dyn ExecutionPlan>) -> Result<bool> {
    let mut found = false;
    plan.apply(|node| {
        found = crate::blob::reads_frames(node.as_ref());
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    Ok(found)
}
