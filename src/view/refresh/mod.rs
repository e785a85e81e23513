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

use super::Views;
use crate::error::{Error, Result};
use crate::session::Session;
use crate::statements::Statement;
use crate::storage::Manifests;
use crate::view::check::{Source, SourceFiles, reading, row_wise_source, source_table};
use crate::view::commit::{RETIRED_KEPT_MS, Target, choose_target, commit, remove_files};
use crate::view::failed::blames_the_files;
use crate::view::plan::{CommitSize, Work, plan};
use crate::view::{
    Generation, Input, Manifest, OutputFile, Unit, id_time, new_id, newest_view, now_ms,
};

mod estimate;
mod repair;
mod units;

use repair::*;
use units::*;

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
    /// What its endpoint models did: requests, answers from the cache, tokens, cost, and a
    /// cascade's proxy's answers.
    pub llm: crate::llm::Usage,
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

/// The newest manifest of view `name`, or the error that there is no such view.
async fn manifest_of(manifests: &Manifests, name: &str) -> Result<Manifest> {
    match newest_view(manifests, &format!("view '{name}''s manifest")).await? {
        Some((_, manifest)) => Ok(manifest),
        None => Err(Error::view(
            name,
            format!("there is no materialized view '{name}' (SHOW MATERIALIZED VIEWS lists them)"),
        )),
    }
}

impl Views<'_> {
    /// Brings materialized view `name` up to date with its input files and models.
    pub async fn refresh_view(&self, name: &str) -> Result<Refreshed> {
        let started = Instant::now();
        let warehouse = self.warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let manifest = manifest_of(&manifests, name).await?;
        crate::view::check::without_credentials(name, &manifest.source)?;
        // Scored with the view's own settings, whichever session refreshes it; tagged as a
        // statement of its own (its rejects' folder).
        let _settings = ViewSettings::apply(self.session, &manifest.settings)?;
        let statement = format!("REFRESH MATERIALIZED VIEW {name}");
        self.session.tag_text(statement, Some(warehouse))?;
        let used = || manifest.current.iter().chain(manifest.pending.iter());
        used().try_for_each(|generation| crate::view::files::check_paths(name, generation))?;
        let models = used().flat_map(|g| g.models.keys());
        self.catalog.reload_changed_folder_models(models).await?;
        let planned = self.plan_view(name, &manifest).await?;
        let mut target = choose_target(&manifest, &planned.models, &planned.schema)?;
        let generation = generation_of(&manifest, &target)?;
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
            return Err(Error::view(
                name,
                format!(
                    "materialized view '{name}' kept changing under this refresh (other refreshes \
                 committed meanwhile); run REFRESH again"
                ),
            ));
        }
        refreshed.rebuilt = finish_rebuild(name, &manifests, &manifest, &mut target).await?;
        self.conclude(
            &manifests,
            &folder,
            worked || target.pending,
            &mut refreshed,
        )
        .await?;
        refreshed.seconds = started.elapsed().as_secs_f64();
        let statement = self.session.statement();
        for usage in crate::llm::spend::usage(&statement.ledger, None).values() {
            refreshed.llm.add(usage);
        }
        Ok(refreshed)
    }

    /// The end of a refresh: the view's totals as it now stands, the files no manifest lists
    /// removed (where this refresh changed anything), and a warning for each input file left out.
    async fn conclude(
        &self,
        manifests: &Manifests,
        folder: &Url,
        changed: bool,
        refreshed: &mut Refreshed,
    ) -> Result<()> {
        let name = refreshed.view.clone();
        let shown = format!("view '{name}''s manifest");
        let Some((now_version, now)) = newest_view(manifests, &shown).await? else {
            return Err(Error::view(
                &name,
                format!("materialized view '{name}' was dropped while it was refreshed"),
            ));
        };
        (refreshed.view_files, refreshed.view_rows) = now.totals();
        if changed {
            self.remove_unlisted(manifests, folder, (now_version, &now))
                .await?;
        }
        for (path, why) in &refreshed.failed {
            crate::say!(
                "warning: materialized view '{name}': the input file {path} is left out until it \
                 changes: {why}"
            );
        }
        Ok(())
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

    /// Plans a view's query (loading its models), checking that it is row-wise. Files the query
    /// names by path are read as the view keeps them, so that planning reads none of them.
    async fn plan_view(&self, name: &str, manifest: &Manifest) -> Result<Planned> {
        let query = &manifest.query;
        let mut statements = self.session.statements(query)?;
        let statement = match (statements.pop(), statements.is_empty()) {
            (Some(Statement::Sql(statement)), true) => *statement,
            _ => {
                return Err(Error::view(
                    name,
                    format!(
                        "materialized view '{name}' has a query that is not one statement: {query}"
                    ),
                ));
            }
        };
        let _source = match &manifest.source_table {
            Some(kept) => {
                let parquet = self.session.ctx().state().table_options().parquet.clone();
                let table = source_table(kept, parquet)?;
                Some(crate::session::Registered::named(
                    self.session.ctx(),
                    &kept.name,
                    table,
                )?)
            }
            None => None,
        };
        let df = self.execute(statement).await?;
        let plan = df.logical_plan().clone();
        let source = row_wise_source(&plan, name)?;
        let models = crate::lineage::versions_in(self.session.registry(), &plan)
            .into_iter()
            .collect();
        // The scan's projection is known once the plan is optimized.
        let read = read_columns(&self.session.ctx().state().optimize(&plan)?, &source.schema);
        Ok(Planned {
            models_json: crate::lineage::models_used(self.session.registry(), &plan)?,
            schema: df.schema().inner().clone(),
            read,
            plan,
            source,
            models,
        })
    }

    /// What a refresh of view `name` would find now against its current generation: its input
    /// files new, changed and gone, each counted ((0, 0, 0): it is up to date).
    pub(crate) async fn behind(
        &self,
        name: &str,
        manifest: &Manifest,
    ) -> Result<(usize, usize, usize)> {
        let Some(current) = &manifest.current else {
            return Ok((0, 0, 0));
        };
        crate::view::check::without_credentials(name, &manifest.source)?;
        let planned = self.plan_view(name, manifest).await?;
        let listed = self.list_inputs(&planned.source).await?;
        let changes = plan(current, &listed, self.commit_size(), &BTreeSet::new());
        Ok((changes.new, changes.changed, changes.removed))
    }

    /// How much a refresh scores between commits (`batchinfer.files_per_commit`).
    fn commit_size(&self) -> CommitSize {
        let options = self.session.batchinfer_options();
        CommitSize {
            files: options.files_per_commit.max(1),
            bytes: COMMIT_BYTES,
        }
    }
}

/// A view's settings in force in the session while it is refreshed; the session's own
/// are put back when this is dropped.
struct ViewSettings<'e> {
    session: &'e Session,
    before: Option<crate::config::BatchInferOptions>,
}

impl<'e> ViewSettings<'e> {
    fn apply(session: &'e Session, settings: &BTreeMap<String, String>) -> Result<Self> {
        // The guard first: a setting that cannot be applied leaves none of them behind.
        let guard = ViewSettings {
            session,
            before: (!settings.is_empty()).then(|| session.batchinfer_options()),
        };
        if settings.is_empty() {
            return Ok(guard);
        }
        session.update_options(|options| {
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
        let _ = self.session.update_options(|options| {
            options.on_error = before.on_error;
            options.rejects = before.rejects;
            options.max_errors = before.max_errors;
            options.nulls = before.nulls;
            Ok(())
        });
    }
}

/// The most input bytes scored between two commits.
const COMMIT_BYTES: u64 = 1 << 30;

/// The generation a refresh scores into: the new one it makes, else the view's own.
fn generation_of(manifest: &Manifest, target: &Target) -> Result<Generation> {
    match &target.new {
        Some(new) => Ok(new.clone()),
        None => manifest
            .current
            .iter()
            .chain(manifest.pending.iter())
            .find(|g| g.id == target.id)
            .cloned()
            .ok_or_else(|| Error::Internal("a view's generation vanished".into())),
    }
}

/// After the units are scored: a rebuild complete is made current (whether it was), a rebuild
/// for models no longer defined is dropped.
async fn finish_rebuild(
    name: &str,
    manifests: &Manifests,
    manifest: &Manifest,
    target: &mut Target,
) -> Result<bool> {
    let nothing = Work {
        replaces: Vec::new(),
        inputs: Vec::new(),
    };
    if target.pending {
        let rebuilt = target_now(manifests, &target.id).await?;
        check_rebuild_loses_nothing(name, manifest.current.as_ref(), rebuilt.as_ref())?;
        commit(manifests, target, &nothing, None, true).await?;
        return Ok(true);
    }
    if target.stale_pending.is_some() {
        commit(manifests, target, &nothing, None, false).await?;
    }
    Ok(false)
}
