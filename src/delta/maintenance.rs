//! The upkeep of a Delta table, from delta-rs: `VACUUM name [RETAIN n HOURS]` deletes the files
//! no version within the retention names, and `OPTIMIZE name` rewrites small files as fewer
//! larger ones (one commit that adds them and removes those they replace: readers of older
//! versions still read theirs).
//!
//! VACUUM deletes what the log removed longer ago than the retention (7 days, or the table's
//! `delta.deletedFileRetentionDuration`, unless `RETAIN n HOURS` says otherwise), and files no
//! version names (a statement that was killed before it committed) only once older than a day
//! at least, so that no statement still writing loses its files.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use deltalake_core::DeltaTable;
use deltalake_core::operations::vacuum::VacuumMode;

use super::{DeltaTableProvider, delta_error};
use crate::error::{Error, Result};

/// The youngest a file no version names may be when VACUUM deletes it, in hours.
pub const UNNAMED_FILES_KEPT_HOURS: u64 = 24;

/// The Delta table `name` of the session `ctx`, loaded at its newest version, for `what`.
async fn newest(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
    what: &str,
) -> Result<(DeltaTable, String)> {
    let provider = ctx.table_provider(name).await?;
    let Some(table) = provider.downcast_ref::<DeltaTableProvider>() else {
        return Err(Error::table(
            name,
            format!("{what} is for Delta tables; '{name}' is not one"),
        ));
    };
    if !table.warehouse && table.version.is_some() {
        return Err(Error::table(
            name,
            format!(
                "{what}: '{name}' reads one version of its table (OPTIONS 'version' or 'timestamp'); name the table itself"
            ),
        ));
    }
    let mut delta = DeltaTable::new(table.log_store.clone());
    delta
        .load()
        .await
        .map_err(|e| delta_error(&table.name, &table.location, e))?;
    Ok((delta, table.location.clone()))
}

/// `VACUUM name [RETAIN n HOURS]` (see the module's text): how many files it deleted.
pub async fn vacuum(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
    retain_hours: Option<u64>,
) -> Result<RecordBatch> {
    let (table, location) = newest(ctx, name, "VACUUM").await?;
    let error = |e| delta_error(name, &location, e);
    let hours = |n: u64| chrono::Duration::hours(i64::try_from(n).unwrap_or(i64::MAX / 3_600_000));
    let mut deleted = 0;
    let table = match retain_hours {
        Some(n) if n < UNNAMED_FILES_KEPT_HOURS => {
            // What the log removed, older than n hours.
            let (table, metrics) = table
                .vacuum()
                .with_mode(VacuumMode::Lite)
                .with_retention_period(hours(n))
                .with_enforce_retention_duration(false)
                .await
                .map_err(error)?;
            deleted += metrics.files_deleted.len();
            table
        }
        _ => table,
    };
    let full = table
        .vacuum()
        .with_mode(VacuumMode::Full)
        .with_enforce_retention_duration(false);
    let full = match retain_hours {
        Some(n) => full.with_retention_period(hours(n.max(UNNAMED_FILES_KEPT_HOURS))),
        None => full,
    };
    let (_, metrics) = full.await.map_err(error)?;
    deleted += metrics.files_deleted.len();
    let schema = Schema::new(vec![Field::new("files_deleted", DataType::UInt64, false)]);
    Ok(RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(UInt64Array::from(vec![deleted as u64]))],
    )?)
}

/// `OPTIMIZE name`: the files it added and removed.
pub async fn optimize(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
) -> Result<RecordBatch> {
    let (table, location) = newest(ctx, name, "OPTIMIZE").await?;
    let (_, metrics) = table
        .optimize()
        .await
        .map_err(|e| delta_error(name, &location, e))?;
    let schema = Schema::new(vec![
        Field::new("files_added", DataType::UInt64, false),
        Field::new("files_removed", DataType::UInt64, false),
    ]);
    Ok(RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(UInt64Array::from(vec![metrics.num_files_added])),
            Arc::new(UInt64Array::from(vec![metrics.num_files_removed])),
        ],
    )?)
}
