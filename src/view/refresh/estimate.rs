//! `EXPLAIN COST REFRESH MATERIALIZED VIEW name`: what the view's next refresh would ask its
//! endpoint models, counted as [`crate::llm::estimate`] counts a query's: the refresh's plan
//! made as a refresh makes it (its new and changed input files only, or every file where the
//! query or a model changed), each unit's query run as an estimate, nothing sent or written.

use super::*;
use crate::llm::estimate::{Estimate, Estimates};

impl Views<'_> {
    /// Each endpoint model's estimate for the next refresh of `name`, and the rows it would
    /// score.
    pub async fn estimate_refresh(&self, name: &str) -> Result<(Vec<Estimate>, u64)> {
        let warehouse = self.warehouse()?;
        let manifests = warehouse.view_manifests(name)?;
        let manifest = manifest_of(&manifests, name).await?;
        crate::view::check::without_credentials(name, &manifest.source)?;
        let _settings = ViewSettings::apply(self.session, &manifest.settings)?;
        self.session.tag_text(
            format!("EXPLAIN COST REFRESH MATERIALIZED VIEW {name}"),
            Some(warehouse),
        )?;
        // As the refresh does: a model file changed on disk is a new model.
        let used = || manifest.current.iter().chain(manifest.pending.iter());
        used().try_for_each(|generation| crate::view::files::check_paths(name, generation))?;
        let models = used().flat_map(|g| g.models.keys());
        self.catalog.reload_changed_folder_models(models).await?;
        let planned = self.plan_view(name, &manifest).await?;
        let target = choose_target(&manifest, &planned.models, &planned.schema)?;
        let generation = generation_of(&manifest, &target)?;
        let folder = warehouse.view_folder(name)?;
        let listed = self.list_inputs(&planned.source).await?;
        let mut damaged = damaged_units(&manifests, &folder, &generation).await?;
        if target.pending || target.new.is_some() {
            damaged.extend(served_but_failed(manifest.current.as_ref(), &generation));
        }
        let changes = plan(&generation, &listed, self.commit_size(), &damaged);
        let estimates = Estimates::start(&self.session.statement());
        let mut rows = 0;
        for work in &changes.work {
            if work.inputs.is_empty() {
                continue;
            }
            let plan = self.unit_plan(&planned, work).await?;
            let plan = crate::rules::estimate_rows::keeping_rows(plan)?;
            // A cascade reads the thresholds the generation keeps, as its refresh would.
            let state = self.state_of(self.unit_statement(&folder, &target.id));
            let mut stream = DataFrame::new(state, plan).execute_stream().await?;
            while let Some(batch) = stream.next().await {
                rows += batch?.num_rows() as u64;
            }
        }
        Ok((estimates.estimates(), rows))
    }
}
