//! The engine's catalog statements: batchinfer's model statements (`CREATE/DROP/DESCRIBE MODEL`,
//! `SHOW MODELS`), kept in the warehouse, and what DROP TABLE and INSERT need to know of tables.

use super::*;

impl Engine {
    pub(super) async fn run_model_statement(&self, statement: ModelStatement) -> Result<DataFrame> {
        match statement {
            ModelStatement::Create {
                name,
                source,
                or_replace,
            } => {
                check_name("model", &name)?;
                if self.registry.contains(&name) && !or_replace {
                    return Err(Error::Usage(format!(
                        "model '{name}' already exists (use CREATE OR REPLACE MODEL, or DROP MODEL {name})"
                    )));
                }
                let source = model_source(&source)?;
                let model = Model::load(
                    &name,
                    &source,
                    self.registry.session_options(),
                    self.registry.stores(),
                )?;
                self.registry.insert_loaded(&name, Arc::new(model));
                self.persist_models(&name, Some(&source))?;
                self.empty()
            }
            ModelStatement::Drop { name, if_exists } => {
                if !self.registry.unregister(&name) && !if_exists {
                    return Err(Error::UnknownModel {
                        name,
                        available: format!("the models are: {}", self.registry.names().join(", ")),
                    });
                }
                self.persist_models(&name, None)?;
                self.empty()
            }
            ModelStatement::Show => Ok(self.results.read_batch(models_batch(&self.registry)?)?),
            ModelStatement::Describe { name } => {
                let model = self.registry.get(&name)?;
                Ok(self.results.read_batch(describe_batch(&model)?)?)
            }
        }
    }

    pub(super) fn persist_models(&self, name: &str, source: Option<&ModelSource>) -> Result<()> {
        match (&self.warehouse, source) {
            (Some(warehouse), Some(source)) => warehouse.save_model(name, &source.to_string()),
            (Some(warehouse), None) => warehouse.remove_model(name),
            (None, _) => Ok(()),
        }
    }

    /// Whether `name` is registered as the warehouse's table of that name (not an external
    /// table that happens to share it), so that DROP TABLE deletes only files the warehouse owns.
    pub(super) async fn is_warehouse_table(
        &self,
        warehouse: &Warehouse,
        name: &str,
    ) -> Result<bool> {
        use datafusion::datasource::listing::ListingTable;
        let Ok(provider) = self.ctx.table_provider(TableReference::bare(name)).await else {
            return Ok(false);
        };
        let Some(listing) = provider.downcast_ref::<ListingTable>() else {
            return Ok(false);
        };
        let owned = location_url(&warehouse.table_location(name)?)?;
        Ok(listing
            .table_paths()
            .iter()
            .any(|path| path.get_url() == &owned))
    }

    /// The folders an INSERT writes into: the locations of its target table.
    pub(super) async fn insert_targets(
        &self,
        insert: &datafusion::sql::sqlparser::ast::Insert,
    ) -> Result<Vec<String>> {
        use datafusion::datasource::listing::ListingTable;
        use datafusion::sql::sqlparser::ast::TableObject;
        let TableObject::TableName(name) = &insert.table else {
            return Ok(Vec::new());
        };
        let Ok(provider) = self.ctx.table_provider(name.to_string()).await else {
            return Ok(Vec::new());
        };
        Ok(provider
            .downcast_ref::<ListingTable>()
            .map(|listing| {
                listing
                    .table_paths()
                    .iter()
                    .map(|path| path.get_url().to_string())
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// The model file a CREATE MODEL source names: a `.onnx` file, or a folder with `model.onnx`,
/// local or in S3; a local path is made absolute so that the definition means the same in a
/// process started elsewhere.
pub(super) fn model_source(source: &str) -> Result<ModelSource> {
    let mut url = match ModelSource::parse(source).map_err(Error::Usage)? {
        ModelSource::Object(url) => url,
        ModelSource::File(path) => return model_file(&path, source).map(ModelSource::File),
    };
    if !url.path().ends_with(".onnx") {
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        url = url
            .join("model.onnx")
            .map_err(|e| Error::Usage(format!("{source}: {e}")))?;
    }
    Ok(ModelSource::Object(url))
}

pub(super) fn model_file(path: &Path, source: &str) -> Result<PathBuf> {
    let path = path.to_path_buf();
    let path = if path.is_dir() {
        path.join("model.onnx")
    } else {
        path
    };
    if !path.is_file() {
        return Err(Error::Usage(format!(
            "no model at '{source}': expected an .onnx file or a folder holding model.onnx"
        )));
    }
    std::path::absolute(&path).map_err(|e| Error::io(format!("resolving {source}"), e))
}
