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
use object_store::ObjectStoreExt;

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
///
/// delta-rs says what it would delete (a dry run); what is deleted is only what the log once
/// named (files a version removed), and files no version names that are batchinfer's own
/// writes' (`data-<uuid>/*.parquet`, a killed statement's): nothing else the folder holds, and
/// nothing through a symbolic link ([`crate::storage::beneath`]).
pub async fn vacuum(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
    retain_hours: Option<u64>,
) -> Result<RecordBatch> {
    let (table, location) = newest(ctx, name, "VACUUM").await?;
    let error = |e| delta_error(name, &location, e);
    let check = ctx
        .state()
        .config()
        .options()
        .extensions
        .get::<crate::config::BatchInferOptions>()
        .is_none_or(|o| o.vacuum_retention_check);
    if let Some(n) = retain_hours
        && check
    {
        let state = table.snapshot().map_err(error)?;
        let kept =
            deltalake_core::table::config::TablePropertiesExt::deleted_file_retention_duration(
                state.table_config(),
            );
        if u128::from(n) * 3_600_000 < kept.as_millis() {
            return Err(Error::table(
                name,
                format!(
                    "VACUUM {name} RETAIN {n} HOURS is under the table's retention of {} hours \
                     (delta.deletedFileRetentionDuration): readers of its older versions and \
                     writers still running could lose their files. SET \
                     batchinfer.vacuum_retention_check = false to vacuum anyway",
                    kept.as_secs().div_ceil(3600)
                ),
            ));
        }
    }
    let hours = |n: u64| chrono::Duration::hours(i64::try_from(n).unwrap_or(i64::MAX / 3_600_000));
    let dry_run = |mode: VacuumMode, retain: Option<u64>| {
        let builder = table
            .clone()
            .vacuum()
            .with_mode(mode)
            .with_dry_run(true)
            .with_enforce_retention_duration(false);
        let builder = match retain {
            Some(n) => builder.with_retention_period(hours(n)),
            None => builder,
        };
        async move {
            let (_, metrics) = builder.await.map_err(error)?;
            Ok::<_, Error>(metrics.files_deleted)
        }
    };
    // Files a version removed, older than the retention.
    let mut doomed: std::collections::BTreeSet<String> = dry_run(VacuumMode::Lite, retain_hours)
        .await?
        .into_iter()
        .collect();
    // Files no version names, a day old at least: batchinfer's own writes' alone.
    let unnamed_after = retain_hours.map(|n| n.max(UNNAMED_FILES_KEPT_HOURS));
    for file in dry_run(VacuumMode::Full, unnamed_after).await? {
        if is_write_file(&file) {
            doomed.insert(file);
        }
    }
    let folder = table.table_url().to_file_path().ok();
    let store = table.log_store().object_store(None);
    let mut deleted = 0u64;
    let mut links = std::collections::BTreeSet::new();
    for file in doomed {
        let path = object_store::path::Path::from(file.as_str());
        let gone = match &folder {
            Some(folder) => {
                let (root, target) = (folder.clone(), folder.join(&file));
                let removed = tokio::task::spawn_blocking(move || {
                    crate::storage::beneath::remove_file_beneath(&root, &target)
                })
                .await
                .map_err(|e| Error::Internal(format!("VACUUM {name}: {e}")))?;
                match removed {
                    Ok(()) => true,
                    Err(crate::storage::beneath::BeneathError::Link { link, .. }) => {
                        links.insert(link);
                        false
                    }
                    Err(e) if e.is_not_found() => false,
                    Err(e) => return Err(Error::table(name, format!("VACUUM {name}: {e}"))),
                }
            }
            None => match store.delete(&path).await {
                Ok(()) => true,
                Err(object_store::Error::NotFound { .. }) => false,
                Err(e) => return Err(e.into()),
            },
        };
        deleted += u64::from(gone);
    }
    for link in links {
        crate::say!(
            "warning: VACUUM {name}: {} is a symbolic link in the table's folder: nothing was \
             deleted through it (remove the link)",
            link.display()
        );
    }
    let schema = Schema::new(vec![Field::new("files_deleted", DataType::UInt64, false)]);
    Ok(RecordBatch::try_new(
        Arc::new(schema),
        vec![Arc::new(UInt64Array::from(vec![deleted]))],
    )?)
}

/// Whether `file` (a path in a table's folder) is a data file one of batchinfer's writes made:
/// `data-<32 hex digits>/NAME.parquet`.
fn is_write_file(file: &str) -> bool {
    let mut parts = file.split('/');
    let (Some(folder), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    folder
        .strip_prefix("data-")
        .is_some_and(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        && name.ends_with(".parquet")
        && !name.starts_with('.')
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

#[cfg(test)]
#[test]
fn only_batchinfer_s_own_write_files_are_unnamed_files_vacuum_deletes() {
    assert!(is_write_file(
        "data-0123456789abcdef0123456789abcdef/part-0.parquet"
    ));
    assert!(!is_write_file(
        "data-0123456789abcdef0123456789abcdef/notes.txt"
    ));
    assert!(!is_write_file("data-x/part-0.parquet"));
    assert!(!is_write_file("part-0.parquet"));
    assert!(!is_write_file(
        "data-0123456789abcdef0123456789abcdef/sub/part-0.parquet"
    ));
}
