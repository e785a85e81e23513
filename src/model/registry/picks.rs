//! The names of a warehouse model's versions ([`crate::model::versions`]): `churn` (the alias
//! `default`, else the newest version), `churn@2` and `churn@champion` are each registered as a
//! model of their own, pinned to the version's sha256, so that `predict`, `embed`, `generate`,
//! views, lineage and a cluster's executors resolve them as any name; what each name picks is
//! kept here, for provenance and listings.

use super::*;

/// Name -> what it picks, shared by the registries of a process's sessions.
pub(super) type Picks = Arc<RwLock<BTreeMap<String, Picked>>>;

/// What one name of a model's versions picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    /// The model's name (`churn` of `churn@champion`).
    pub model: String,
    /// The version picked.
    pub version: u32,
    /// The alias it was picked through (`default` for the name alone where that alias is set).
    pub alias: Option<String>,
    /// What a view records of it ([`crate::model::Model::version`]), where known.
    pub identity: Option<String>,
    /// Where the version was registered from.
    pub origin: String,
    /// Every version of the model, oldest first, and its aliases (`alias -> version`).
    pub versions: Vec<u32>,
    pub aliases: Vec<(String, u32)>,
}

impl ModelRegistry {
    fn picks(&self) -> parking_lot::RwLockReadGuard<'_, BTreeMap<String, Picked>> {
        self.picks.read()
    }

    fn picks_mut(&self) -> parking_lot::RwLockWriteGuard<'_, BTreeMap<String, Picked>> {
        self.picks.write()
    }

    /// Registers `key`, one name of a model's version, as the file `source` whose files have
    /// the version `identity` (`sha256`, or `sha256+beside`: [`Model::version`]), checked whole
    /// when it is loaded; a model already registered under `key` with that file and version
    /// stays, loaded.
    pub fn register_version(
        &self,
        key: &str,
        source: ModelSource,
        identity: Option<&str>,
        picked: Picked,
    ) {
        let same = self.read().get(key).is_some_and(|entry| {
            entry.version && entry.source == source && entry.sha256.as_deref() == identity
        });
        if !same {
            let entry = Arc::new(ModelEntry {
                version: identity.is_some(),
                ..ModelEntry::new(source, identity.map(str::to_string))
            });
            self.write().insert(key.to_string(), entry);
            self.unregister_endpoint(key);
        }
        self.picks_mut().insert(key.to_string(), picked);
    }

    /// Keeps what `key` picks (an endpoint model's version, registered by
    /// [`ModelRegistry::register_endpoint`]).
    pub fn set_picked(&self, key: &str, picked: Picked) {
        self.picks_mut().insert(key.to_string(), picked);
    }

    /// What `name` picks, where it names a version of a warehouse model.
    pub fn picked(&self, name: &str) -> Option<Picked> {
        self.picks().get(name).cloned()
    }

    /// Removes model `name` with the names of its versions and aliases (`name@...`); whether
    /// any was there.
    pub fn unregister_model(&self, name: &str) -> bool {
        let prefix = format!("{name}@");
        self.picks_mut()
            .retain(|key, _| key != name && !key.starts_with(&prefix));
        let named = self.unregister(name);
        self.unregister_picks_but(name, &[]) || named
    }

    /// Removes the names of model `name`'s versions and aliases that `keep` does not hold;
    /// whether any was there.
    pub fn unregister_picks_but(&self, name: &str, keep: &[String]) -> bool {
        let prefix = format!("{name}@");
        let stale: Vec<String> = {
            let files = self.read();
            let endpoints = self.endpoints();
            files
                .keys()
                .chain(endpoints.keys())
                .filter(|k| k.starts_with(&prefix) && !keep.contains(k))
                .cloned()
                .collect()
        };
        self.picks_mut().retain(|key, _| !stale.contains(key));
        let mut any = false;
        for key in stale {
            any |= self.unregister(&key);
        }
        any
    }

    /// The error of `name@...` where `name` is a model but has no such version or alias.
    pub(super) fn no_such_version(&self, name: &str) -> Option<Error> {
        let (model, after) = name.split_once('@')?;
        let picked = self.picked(model)?;
        let pick = crate::model::versions::parse_pick(name, after);
        let versions: Vec<String> = picked.versions.iter().map(u32::to_string).collect();
        let aliases: Vec<String> = picked
            .aliases
            .iter()
            .map(|(a, v)| format!("{a} -> {v}"))
            .collect();
        let what = match pick {
            Err(e) => return Some(e),
            Ok(crate::model::versions::Pick::Version(n)) => format!("no version {n}"),
            Ok(_) => format!("no alias '{after}'"),
        };
        Some(Error::model(
            name,
            format!(
                "model '{model}' has {what}: its versions are {}; its aliases {} (SHOW MODEL \
                 VERSIONS {model})",
                versions.join(", "),
                if aliases.is_empty() {
                    "none".to_string()
                } else {
                    aliases.join(", ")
                }
            ),
        ))
    }
}
