//! A statement that reads a view refused while the files its newest manifest lists are not all
//! there. (Views are read by name through the warehouse's schema, [`crate::warehouse::schema`].)

use super::{Views, newest_view};
use crate::error::Result;
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
        self.catalog.is_view(name).await
    }
}
