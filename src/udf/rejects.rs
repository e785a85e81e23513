//! `batchinfer_rejects()`: the rows models failed on, kept with `on_error = 'reject'`
//! ([`crate::rejects`]), read back as a table; `batchinfer_rejects('model')`: one model's, with
//! its inputs (a `generate`'s `prompt` and `reply`).

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::rejects::meta_schema;
use crate::statement_context::StatementContext;
use crate::storage::StoreRegistry;

/// `batchinfer_rejects()`: every rejected row kept at the session's rejects location, with the
/// columns every rejects file has (a statement's own folder, `REJECTS/STATEMENT/`, has the
/// inputs too). `batchinfer_rejects('model')`: the rows that model failed on, with the columns
/// of its newest rejects file (its inputs).
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
        let model = match args.exprs() {
            [] => None,
            [
                datafusion::logical_expr::Expr::Literal(
                    datafusion::common::ScalarValue::Utf8(Some(model)),
                    _,
                ),
            ] => Some(model.clone()),
            _ => {
                return datafusion::common::plan_err!(
                    "batchinfer_rejects() takes no argument, or a model's name as a string: \
                     batchinfer_rejects('model')"
                );
            }
        };
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
        if let Some(model) = model {
            return self.of_model(&url, &model, &files);
        }
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

/// The largest rejects file whose columns are read for `batchinfer_rejects('model')`.
const MAX_SCHEMA_FILE: u64 = 256 << 20;

impl RejectsFunction {
    /// `batchinfer_rejects('model')`: the rejects files of `model` among `files` (each
    /// `STATEMENT/MODEL-PID-N.parquet` under `root`), read with the columns of the newest.
    fn of_model(
        &self,
        root: &url::Url,
        model: &str,
        files: &[String],
    ) -> datafusion::error::Result<Arc<dyn datafusion::catalog::TableProvider>> {
        use datafusion::datasource::file_format::parquet::ParquetFormat;
        use datafusion::datasource::listing::{
            ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
        };
        // `MODEL-PID-N.parquet`, so that model `a` does not take model `a-b`'s files.
        let of_model = |file: &str| {
            file.strip_prefix(model)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|rest| rest.strip_suffix(".parquet"))
                .and_then(|rest| rest.split_once('-'))
                .is_some_and(|(pid, n)| {
                    [pid, n]
                        .iter()
                        .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
                })
        };
        let mut chosen: Vec<&String> = files
            .iter()
            .filter(|f| f.split_once('/').is_some_and(|(_, file)| of_model(file)))
            .collect();
        // Statement folders are named by their time: the newest last.
        chosen.sort();
        let Some(newest) = chosen.last() else {
            return Ok(Arc::new(datafusion::datasource::MemTable::try_new(
                meta_schema(),
                vec![vec![]],
            )?));
        };
        let url_of = |file: &str| {
            root.join(file).map_err(|e| {
                datafusion::error::DataFusionError::from(Error::setting(
                    "batchinfer.rejects",
                    format!("{root}{file}: {e}"),
                ))
            })
        };
        let bytes = self.stores.read_file(&url_of(newest)?, MAX_SCHEMA_FILE)?;
        let schema =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                bytes::Bytes::from(bytes),
            )?
            .schema()
            .clone();
        let paths = chosen
            .iter()
            .map(|file| ListingTableUrl::parse(url_of(file)?.as_str()))
            .collect::<datafusion::error::Result<Vec<_>>>()?;
        let options =
            ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
        let config = ListingTableConfig::new_with_multi_paths(paths)
            .with_listing_options(options)
            .with_schema(schema);
        Ok(Arc::new(ListingTable::try_new(config)?))
    }
}
