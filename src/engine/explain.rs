//! What the engine adds to DataFusion's explanations: EXPLAIN ANALYZE's rows per model, and the
//! cause behind "table not found" for an `s3://` path.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::dataframe::DataFrame;
use datafusion::sql::parser::Statement as DFStatement;

use super::Engine;
use crate::error::Result;

impl Engine {
    /// EXPLAIN ANALYZE, with a row per model: rows scored, calls, and time inside the model.
    pub(super) async fn explain_analyze(&self, statement: DFStatement) -> Result<DataFrame> {
        let df = self.execute(statement).await?;
        let before = self.session.registry().stats_by_model();
        let mut batches = df.collect().await?;
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return self.session.empty();
        };
        let mut kinds = Vec::new();
        let mut lines = Vec::new();
        for (name, rows, nanos, calls) in self.session.registry().stats_by_model() {
            let (r0, n0, c0) = before
                .iter()
                .find(|b| b.0 == name)
                .map_or((0, 0, 0), |b| (b.1, b.2, b.3));
            if calls > c0 {
                kinds.push("batchinfer_model".to_string());
                lines.push(format!(
                    "model '{name}': {} rows scored in {} calls, {:.3} ms inside ONNX Runtime (summed over parallel calls)",
                    rows - r0,
                    calls - c0,
                    (nanos - n0) as f64 / 1e6
                ));
            }
        }
        let (rejected, folder) = self.session.statement_rejects().await?;
        for (name, rows) in rejected {
            kinds.push("batchinfer_rejects".to_string());
            lines.push(format!(
                "model '{name}': {rows} rows rejected, kept in {folder}"
            ));
        }
        if !lines.is_empty() {
            let columns = [kinds, lines]
                .into_iter()
                .zip(schema.fields())
                .map(|(values, field)| {
                    let array: datafusion::arrow::array::ArrayRef =
                        Arc::new(datafusion::arrow::array::StringArray::from(values));
                    datafusion::arrow::compute::cast(&array, field.data_type())
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            batches.push(RecordBatch::try_new(schema.clone(), columns)?);
        }
        self.session.results(batches)
    }
}
