//! `DESCRIBE HISTORY`: a table's commits, newest first.

use super::*;

/// The columns of `DESCRIBE HISTORY`, newest commit first.
pub fn history_schema() -> SchemaRef {
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    Arc::new(Schema::new(vec![
        Field::new("version", DataType::UInt64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("operation", DataType::Utf8, true),
        Field::new("operation_parameters", DataType::Utf8, true),
        Field::new("read_version", DataType::UInt64, true),
        Field::new("engine_info", DataType::Utf8, true),
        Field::new("info", DataType::Utf8, true),
    ]))
}

/// `DESCRIBE HISTORY name`: each commit of the Delta table `name` (a table of the session
/// `ctx`), newest first, with what its commit says of itself (Delta's commit info: the
/// operation and its parameters, the engine that wrote it, and the rest of what it recorded).
pub async fn history(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
) -> Result<datafusion::arrow::array::RecordBatch> {
    use datafusion::arrow::array::{
        RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
    };
    let provider = ctx.table_provider(name).await?;
    let Some(table) = provider.downcast_ref::<DeltaTableProvider>() else {
        return Err(Error::table(
            name,
            format!(
                "DESCRIBE HISTORY reads a Delta table's log; '{name}' is not a Delta table \
                 (CREATE EXTERNAL TABLE {name} STORED AS DELTATABLE LOCATION '...')"
            ),
        ));
    };
    let (versions, infos) =
        deltalake_core::logstore::get_all_versions_from(table.log_store.clone(), 0)
            .await
            .map_err(|e| delta_error(&table.name, &table.location, e))?;
    let mut rows: Vec<_> = versions.into_iter().zip(infos).collect();
    rows.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    let text = |map: &std::collections::HashMap<String, serde_json::Value>| {
        (!map.is_empty()).then(|| serde_json::to_string(&sorted(map)).unwrap_or_default())
    };
    let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(v, _)| *v))),
        Arc::new(
            TimestampMillisecondArray::from_iter(rows.iter().map(|(_, c)| c.timestamp))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| c.operation.clone()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter()
                .map(|(_, c)| c.operation_parameters.as_ref().and_then(text)),
        )),
        Arc::new(UInt64Array::from_iter(
            rows.iter().map(|(_, c)| c.read_version),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| c.engine_info.clone()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| text(&c.info)),
        )),
    ];
    Ok(RecordBatch::try_new(history_schema(), columns)?)
}

/// A JSON object's entries in key order (a `HashMap` has none), so that the text is the same
/// each time.
pub(super) fn sorted(
    map: &std::collections::HashMap<String, serde_json::Value>,
) -> BTreeMap<&String, &serde_json::Value> {
    map.iter().collect()
}
