//! `batchinfer_rejects()`: the rows models failed on, kept with `on_error = 'reject'`
//! ([`crate::rejects`]), read back as a table.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::rejects::meta_schema;
use crate::statement_context::StatementContext;
use crate::storage::StoreRegistry;

/// `batchinfer_rejects()`: every rejected row kept at the session's rejects location, with the
/// columns every rejects file has (a statement's own folder, `REJECTS/STATEMENT/`, has the
/// inputs too).
#[derive(Debug)]
pub struct RejectsFunction {
    pub stores: Arc<StoreRegistry>,
}

impl datafusion::catalog::TableFunctionImpl for RejectsFunction {
    fn call_with_args(
        &self,
        args: datafusion::catalog::TableFunctionArgs,
    ) -> datafusion::error::Result<Arc<dyn datafusion::catalog::TableProvider>> {
        use datafusion::datasource::file_format::parquet::ParquetFormat;
        use datafusion::datasource::listing::{
            ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
        };
        if !args.exprs().is_empty() {
            return datafusion::common::plan_err!("batchinfer_rejects() takes no arguments");
        }
        let root = args
            .session()
            .config()
            .options()
            .extensions
            .get::<StatementContext>()
            .map(|o| o.rejects.clone())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "rejects/".to_string());
        let url = crate::storage::folder_location(&root)?;
        // One folder per statement (DataFusion reads no subfolders of a table's folder).
        let files = match self.stores.list_two_levels(&url, &root) {
            Ok(files) => files,
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Vec::new()
            }
            Err(e) => return Err(e.into()),
        };
        let mut folders: Vec<&str> = files
            .iter()
            .filter(|f| f.ends_with(".parquet"))
            .filter_map(|f| Some(f.split_once('/')?.0))
            .collect();
        folders.dedup();
        if folders.is_empty() {
            return Ok(Arc::new(datafusion::datasource::MemTable::try_new(
                meta_schema(),
                vec![vec![]],
            )?));
        }
        let paths = folders
            .iter()
            .map(|folder| {
                let url = url.join(&format!("{folder}/")).map_err(|e| {
                    Error::setting("batchinfer.rejects", format!("{url}{folder}/: {e}"))
                })?;
                Ok(ListingTableUrl::parse(url.as_str())?)
            })
            .collect::<Result<Vec<_>>>()?;
        let options =
            ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(paths)
            .with_listing_options(options)
            .with_schema(meta_schema());
        Ok(Arc::new(ListingTable::try_new(config)?))
    }
}
