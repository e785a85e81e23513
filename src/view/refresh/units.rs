//! The units of a refresh: its input files listed, each unit scored and its files written.

use super::*;

impl Views<'_> {
    /// The input files of `source` now: each one's URL, size and version.
    pub(super) async fn list_inputs(&self, source: &Source) -> Result<Vec<Input>> {
        let state = self.session.ctx().state();
        let (paths, options) = match &source.files {
            SourceFiles::Listing { paths, options } => (paths, options),
            SourceFiles::Blob(table) => {
                if let Some(folder) = table.gone() {
                    return Err(Error::location(
                        folder.display().to_string(),
                        format!(
                            "the view's input {} is not there (moved, or not mounted?); the view \
                             is left as it was",
                            folder.display()
                        ),
                    ));
                }
                let local = table.is_local();
                return Ok(table
                    .files(&state)
                    .await?
                    .into_iter()
                    .map(|(path, meta)| Input {
                        path,
                        size: meta.size,
                        version: crate::storage::file_version(local, &meta),
                    })
                    .collect());
            }
        };
        let mut inputs = Vec::new();
        for url in paths {
            let store = state.runtime_env().object_store(url)?;
            let local = crate::storage::is_local_store(&url.object_store());
            // A folder that is gone is not a folder emptied: the view is left as it was.
            if local
                && let Some(path) = crate::storage::local_file(url.prefix())
                && !path.exists()
            {
                return Err(Error::location(
                    crate::storage::display_location(url.get_url()),
                    format!(
                        "the view's input {} is not there (moved, or not mounted?); the view is left \
                     as it was",
                        crate::storage::display_location(url.get_url())
                    ),
                ));
            }
            let extension = &options.file_extension;
            let files: Vec<_> = url
                .list_all_files(&state, store.as_ref(), extension)
                .await?
                .try_collect()
                .await?;
            let base = Url::parse(url.object_store().as_str())
                .map_err(|e| Error::location(url.as_str(), format!("{url}: {e}")))?;
            for meta in files {
                let mut file = base.clone();
                file.path_segments_mut()
                    .map_err(|()| Error::location(&base, format!("{base} has no path")))?
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
    pub(super) async fn score_unit_or_say_why(
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
            let now = self.session.registry().stores().file_version(&url).await;
            if now.ok().flatten().as_ref() != Some(&input.version) {
                return Err(Error::location(
                    crate::storage::display_location(&url),
                    format!(
                        "the input file {} changed while this refresh read it; nothing of it was \
                     kept: run REFRESH again ({})",
                        crate::storage::display_location(&url),
                        crate::message::display_error(&e)
                    ),
                ));
            }
        }
        Err(e)
    }

    /// The view's query over the inputs of `work` alone.
    pub(super) async fn unit_plan(
        &self,
        planned: &Planned,
        work: &Work,
    ) -> Result<datafusion::logical_expr::LogicalPlan> {
        let table: Arc<dyn datafusion::catalog::TableProvider> = match &planned.source.files {
            SourceFiles::Listing { options, .. } => {
                let paths = work
                    .inputs
                    .iter()
                    .map(|i| {
                        let url = Url::parse(&i.path)
                            .map_err(|e| Error::location(&i.path, format!("{}: {e}", i.path)))?;
                        Ok(ListingTableUrl::try_new(url, None)?)
                    })
                    .collect::<Result<Vec<_>>>()?;
                check_columns(
                    &self.session.ctx().state(),
                    planned,
                    options,
                    &paths,
                    &work.inputs,
                )
                .await?;
                let config = ListingTableConfig::new_with_multi_paths(paths)
                    .with_listing_options(options.clone())
                    .with_schema(planned.source.schema.clone());
                Arc::new(ListingTable::try_new(config)?)
            }
            SourceFiles::Blob(table) => Arc::new(
                table.of_files(
                    work.inputs
                        .iter()
                        .map(|i| (i.path.clone(), i.version.clone()))
                        .collect(),
                ),
            ),
        };
        reading(&planned.plan, table)
    }

    /// The statement a unit of the generation `generation` runs as: what its calls learn is
    /// kept for the generation's next refreshes, apart from any other generation's (another
    /// query, another model).
    pub(super) fn unit_statement(
        &self,
        folder: &Url,
        generation: &str,
    ) -> crate::statement_context::StatementContext {
        let mut statement = self.session.statement();
        statement.keeps = folder
            .join(&format!("cascades/{generation}/"))
            .map(|u| u.to_string())
            .unwrap_or_default();
        statement
    }

    /// The session's state with `statement` as the statement at hand, for a unit's plan: what
    /// the functions of its plan are given (the options as they were when the state was
    /// taken) is taken again.
    pub(super) fn state_of(
        &self,
        statement: crate::statement_context::StatementContext,
    ) -> datafusion::execution::SessionState {
        let mut state = self.session.ctx().state();
        state
            .config_mut()
            .options_mut()
            .extensions
            .insert(statement);
        state.mark_start_execution();
        state
    }

    /// Scores the inputs of `work` into a folder of their own under the view's `data/`; `None`
    /// where it has none (its files are gone).
    pub(super) async fn score_unit(
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
        let plan = self.unit_plan(planned, work).await?;
        // The unit is a part of the refresh of its own: what endpoint models do for it is
        // counted apart, for its files.
        let mut statement = self.unit_statement(folder, generation);
        statement.part = id.clone();
        let usage = crate::lineage::UsageRecord::of(self.session.registry(), &plan, &statement);
        let df = DataFrame::new(self.state_of(statement), plan);
        let mut options = self.session.parquet_options(df.schema().as_arrow());
        let inputs = serde_json::to_string(&work.inputs).unwrap_or_default();
        for (key, value) in [
            (crate::lineage::MODELS_KEY, planned.models_json.clone()),
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
        let (write_to, write) = self
            .session
            .placement()
            .write_to(self.session.registry().stores(), &location)?;
        if let Some(placeholder) = usage.and_then(|u| u.reserve(&write, &options)) {
            options
                .key_value_metadata
                .insert(crate::lineage::LLM_USAGE_KEY.to_string(), Some(placeholder));
        }
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
        let files = self.unit_files(folder, &unit_folder).await?;
        Ok(Some(Unit {
            id,
            inputs: work.inputs.clone(),
            files,
            rows: crate::session::rows_in(&counts),
            error: None,
        }))
    }

    /// The files a unit wrote in `unit_folder`, by their paths under the view's `folder`.
    async fn unit_files(&self, folder: &Url, unit_folder: &Url) -> Result<Vec<OutputFile>> {
        let store = self.session.registry().stores().commit_store(unit_folder)?;
        let prefix = crate::storage::object_path(unit_folder)?;
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
        Ok(files)
    }
}

/// Each file is read with its own columns as they are, or it is that file's error: the columns
/// the query reads.
async fn check_columns(
    state: &datafusion::execution::SessionState,
    planned: &Planned,
    options: &datafusion::datasource::listing::ListingOptions,
    paths: &[ListingTableUrl],
    inputs: &[crate::view::Input],
) -> Result<()> {
    for (path, input) in paths.iter().zip(inputs) {
        let inferred = ListingTableConfig::new(path.clone())
            .with_listing_options(options.clone())
            .infer_schema(state)
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
    Ok(())
}

/// The columns of `source` the plan's scan reads (all of them where it names none).
pub(super) fn read_columns(
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
pub(super) struct Pieces {
    pub(super) scored: Vec<Unit>,
    pub(super) failed: Vec<(Input, String)>,
}

/// Commits a scored `unit` of `work` (or none: its files are gone), counting what it scored; a
/// unit another refresh committed first is removed again.
pub(super) async fn commit_scored(
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
