//! The catalog's model statements (`CREATE/DROP/DESCRIBE MODEL`, `SHOW MODELS`), kept in the
//! warehouse, and the models brought up to the warehouse's definitions before each statement.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::dataframe::DataFrame;

use super::Catalog;
use crate::error::{Error, Result};
use crate::llm::{Endpoint, EndpointModel};
use crate::model::listing::{describe_batch, describe_endpoint_batch, models_batch};
use crate::model::{Model, ModelSource};
use crate::session::Session;
use crate::statements::ModelStatement;
use crate::storage::StoreRegistry;
use crate::warehouse::{Definition, check_name};

impl Catalog {
    pub async fn run_model_statement(
        &self,
        statement: ModelStatement,
        session: &Session,
    ) -> Result<DataFrame> {
        match statement {
            ModelStatement::Create {
                name,
                source,
                or_replace,
                quantize,
            } => {
                self.check_definable(&name, or_replace)?;
                let source = model_source(&name, &source, self.registry.stores()).await?;
                let (model, quantized) = self.model_of(&name, &source, quantize.is_some()).await?;
                let model = Arc::new(model);
                // Defined in the warehouse first: a model this process scores with is one the
                // warehouse names.
                self.persist_models(&name, Some(&model)).await?;
                let created = format!(
                    "model '{name}' {} from {} (sha256 {})",
                    if or_replace { "defined" } else { "created" },
                    model.source,
                    model.sha256
                );
                self.registry.insert_loaded(&name, model);
                eprintln!("{created}");
                if let Some(message) = quantized {
                    eprintln!("model '{name}' {message}");
                }
                session.empty()
            }
            ModelStatement::CreateEndpoint {
                name,
                or_replace,
                options,
            } => {
                self.check_definable(&name, or_replace)?;
                let endpoint = Endpoint::from_options(&name, &options)?;
                let definition = Definition {
                    source: endpoint.endpoint.clone(),
                    sha256: Some(endpoint.sha256()),
                    endpoint: Some(endpoint.to_json()),
                };
                let model = Arc::new(self.endpoint_model(&name, endpoint)?);
                self.persist_definition(&name, Some(definition)).await?;
                eprintln!(
                    "model '{name}' {} as {} at {} (definition sha256 {})",
                    if or_replace { "defined" } else { "created" },
                    model.endpoint.model,
                    model.endpoint.endpoint,
                    model.sha256
                );
                self.registry.register_endpoint(&name, model);
                session.empty()
            }
            ModelStatement::Drop { name, if_exists } => {
                self.check_not_a_folder_model(&name)?;
                let known = self.registry.unregister(&name);
                // A definition that cannot be read (left out with a warning) is dropped too.
                let unusable = match (&self.warehouse, known) {
                    (Some(warehouse), false) => {
                        warehouse.definitions().await?.unusable.contains_key(&name)
                    }
                    _ => false,
                };
                if !known && !unusable && !if_exists {
                    return Err(Error::UnknownModel {
                        name,
                        available: format!("the models are: {}", self.registry.names().join(", ")),
                    });
                }
                self.persist_models(&name, None).await?;
                if known || unusable {
                    eprintln!("model '{name}' dropped");
                }
                session.empty()
            }
            ModelStatement::Show => session.result(models_batch(&self.registry)?),
            // WIP (#39): the catalog's side of versions and aliases is not written yet.
            ModelStatement::AddVersion { .. }
            | ModelStatement::SetAlias { .. }
            | ModelStatement::DropAlias { .. }
            | ModelStatement::DropVersion { .. }
            | ModelStatement::ShowVersions { .. } => Err(Error::Usage(
                "model versions and aliases are not available in this build".into(),
            )),
            ModelStatement::ShowCache | ModelStatement::ClearCache => {
                let Some(warehouse) = &self.warehouse else {
                    return Err(Error::Usage(
                        "the LLM cache is kept in the warehouse: give --warehouse DIR".into(),
                    ));
                };
                let (store, prefix, url) = warehouse.area(crate::llm::cache::FOLDER)?;
                let cache = crate::llm::cache::Cache::new(store, prefix, url.to_string());
                let (entries, bytes) = match statement {
                    ModelStatement::ClearCache => (cache.clear().await?, 0),
                    _ => cache.size().await?,
                };
                let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(vec![
                    datafusion::arrow::datatypes::Field::new(
                        "answers",
                        datafusion::arrow::datatypes::DataType::UInt64,
                        false,
                    ),
                    datafusion::arrow::datatypes::Field::new(
                        "bytes",
                        datafusion::arrow::datatypes::DataType::UInt64,
                        false,
                    ),
                ]));
                let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
                    Arc::new(datafusion::arrow::array::UInt64Array::from(vec![entries])),
                    Arc::new(datafusion::arrow::array::UInt64Array::from(vec![bytes])),
                ];
                if matches!(statement, ModelStatement::ClearCache) {
                    eprintln!("{entries} kept answers removed from the LLM cache");
                }
                session.result(datafusion::arrow::array::RecordBatch::try_new(
                    schema, columns,
                )?)
            }
            ModelStatement::Describe { name } => {
                if let Some(model) = self.registry.endpoint_model(&name) {
                    return session.result(describe_endpoint_batch(&model)?);
                }
                let model = self.registry.get(&name)?;
                session.result(describe_batch(&model)?)
            }
        }
    }

    /// The model CREATE MODEL defines from `source`: loaded, or quantized (and kept in the
    /// warehouse, with what was done, for the statement to say).
    async fn model_of(
        &self,
        name: &str,
        source: &ModelSource,
        quantize: bool,
    ) -> Result<(Model, Option<String>)> {
        if quantize {
            let warehouse = self.warehouse.as_ref();
            let (model, message) =
                crate::quantized::quantized_model(warehouse, &self.registry, name, source).await?;
            return Ok((model, Some(message)));
        }
        let options = self.registry.session_options();
        let model = Model::load(name, source, options, self.registry.stores())?;
        Ok((model, None))
    }

    /// Refuses a CREATE MODEL of `name` that cannot be: not a name, a model of `--models`, or
    /// one that exists without OR REPLACE.
    fn check_definable(&self, name: &str, or_replace: bool) -> Result<()> {
        check_name("model", name)?;
        self.check_not_a_folder_model(name)?;
        if self.registry.contains(name) && !or_replace {
            return Err(Error::model(
                name,
                format!(
                    "model '{name}' already exists (use CREATE OR REPLACE MODEL, or DROP MODEL {name})"
                ),
            ));
        }
        Ok(())
    }

    /// Refuses to redefine or drop a model of `--models`: it is a file, read again by every
    /// process, which would hide the warehouse's definition from the next one.
    fn check_not_a_folder_model(&self, name: &str) -> Result<()> {
        if !self.folder_models.contains(name) {
            return Ok(());
        }
        let file = self
            .registry
            .source(name)
            .map_or_else(String::new, |s| format!(" ({s})"));
        Err(Error::model(
            name,
            format!(
                "model '{name}' is a file of --models{file}: every process reads it again, so it is \
             not redefined or dropped by a statement; replace or remove the file, or CREATE MODEL \
             under another name"
            ),
        ))
    }

    /// Keeps this process's CREATE MODEL (`Some`) or DROP MODEL (`None`) in the warehouse.
    async fn persist_models(&self, name: &str, model: Option<&Model>) -> Result<()> {
        let definition = model.map(|model| Definition {
            source: model.source.to_string(),
            sha256: Some(model.sha256.clone()),
            endpoint: None,
        });
        self.persist_definition(name, definition).await
    }

    /// Keeps the definition of `name` (`None`: its removal) in the warehouse.
    async fn persist_definition(&self, name: &str, definition: Option<Definition>) -> Result<()> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(());
        };
        match definition {
            Some(definition) => {
                warehouse.save_model(name, &definition).await?;
                self.seen_models().insert(name.to_string(), definition);
            }
            None => {
                warehouse.remove_model(name).await?;
                self.seen_models().remove(name);
            }
        }
        Ok(())
    }

    /// The endpoint model `name` of `endpoint`, keeping its answers in the warehouse's cache.
    fn endpoint_model(&self, name: &str, endpoint: Endpoint) -> Result<EndpointModel> {
        let cache = match &self.warehouse {
            Some(warehouse) => {
                let (store, prefix, url) = warehouse.area(crate::llm::cache::FOLDER)?;
                Some(crate::llm::cache::Cache::new(
                    store,
                    prefix,
                    url.to_string(),
                ))
            }
            None => None,
        };
        Ok(EndpointModel::new(name, endpoint, cache)?)
    }

    /// Models of `--models` among `names` whose file was written again since this process
    /// loaded them are loaded again from it: a refresh that runs for days (`batchinfer refresh
    /// --every`) scores with the file there is, as a new process would. (A statement in a
    /// shell keeps the model it loaded, as said in docs/catalog.md.)
    pub async fn reload_changed_folder_models<'a>(
        &self,
        names: impl Iterator<Item = &'a String>,
    ) -> Result<()> {
        for name in names.filter(|n| self.folder_models.contains(*n)) {
            let Some(source) = self.registry.source(name) else {
                continue;
            };
            let version = self.registry.stores().file_version(source.url()).await?;
            let mut seen = self
                .folder_versions
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match seen.insert(name.clone(), version.clone()) {
                Some(before) if before != version => self.registry.register(name, source),
                _ => {}
            }
        }
        Ok(())
    }

    /// Brings the models up to the warehouse's definitions, which other processes may have
    /// changed since this one last read them: a model defined or redefined there (another file,
    /// or the same file with other bytes) is registered anew and loaded on first use, one dropped
    /// there is dropped here. So no statement scores with a model the warehouse no longer names.
    pub async fn refresh_models(&self) -> Result<()> {
        let Some(warehouse) = &self.warehouse else {
            return Ok(());
        };
        self.opened
            .get_or_try_init(|| warehouse.move_legacy_models())
            .await?;
        let definitions = warehouse.definitions().await?;
        let warn = |warning: String| self.warn_once(warning);
        for why in definitions.unusable.values() {
            warn(format!("a model definition is left out: {why}"));
        }
        for name in self.folder_models.iter() {
            if let Some(definition) = definitions.models.get(name)
                && !self.same_model(name, definition)
            {
                warn(self.hidden_warning(name, definition));
            }
        }
        let defined = definitions.models;
        let mut seen = self.seen_models();
        for (name, definition) in &defined {
            if self.folder_models.contains(name) || seen.get(name) == Some(definition) {
                continue;
            }
            if let Some(endpoint) = &definition.endpoint {
                match Endpoint::from_json(endpoint) {
                    Ok(endpoint) => {
                        let model = self.endpoint_model(name, endpoint)?;
                        self.registry.register_endpoint(name, Arc::new(model));
                    }
                    Err(why) => warn(format!("the definition of model '{name}' {why}")),
                }
                seen.insert(name.clone(), definition.clone());
                continue;
            }
            let source = ModelSource::parse(&definition.source)?;
            // A registered model is the bytes that were registered: a file rewritten since is
            // refused when it is loaded, here and on a cluster's executors, until CREATE OR
            // REPLACE MODEL takes the new one.
            match &definition.sha256 {
                Some(sha256) => self.registry.register_pinned(name, source, sha256),
                None => self.registry.register(name, source),
            }
            seen.insert(name.clone(), definition.clone());
        }
        // A definition that cannot be read now (being rewritten by hand) leaves its model as
        // it was.
        seen.retain(|name, _| {
            let kept = defined.contains_key(name) || definitions.unusable.contains_key(name);
            if !kept {
                self.registry.unregister(name);
            }
            kept
        });
        Ok(())
    }

    /// Whether the file of `--models` named `name` is the model `definition` defines: the same
    /// source, or bytes of the sha256 it was defined with.
    fn same_model(&self, name: &str, definition: &Definition) -> bool {
        let source = self.registry.source(name).map(|s| s.to_string());
        source.as_deref() == Some(definition.source.as_str())
            || definition
                .sha256
                .as_ref()
                .is_some_and(|sha256| self.registry.sha256_of(name).as_ref() == Some(sha256))
    }

    /// The warning of a warehouse model hidden by a file of `--models` of the same name.
    fn hidden_warning(&self, name: &str, definition: &Definition) -> String {
        let dir = self.models_dir.as_deref().unwrap_or(Path::new(""));
        format!(
            "model '{name}' of --models {} hides the warehouse's model of that name (FROM '{}'); \
             DROP MODEL it in a process without --models, or rename the file",
            dir.display(),
            definition.source
        )
    }

    fn seen_models(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Definition>> {
        self.models.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The model file a CREATE MODEL source names: a `.onnx` file, or a folder with `model.onnx`,
/// local or in S3; a local path is made absolute so that the definition means the same in a
/// process started elsewhere.
async fn model_source(name: &str, source: &str, stores: &StoreRegistry) -> Result<ModelSource> {
    let url = ModelSource::parse(source)?;
    match stores.file_or_folder(url.url(), "model.onnx").await? {
        Some(file) => Ok(ModelSource::from_url(file)),
        None => Err(Error::model(
            name,
            format!(
                "model '{name}': no model at '{source}': expected an .onnx file or a folder holding \
             model.onnx; {url} does not exist, or is a folder without model.onnx"
            ),
        )),
    }
}
