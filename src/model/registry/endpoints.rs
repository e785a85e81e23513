//! The registry's endpoint models ([`crate::llm`]): LLMs behind an HTTP API, by name beside the
//! model files, one name one model.

use super::*;
use crate::llm::{EndpointModel, Usage};

/// Name -> endpoint model, shared by the registries of a process's sessions.
pub(super) type Endpoints = Arc<RwLock<BTreeMap<String, Arc<EndpointModel>>>>;

impl ModelRegistry {
    pub(super) fn endpoints(
        &self,
    ) -> parking_lot::RwLockReadGuard<'_, BTreeMap<String, Arc<EndpointModel>>> {
        self.endpoints.read()
    }

    fn endpoints_mut(
        &self,
    ) -> parking_lot::RwLockWriteGuard<'_, BTreeMap<String, Arc<EndpointModel>>> {
        self.endpoints.write()
    }

    /// Registers (or replaces) the endpoint model `name`; a model file of that name is no
    /// longer the model `name`.
    pub fn register_endpoint(&self, name: &str, model: Arc<EndpointModel>) {
        self.write().remove(name);
        self.endpoints_mut().insert(name.to_string(), model);
    }

    /// Removes the endpoint model `name`; whether it was there.
    pub(super) fn unregister_endpoint(&self, name: &str) -> bool {
        self.endpoints_mut().remove(name).is_some()
    }

    /// The endpoint model `name`, if `name` is one.
    pub fn endpoint_model(&self, name: &str) -> Option<Arc<EndpointModel>> {
        self.endpoints().get(name).cloned()
    }

    /// The endpoint model `name` as the query's session defines it: through the definitions a
    /// cluster client sent (`batchinfer_statement.models` in `config`) when they name it, else
    /// by name; an error saying what `name` is otherwise.
    pub fn resolve_endpoint(
        &self,
        name: &str,
        config: Option<&datafusion::config::ConfigOptions>,
    ) -> Result<Arc<EndpointModel>> {
        let statement = crate::statement_context::StatementContext::of(config);
        match statement.and_then(|s| Some((s.models.get(name)?, s.executors))) {
            Some((model, executors)) if model.endpoint.is_some() => {
                self.shared_endpoint(name, model, executors)
            }
            _ => self.endpoint(name),
        }
    }

    /// The endpoint model `name`, if `name` is one for the query's session (see
    /// [`Self::resolve_endpoint`]); `None` for a model file.
    pub fn endpoint_if(
        &self,
        name: &str,
        config: Option<&datafusion::config::ConfigOptions>,
    ) -> Result<Option<Arc<EndpointModel>>> {
        let statement = crate::statement_context::StatementContext::of(config);
        match statement.and_then(|s| Some((s.models.get(name)?, s.executors))) {
            Some((model, executors)) if model.endpoint.is_some() => {
                self.shared_endpoint(name, model, executors).map(Some)
            }
            Some(_) => Ok(None),
            None => Ok(self.endpoint_model(name)),
        }
    }

    /// The endpoint model of a client's definition, one per definition in the process (its
    /// requests at once and its pace shared by every query that names it), with its share of
    /// the limits where `executors` share them.
    pub(super) fn shared_endpoint(
        &self,
        name: &str,
        model: &crate::statement_context::SharedModel,
        executors: usize,
    ) -> Result<Arc<EndpointModel>> {
        // Per process: an endpoint's concurrency and pace are shared by every session that names it.
        static BY_CONTENT: Mutex<BTreeMap<String, Arc<EndpointModel>>> =
            Mutex::new(BTreeMap::new());
        let text = model.endpoint.as_deref().unwrap_or_default();
        let key = format!(
            "{name}\n{text}\n{}\n{executors}",
            model.cache.as_deref().unwrap_or_default()
        );
        let mut by_content = BY_CONTENT.lock();
        if let Some(found) = by_content.get(&key) {
            return Ok(found.clone());
        }
        let json: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::Internal(format!("model '{name}': its definition: {e}")))?;
        let endpoint = crate::llm::Endpoint::from_json(&json)
            .map_err(|why| Error::model(name, format!("model '{name}': its definition {why}")))?
            .share(executors);
        let cache = match &model.cache {
            Some(url) => Some(crate::llm::cache::Cache::at(&self.stores, url)?),
            None => None,
        };
        let created = Arc::new(EndpointModel::new(name, endpoint, cache)?);
        by_content.insert(key, created.clone());
        Ok(created)
    }

    /// The definitions of the endpoint models, as a cluster client sends them.
    pub(super) fn shared_endpoints(&self) -> Vec<(String, crate::statement_context::SharedModel)> {
        self.endpoints()
            .iter()
            .map(|(name, model)| {
                let shared = crate::statement_context::SharedModel {
                    source: model.endpoint.endpoint.clone(),
                    sha256: Some(model.sha256.clone()),
                    endpoint: Some(model.endpoint.to_json().to_string()),
                    cache: model.cache_location(),
                };
                (name.clone(), shared)
            })
            .collect()
    }

    /// The error of an endpoint model asked to score as a model file, from its definition.
    pub(super) fn endpoint_not_a_file(&self, name: &str, endpoint: &str) -> Error {
        Error::model(
            name,
            format!(
                "model '{name}' is an endpoint model (at {endpoint}): call it with \
                 generate('{name}', prompt)"
            ),
        )
    }

    /// The endpoint model `name`; an error saying what `name` is otherwise.
    pub fn endpoint(&self, name: &str) -> Result<Arc<EndpointModel>> {
        if let Some(model) = self.endpoint_model(name) {
            return Ok(model);
        }
        if self.read().contains_key(name) {
            return Err(Error::model(
                name,
                format!(
                    "model '{name}' is a model file: generate takes an endpoint model, defined by \
                     CREATE MODEL name OPTIONS ('endpoint' 'http://.../v1', 'model' '...'); \
                     score this one with predict('{name}', ...)"
                ),
            ));
        }
        Err(self.unknown(name))
    }

    /// The error of a name no model has.
    pub(super) fn unknown(&self, name: &str) -> Error {
        if let Some(error) = self.no_such_version(name) {
            return error;
        }
        let names = self.names();
        let available = if names.is_empty() {
            format!("no models are registered; {}", self.origins)
        } else {
            format!("the models are: {}; {}", names.join(", "), self.origins)
        };
        Error::UnknownModel {
            name: name.to_string(),
            available,
        }
    }

    /// The error of an endpoint model asked to score as a model file.
    pub(super) fn not_a_file(&self, name: &str) -> Option<Error> {
        let model = self.endpoint_model(name)?;
        let how = match model.endpoint.kind {
            crate::llm::Kind::Chat => format!("call it with generate('{name}', prompt)"),
            crate::llm::Kind::Embedding => format!("call it with embed('{name}', text)"),
        };
        Some(Error::model(
            name,
            format!(
                "model '{name}' is an endpoint model ({} at {}): {how}",
                model.endpoint.model, model.endpoint.endpoint
            ),
        ))
    }

    /// Names of the endpoint models.
    pub(super) fn endpoint_names(&self) -> Vec<String> {
        self.endpoints().keys().cloned().collect()
    }

    /// What the endpoint models have done, summed: see [`EndpointModel::usage`].
    pub fn llm_usage(&self) -> Usage {
        let mut total = Usage::default();
        for model in self.endpoints().values() {
            total.add(&model.usage());
        }
        total
    }

    /// What each endpoint model has done, by name.
    pub fn llm_usage_by_model(&self) -> Vec<(String, Usage)> {
        self.endpoints()
            .iter()
            .map(|(name, model)| (name.clone(), model.usage()))
            .collect()
    }
}
