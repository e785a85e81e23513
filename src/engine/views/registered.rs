//! Each view registered by name as the files its newest manifest lists, and a statement that
//! reads a view refused while those files are not all there.

use super::*;

impl Engine {
    /// Registers each materialized view of the warehouse by name, as its newest manifest has
    /// it: one listing of `views/`, and one of each view's folder, per statement.
    pub(crate) async fn register_views(&self) -> Result<()> {
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
    pub(crate) async fn register_view(
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

    /// Refuses a statement that reads view `name` while its files are not all there, each of
    /// the size it was written with: it would answer with part of the view's rows.
    pub(crate) async fn check_view_files(&self, name: &str) -> Result<()> {
        if !self.seen_views().contains_key(name) {
            return Ok(());
        }
        self.view_files_whole(name).await
    }

    /// The error refusing view `name`'s newest manifest for the files it lists, if it names
    /// any that is not the view's own (a manifest that cannot be read says nothing here).
    pub(crate) async fn view_paths_refused(&self, name: &str) -> Option<Error> {
        let warehouse = self.warehouse.as_ref()?;
        let manifests = warehouse.view_manifests(name).ok()?;
        let (_, manifest) = newest_view(&manifests, name).await.ok()??;
        let current = manifest.current.as_ref()?;
        crate::view::files::check_paths(name, current).err()
    }

    /// Whether view `name`'s newest manifest lists only files of its own, each there with the
    /// size it was written with (a view not refreshed yet has none to check).
    pub(crate) async fn view_files_whole(&self, name: &str) -> Result<()> {
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
    pub(crate) async fn is_view(&self, name: &str) -> Result<bool> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(false);
        };
        let latest = warehouse.view_manifests(name)?.latest().await?;
        Ok(live(latest).is_some())
    }

    pub(crate) fn forget_view(&self, name: &str) -> Result<()> {
        if self.seen_views().remove(name).is_some() {
            self.ctx.deregister_table(TableReference::bare(name))?;
        }
        Ok(())
    }

    /// The views registered by name, with the manifest version each was registered at.
    pub(crate) fn seen_views(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.seen.views.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The newest manifest, unless it says the view was dropped (one that cannot be read counts as
/// a view).
pub(crate) fn live(latest: Option<(u64, Vec<u8>)>) -> Option<(u64, Vec<u8>)> {
    latest.filter(|(_, bytes)| {
        Manifest::from_bytes(bytes, "the view's manifest").map_or(true, |m| !m.dropped)
    })
}

/// The rows of `generation`: the files it lists under the view's folder, with its schema; a
/// manifest listing any other file is refused ([`crate::view::files::check_paths`]).
pub(crate) fn view_table(
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
