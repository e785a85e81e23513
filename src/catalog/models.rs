//! The catalog's model statements (`CREATE/ALTER/DROP/DESCRIBE MODEL`, `SHOW MODELS`, `SHOW
//! MODEL VERSIONS`, the LLM cache's), each handed to what runs it: the versions of a model from
//! files here, kept in the warehouse with its aliases; an endpoint model's definition in
//! `endpoint_models.rs`, DROP MODEL in `drop_model.rs`, the LLM cache in `llm_cache.rs` (the
//! models brought up to the definitions: `definitions.rs`).

use std::sync::Arc;

use datafusion::dataframe::DataFrame;

use super::Catalog;
use crate::error::{Error, Result};
use crate::model::listing::{
    describe_batch, describe_endpoint_batch, models_batch, versions_batch,
};
use crate::model::versions::{Version, Versions};
use crate::model::{Model, ModelFiles, ModelSource};
use crate::session::Session;
use crate::statements::ModelStatement;
use crate::storage::StoreRegistry;
use crate::warehouse::{Definition, Warehouse, check_name};

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
                let adding = if or_replace {
                    Adding::Replace
                } else {
                    Adding::Create
                };
                self.add_version(&name, &source, quantize.is_some(), adding)
                    .await?;
                session.empty()
            }
            ModelStatement::AddVersion {
                name,
                source,
                quantize,
            } => {
                self.versioned("ALTER MODEL ... ADD VERSION", &name)?;
                self.add_version(&name, &source, quantize.is_some(), Adding::Version)
                    .await?;
                session.empty()
            }
            ModelStatement::SetAlias {
                name,
                alias,
                version,
            } => {
                self.change_versions("ALTER MODEL ... SET ALIAS", &name, |v| {
                    v.set_alias(&name, &alias, version)
                })
                .await?;
                crate::say!("model '{name}': alias {alias} -> version {version}");
                session.empty()
            }
            ModelStatement::DropAlias { name, alias } => {
                self.change_versions("ALTER MODEL ... DROP ALIAS", &name, |v| {
                    v.drop_alias(&name, &alias)
                })
                .await?;
                crate::say!("model '{name}': alias {alias} dropped");
                session.empty()
            }
            ModelStatement::DropVersion { name, version } => {
                self.change_versions("ALTER MODEL ... DROP VERSION", &name, |v| {
                    v.drop_version(&name, version)
                })
                .await?;
                crate::say!("model '{name}': version {version} dropped");
                session.empty()
            }
            ModelStatement::ShowVersions { name } => {
                let warehouse = self.versioned("SHOW MODEL VERSIONS", &name)?;
                let Some(definition) = warehouse.definition(&name).await? else {
                    return Err(self.not_defined(&name));
                };
                session.result(versions_batch(&name, &definition.versions)?)
            }
            ModelStatement::CreateEndpoint {
                name,
                or_replace,
                options,
            } => {
                self.create_endpoint(&name, or_replace, &options).await?;
                session.empty()
            }
            ModelStatement::Drop { name, if_exists } => {
                self.drop_model(name, if_exists).await?;
                session.empty()
            }
            ModelStatement::Show => session.result(models_batch(&self.registry)?),
            ModelStatement::ShowCache => session.result(self.llm_cache(false).await?),
            ModelStatement::ClearCache => session.result(self.llm_cache(true).await?),
            ModelStatement::Describe { name } => {
                if let Some(model) = self.registry.endpoint_model(&name) {
                    return session.result(describe_endpoint_batch(&model)?);
                }
                let model = self.registry.get(&name)?;
                session.result(describe_batch(&model)?)
            }
        }
    }

    /// Adds a version of model `name` from `source` (CREATE MODEL: the first; CREATE OR
    /// REPLACE MODEL and ALTER MODEL ... ADD VERSION: the newest), loaded before anything is
    /// kept, and registers it. Without a warehouse, the model is this process's alone, of no
    /// versions.
    async fn add_version(
        &self,
        name: &str,
        source: &str,
        quantize: bool,
        adding: Adding,
    ) -> Result<()> {
        let source = model_source(name, source, self.registry.stores()).await?;
        let (model, version, quantized) = self.version_of(name, &source, quantize).await?;
        let model = Arc::new(model);
        let number = match &self.warehouse {
            Some(_) => {
                let definition = self.keep_version(name, version, adding).await?;
                let number = newest(&definition);
                self.register_definition(name, &definition, Some((number, &model)));
                Some(number)
            }
            None => {
                self.registry.insert_loaded(name, model.clone(), false);
                None
            }
        };
        let what = match (adding, number) {
            (Adding::Version, Some(n)) => format!("version {n} added"),
            (Adding::Create, n) => format!("created{}", version_suffix(n)),
            (_, n) => format!("defined{}", version_suffix(n)),
        };
        crate::say!(
            "model '{name}' {what} from {} (sha256 {})",
            source,
            model.sha256
        );
        if let Some(message) = quantized {
            crate::say!("model '{name}' {message}");
        }
        Ok(())
    }

    /// The model `source` holds, loaded (or quantized, and kept in the warehouse, with what was
    /// done, for the statement to say), with the version it is: its files copied to the
    /// warehouse's `model-files/`, where there is a warehouse.
    async fn version_of(
        &self,
        name: &str,
        source: &ModelSource,
        quantize: bool,
    ) -> Result<(Model, Version, Option<String>)> {
        let version_of = |model: &Model| {
            let mut version = Version::new(
                Some(model.sha256.clone()),
                model.source.to_string(),
                source.to_string(),
            );
            version.beside_sha256 = model.beside_sha256.clone();
            version
        };
        if quantize {
            let warehouse = self.warehouse.as_ref();
            let (model, message) =
                crate::quantized::quantized_model(warehouse, &self.registry, name, source).await?;
            let version = version_of(&model);
            return Ok((model, version, Some(message)));
        }
        let options = self.registry.session_options();
        let stores = self.registry.stores();
        let Some(warehouse) = &self.warehouse else {
            let model = Model::load(name, source, options, stores)?;
            let version = version_of(&model);
            return Ok((model, version, None));
        };
        // The files are read once: what is loaded is what is kept.
        let load_error = |e: Error| Error::ModelLoad {
            model: name.to_string(),
            path: source.to_string(),
            message: e.to_string(),
        };
        let files = ModelFiles::read(source, stores).map_err(load_error)?;
        let beside = match source.file_name() {
            Some("model.onnx") => {
                crate::model::text::read_text_files(source, stores).map_err(load_error)?
            }
            _ => Vec::new(),
        };
        let mut key = files.sha256();
        if let Some(beside) = crate::quantize::text_digest(&beside) {
            key = format!("{key}-{beside}");
        }
        let kept = ModelSource::from_url(warehouse.kept_model(&key)?);
        let copy = ModelFiles {
            bytes: files.bytes.clone(),
            external: files.external.clone(),
        };
        let model = Model::assemble(name, &kept, copy, &beside, options).map_err(|e| match e {
            // Said of the file the statement named.
            Error::ModelLoad { message, .. } => load_error(Error::ModelFile(message)),
            e => e,
        })?;
        let mut kept_files: Vec<(String, Arc<[u8]>)> = vec![("model.onnx".into(), files.bytes)];
        kept_files.extend(files.external);
        kept_files.extend(beside.into_iter().map(|(f, b)| (f.to_string(), b.into())));
        warehouse.keep_model_files(&key, kept_files).await?;
        let version = version_of(&model);
        Ok((model, version, None))
    }

    /// Adds `version` to model `name` in the warehouse (refused where `adding` says the model
    /// must not exist, or must); its definition as kept.
    pub(super) async fn keep_version(
        &self,
        name: &str,
        version: Version,
        adding: Adding,
    ) -> Result<Definition> {
        let warehouse = self
            .warehouse
            .as_ref()
            .ok_or_else(|| self.no_warehouse("versions"))?;
        let definition = warehouse
            .change_model(name, |there| {
                let mut versions = match (there, adding) {
                    (Some(_), Adding::Create) => return Err(already_exists(name)),
                    (None, Adding::Version) => return Err(self.not_defined(name)),
                    (Some(there), _) => there.versions.clone(),
                    (None, _) => Versions::default(),
                };
                versions.add(name, version.clone())?;
                Ok(versions)
            })
            .await?;
        self.seen_models()
            .insert(name.to_string(), definition.clone());
        Ok(definition)
    }

    /// Changes model `name`'s versions or aliases by `change` (ALTER MODEL), in the warehouse
    /// first, then here.
    async fn change_versions(
        &self,
        statement: &str,
        name: &str,
        change: impl Fn(&mut Versions) -> Result<()>,
    ) -> Result<Definition> {
        let warehouse = self.versioned(statement, name)?;
        let definition = warehouse
            .change_model(name, |there| {
                let mut versions = there
                    .ok_or_else(|| self.not_defined(name))?
                    .versions
                    .clone();
                change(&mut versions)?;
                Ok(versions)
            })
            .await?;
        self.seen_models()
            .insert(name.to_string(), definition.clone());
        self.register_definition(name, &definition, None);
        Ok(definition)
    }

    /// The warehouse, for a statement on the versions of model `name`: refused without one, and
    /// for a model of `--models`.
    fn versioned(&self, statement: &str, name: &str) -> Result<&Warehouse> {
        check_name("model", name)?;
        self.check_not_a_folder_model(name)?;
        self.warehouse
            .as_ref()
            .ok_or_else(|| self.no_warehouse(statement))
    }

    fn no_warehouse(&self, statement: &str) -> Error {
        Error::Usage(format!(
            "{statement}: a model's versions and aliases are kept in the warehouse, and this              engine has none (start it with --warehouse DIR, or set BATCHINFER_WAREHOUSE)"
        ))
    }

    /// The error of a statement on the versions of a model the warehouse does not define.
    fn not_defined(&self, name: &str) -> Error {
        let names: Vec<String> = self
            .registry
            .names()
            .into_iter()
            .filter(|n| n != name)
            .collect();
        Error::UnknownModel {
            name: name.to_string(),
            available: format!(
                "the warehouse defines no model '{name}' (CREATE MODEL defines one; another \
                 statement may have dropped it); {}",
                if names.is_empty() {
                    "no other models are registered".to_string()
                } else {
                    format!("the models are: {}", names.join(", "))
                }
            ),
        }
    }
}

/// How a statement adds a version.
#[derive(Debug, Clone, Copy)]
pub(super) enum Adding {
    /// CREATE MODEL: the model's first.
    Create,
    /// CREATE OR REPLACE MODEL: the first, or the newest.
    Replace,
    /// ALTER MODEL ... ADD VERSION: the newest of a model there is.
    Version,
}

/// The number of the newest version of `definition`.
pub(super) fn newest(definition: &Definition) -> u32 {
    definition.versions.versions.last().map_or(1, |v| v.version)
}

fn version_suffix(number: Option<u32>) -> String {
    number.map_or_else(String::new, |n| format!(" as version {n}"))
}

pub(super) fn already_exists(name: &str) -> Error {
    Error::model(
        name,
        format!(
            "model '{name}' already exists (use CREATE OR REPLACE MODEL, ALTER MODEL {name} ADD \
             VERSION, or DROP MODEL {name})"
        ),
    )
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
