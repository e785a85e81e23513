//! What EXPLAIN ANALYZE adds to DataFusion's: a row per model (rows scored, calls, time inside
//! ONNX Runtime) and the rows it rejected.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::dataframe::DataFrame;

use super::Session;
use crate::error::Result;

impl Session {
    /// An EXPLAIN ANALYZE planned as `df`, run, with a row per model: rows scored, calls, and
    /// time inside the model; and a row per model that rejected rows.
    pub async fn explain_analyzed(&self, df: DataFrame) -> Result<DataFrame> {
        let before = self.registry().stats_by_model();
        let llm_before = self.registry().llm_usage_by_model();
        let mut batches = df.collect().await?;
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return self.empty();
        };
        let mut kinds = Vec::new();
        let mut lines = Vec::new();
        for (name, rows, nanos, calls) in self.registry().stats_by_model() {
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
        for (name, usage) in self.registry().llm_usage_by_model() {
            let used = match llm_before.iter().find(|b| b.0 == name) {
                Some((_, before)) => usage.since(before),
                None => usage,
            };
            if !used.is_empty() {
                kinds.push("batchinfer_model".to_string());
                lines.push(format!("model '{name}': {}", used.described()));
            }
        }
        let (rejected, folder) = self.statement_rejects().await?;
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
        self.results(batches)
    }
}
