//! The registry: model names (and, for a cluster's clients, model definitions) to loaded models,
//! each loaded once per device and shared by every partition of every query.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::{Model, ModelSource, SessionOptions, SharedModels, shared};
use crate::config::EngineConfig;
use crate::device::Target;
use crate::error::{Error, Result};
use crate::storage::StoreRegistry;

/// What a listing shows of one model.
#[derive(Debug, Clone)]
pub struct Listed {
    pub inputs: Vec<super::TensorSpec>,
    pub outputs: Vec<super::TensorSpec>,
    pub size_bytes: usize,
    pub sha256: String,
    /// What it was quantized from, for a model batchinfer quantized.
    pub quantized: Option<String>,
}

impl Listed {
    fn of(model: &Model) -> Listed {
        Listed {
            inputs: model.signature.inputs.clone(),
            outputs: model.signature.outputs.clone(),
            size_bytes: model.size_bytes,
            sha256: model.sha256.clone(),
            quantized: model.quantized.as_ref().map(|q| q.to_string()),
        }
    }
}

/// A registered model: where it comes from, and the model once loaded.
#[derive(Debug)]
struct ModelEntry {
    source: ModelSource,
    /// The sha256 the model's bytes must have (a definition a cluster client sent), or its
    /// whole version, `sha256+beside` ([`Model::version`]), where the files beside it count.
    sha256: Option<String>,
    /// A version of a warehouse model: what it loads is checked whole ([`Model::version`]).
    version: bool,
    /// The model once loaded, per device asked for (one session per model per device).
    loaded: Mutex<Vec<(Target, Arc<Model>)>>,
}

impl ModelEntry {
    fn new(source: ModelSource, sha256: Option<String>) -> Self {
        ModelEntry {
            source,
            sha256,
            version: false,
            loaded: Mutex::new(Vec::new()),
        }
    }

    /// What of `model` is checked against [`ModelEntry::sha256`].
    fn identity_of(&self, model: &Model) -> String {
        match &self.sha256 {
            Some(expected) if self.version || expected.contains('+') => model.version(),
            _ => model.sha256.clone(),
        }
    }

    fn models(&self) -> Vec<Arc<Model>> {
        self.loaded.lock().iter().map(|(_, m)| m.clone()).collect()
    }
}

/// Models kept by content: (source, sha256) -> entry; see [`shared`].
type ByContent = Arc<Mutex<HashMap<(String, String), Arc<ModelEntry>>>>;

/// Name -> model, shared by the whole engine.
#[derive(Debug)]
pub struct ModelRegistry {
    entries: RwLock<BTreeMap<String, Arc<ModelEntry>>>,
    options: SessionOptions,
    /// Where models run unless a query says otherwise (`--device`, `SET batchinfer.device`).
    device: RwLock<Target>,
    stores: Arc<StoreRegistry>,
    loads: Arc<AtomicU64>,
    /// Models of cluster clients' definitions, by content (a scheduler's or executor's).
    by_content: ByContent,
    /// Where models come from, for the message of an unknown one.
    origins: String,
    /// Endpoint models ([`crate::llm`]), by name.
    endpoints: endpoints::Endpoints,
    /// What each name of a warehouse model's versions picks (`churn`, `churn@2`,
    /// `churn@champion`).
    picks: picks::Picks,
}

/// Where the models of an engine configured by `config` come from, as a person reads it.
fn origins(config: &EngineConfig) -> String {
    let folder = match &config.models_dir {
        Some(dir) => format!("the files of --models {}", dir.display()),
        None => "the files of --models DIR (none given)".to_string(),
    };
    let warehouse = match &config.warehouse {
        Some(w) if w.is_relative() && !w.to_string_lossy().contains("://") => {
            std::env::current_dir().map_or_else(|_| w.clone(), |cwd| cwd.join(w))
        }
        Some(w) => w.clone(),
        None => return format!("models are {folder}"),
    };
    format!(
        "models are {folder} and those CREATE MODEL defined in the warehouse {} \
         (--warehouse DIR or BATCHINFER_WAREHOUSE names another)",
        warehouse.display()
    )
}

mod endpoints;
mod picks;
mod stats;

pub use picks::Picked;

pub use stats::Totals;

impl ModelRegistry {
    /// An empty registry whose models get sessions as `config` says.
    pub fn new(config: &EngineConfig, stores: Arc<StoreRegistry>) -> Self {
        ModelRegistry {
            stores,
            entries: RwLock::new(BTreeMap::new()),
            loads: Arc::new(AtomicU64::new(0)),
            by_content: ByContent::default(),
            device: RwLock::new(config.device),
            options: SessionOptions {
                max_sessions: config.sessions(),
                intra_threads: config.threads_per_session(),
                optimization: config.optimization,
                varying_shapes: false,
                device: config.device,
            },
            origins: origins(config),
            endpoints: Default::default(),
            picks: Default::default(),
        }
    }

    /// Registers every `NAME.onnx` and `NAME/model.onnx` in `dir` as the model `NAME`.
    /// The folder may be in an object store (`s3://bucket/models/`, `gs://`, `az://`).
    pub fn register_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let folder = ModelSource::from_path(dir)?;
        let url = crate::storage::folder_url(folder.url().clone());
        let mut found = Vec::new();
        let shown = format!("the models folder {}", dir.display());
        for file in self.stores.list_two_levels(&url, &shown)? {
            let name = match file.split_once('/') {
                None => file.strip_suffix(".onnx"),
                Some((folder, "model.onnx")) => Some(folder),
                Some(_) => None,
            };
            let Some(name) = name.filter(|n| !n.is_empty()) else {
                continue;
            };
            // A model name is a name (as CREATE MODEL's), and one model's.
            if let Err(e) = crate::storage::check_name("model", name) {
                crate::say!("warning: {file} in {} is left out: {e}", dir.display());
                continue;
            }
            if found.iter().any(|f| f == name) {
                crate::say!(
                    "warning: {file} in {} is left out: the model '{name}' is already its \
                     {name}.onnx",
                    dir.display()
                );
                continue;
            }
            let mut source = url.clone();
            if let Ok(mut segments) = source.path_segments_mut() {
                segments.pop_if_empty().extend(file.split('/'));
            }
            // Anything there is registered (a FIFO too): loading it says what is wrong.
            self.register(name, ModelSource::from_url(source));
            found.push(name.to_string());
        }
        found.sort();
        Ok(found)
    }

    /// Registers each `name -> source` (a path or an object store's URL) that is not already registered
    /// with that source; a model already loaded from the same source stays loaded.
    pub fn register_sources(&self, sources: &BTreeMap<String, String>) -> Result<()> {
        for (name, source) in sources {
            let source = ModelSource::parse(source)?;
            if self.source(name).as_ref() != Some(&source) {
                self.register(name, source);
            }
        }
        Ok(())
    }

    /// Every registered model with its source and, once loaded, its sha256: the definitions a
    /// cluster client sends with a query ([`shared`]).
    pub fn shared_models(&self) -> SharedModels {
        let models = self
            .read()
            .iter()
            .map(|(name, entry)| {
                let sha256 = entry.models().first().map(|m| m.sha256.clone());
                let model = shared::SharedModel {
                    source: entry.source.to_string(),
                    sha256: entry.sha256.clone().or(sha256),
                    endpoint: None,
                    cache: None,
                };
                (name.clone(), model)
            })
            .chain(self.shared_endpoints())
            .collect();
        shared::SharedModels(models)
    }

    /// The entry of a client's definition, kept by content for every query that names it.
    fn shared_entry(&self, model: &shared::SharedModel) -> Result<Arc<ModelEntry>> {
        let mut by_content = self.by_content.lock();
        if let Some(entry) = by_content.get(&model.key()) {
            return Ok(entry.clone());
        }
        let entry = Arc::new(ModelEntry::new(model.model_source()?, model.sha256.clone()));
        by_content.insert(model.key(), entry.clone());
        Ok(entry)
    }

    /// A registry for one cluster session: this one's models, with the definitions of the
    /// session's client over them (a scheduler plans each client's queries with its own).
    pub fn for_session(&self, shared: &SharedModels) -> Result<Arc<ModelRegistry>> {
        let mut entries = self.read().clone();
        let mut endpoints = self.endpoints().clone();
        for (name, model) in &shared.0 {
            if model.endpoint.is_some() {
                entries.remove(name);
                // The scheduler plans; it sends no request, so the whole limits are its.
                endpoints.insert(name.clone(), self.shared_endpoint(name, model, 1)?);
            } else {
                endpoints.remove(name);
                entries.insert(name.clone(), self.shared_entry(model)?);
            }
        }
        Ok(Arc::new(ModelRegistry {
            entries: RwLock::new(entries),
            options: self.options,
            device: RwLock::new(self.device()),
            stores: self.stores.clone(),
            loads: self.loads.clone(),
            by_content: self.by_content.clone(),
            origins: self.origins.clone(),
            endpoints: Arc::new(RwLock::new(endpoints)),
            picks: Default::default(),
        }))
    }

    /// The model `name` on `device` as the query's session defines it: through the definitions a
    /// cluster client sent (`batchinfer_statement.models` in `config`) when they name it, else by name.
    pub fn resolve(
        &self,
        name: &str,
        device: Option<Target>,
        config: Option<&datafusion::config::ConfigOptions>,
    ) -> Result<Arc<Model>> {
        let shared = crate::statement_context::StatementContext::of(config).map(|s| &s.models);
        if let Some(model) = shared.and_then(|models| models.get(name)) {
            if model.endpoint.is_some() {
                return Err(self.endpoint_not_a_file(name, &model.source));
            }
            let entry = self.shared_entry(model)?;
            return self.load(name, &entry, device);
        }
        self.get_on(name, device)
    }

    /// Registers (or re-registers) one model file under `name`; it is loaded on first use.
    pub fn register(&self, name: &str, source: ModelSource) {
        let entry = Arc::new(ModelEntry::new(source, None));
        self.write().insert(name.to_string(), entry);
    }

    /// Registers a model that is already loaded (CREATE MODEL loads to check before it
    /// registers); `version`: a version of a warehouse model, pinned whole.
    pub fn insert_loaded(&self, name: &str, model: Arc<Model>, version: bool) {
        let entry = Arc::new(ModelEntry {
            source: model.source.clone(),
            sha256: version.then(|| model.version()),
            version,
            loaded: Mutex::new(vec![(self.device(), model)]),
        });
        self.loads.fetch_add(1, Ordering::Relaxed);
        self.write().insert(name.to_string(), entry);
    }

    /// Removes a model; whether it was there.
    pub fn unregister(&self, name: &str) -> bool {
        let file = self.write().remove(name).is_some();
        self.unregister_endpoint(name) || file
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.read().contains_key(name) || self.endpoint_model(name).is_some()
    }

    /// The file a registered model comes from.
    pub fn source(&self, name: &str) -> Option<ModelSource> {
        self.read().get(name).map(|e| e.source.clone())
    }

    /// The object stores models are read from.
    pub fn stores(&self) -> &Arc<StoreRegistry> {
        &self.stores
    }

    /// The options sessions are built with (on the current device).
    pub fn session_options(&self) -> SessionOptions {
        SessionOptions {
            device: self.device(),
            ..self.options
        }
    }

    /// Names of the registered models, sorted, without their versions' and aliases' names
    /// (`name@...`).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.read().keys().cloned().collect();
        names.extend(self.endpoint_names());
        names.retain(|n| !n.contains('@'));
        names.sort();
        names
    }

    /// What SHOW MODELS says of model `name`: a loaded model's own description, else what its
    /// file declares ([`super::header`]), read without building a session (and kept nowhere);
    /// a file whose declarations the header does not describe is loaded.
    pub fn listing(&self, name: &str) -> Result<Listed> {
        let Some(entry) = self.read().get(name).cloned() else {
            return self.get(name).map(|m| Listed::of(&m));
        };
        if let Some(model) = entry.models().first() {
            return Ok(Listed::of(model));
        }
        let unreadable = |e: Error| Error::ModelLoad {
            model: name.to_string(),
            path: entry.source.to_string(),
            message: e.to_string(),
        };
        let files = super::ModelFiles::read(&entry.source, &self.stores).map_err(unreadable)?;
        let Some(header) = super::header::read(&files.bytes).map_err(unreadable)? else {
            return self.get(name).map(|m| Listed::of(&m));
        };
        let sha256 = crate::onnx::external::sha256(&files.bytes, &files.external);
        if let Some(expected) = &entry.sha256
            && super::sha256_of_version(expected) != sha256
        {
            // The load says why, as a query of the model would.
            return self.get(name).map(|m| Listed::of(&m));
        }
        Ok(Listed {
            inputs: header.inputs.clone(),
            outputs: header.outputs.clone(),
            size_bytes: files.bytes.len()
                + files.external.iter().map(|(_, f)| f.len()).sum::<usize>(),
            sha256,
            quantized: crate::quantize::Provenance::from_metadata(|key| header.metadata(key))
                .map(|q| q.to_string()),
        })
    }

    /// The sha256 model `name` scores with now: the one it was registered with, else that of
    /// its loaded bytes, else that of its file; None for a model not registered or unreadable.
    pub fn sha256_of(&self, name: &str) -> Option<String> {
        let entry = self.read().get(name).cloned()?;
        if let Some(sha256) = &entry.sha256 {
            return Some(super::sha256_of_version(sha256).to_string());
        }
        if let Some(model) = entry.models().first() {
            return Some(model.sha256.clone());
        }
        self.listing(name).ok().map(|l| l.sha256)
    }

    /// The model `name`, loading it on first use.
    pub fn get(&self, name: &str) -> Result<Arc<Model>> {
        self.get_on(name, None)
    }

    /// Where models run unless a query says otherwise.
    pub fn device(&self) -> Target {
        *self.device.read()
    }

    /// Makes `device` where models run from now on (`SET batchinfer.device`); models loaded for
    /// another device stay loaded there.
    pub fn set_device(&self, device: Target) {
        *self.device.write() = device;
    }

    /// The model `name` with its sessions on `device` (None: where models run now), loading it
    /// there on first use.
    pub fn get_on(&self, name: &str, device: Option<Target>) -> Result<Arc<Model>> {
        let device = device.unwrap_or_else(|| self.device());
        let entry = self.read().get(name).cloned();
        let Some(entry) = entry else {
            return Err(self.not_a_file(name).unwrap_or_else(|| self.unknown(name)));
        };
        self.load(name, &entry, Some(device))
    }

    /// `entry`'s model on `device` (None: where models run now), loaded there on first use; an
    /// entry with a sha256 is checked to load bytes of that hash.
    fn load(&self, name: &str, entry: &ModelEntry, device: Option<Target>) -> Result<Arc<Model>> {
        let device = device.unwrap_or_else(|| self.device());
        let mut loaded = entry.loaded.lock();
        if let Some((_, model)) = loaded.iter().find(|(on, _)| *on == device) {
            return Ok(model.clone());
        }
        let options = SessionOptions {
            device,
            ..self.options
        };
        let model = Arc::new(Model::load(name, &entry.source, options, &self.stores)?);
        if let Some(expected) = &entry.sha256
            && *expected != entry.identity_of(&model)
        {
            return Err(self.changed_since(name, entry, &model, expected));
        }
        self.loads.fetch_add(1, Ordering::Relaxed);
        loaded.push((device, model.clone()));
        Ok(model)
    }

    /// The error of a model whose files no longer have the sha256 `expected` they were
    /// registered with.
    fn changed_since(
        &self,
        name: &str,
        entry: &ModelEntry,
        model: &Model,
        expected: &str,
    ) -> Error {
        let now = entry.identity_of(model);
        let what = if now.contains('+') || expected.contains('+') {
            "the files (the model's and those beside it) now have sha256"
        } else {
            "the file now has sha256"
        };
        let message = match self.picked(name) {
            // A version of an older warehouse, read from the file it was defined from.
            Some(picked) if picked.origin == entry.source.to_string() => format!(
                "{what} {now}, but version {} of model '{}' was registered with sha256 \
                 {expected}: the file changed since, and the warehouse keeps no copy of that \
                 version. To score with the file as it is, run ALTER MODEL {} ADD VERSION FROM \
                 '{}'",
                picked.version, picked.model, picked.model, picked.origin
            ),
            Some(picked) => format!(
                "{what} {now}, but version {} of model '{}' was registered with sha256 \
                 {expected}: its files kept in the warehouse were changed or damaged since. To \
                 register the model again, run ALTER MODEL {} ADD VERSION FROM '{}'",
                picked.version, picked.model, picked.model, picked.origin
            ),
            None => format!(
                "{what} {now}, but the model was registered with sha256 {expected}: the file \
                 changed since. To score with the new file, run CREATE OR REPLACE MODEL {name} \
                 FROM '{}'",
                entry.source
            ),
        };
        Error::ModelLoad {
            model: name.to_string(),
            path: entry.source.to_string(),
            message,
        }
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, BTreeMap<String, Arc<ModelEntry>>> {
        self.entries.read()
    }

    fn write(&self) -> parking_lot::RwLockWriteGuard<'_, BTreeMap<String, Arc<ModelEntry>>> {
        self.entries.write()
    }
}
