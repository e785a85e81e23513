//! The engine's materialized-view statements ([`crate::view`]): CREATE, REFRESH, SHOW and DROP
//! MATERIALIZED VIEW, and the registration of each view, by name, as the files its newest
//! manifest lists.

use datafusion::arrow::array::{ArrayRef, StringArray, TimestampMillisecondArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::catalog::TableProvider;
use datafusion::datasource::empty::EmptyTable;
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::sql::sqlparser::ast::Query;

use super::refresh::Refreshed;
use super::*;
use crate::statements::ViewStatement;
use crate::view::{Generation, Manifest, newest_view, now_ms};

impl Engine {
    pub(super) async fn run_view_statement(&self, statement: ViewStatement) -> Result<DataFrame> {
        match statement {
            ViewStatement::Create {
                name,
                query,
                or_replace,
                if_not_exists,
            } => {
                let name = object_name("view", &name)?;
                self.create_view(&name, &query, or_replace, if_not_exists)
                    .await
            }
            ViewStatement::Refresh { name } => {
                let refreshed = self.refresh_view(&object_name("view", &name)?).await?;
                self.register_views().await?;
                Ok(self.results.read_batch(refreshed_batch(&refreshed)?)?)
            }
            ViewStatement::Show => self.show_views().await,
            ViewStatement::Drop { name, if_exists } => {
                let name = object_name("view", &name)?;
                self.drop_view(&name, if_exists).await
            }
        }
    }

    /// DROP MATERIALIZED VIEW: a version saying so is created on top of the newest (so no
    /// statement that read an older one can commit after it), then the files the dropped view's
    /// last manifest names are removed, generation folder by generation folder: a view created
    /// again meanwhile writes into folders of its own.
    async fn drop_view(&self, name: &str, if_exists: bool) -> Result<DataFrame> {
        let warehouse = self.view_warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let (version, dropped) = loop {
            let Some((version, bytes)) = live(manifests.latest().await?) else {
                if if_exists {
                    return self.empty();
                }
                return Err(Error::Usage(format!(
                    "there is no materialized view '{name}'"
                )));
            };
            let tombstone = Manifest::dropped(name).to_bytes()?;
            if manifests.create(version + 1, tombstone).await? {
                break (
                    version + 1,
                    Manifest::from_bytes(&bytes, "the view's manifest").ok(),
                );
            }
        };
        self.forget_view(name)?;
        warehouse
            .remove_view_data(name, version, dropped.as_ref())
            .await?;
        self.empty()
    }

    /// Runs REFRESH MATERIALIZED VIEW `name` as a statement of its own (as [`Engine::run`]
    /// does): for `batchinfer refresh`.
    pub async fn refresh(&self, name: &str) -> Result<Refreshed> {
        crate::warehouse::check_name("view", name)?;
        self.before_statement().await?;
        let refreshed = self.refresh_view(name).await?;
        self.register_views().await?;
        Ok(refreshed)
    }

    /// CREATE MATERIALIZED VIEW: the definition kept, then the first refresh. When that fails,
    /// the view is as it was before the statement (none, or the former definition).
    async fn create_view(
        &self,
        name: &str,
        query: &Query,
        or_replace: bool,
        if_not_exists: bool,
    ) -> Result<DataFrame> {
        let warehouse = self.view_warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let latest = manifests.latest().await?;
        let exists = live(latest.clone()).is_some();
        if exists && if_not_exists {
            return self.empty();
        }
        if exists && !or_replace {
            return Err(Error::Usage(format!(
                "materialized view '{name}' already exists (use CREATE OR REPLACE MATERIALIZED \
                 VIEW, or REFRESH MATERIALIZED VIEW {name})"
            )));
        }
        if !exists
            && !self.seen_views().contains_key(name)
            && self.ctx.table_exist(TableReference::bare(name))?
        {
            return Err(Error::Usage(format!(
                "a table named '{name}' exists; a materialized view needs a name of its own"
            )));
        }
        // The files it reads are the same ones whatever the working folder of a later refresh.
        let mut query = query.clone();
        let mut unusable = None;
        let mut literals = Vec::new();
        let _ = datafusion::sql::sqlparser::ast::visit_relations_mut(&mut query, |relation| {
            use datafusion::sql::sqlparser::ast::ObjectNamePart;
            if let [ObjectNamePart::Identifier(ident)] = relation.0.as_mut_slice()
                && ident.quote_style == Some('\'')
            {
                match crate::storage::absolute_location(&ident.value) {
                    Ok(absolute) => {
                        literals.push(absolute.clone());
                        ident.value = absolute;
                    }
                    Err(e) => unusable = Some(e),
                }
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
        if let Some(e) = unusable {
            return Err(e);
        }
        for literal in &literals {
            crate::view::check::without_credentials(name, literal)?;
        }
        let query = &query;
        // Refused now, before anything is kept, if it cannot be a view.
        let df = self
            .execute(DFStatement::Statement(Box::new(SQLStatement::Query(
                Box::new(query.clone()),
            ))))
            .await?;
        let source = crate::view::check::row_wise_source(df.logical_plan(), name)?;
        crate::view::check::without_credentials(name, &source.shown())?;
        let text = query.to_string();
        let source_table = source.as_table(&literals)?;
        let settings = self.view_settings_now()?;
        // Kept on top of whatever is there now: a refresh committing meanwhile is not undone.
        let mut latest = latest;
        let before = loop {
            // A manifest that cannot be read is replaced as if there were none, as is a drop.
            let before = latest
                .as_ref()
                .and_then(|(_, bytes)| Manifest::from_bytes(bytes, "the view's manifest").ok())
                .filter(|m| !m.dropped);
            let manifest = Manifest {
                dropped: false,
                settings: settings.clone(),
                format: crate::view::FORMAT,
                name: name.to_string(),
                source: source.shown(),
                source_table: source_table.clone(),
                created_ms: before.as_ref().map_or_else(now_ms, |b| b.created_ms),
                refreshed_ms: before.as_ref().and_then(|b| b.refreshed_ms),
                current: before.as_ref().and_then(|b| b.current.clone()),
                // A rebuild for the former query is abandoned; one for this query goes on.
                pending: before
                    .as_ref()
                    .and_then(|b| b.pending.clone())
                    .filter(|p| p.query == text),
                query: text.clone(),
                retired: match &before {
                    Some(b) => retire_abandoned(b, &text),
                    // What an unreadable manifest held is unknown: every generation folder
                    // there is now is the old view's, retired (a DROP removes them).
                    None if exists => manifests
                        .folders_under("data")
                        .await?
                        .into_iter()
                        .map(|g| crate::view::Retired {
                            path: format!("data/{g}"),
                            at_ms: now_ms(),
                        })
                        .collect(),
                    None => Vec::new(),
                },
            };
            let version = latest.as_ref().map_or(1, |(v, _)| v + 1);
            if manifests.create(version, manifest.to_bytes()?).await? {
                break before;
            }
            latest = manifests.latest().await?;
            if live(latest.clone()).is_none() || !or_replace {
                return Err(Error::Usage(format!(
                    "materialized view '{name}' was created or dropped by another statement \
                     meanwhile"
                )));
            }
        };
        match self.refresh_view(name).await {
            Ok(refreshed) => {
                self.register_views().await?;
                self.rows_result(refreshed.rows_scored)
            }
            Err(e) => {
                self.undo_create(name, &text, before).await;
                Err(e)
            }
        }
    }

    /// After a CREATE of `query` whose first refresh failed: no view, or the one there was (its
    /// definition put back; what it held was never taken away). Unless another statement
    /// redefined the view meanwhile: then it is left as that one made it.
    async fn undo_create(&self, name: &str, query: &str, before: Option<Manifest>) {
        let Ok(warehouse) = self.view_warehouse() else {
            return;
        };
        let undone = async {
            let manifests = warehouse.view_manifests(name)?;
            // Tried again over what other statements commit meanwhile, as a refresh's commits.
            for _ in 0..64 {
                let Some((version, bytes)) = manifests.latest().await? else {
                    return Ok(());
                };
                let mut now = Manifest::from_bytes(&bytes, "the view's manifest")?;
                if now.query != query || now.dropped {
                    return Ok(());
                }
                let Some(before) = &before else {
                    return self.drop_view(name, true).await.map(|_| ());
                };
                now.query = before.query.clone();
                now.source = before.source.clone();
                now.source_table = before.source_table.clone();
                now.pending = before.pending.clone();
                now.settings = before.settings.clone();
                if manifests.create(version + 1, now.to_bytes()?).await? {
                    return Ok(());
                }
            }
            Err(Error::Usage("its manifest kept changing".into()))
        }
        .await;
        if let Err(e) = undone {
            eprintln!(
                "warning: materialized view '{name}' could not be put back as it was: {}",
                display_error(&e)
            );
        }
    }

    /// SHOW MATERIALIZED VIEWS: each view's source, last refresh, input files and rows.
    async fn show_views(&self) -> Result<DataFrame> {
        let warehouse = self.view_warehouse()?;
        let mut views = Vec::new();
        for name in warehouse.view_names().await? {
            let shown = format!("view '{name}''s manifest");
            if let Some((_, view)) = newest_view(&warehouse.view_manifests(&name)?, &shown).await? {
                views.push(view);
            }
        }
        let column = |values: Vec<Option<String>>| Arc::new(StringArray::from(values)) as ArrayRef;
        let totals: Vec<(u64, u64)> = views.iter().map(Manifest::totals).collect();
        let batch = RecordBatch::try_new(
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
            ])),
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
                column(
                    views
                        .iter()
                        .map(|v| Some(view_state(v, &self.registry)))
                        .collect(),
                ),
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
        Ok(self.results.read_batch(batch)?)
    }

    /// Registers each materialized view of the warehouse by name, as its newest manifest has
    /// it: one listing of `views/`, and one of each view's folder, per statement.
    pub(super) async fn register_views(&self) -> Result<()> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(());
        };
        let names: BTreeSet<String> = warehouse.view_names().await?.into_iter().collect();
        let seen: Vec<String> = self.seen_views().keys().cloned().collect();
        for name in seen.iter().filter(|n| !names.contains(*n)) {
            self.forget_view(name)?;
        }
        for name in &names {
            if let Err(e) = self.register_view(warehouse, name).await {
                // One view that cannot be read does not take the others, or the warehouse,
                // with it: DROP MATERIALIZED VIEW still removes it.
                self.forget_view(name)?;
                let warning = format!(
                    "materialized view '{name}' cannot be read and is left out: {}",
                    display_error(&e)
                );
                self.seen.warn_once(warning);
            }
        }
        Ok(())
    }

    /// Registers view `name` as its newest manifest has it, unless it already is.
    async fn register_view(
        &self,
        warehouse: &crate::warehouse::Warehouse,
        name: &str,
    ) -> Result<()> {
        let manifests = warehouse.view_manifests(name)?;
        let newest = manifests.newest().await?;
        if newest.is_some() && self.seen_views().get(name) == newest.as_ref() {
            return Ok(());
        }
        let registered_here = self.seen_views().contains_key(name);
        if !registered_here && self.ctx.table_exist(TableReference::bare(name))? {
            // A table of that name, registered by this process, stays.
            return Ok(());
        }
        let (Some(newest), Some((_, bytes))) = (newest, manifests.latest().await?) else {
            return self.forget_view(name);
        };
        let manifest = Manifest::from_bytes(&bytes, &format!("view '{name}''s manifest"))?;
        let Some(current) = manifest.current.as_ref().filter(|_| !manifest.dropped) else {
            // Not yet refreshed to the end once: nothing to read.
            return self.forget_view(name);
        };
        let table = view_table(name, &warehouse.view_folder(name)?, current)?;
        self.forget_view(name)?;
        self.ctx.register_table(TableReference::bare(name), table)?;
        self.seen_views().insert(name.to_string(), newest);
        Ok(())
    }

    /// The session's settings a view keeps ([`crate::view::VIEW_SETTINGS`]), a rejects folder
    /// made absolute (so that any later refresh writes where this one would).
    fn view_settings_now(&self) -> Result<BTreeMap<String, String>> {
        let options = self.batchinfer_options();
        let mut settings = BTreeMap::new();
        for entry in datafusion::config::ExtensionOptions::entries(&options) {
            let Some(key) = entry.key.strip_prefix("batchinfer.") else {
                continue;
            };
            // Unset is kept too (as ''), so that no refreshing session's setting stands in.
            let value = entry.value.or_else(|| Some(String::new()));
            if let (true, Some(value)) = (crate::view::VIEW_SETTINGS.contains(&key), value) {
                let value = match key {
                    "rejects" if !value.is_empty() => crate::storage::absolute_location(&value)?,
                    _ => value,
                };
                settings.insert(key.to_string(), value);
            }
        }
        Ok(settings)
    }

    /// Refuses a statement that reads view `name` while its files are not all there, each of
    /// the size it was written with: it would answer with part of the view's rows.
    pub(super) async fn check_view_files(&self, name: &str) -> Result<()> {
        if !self.seen_views().contains_key(name) {
            return Ok(());
        }
        self.view_files_whole(name).await
    }

    /// The error refusing view `name`'s newest manifest for the files it lists, if it names
    /// any that is not the view's own (a manifest that cannot be read says nothing here).
    pub(super) async fn view_paths_refused(&self, name: &str) -> Option<Error> {
        let warehouse = self.warehouse.as_ref()?;
        let manifests = warehouse.view_manifests(name).ok()?;
        let (_, manifest) = newest_view(&manifests, name).await.ok()??;
        let current = manifest.current.as_ref()?;
        crate::view::files::check_paths(name, current).err()
    }

    /// Whether view `name`'s newest manifest lists only files of its own, each there with the
    /// size it was written with (a view not refreshed yet has none to check).
    pub(super) async fn view_files_whole(&self, name: &str) -> Result<()> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(());
        };
        let manifests = warehouse.view_manifests(name)?;
        let shown = format!("view '{name}''s manifest");
        let Some((_, manifest)) = newest_view(&manifests, &shown).await? else {
            return Ok(());
        };
        let Some(current) = &manifest.current else {
            return Ok(());
        };
        crate::view::files::check_paths(name, current)?;
        let folder = warehouse.view_folder(name)?;
        let present = crate::view::files::present_files(&manifests, &folder).await?;
        crate::view::files::check_present(name, current, &present)
    }

    /// Whether the warehouse has a materialized view `name`, for `batchinfer refresh`.
    pub async fn view_exists(&self, name: &str) -> Result<bool> {
        crate::warehouse::check_name("view", name)?;
        self.is_view(name).await
    }

    /// Whether the warehouse has a materialized view `name` (registered or not; one whose
    /// manifest cannot be read counts).
    pub(super) async fn is_view(&self, name: &str) -> Result<bool> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(false);
        };
        let latest = warehouse.view_manifests(name)?.latest().await?;
        Ok(live(latest).is_some())
    }

    fn forget_view(&self, name: &str) -> Result<()> {
        if self.seen_views().remove(name).is_some() {
            self.ctx.deregister_table(TableReference::bare(name))?;
        }
        Ok(())
    }

    /// The views registered by name, with the manifest version each was registered at.
    pub(super) fn seen_views(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.seen.views.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The newest manifest, unless it says the view was dropped (one that cannot be read counts as
/// a view).
fn live(latest: Option<(u64, Vec<u8>)>) -> Option<(u64, Vec<u8>)> {
    latest.filter(|(_, bytes)| {
        Manifest::from_bytes(bytes, "the view's manifest").map_or(true, |m| !m.dropped)
    })
}

/// The files `before` retired, and those of its pending generation when a new query abandons it.
fn retire_abandoned(before: &Manifest, query: &str) -> Vec<crate::view::Retired> {
    let mut retired = before.retired.clone();
    let at_ms = now_ms();
    let abandoned = before.pending.iter().filter(|p| p.query != query);
    retired.extend(abandoned.flat_map(|p| {
        p.files().map(move |f| crate::view::Retired {
            path: f.path.clone(),
            at_ms,
        })
    }));
    retired
}

/// The rows of `generation`: the files it lists under the view's folder, with its schema; a
/// manifest listing any other file is refused ([`crate::view::files::check_paths`]).
fn view_table(
    name: &str,
    folder: &url::Url,
    generation: &Generation,
) -> Result<Arc<dyn TableProvider>> {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::ListingOptions;
    crate::view::files::check_paths(name, generation)?;
    let schema = generation.schema()?;
    let paths = generation
        .files()
        .map(|f| {
            let url = folder
                .join(&f.path)
                .map_err(|e| Error::Internal(format!("{}: {e}", f.path)))?;
            Ok(ListingTableUrl::try_new(url, None)?)
        })
        .collect::<Result<Vec<_>>>()?;
    if paths.is_empty() {
        return Ok(Arc::new(EmptyTable::new(schema)));
    }
    let options =
        ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(paths)
        .with_listing_options(options)
        .with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// Whether a view is current, being rebuilt, not yet refreshed, or holds rows of another query
/// or of a model since redefined.
fn view_state(view: &Manifest, registry: &crate::model::ModelRegistry) -> String {
    let changed = |current: &crate::view::Generation| -> Vec<String> {
        current
            .models
            .iter()
            .filter(|(name, sha256)| registry.sha256_of(name).is_some_and(|now| now != **sha256))
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
            [] => "current".into(),
            ref models => format!("model changed ({}): REFRESH to rebuild", models.join(", ")),
        },
    }
}

/// What REFRESH MATERIALIZED VIEW returns: one row of what it found and did.
fn refreshed_batch(r: &Refreshed) -> Result<RecordBatch> {
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
