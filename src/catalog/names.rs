//! What a name a statement reads means, when DataFusion finds no table by it: a view without a
//! complete refresh, or a path the store says why it cannot open; and whether a name is a view.

use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DFStatement;

use super::Catalog;
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::session::Session;
use crate::storage::is_object_store_url;
use crate::warehouse::view_manifest::{live, newest_view};

impl Catalog {
    /// Plans and runs one parsed statement (CREATE EXTERNAL TABLE by the catalog's table
    /// factories); a table it reads that is not found is explained ([`Catalog::explain_missing`]).
    pub async fn execute(&self, session: &Session, statement: DFStatement) -> Result<DataFrame> {
        let plan = match session.plan(statement).await {
            Ok(plan) => plan,
            Err(e) => return Err(self.explain_missing(e).await),
        };
        if let LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)) = &plan {
            return self.create_external_table(session, create).await;
        }
        session.run_plan(plan).await
    }

    /// DataFusion reports any failure to open `FROM 's3://...'` or `FROM 'path'` as "table not
    /// found"; the store says why (no such object, file or bucket, credentials refused, endpoint
    /// unreachable, not a regular file).
    pub async fn explain_missing(&self, err: Error) -> Error {
        let Error::DataFusion(inner) = &err else {
            return err;
        };
        let message = inner.to_string();
        let Some(name) = message
            .split_once("table '")
            .and_then(|(_, rest)| rest.split_once("' not found"))
            .map(|(name, _)| name.trim_start_matches("datafusion.public."))
        else {
            return err;
        };
        if crate::warehouse::check_name("view", name).is_ok()
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
        if !is_object_store_url(name) && !name.contains('/') {
            return err;
        }
        match self.registry.stores().why_nothing_at(name).await {
            Ok(None) => err,
            Ok(Some(why)) => Error::location(name, why),
            Err(e) => Error::location(name, format!("cannot read {name}: {}", display_error(&e))),
        }
    }

    /// Whether the warehouse has a materialized view `name` (registered or not; one whose
    /// manifest cannot be read counts).
    pub async fn is_view(&self, name: &str) -> Result<bool> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(false);
        };
        let latest = warehouse.view_manifests(name)?.latest().await?;
        Ok(live(latest).is_some())
    }

    /// The error refusing view `name`'s newest manifest for the files it lists, if it names
    /// any that is not the view's own (a manifest that cannot be read says nothing here).
    async fn view_paths_refused(&self, name: &str) -> Option<Error> {
        let warehouse = self.warehouse.as_ref()?;
        let manifests = warehouse.view_manifests(name).ok()?;
        let (_, manifest) = newest_view(&manifests, name).await.ok()??;
        let current = manifest.current.as_ref()?;
        crate::warehouse::view_files::check_paths(name, current).err()
    }
}
