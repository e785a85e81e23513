//! SHOW MATERIALIZED VIEWS, and what a refresh says it did.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::dataframe::DataFrame;

use super::{Manifest, Refreshed, Views, newest_view};
use crate::error::Result;
use crate::message::display_error;

impl Views<'_> {
    /// SHOW MATERIALIZED VIEWS: each view's source, last refresh, input files and rows.
    pub(crate) async fn show_views(&self) -> Result<DataFrame> {
        let warehouse = self.warehouse()?;
        let mut views = Vec::new();
        for name in warehouse.view_names().await? {
            let shown = format!("view '{name}''s manifest");
            match newest_view(&warehouse.view_manifests(&name)?, &shown).await {
                Ok(Some((_, view))) => views.push(view),
                Ok(None) => {}
                // One view that cannot be read does not hide the others.
                Err(e) => self.catalog.warn_once(format!(
                    "materialized view '{name}' cannot be read and is left out: {}",
                    display_error(&e)
                )),
            }
        }
        let mut states = Vec::with_capacity(views.len());
        for view in &views {
            states.push(Some(self.state_now(view).await));
        }
        let column = |values: Vec<Option<String>>| Arc::new(StringArray::from(values)) as ArrayRef;
        let totals: Vec<(u64, u64)> = views.iter().map(Manifest::totals).collect();
        let batch = RecordBatch::try_new(
            views_schema(),
            vec![
                column(views.iter().map(|v| Some(v.name.clone())).collect()),
                // A view kept before credentials in its query were refused shows none.
                column(
                    views
                        .iter()
                        .map(|v| Some(crate::storage::blank_passwords(&v.source)))
                        .collect(),
                ),
                Arc::new(
                    TimestampMillisecondArray::from(
                        views
                            .iter()
                            .map(|v| v.refreshed_ms.map(|ms| ms as i64))
                            .collect::<Vec<_>>(),
                    )
                    .with_timezone("UTC"),
                ),
                Arc::new(UInt64Array::from(
                    totals.iter().map(|t| t.0).collect::<Vec<_>>(),
                )),
                Arc::new(UInt64Array::from(
                    totals.iter().map(|t| t.1).collect::<Vec<_>>(),
                )),
                column(states),
                column(
                    views
                        .iter()
                        .map(|v| Some(crate::storage::blank_passwords(&v.query)))
                        .collect(),
                ),
                // Files left out because they cannot be read, each with why, until they change.
                column(
                    views
                        .iter()
                        .map(|v| {
                            let failed = v.failed_inputs();
                            (!failed.is_empty()).then(|| {
                                failed
                                    .iter()
                                    .map(|(path, why)| format!("{path}: {why}"))
                                    .collect::<Vec<_>>()
                                    .join("; ")
                            })
                        })
                        .collect(),
                ),
            ],
        )?;
        self.session.result(batch)
    }
}

impl Views<'_> {
    /// [`view_state`], and for a view it calls current, whether its source has changed since
    /// its last refresh (its files listed now).
    async fn state_now(&self, view: &Manifest) -> String {
        let state = view_state(view, self.session.registry());
        if state != "current" {
            return state;
        }
        match self.behind(&view.name, view).await {
            Ok((0, 0, 0)) => state,
            Ok((new, changed, removed)) => format!(
                "behind its source ({new} new, {changed} changed, {removed} removed input files): \
                 REFRESH to bring it up to date"
            ),
            Err(e) => format!(
                "current as of its last refresh (its source cannot be listed now: {})",
                display_error(&e)
            ),
        }
    }
}

/// Whether a view is current, being rebuilt, not yet refreshed, or holds rows of another query
/// or of a model since redefined.
pub(crate) fn view_state(view: &Manifest, registry: &crate::model::ModelRegistry) -> String {
    let changed = |current: &crate::view::Generation| -> Vec<String> {
        current
            .models
            .iter()
            .filter(|(name, version)| {
                // A warehouse model's version says what it is whole (its file and the files
                // beside it); another model, its file.
                match registry.picked(name).and_then(|p| p.identity) {
                    Some(identity) => identity != **version,
                    None => registry
                        .sha256_of(name)
                        .is_some_and(|now| now != crate::model::sha256_of_version(version)),
                }
            })
            .map(|(name, _)| name.clone())
            .collect()
    };
    match (&view.current, &view.pending) {
        (_, Some(pending)) => {
            let files: usize = pending.units.iter().map(|u| u.inputs.len()).sum();
            format!("rebuilding ({files} input files so far)")
        }
        (None, None) => "not refreshed".into(),
        (Some(current), None) if current.query != view.query => {
            "query changed: REFRESH to rebuild".into()
        }
        (Some(current), None) => match changed(current)[..] {
            [] => match current
                .models
                .iter()
                .filter(|(name, _)| !registry.contains(name))
                .map(|(name, _)| name.clone())
                .collect::<Vec<_>>()[..]
            {
                [] => "current".into(),
                ref missing => format!(
                    "model missing ({}): a refresh fails until it is defined again",
                    missing.join(", ")
                ),
            },
            ref models => format!("model changed ({}): REFRESH to rebuild", models.join(", ")),
        },
    }
}

/// What REFRESH MATERIALIZED VIEW returns: one row of what it found and did.
pub(crate) fn refreshed_batch(r: &Refreshed) -> Result<RecordBatch> {
    let count = |name: &str, n: u64| {
        (
            Field::new(name, DataType::UInt64, false),
            Arc::new(UInt64Array::from(vec![n])) as ArrayRef,
        )
    };
    let (fields, columns): (Vec<Field>, Vec<ArrayRef>) = [
        (
            Field::new("view", DataType::Utf8, false),
            Arc::new(StringArray::from(vec![r.view.clone()])) as ArrayRef,
        ),
        count("new_files", r.new as u64),
        count("changed_files", r.changed as u64),
        count("removed_files", r.removed as u64),
        count("rows_scored", r.rows_scored),
        count("input_files", r.view_files),
        count("rows", r.view_rows),
        count("failed_files", r.failed.len() as u64),
    ]
    .into_iter()
    .unzip();
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns,
    )?)
}

/// The columns of SHOW MATERIALIZED VIEWS.
fn views_schema() -> datafusion::arrow::datatypes::SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new(
            "last_refresh",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("input_files", DataType::UInt64, false),
        Field::new("rows", DataType::UInt64, false),
        Field::new("state", DataType::Utf8, false),
        Field::new("query", DataType::Utf8, false),
        Field::new("failed_inputs", DataType::Utf8, true),
    ]))
}
