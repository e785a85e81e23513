//! The models a session knows brought up to the warehouse's definitions before each statement:
//! every name of a version (`churn`, `churn@2`, `churn@champion`) registered pinned to its
//! sha256, folder models whose file changed loaded again, and what a name may be defined as.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::Catalog;
use super::models::already_exists;
use crate::error::{Error, Result};
use crate::llm::{Endpoint, EndpointModel};
use crate::model::versions::{DEFAULT_ALIAS, Pick, Version};
use crate::model::{Model, ModelSource, Picked};
use crate::warehouse::{Definition, check_name};

impl Catalog {
    /// Registers every name of model `name`'s versions as `definition` has them: `name` (the
    /// alias `default`, else the newest version), `name@N` for each version and `name@alias`
    /// for each alias, each pinned to its version's sha256; `loaded`, the version this process
    /// loaded (CREATE MODEL), under each name that picks it. Names no longer there are removed.
    pub(super) fn register_definition(
        &self,
        name: &str,
        definition: &Definition,
        loaded: Option<(u32, &Arc<Model>)>,
    ) {
        let versions = &definition.versions;
        let numbers: Vec<u32> = versions.versions.iter().map(|v| v.version).collect();
        let aliases: Vec<(String, u32)> = versions
            .aliases
            .iter()
            .map(|(a, v)| (a.clone(), *v))
            .collect();
        let mut keys: Vec<(String, &Version, Option<String>)> = Vec::new();
        if let Ok(picked) = versions.resolve(name, &Pick::Default) {
            let alias = versions
                .aliases
                .contains_key(DEFAULT_ALIAS)
                .then(|| DEFAULT_ALIAS.to_string());
            keys.push((name.to_string(), picked, alias));
        }
        for version in &versions.versions {
            keys.push((format!("{name}@{}", version.version), version, None));
        }
        for (alias, number) in &versions.aliases {
            if let Ok(version) = versions.resolve(name, &Pick::Version(*number)) {
                keys.push((format!("{name}@{alias}"), version, Some(alias.clone())));
            }
        }
        let names: Vec<String> = keys.iter().map(|(k, _, _)| k.clone()).collect();
        self.registry.unregister_picks_but(name, &names);
        for (key, version, alias) in keys {
            let picked = Picked {
                model: name.to_string(),
                version: version.version,
                alias,
                identity: version.identity(),
                origin: version.origin.clone(),
                versions: numbers.clone(),
                aliases: aliases.clone(),
            };
            if let Some(endpoint) = &version.endpoint {
                let model = Endpoint::from_json(endpoint)
                    .map_err(|e| e.to_string())
                    .and_then(|e| self.endpoint_model(&key, e).map_err(|e| e.to_string()));
                match model {
                    Ok(model) => {
                        self.registry.register_endpoint(&key, Arc::new(model));
                        self.registry.set_picked(&key, picked);
                    }
                    Err(why) => self.warn_once(format!("the definition of model '{key}' {why}")),
                }
                continue;
            }
            match (loaded, ModelSource::parse(&version.source)) {
                (Some((number, model)), _) if number == version.version => {
                    self.registry.insert_loaded(&key, model.clone(), true);
                    self.registry.set_picked(&key, picked);
                }
                (_, Ok(source)) => {
                    let identity = version.identity();
                    self.registry
                        .register_version(&key, source, identity.as_deref(), picked)
                }
                (_, Err(why)) => self.warn_once(format!("model '{key}' is left out: {why}")),
            }
        }
    }

    /// Refuses a CREATE MODEL of `name` that cannot be: not a name, a model of `--models`, or
    /// one that exists without OR REPLACE.
    pub(super) fn check_definable(&self, name: &str, or_replace: bool) -> Result<()> {
        check_name("model", name)?;
        self.check_not_a_folder_model(name)?;
        if self.registry.contains(name) && !or_replace {
            return Err(already_exists(name));
        }
        Ok(())
    }

    /// Refuses to redefine or drop a model of `--models`: it is a file, read again by every
    /// process, which would hide the warehouse's definition from the next one.
    pub(super) fn check_not_a_folder_model(&self, name: &str) -> Result<()> {
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

    /// The endpoint model `name` of `endpoint`, keeping its answers in the warehouse's cache.
    pub(super) fn endpoint_model(&self, name: &str, endpoint: Endpoint) -> Result<EndpointModel> {
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
            let mut seen = self.folder_versions.lock();
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
            self.register_definition(name, definition, None);
            seen.insert(name.clone(), definition.clone());
        }
        // A definition that cannot be read now (being rewritten by hand) leaves its model as
        // it was.
        seen.retain(|name, _| {
            let kept = defined.contains_key(name) || definitions.unusable.contains_key(name);
            if !kept {
                self.registry.unregister_model(name);
            }
            kept
        });
        Ok(())
    }

    /// Whether the file of `--models` named `name` is the model `definition` defines: the same
    /// source, or bytes of the sha256 it was defined with.
    pub(super) fn same_model(&self, name: &str, definition: &Definition) -> bool {
        let source = self.registry.source(name).map(|s| s.to_string());
        source.as_deref() == Some(definition.source.as_str())
            || definition
                .sha256
                .as_ref()
                .is_some_and(|sha256| self.registry.sha256_of(name).as_ref() == Some(sha256))
    }

    /// The warning of a warehouse model hidden by a file of `--models` of the same name.
    pub(super) fn hidden_warning(&self, name: &str, definition: &Definition) -> String {
        let dir = self.models_dir.as_deref().unwrap_or(Path::new(""));
        format!(
            "model '{name}' of --models {} hides the warehouse's model of that name (FROM '{}'); \
             DROP MODEL it in a process without --models, or rename the file",
            dir.display(),
            definition.source
        )
    }

    pub(super) fn seen_models(&self) -> parking_lot::MutexGuard<'_, BTreeMap<String, Definition>> {
        self.models.lock()
    }
}
