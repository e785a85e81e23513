//! A statement that reads a view refused while the files its newest manifest lists are not all
//! there; whether a name is a view. (Views are read by name through the warehouse's schema,
//! [`crate::warehouse::schema`].)

use super::{Views, live, newest_view};
use crate::error::{Error, Result};
use crate::message::display_error;
use crate::storage::is_object_store_url;
use crate::warehouse::schema::Kind;

impl Views<'_> {
    /// Refuses a statement that reads view `name` while its files are not all there, each of
    /// the size it was written with: it would answer with part of the view's rows.
    pub(crate) async fn check_view_files(&self, name: &str) -> Result<()> {
        match self.catalog.table_kind(name, self.session).await? {
            Some(Kind::View) => self.view_files_whole(name).await,
            _ => Ok(()),
        }
    }

    /// The error refusing view `name`'s newest manifest for the files it lists, if it names
    /// any that is not the view's own (a manifest that cannot be read says nothing here).
    pub(crate) async fn view_paths_refused(&self, name: &str) -> Option<Error> {
        let warehouse = self.warehouse?;
        let manifests = warehouse.view_manifests(name).ok()?;
        let (_, manifest) = newest_view(&manifests, name).await.ok()??;
        let current = manifest.current.as_ref()?;
        crate::view::files::check_paths(name, current).err()
    }

    /// Whether view `name`'s newest manifest lists only files of its own, each there with the
    /// size it was written with (a view not refreshed yet, or whose manifest cannot be read,
    /// has none to check).
    pub(crate) async fn view_files_whole(&self, name: &str) -> Result<()> {
        let Some(warehouse) = self.warehouse else {
            return Ok(());
        };
        let manifests = warehouse.view_manifests(name)?;
        let shown = format!("view '{name}''s manifest");
        // A manifest that cannot be read says nothing here: the view is left out of the
        // statement's tables, which says why.
        let Ok(Some((_, manifest))) = newest_view(&manifests, &shown).await else {
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
    pub(crate) async fn is_view(&self, name: &str) -> Result<bool> {
        let Some(warehouse) = self.warehouse else {
            return Ok(false);
        };
        let latest = warehouse.view_manifests(name)?.latest().await?;
        Ok(live(latest).is_some())
    }

    /// DataFusion reports any failure to open `FROM 's3://...'` or `FROM 'path'` as "table not
    /// found"; the store says why (no such object, file or bucket, credentials refused, endpoint
    /// unreachable, not a regular file).
    pub async fn explain_missing(&self, err: Error) -> Error {
        let Error::DataFusion(inner) = &err else {
            return err;
        };
        let message = inner.to_string();
        let missing = message
            .split_once("table '")
            .and_then(|(_, rest)| rest.split_once("' not found"))
            .map(|(name, _)| name.trim_start_matches("datafusion.public."));
        if let Some(name) = missing
            && crate::warehouse::check_name("view", name).is_ok()
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
        let Some(name) = message
            .split_once("table '")
            .and_then(|(_, rest)| rest.split_once("' not found"))
            .map(|(name, _)| name.trim_start_matches("datafusion.public."))
            .filter(|name| is_object_store_url(name) || name.contains('/'))
        else {
            return err;
        };
        match self.session.registry().stores().why_nothing_at(name).await {
            Ok(None) => err,
            Ok(Some(why)) => Error::location(name, why),
            Err(e) => Error::location(name, format!("cannot read {name}: {}", display_error(&e))),
        }
    }
}
