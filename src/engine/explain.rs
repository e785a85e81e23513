//! What the engine adds to DataFusion's explanations: EXPLAIN ANALYZE's rows per model, and the
//! cause behind "table not found" for an `s3://` path.

use super::*;

impl Engine {
    /// EXPLAIN ANALYZE, with a row per model: rows scored, calls, and time inside the model.
    pub(super) async fn explain_analyze(&self, statement: DFStatement) -> Result<DataFrame> {
        let df = self.execute(statement).await?;
        let before = self.registry.stats_by_model();
        let mut batches = df.collect().await?;
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return self.empty();
        };
        let mut kinds = Vec::new();
        let mut lines = Vec::new();
        for (name, rows, nanos, calls) in self.registry.stats_by_model() {
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
        Ok(self.results.read_batches(batches)?)
    }

    /// DataFusion reports any failure to open `FROM 's3://...'` or `FROM 'path'` as "table not
    /// found"; the store says why (no such object, file or bucket, credentials refused, endpoint
    /// unreachable, not a regular file).
    pub(super) async fn explain_missing_table(&self, err: DataFusionError) -> Error {
        let message = err.to_string();
        let missing = message
            .split_once("table '")
            .and_then(|(_, rest)| rest.split_once("' not found"))
            .map(|(name, _)| name.trim_start_matches("datafusion.public."));
        if let Some(name) = missing
            && crate::warehouse::check_name("view", name).is_ok()
            && self.is_view(name).await.unwrap_or(false)
        {
            // Left out because its manifest lists files that are not its own: that is why.
            if let Some(e) = self.view_paths_refused(name).await {
                return e;
            }
            return Error::view(
                name,
                format!(
                    "materialized view '{name}' has no complete refresh yet (one was interrupted, or \
                 its manifest cannot be read): REFRESH MATERIALIZED VIEW {name}"
                ),
            );
        }
        let Some(name) = message
            .split_once("table '")
            .and_then(|(_, rest)| rest.split_once("' not found"))
            .map(|(name, _)| name.trim_start_matches("datafusion.public."))
            .filter(|name| is_object_store_url(name) || name.contains('/'))
        else {
            return err.into();
        };
        match self.registry.stores().why_nothing_at(name).await {
            Ok(None) => err.into(),
            Ok(Some(why)) => Error::location(name, why),
            Err(e) => Error::location(name, format!("cannot read {name}: {}", display_error(&e))),
        }
    }
}
