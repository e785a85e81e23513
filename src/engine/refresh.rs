//! REFRESH MATERIALIZED VIEW: the view's input files listed and compared with its manifest
//! ([`crate::view::plan`]), what is new or changed scored a unit at a time, wherever statements
//! run ([`crate::cluster::Placement::write_to`]), and each unit committed as a new manifest
//! version ([`crate::storage::Manifests`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::dataframe::{DataFrame, DataFrameWriteOptions};
use datafusion::datasource::listing::{ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::LogicalPlan;
use futures::{StreamExt, TryStreamExt};
use url::Url;

use super::Engine;
use crate::error::{Error, Result};
use crate::statements::Statement;
use crate::storage::Manifests;
use crate::view::check::{Source, reading, row_wise_source, source_table};
use crate::view::commit::{RETIRED_KEPT_MS, Target, choose_target, commit, remove_files};
use crate::view::failed::blames_the_files;
use crate::view::plan::{CommitSize, Work, plan};
use crate::view::{
    Generation, Input, Manifest, OutputFile, Unit, id_time, new_id, newest_view, now_ms,
};
use crate::warehouse::Warehouse;

/// What one refresh did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Refreshed {
    pub view: String,
    /// Input files seen for the first time, changed, and gone.
    pub new: usize,
    pub changed: usize,
    pub removed: usize,
    /// Input files and rows scored.
    pub files_scored: usize,
    pub rows_scored: u64,
    /// Whether it built a new generation (a model or the query changed) and made it current.
    pub rebuilt: bool,
    /// Units scored again because files of theirs were missing from the view's folder.
    pub repaired: usize,
    /// Input files this refresh left out because they cannot be read (path, why).
    pub failed: Vec<(String, String)>,
    /// What the view holds after it: input files and rows.
    pub view_files: u64,
    pub view_rows: u64,
    pub seconds: f64,
}

/// The query of a view, planned: its plan, the files it reads, its models and rows' schema.
struct Planned {
    plan: LogicalPlan,
    source: Source,
    models: BTreeMap<String, String>,
    models_json: String,
    schema: SchemaRef,
    /// The source's columns the query reads (what an input file must have as the view has it).
    read: datafusion::arrow::datatypes::Schema,
}

/// Rounds of scoring a refresh makes before it gives up on a view other refreshes keep changing.
const ROUNDS: usize = 8;

/// Units scored at once by one refresh.
const UNITS_AT_ONCE: usize = 2;

impl Engine {
    /// Brings materialized view `name` up to date with its input files and models.
    pub(super) async fn refresh_view(&self, name: &str) -> Result<Refreshed> {
        let started = Instant::now();
        let warehouse = self.view_warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let shown = format!("view '{name}''s manifest");
        let Some((_, manifest)) = newest_view(&manifests, &shown).await? else {
            return Err(Error::Usage(format!(
                "there is no materialized view '{name}' (SHOW MATERIALIZED VIEWS lists them)"
            )));
        };
        crate::view::check::without_credentials(name, &manifest.source)?;
        // Scored with the view's own settings, whichever session refreshes it; tagged as a
        // statement of its own (its rejects' folder).
        let _settings = ViewSettings::apply(self, &manifest.settings)?;
        self.tag_text(format!("REFRESH MATERIALIZED VIEW {name}"))?;
        for generation in manifest.current.iter().chain(manifest.pending.iter()) {
            crate::view::files::check_paths(name, generation)?;
        }
        let used = manifest.current.iter().chain(manifest.pending.iter());
        self.reload_changed_folder_models(used.flat_map(|g| g.models.keys()))
            .await?;
        let planned = self.plan_view(name, &manifest).await?;
        let mut target = choose_target(&manifest, &planned.models, &planned.schema)?;
        let generation = match &target.new {
            Some(new) => new.clone(),
            None => manifest
                .current
                .iter()
                .chain(manifest.pending.iter())
                .find(|g| g.id == target.id)
                .cloned()
                .ok_or_else(|| Error::Internal("a view's generation vanished".into()))?,
        };
        let folder = warehouse.view_folder(name)?;
        let listed = self.list_inputs(&planned.source).await?;
        let mut damaged = damaged_units(&manifests, &folder, &generation).await?;
        // A rebuild tries again, at every refresh, the files it could not read that the view
        // serves now: it stays pending until it can (see `check_rebuild_loses_nothing`).
        if target.pending || target.new.is_some() {
            damaged.extend(served_but_failed(manifest.current.as_ref(), &generation));
        }
        let changes = plan(&generation, &listed, self.commit_size(), &damaged);
        let mut refreshed = Refreshed {
            view: name.to_string(),
            new: changes.new,
            changed: changes.changed,
            removed: changes.removed,
            repaired: damaged.len(),
            ..Default::default()
        };
        let mut work = changes.work;
        let mut worked = false;
        // Until the generation holds every file listed: a unit skipped because another refresh
        // had scored some of its files leaves the others to the next round.
        for _ in 0..ROUNDS {
            if work.is_empty() {
                break;
            }
            worked = true;
            self.score_and_commit(
                &manifests,
                &folder,
                &planned,
                &mut target,
                &work,
                &mut refreshed,
            )
            .await?;
            let Some(now) = target_now(&manifests, &target.id).await? else {
                break;
            };
            work = plan(&now, &listed, self.commit_size(), &BTreeSet::new()).work;
        }
        if !work.is_empty() {
            return Err(Error::Usage(format!(
                "materialized view '{name}' kept changing under this refresh (other refreshes \
                 committed meanwhile); run REFRESH again"
            )));
        }
        let nothing = Work {
            replaces: Vec::new(),
            inputs: Vec::new(),
        };
        if target.pending {
            let rebuilt = target_now(&manifests, &target.id).await?;
            check_rebuild_loses_nothing(name, manifest.current.as_ref(), rebuilt.as_ref())?;
            commit(&manifests, &mut target, &nothing, None, true).await?;
            refreshed.rebuilt = true;
        } else if target.stale_pending.is_some() {
            // A rebuild for models no longer defined: dropped.
            commit(&manifests, &mut target, &nothing, None, false).await?;
        }
        let Some((now_version, now)) = newest_view(&manifests, &shown).await? else {
            return Err(Error::Usage(format!(
                "materialized view '{name}' was dropped while it was refreshed"
            )));
        };
        (refreshed.view_files, refreshed.view_rows) = now.totals();
        if worked || target.pending {
            self.remove_unlisted(&manifests, &folder, (now_version, &now))
                .await?;
        }
        for (path, why) in &refreshed.failed {
            eprintln!(
                "warning: materialized view '{name}': the input file {path} is left out until it \
                 changes: {why}"
            );
        }
        refreshed.seconds = started.elapsed().as_secs_f64();
        Ok(refreshed)
    }

    /// Scores the units of `work`, two at a time (one starts while the other finishes: its last
    /// partition, its commit, so that no core waits between them), and commits them in order.
    async fn score_and_commit(
        &self,
        manifests: &Manifests,
        folder: &Url,
        planned: &Planned,
        target: &mut Target,
        work: &[Work],
        refreshed: &mut Refreshed,
    ) -> Result<()> {
        let generation_id = target.id.clone();
        let score = |i: usize| -> futures::future::BoxFuture<'_, Result<Option<Unit>>> {
            Box::pin(self.score_unit_or_say_why(folder, &generation_id, planned, &work[i]))
        };
        let mut scored = futures::stream::iter(0..work.len())
            .map(score)
            .buffered(UNITS_AT_ONCE);
        let mut works = work.iter();
        while let (Some(unit), Some(work)) = (scored.next().await, works.next()) {
            match unit {
                Ok(unit) => {
                    commit_scored(manifests, folder, target, work, unit, refreshed).await?;
                }
                Err(e) if blames_the_files(&e) => {
                    self.leave_out_failing(manifests, folder, planned, target, work, e, refreshed)
                        .await?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Commits what can be read of `work`, whose scoring failed with `error`, a failure of its
    /// files ([`blames_the_files`]): halves are scored apart until each file that fails is
    /// found. Those are committed as units of their own, with the error and no rows, and the
    /// rest as one unit that replaces what `work` replaces; nothing is committed until every
    /// piece is scored, so a refresh that fails meanwhile leaves the view as it was.
    #[allow(clippy::too_many_arguments)]
    async fn leave_out_failing(
        &self,
        manifests: &Manifests,
        folder: &Url,
        planned: &Planned,
        target: &mut Target,
        work: &Work,
        error: Error,
        refreshed: &mut Refreshed,
    ) -> Result<()> {
        let mut pieces = Pieces::default();
        let id = target.id.clone();
        if let Err(e) = self
            .score_pieces(folder, &id, planned, &work.inputs, error, &mut pieces)
            .await
        {
            for unit in &pieces.scored {
                remove_files(manifests, folder, unit).await?;
            }
            return Err(e);
        }
        for (input, why) in pieces.failed {
            let failed = Work {
                replaces: Vec::new(),
                inputs: vec![input.clone()],
            };
            let unit = Unit {
                id: new_id("u"),
                inputs: vec![input.clone()],
                files: Vec::new(),
                rows: 0,
                error: Some(why.clone()),
            };
            if commit(manifests, target, &failed, Some(unit), false).await? {
                refreshed.failed.push((input.path, why));
            }
        }
        let mut scored = pieces.scored.into_iter();
        let merged = scored.next().map(|first| {
            scored.fold(first, |mut all, unit| {
                all.inputs.extend(unit.inputs);
                all.files.extend(unit.files);
                all.rows += unit.rows;
                all
            })
        });
        if merged.is_none() && work.replaces.is_empty() {
            return Ok(());
        }
        let good = Work {
            replaces: work.replaces.clone(),
            inputs: merged.as_ref().map_or_else(Vec::new, |u| u.inputs.clone()),
        };
        commit_scored(manifests, folder, target, &good, merged, refreshed).await
    }

    /// Scores `inputs` (which failed together with `error`) in halves, down to the files that
    /// fail alone: what scores goes to `pieces.scored`, uncommitted, each failing file with why
    /// to `pieces.failed`. An error that is not the files' own ends it.
    fn score_pieces<'a>(
        &'a self,
        folder: &'a Url,
        generation: &'a str,
        planned: &'a Planned,
        inputs: &'a [Input],
        error: Error,
        pieces: &'a mut Pieces,
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if let [input] = inputs {
                pieces
                    .failed
                    .push((input.clone(), crate::message::display_error(&error)));
                return Ok(());
            }
            if inputs.is_empty() {
                return Err(error);
            }
            let (first, second) = inputs.split_at(inputs.len() / 2);
            for half in [first, second] {
                let work = Work {
                    replaces: Vec::new(),
                    inputs: half.to_vec(),
                };
                match self
                    .score_unit_or_say_why(folder, generation, planned, &work)
                    .await
                {
                    Ok(unit) => pieces.scored.extend(unit),
                    Err(e) if blames_the_files(&e) => {
                        self.score_pieces(folder, generation, planned, half, e, pieces)
                            .await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }

    pub(super) fn view_warehouse(&self) -> Result<&Warehouse> {
        self.warehouse.as_ref().ok_or_else(|| {
            Error::Usage("materialized views are kept in a warehouse; this engine has none".into())
        })
    }

    /// Plans a view's query (loading its models), checking that it is row-wise. Files the query
    /// names by path are read as the view keeps them, so that planning reads none of them.
    async fn plan_view(&self, name: &str, manifest: &Manifest) -> Result<Planned> {
        let query = &manifest.query;
        let mut statements = self.statements(query)?;
        let statement = match (statements.pop(), statements.is_empty()) {
            (Some(Statement::Sql(statement)), true) => *statement,
            _ => {
                return Err(Error::Usage(format!(
                    "materialized view '{name}' has a query that is not one statement: {query}"
                )));
            }
        };
        let _source = match &manifest.source_table {
            Some(kept) => {
                let parquet = self.ctx.state().table_options().parquet.clone();
                let table = source_table(kept, parquet)?;
                Some(super::write::Registered::named(
                    &self.ctx, &kept.name, table,
                )?)
            }
            None => None,
        };
        let df = self.execute(statement).await?;
        let plan = df.logical_plan().clone();
        let source = row_wise_source(&plan, name)?;
        let models = super::lineage::models_in(&self.registry, &plan)
            .into_iter()
            .map(|m| (m.name.clone(), m.sha256.clone()))
            .collect();
        // The scan's projection is known once the plan is optimized.
        let read = read_columns(&self.ctx.state().optimize(&plan)?, &source.schema);
        Ok(Planned {
            models_json: super::lineage::models_used(&self.registry, &plan)?,
            schema: df.schema().inner().clone(),
            read,
            plan,
            source,
            models,
        })
    }

    /// How much a refresh scores between commits (`batchinfer.files_per_commit`).
    fn commit_size(&self) -> CommitSize {
        let options = self.batchinfer_options();
        CommitSize {
            files: options.files_per_commit.max(1),
            bytes: COMMIT_BYTES,
        }
    }

    /// The input files of `source` now: each one's URL, size and version.
    async fn list_inputs(&self, source: &Source) -> Result<Vec<Input>> {
        let state = self.ctx.state();
        let mut inputs = Vec::new();
        for url in &source.paths {
            let store = state.runtime_env().object_store(url)?;
            let local = crate::storage::is_local_store(&url.object_store());
            // A folder that is gone is not a folder emptied: the view is left as it was.
            if local
                && let Some(path) = crate::storage::local_file(url.prefix())
                && !path.exists()
            {
                return Err(Error::Usage(format!(
                    "the view's input {} is not there (moved, or not mounted?); the view is left \
                     as it was",
                    crate::storage::display_location(url.get_url())
                )));
            }
            let extension = &source.options.file_extension;
            let files: Vec<_> = url
                .list_all_files(&state, store.as_ref(), extension)
                .await?
                .try_collect()
                .await?;
            let base = Url::parse(url.object_store().as_str())
                .map_err(|e| Error::Internal(format!("{url}: {e}")))?;
            for meta in files {
                let mut file = base.clone();
                file.path_segments_mut()
                    .map_err(|()| Error::Internal(format!("{base} has no path")))?
                    .clear()
                    .extend(meta.location.parts().map(|p| p.as_ref().to_string()));
                inputs.push(Input {
                    path: file.to_string(),
                    size: meta.size,
                    version: crate::storage::file_version(local, &meta),
                });
            }
        }
        inputs.sort_by(|a, b| a.path.cmp(&b.path));
        inputs.dedup_by(|a, b| a.path == b.path);
        Ok(inputs)
    }

    /// [`Engine::score_unit`]; when it fails (a panic in a reader included) because an input
    /// file was replaced while it was read, an error that says so.
    async fn score_unit_or_say_why(
        &self,
        folder: &Url,
        generation: &str,
        planned: &Planned,
        work: &Work,
    ) -> Result<Option<Unit>> {
        use futures::FutureExt;
        let scored =
            std::panic::AssertUnwindSafe(self.score_unit(folder, generation, planned, work))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(Error::Internal(crate::error::panic_message(&panic))));
        let Err(e) = scored else {
            return scored;
        };
        for input in &work.inputs {
            let url = Url::parse(&input.path).map_err(|e| Error::Internal(e.to_string()))?;
            let now = self.registry.stores().file_version(&url).await;
            if now.ok().flatten().as_ref() != Some(&input.version) {
                return Err(Error::Usage(format!(
                    "the input file {} changed while this refresh read it; nothing of it was \
                     kept: run REFRESH again ({})",
                    crate::storage::display_location(&url),
                    crate::message::display_error(&e)
                )));
            }
        }
        Err(e)
    }

    /// Scores the inputs of `work` into a folder of their own under the view's `data/`; `None`
    /// where it has none (its files are gone).
    async fn score_unit(
        &self,
        folder: &Url,
        generation: &str,
        planned: &Planned,
        work: &Work,
    ) -> Result<Option<Unit>> {
        if work.inputs.is_empty() {
            return Ok(None);
        }
        let id = new_id("u");
        let paths = work
            .inputs
            .iter()
            .map(|i| {
                let url = Url::parse(&i.path).map_err(|e| Error::Internal(format!("{e}")))?;
                Ok(ListingTableUrl::try_new(url, None)?)
            })
            .collect::<Result<Vec<_>>>()?;
        // Each file is read with its own columns as they are, or it is that file's error: the
        // columns the query reads.
        let state = self.ctx.state();
        for (path, input) in paths.iter().zip(&work.inputs) {
            let inferred = ListingTableConfig::new(path.clone())
                .with_listing_options(planned.source.options.clone())
                .infer_schema(&state)
                .await?;
            let Some(columns) = inferred.file_schema else {
                continue;
            };
            crate::view::check::check_file_columns(&planned.read, &columns).map_err(|why| {
                Error::DataFusion(datafusion::error::DataFusionError::External(Box::new(
                    crate::storage::unreadable::Unreadable(format!("{}: {why}", input.path)),
                )))
            })?;
        }
        let config = ListingTableConfig::new_with_multi_paths(paths)
            .with_listing_options(planned.source.options.clone())
            .with_schema(planned.source.schema.clone());
        let table = Arc::new(ListingTable::try_new(config)?);
        let plan = reading(&planned.plan, table)?;
        let df = DataFrame::new(self.ctx.state(), plan);
        let mut options = self.parquet_options(df.schema().as_arrow());
        let inputs = serde_json::to_string(&work.inputs).unwrap_or_default();
        for (key, value) in [
            (super::lineage::MODELS_KEY, planned.models_json.clone()),
            ("batchinfer.inputs", inputs),
        ] {
            options
                .key_value_metadata
                .insert(key.to_string(), Some(value));
        }
        let unit_folder = folder
            .join(&format!("data/{generation}/{id}/"))
            .map_err(|e| Error::Internal(e.to_string()))?;
        let location = crate::storage::display_location(&unit_folder);
        let (write_to, write) = self.placement.write_to(self.registry.stores(), &location)?;
        let counts = match df
            .write_parquet(&write_to, DataFrameWriteOptions::new(), Some(options))
            .await
        {
            Ok(counts) => counts,
            Err(e) => {
                write.abort().await;
                return Err(e.into());
            }
        };
        write.commit().await?;
        let store = self.registry.stores().commit_store(&unit_folder)?;
        let prefix = crate::storage::object_path(&unit_folder)?;
        let view_prefix = crate::storage::object_path(folder)?;
        let manifests = Manifests::new(store, view_prefix.clone());
        let mut files = Vec::new();
        for meta in manifests.files_under(&prefix).await? {
            let Some(path) = meta.location.prefix_match(&view_prefix) else {
                continue;
            };
            let path: Vec<String> = path.map(|p| p.as_ref().to_string()).collect();
            files.push(OutputFile {
                path: path.join("/"),
                size: meta.size,
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Some(Unit {
            id,
            inputs: work.inputs.clone(),
            files,
            rows: super::write::rows_in(&counts),
            error: None,
        }))
    }

    /// Removes files under the view's `data/` that the manifest `now` does not list: those it
    /// retired an hour ago or more (a reader of an older manifest has had that long), and those
    /// of units never committed (a refresh killed, or beaten to them) begun a day ago or more.
    /// A file of a unit still being scored, or of a unit just replaced, is never removed.
    async fn remove_unlisted(
        &self,
        manifests: &Manifests,
        folder: &Url,
        (now_version, now): (u64, &Manifest),
    ) -> Result<()> {
        let listed: BTreeSet<&str> = now
            .current
            .iter()
            .chain(now.pending.iter())
            .flat_map(Generation::files)
            .map(|f| f.path.as_str())
            .collect();
        let retired: BTreeMap<&str, u64> = now
            .retired
            .iter()
            .map(|r| (r.path.as_str(), r.at_ms))
            .collect();
        // Files an older version still kept listed, which the newest neither lists nor retired:
        // dropped by a version written by hand (every commit retires what it drops). They go as
        // retired files do, an hour after they were last written.
        let mut dropped: BTreeSet<String> = BTreeSet::new();
        for version in manifests.versions().await? {
            // Only versions before the one this refresh ended at: a later one is another
            // refresh's commit, whose units `now` cannot know.
            if version >= now_version {
                break;
            }
            let Some(bytes) = manifests.read(version).await? else {
                continue;
            };
            let Ok(older) = Manifest::from_bytes(&bytes, "a view's manifest") else {
                continue;
            };
            dropped.extend(
                older
                    .current
                    .iter()
                    .chain(older.pending.iter())
                    .flat_map(Generation::files)
                    .map(|f| f.path.clone())
                    .filter(|p| !listed.contains(p.as_str()) && !retired.contains_key(p.as_str())),
            );
        }
        let view_prefix = crate::storage::object_path(folder)?;
        let data = view_prefix.clone().join("data");
        let now_ms = now_ms();
        for meta in manifests.files_under(&data).await? {
            let Some(path) = meta.location.prefix_match(&view_prefix) else {
                continue;
            };
            let parts: Vec<String> = path.map(|p| p.as_ref().to_string()).collect();
            let path = parts.join("/");
            if listed.contains(path.as_str()) {
                continue;
            }
            let written_ms = meta.last_modified.timestamp_millis() as u64;
            let removable = match retired.get(path.as_str()) {
                Some(at) => at + RETIRED_KEPT_MS <= now_ms,
                None if dropped.contains(&path) => written_ms + RETIRED_KEPT_MS <= now_ms,
                None => parts
                    .get(2)
                    .and_then(|unit| id_time(unit))
                    .is_some_and(|began| {
                        began + ABANDONED_AFTER_MS <= now_ms
                            && meta.last_modified.timestamp_millis() as u64 + RETIRED_KEPT_MS
                                <= now_ms
                    }),
            };
            if removable {
                manifests.delete(&meta.location).await?;
            }
        }
        Ok(())
    }
}

/// How long after it began a unit no manifest lists is taken for abandoned.
const ABANDONED_AFTER_MS: u64 = 24 * 3_600_000;

/// The generation `id` as the newest manifest has it.
async fn target_now(manifests: &Manifests, id: &str) -> Result<Option<Generation>> {
    let Some((_, manifest)) = newest_view(manifests, "a view's manifest").await? else {
        return Ok(None);
    };
    Ok(manifest
        .current
        .into_iter()
        .chain(manifest.pending)
        .find(|g| g.id == id))
}

/// The units of `generation` with a file missing from the view's folder, or of another size
/// (one listing).
async fn damaged_units(
    manifests: &Manifests,
    folder: &Url,
    generation: &Generation,
) -> Result<BTreeSet<String>> {
    if generation.units.iter().all(|u| u.files.is_empty()) {
        return Ok(BTreeSet::new());
    }
    let present = crate::view::files::present_files(manifests, folder).await?;
    Ok(generation
        .units
        .iter()
        .filter(|u| {
            u.files
                .iter()
                .any(|f| present.get(&f.path) != Some(&f.size))
        })
        .map(|u| u.id.clone())
        .collect())
}

/// A view's settings in force in the engine's session while it is refreshed; the session's own
/// are put back when this is dropped.
struct ViewSettings<'e> {
    engine: &'e Engine,
    before: Option<crate::config::BatchInferOptions>,
}

impl<'e> ViewSettings<'e> {
    fn apply(engine: &'e Engine, settings: &BTreeMap<String, String>) -> Result<Self> {
        // The guard first: a setting that cannot be applied leaves none of them behind.
        let guard = ViewSettings {
            engine,
            before: (!settings.is_empty()).then(|| engine.batchinfer_options()),
        };
        if settings.is_empty() {
            return Ok(guard);
        }
        engine.update_options(|options| {
            // A view kept before it kept `nulls` scored NULL features as NULL.
            options.nulls = Default::default();
            for (key, value) in settings {
                datafusion::config::ExtensionOptions::set(options, key, value)?;
            }
            Ok(())
        })?;
        Ok(guard)
    }
}

impl Drop for ViewSettings<'_> {
    fn drop(&mut self) {
        let Some(before) = self.before.take() else {
            return;
        };
        let _ = self.engine.update_options(|options| {
            options.on_error = before.on_error;
            options.rejects = before.rejects;
            options.max_errors = before.max_errors;
            options.nulls = before.nulls;
            Ok(())
        });
    }
}

/// The columns of `source` the plan's scan reads (all of them where it names none).
fn read_columns(
    plan: &LogicalPlan,
    source: &datafusion::arrow::datatypes::Schema,
) -> datafusion::arrow::datatypes::Schema {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut names: Option<Vec<String>> = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            names = Some(
                scan.projected_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect(),
            );
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    let fields: Vec<_> = source
        .fields()
        .iter()
        .filter(|f| names.as_ref().is_none_or(|n| n.contains(f.name())))
        .cloned()
        .collect();
    datafusion::arrow::datatypes::Schema::new(fields)
}

/// What a commit's input files came to once those that fail alone were found.
#[derive(Default)]
struct Pieces {
    scored: Vec<Unit>,
    failed: Vec<(Input, String)>,
}

/// Commits a scored `unit` of `work` (or none: its files are gone), counting what it scored; a
/// unit another refresh committed first is removed again.
async fn commit_scored(
    manifests: &Manifests,
    folder: &Url,
    target: &mut Target,
    work: &Work,
    unit: Option<Unit>,
    refreshed: &mut Refreshed,
) -> Result<()> {
    let rows = unit.as_ref().map_or(0, |u| u.rows);
    let applied = commit(manifests, target, work, unit.clone(), false).await?;
    match (applied, unit) {
        (true, _) => {
            refreshed.files_scored += work.inputs.len();
            refreshed.rows_scored += rows;
        }
        // Another refresh scored these files first: this one's output is not needed.
        (false, Some(unit)) => remove_files(manifests, folder, &unit).await?,
        (false, None) => {}
    }
    Ok(())
}

/// The units of `rebuilt` that hold an error for a file `current` serves.
fn served_but_failed(current: Option<&Generation>, rebuilt: &Generation) -> Vec<String> {
    let Some(current) = current else {
        return Vec::new();
    };
    if current.id == rebuilt.id {
        return Vec::new();
    }
    let served = served_inputs(current);
    rebuilt
        .units
        .iter()
        .filter(|u| u.error.is_some() && u.inputs.iter().any(|i| served.contains(i.path.as_str())))
        .map(|u| u.id.clone())
        .collect()
}

/// The input files whose rows `generation` serves.
fn served_inputs(generation: &Generation) -> BTreeSet<&str> {
    generation
        .units
        .iter()
        .filter(|u| u.error.is_none())
        .flat_map(|u| u.inputs.iter().map(|i| i.path.as_str()))
        .collect()
}

/// A rebuild that could not read files the current generation serves would take their rows out
/// of the view: it stays pending (readers keep the current rows) and the refresh fails naming
/// them, until they can be read or are removed.
fn check_rebuild_loses_nothing(
    name: &str,
    current: Option<&Generation>,
    rebuilt: Option<&Generation>,
) -> Result<()> {
    let (Some(current), Some(rebuilt)) = (current, rebuilt) else {
        return Ok(());
    };
    let served = served_inputs(current);
    let lost: Vec<String> = rebuilt
        .failed_inputs()
        .into_iter()
        .filter(|(path, _)| served.contains(path))
        .map(|(path, why)| format!("{path}: {why}"))
        .collect();
    if lost.is_empty() {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "materialized view '{name}': its rebuild cannot read {} input file(s) whose rows the view \
         serves now, so it keeps its current rows ({}); fix or remove them and REFRESH again",
        lost.len(),
        lost.join("; ")
    )))
}

/// The most input bytes scored between two commits.
const COMMIT_BYTES: u64 = 1 << 30;
