//! The exec that reads a `read_blob`'s files, a run of them per partition.

use super::*;

/// Reads the files of a `read_blob`, a run of them per partition.
#[derive(Debug)]
pub(super) struct BlobExec {
    pub(super) files: Arc<Files>,
    /// The columns read, of [`schema`]'s.
    pub(super) columns: Vec<usize>,
    pub(super) schema: SchemaRef,
    pub(super) partitions: usize,
    pub(super) properties: Arc<PlanProperties>,
}

impl BlobExec {
    pub(super) fn new(
        files: Files,
        columns: Vec<usize>,
        schema: SchemaRef,
        partitions: usize,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        BlobExec {
            files: Arc::new(files),
            columns,
            schema,
            partitions,
            properties: Arc::new(properties),
        }
    }
}

impl DisplayAs for BlobExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let read = match (
            self.files.form.reads_content(&self.columns),
            self.files.ends,
        ) {
            (false, _) => "names and sizes only".to_string(),
            (true, None) => "with their content".to_string(),
            (true, Some(block)) => format!("the first and last {block} bytes of each"),
        };
        write!(f, "BlobExec: {} files, {read}", self.files.metas.len())
    }
}

impl ExecutionPlan for BlobExec {
    fn name(&self) -> &str {
        "BlobExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(
            &Arc<dyn datafusion::physical_plan::PhysicalExpr>,
        ) -> datafusion::error::Result<TreeNodeRecursion>,
    ) -> datafusion::error::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _: Arc<TaskContext>,
    ) -> datafusion::error::Result<SendableRecordBatchStream> {
        let files = self.files.clone();
        let range = files.of_partition(partition, self.partitions);
        let batches = files.batches(range.clone(), files.form.reads_content(&self.columns));
        let columns = Arc::new(self.columns.clone());
        let schema = self.schema.clone();
        let stream = if let Form::Frames(sampling) = files.form {
            files.frame_batches(range, sampling, columns, schema)
        } else if files.form == Form::Document {
            futures::stream::iter(batches)
                .map(move |range| {
                    files
                        .clone()
                        .document_batches(range, columns.clone(), schema.clone())
                })
                .flatten()
                .boxed()
        } else {
            futures::stream::iter(batches)
                .then(move |range| files.clone().batch(range, columns.clone(), schema.clone()))
                .boxed()
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            stream,
        )))
    }
}
