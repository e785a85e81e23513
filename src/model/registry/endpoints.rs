//! The registry's endpoint models ([`crate::llm`]): LLMs behind an HTTP API, by name beside the
//! model files, one name one model.

use super::*;
use crate::llm::{EndpointModel, Usage};

/// Name -> endpoint model, shared by the registries of a process's sessions.
pub(super) type Endpoints = Arc<RwLock<BTreeMap<String, Arc<EndpointModel>>>>;

impl ModelRegistry {
    fn endpoints(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<EndpointModel>>> {
        self.endpoints.read().unwrap_or_else(|p| p.into_inner())
    }

    fn endpoints_mut(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<EndpointModel>>> {
        self.endpoints.write().unwrap_or_else(|p| p.into_inner())
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
            crate::llm::Kind::Embedding => {
                "embedding endpoints are not called by embed yet: embed takes a text model's \
                 folder (CREATE MODEL name FROM 'folder/')"
                    .to_string()
            }
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

    /// Rows of endpoint models given NULL since the last call, per model; resets the counts.
    pub(super) fn take_failed_endpoint_rows(&self) -> Vec<(String, u64)> {
        self.endpoints()
            .iter()
            .filter_map(|(name, model)| {
                let n = model.failed_rows.swap(0, Ordering::Relaxed);
                (n > 0).then(|| (name.clone(), n))
            })
            .collect()
    }
}
