//! A warehouse's models. Each is a folder `models/NAME/` of manifests ([`Manifests`]), the
//! newest holding the model's versions and aliases ([`Versions`]); every change (a version
//! added, an alias set) creates the next manifest, only where no writer created it first, so
//! concurrent changes from several processes are each kept, locally and in S3 alike. A version's
//! files are copied, as they were registered, to `model-files/KEY/`, KEY their sha256: a file
//! changed or removed after registration changes nothing.
//!
//! Warehouses written before versions keep `models/NAME.json`, a model of one version (its
//! source, not copied); its first change moves it to `models/NAME/`.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

use super::Warehouse;
use crate::error::{Error, Result};
use crate::model::versions::{Pick, Version, Versions};
use crate::storage::{Manifests, check_name, read_object};

/// The warehouse's folder of the files of models' versions.
pub const KEPT_FOLDER: &str = "model-files";

/// The largest model definition read.
const MODEL_DEFINITION_CAP: u64 = 1 << 20;

/// How many times a change is tried again after another process changed the model first.
const ATTEMPTS: u32 = 100;

/// A model as the warehouse defines it: its versions and aliases, and the version its name
/// alone picks (the alias `default`, else the newest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// The picked version's file (the warehouse's copy, or an older definition's path), or an
    /// endpoint model's URL.
    pub source: String,
    /// The picked version's sha256 (absent in definitions written before it was kept).
    pub sha256: Option<String>,
    /// The picked version's endpoint definition, for an endpoint model.
    pub endpoint: Option<Value>,
    /// Every version and alias.
    pub versions: Versions,
}

impl Definition {
    /// The definition of `name` with `versions`.
    pub fn of(name: &str, versions: Versions) -> Result<Definition> {
        let picked = versions.resolve(name, &Pick::Default)?;
        Ok(Definition {
            source: picked.source.clone(),
            sha256: picked.sha256.clone(),
            endpoint: picked.endpoint.clone(),
            versions,
        })
    }

    /// A model of the one version `version` (a new model, or an older definition).
    pub fn first(name: &str, version: Version) -> Result<Definition> {
        let mut versions = Versions::default();
        versions.add(name, version)?;
        Definition::of(name, versions)
    }
}

/// The model definitions of a warehouse.
#[derive(Debug, Default)]
pub struct Definitions {
    /// Name -> definition.
    pub models: BTreeMap<String, Definition>,
    /// Name -> why its definition cannot be read.
    pub unusable: BTreeMap<String, String>,
}

/// A manifest of `models/NAME/`: the model's versions, or (`dropped`) its removal, kept as the
/// newest manifest so that a change another statement makes at the same time, on the model it
/// read before, cannot bring it back.
#[derive(Serialize, Deserialize)]
struct Manifest {
    name: String,
    #[serde(default)]
    versions: Versions,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    dropped: bool,
}

impl Warehouse {
    /// Models defined by CREATE MODEL: name -> the source of the version its name picks
    /// (definitions that cannot be read left out: see [`Warehouse::definitions`]).
    pub async fn models(&self) -> Result<BTreeMap<String, String>> {
        Ok(self
            .definitions()
            .await?
            .models
            .into_iter()
            .map(|(name, d)| (name, d.source))
            .collect())
    }

    /// Models defined by CREATE MODEL. A definition that cannot be read (not JSON, no source, a
    /// FIFO, too large) is set apart with what is wrong, so that one bad file does not take the
    /// others, or the warehouse, with it.
    pub async fn definitions(&self) -> Result<Definitions> {
        // One listing of everything under models/ (each model's manifests, the older layout's
        // files), then one read of each model's newest manifest.
        let folder = self.object("models/")?;
        let listed: Vec<object_store::ObjectMeta> =
            match self.store.inner().list(Some(&folder)).try_collect().await {
                Ok(listed) => listed,
                Err(object_store::Error::NotFound { .. }) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
        // Name -> its newest manifest's number (0: the older layout's file alone).
        let mut named: BTreeMap<String, u64> = BTreeMap::new();
        for object in &listed {
            let Some(relative) = object.location.prefix_match(&folder) else {
                continue;
            };
            let parts: Vec<String> = relative.map(|p| p.as_ref().to_string()).collect();
            let found = match parts.as_slice() {
                [file] => file.strip_suffix(".json").map(|name| (name, 0)),
                [name, file] => file
                    .strip_prefix("manifest-")
                    .and_then(|f| f.strip_suffix(".json"))
                    .filter(|digits| digits.len() == 20)
                    .and_then(|digits| digits.parse().ok())
                    .map(|number| (name.as_str(), number)),
                _ => None,
            };
            if let Some((name, number)) = found
                && check_name("model", name).is_ok()
            {
                let newest = named.entry(name.to_string()).or_default();
                *newest = (*newest).max(number);
            }
        }
        let mut definitions = Definitions::default();
        for (name, number) in named {
            let read = match number {
                0 => self.single_file(&name).await,
                n => match self.manifest(&name, n).await {
                    Ok(Some(read)) => Ok(read),
                    // Pruned since it was listed: a newer one is there.
                    Ok(None) => self.definition(&name).await,
                    Err(e) => Err(e),
                },
            };
            match read {
                Ok(Some(definition)) => {
                    definitions.models.insert(name, definition);
                }
                // Removed since it was listed.
                Ok(None) => {}
                Err(e) => {
                    definitions.unusable.insert(name, e.to_string());
                }
            }
        }
        Ok(definitions)
    }

    /// The definition of model `name`: its newest manifest, else an older warehouse's
    /// `models/NAME.json`; `None` where it has neither.
    pub async fn definition(&self, name: &str) -> Result<Option<Definition>> {
        Ok(self.current(name).await?.1)
    }

    /// The definition of model `name` with its manifest's number (0: none, the definition an
    /// older warehouse's file, if any).
    async fn current(&self, name: &str) -> Result<(u64, Option<Definition>)> {
        let manifests = self.model_manifests(name)?;
        if let Some((number, bytes)) = manifests.latest().await? {
            return Ok((number, self.parse_manifest(name, number, &bytes)?));
        }
        Ok((0, self.single_file(name).await?))
    }

    /// Model `name`'s manifest `number`, where it is there.
    async fn manifest(&self, name: &str, number: u64) -> Result<Option<Option<Definition>>> {
        match self.model_manifests(name)?.read(number).await? {
            Some(bytes) => self.parse_manifest(name, number, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Model `name`'s manifest `number` read: its definition, or `None` where it says the model
    /// was dropped.
    fn parse_manifest(&self, name: &str, number: u64, bytes: &[u8]) -> Result<Option<Definition>> {
        let path = format!(
            "{}models/{name}/",
            crate::storage::display_location(&self.root)
        );
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| Error::Definition {
            path: path.clone(),
            problem: format!("its manifest {number} is not a model's versions: {e}"),
        })?;
        let problem = |problem: String| Error::Definition {
            path: path.clone(),
            problem: format!("its manifest {number} {problem}"),
        };
        if manifest.name != name {
            return Err(problem(format!(
                "is that of model '{}', not '{name}'",
                manifest.name
            )));
        }
        if manifest.dropped {
            return Ok(None);
        }
        let mut versions = manifest.versions;
        versions
            .check()
            .map_err(|why| problem(format!("is refused: {why}")))?;
        for version in &mut versions.versions {
            version.source = self
                .in_warehouse(&version.source)
                .map_err(|why| problem(format!("is refused: {why}")))?;
        }
        Definition::of(name, versions)
            .map(Some)
            .map_err(|e| problem(format!("is refused: {e}")))
    }

    /// The model `name` of an older warehouse's `models/NAME.json`: one version, not copied.
    async fn single_file(&self, name: &str) -> Result<Option<Definition>> {
        let path = self.object(&format!("models/{name}.json"))?;
        let shown = self.display(&path);
        let unreadable = |e: Error| Error::warehouse(&shown, format!("reading {shown}: {e}"));
        let Some(bytes) = read_object(&self.store, &path, MODEL_DEFINITION_CAP)
            .await
            .map_err(unreadable)?
        else {
            return Ok(None);
        };
        let problem = |problem: String| Error::Definition {
            path: shown.clone(),
            problem,
        };
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|e| problem(format!("is not valid JSON: {e}")))?;
        let source = json
            .get("source")
            .and_then(Value::as_str)
            .ok_or_else(|| problem("has no \"source\": not a model definition".into()))?;
        let sha256 = json.get("sha256").and_then(Value::as_str);
        let mut version = Version::new(
            sha256.map(str::to_string),
            source.to_string(),
            source.to_string(),
        );
        version.created = String::new();
        version.endpoint = json.get("endpoint").cloned();
        Definition::first(name, version).map(Some)
    }

    /// Changes model `name`'s versions and aliases: `change` is given its definition as it is
    /// (`None`: there is none) and returns what it becomes, kept as the next manifest. Where
    /// another process changed the model in between, `change` is given its definition again, so
    /// that no change is lost. The definition as changed.
    pub async fn change_model(
        &self,
        name: &str,
        mut change: impl FnMut(Option<&Definition>) -> Result<Versions>,
    ) -> Result<Definition> {
        let mut definition = None;
        self.commit_model(name, true, |current| {
            let versions = change(current)?;
            let changed = Definition::of(name, versions.clone())?;
            definition = Some(changed);
            Ok(Manifest {
                name: name.to_string(),
                versions,
                dropped: false,
            })
        })
        .await?;
        definition.ok_or_else(|| Error::Internal("a model changed to nothing".into()))
    }

    /// Creates the manifest `next` makes of model `name`'s definition as it is (`read`; else
    /// of none), as the next one (retried on the definition another writer made, where one was
    /// first); then an older warehouse's `models/NAME.json` is removed.
    async fn commit_model(
        &self,
        name: &str,
        read: bool,
        mut next: impl FnMut(Option<&Definition>) -> Result<Manifest>,
    ) -> Result<()> {
        let manifests = self.model_manifests(name)?;
        for attempt in 0..ATTEMPTS {
            let (number, current) = match read {
                true => self.current(name).await?,
                false => (
                    manifests.versions().await?.last().copied().unwrap_or(0),
                    None,
                ),
            };
            let mut manifest = next(current.as_ref())?;
            for version in &mut manifest.versions.versions {
                version.source = self.relative(&version.source);
            }
            let bytes = serde_json::to_vec_pretty(&manifest)
                .map_err(|e| Error::warehouse(format!("models/{name}/"), e.to_string()))?;
            if manifests.create(number + 1, bytes).await? {
                // An older warehouse's file, moved into the manifest (or dropped with it).
                self.delete(&self.object(&format!("models/{name}.json"))?)
                    .await?;
                return Ok(());
            }
            if manifests.versions().await?.last().copied().unwrap_or(0) <= number {
                // Not another writer's manifest: something else is where it goes.
                return Err(Error::warehouse(
                    format!("models/{name}/"),
                    format!(
                        "model '{name}' cannot be changed: {}models/{name}/manifest-{:020}.json \
                         is there and is not a manifest (remove it)",
                        crate::storage::display_location(&self.root),
                        number + 1
                    ),
                ));
            }
            // Another writer's change came first: read it and try again, a while later.
            let wait = 5 + u64::from(attempt) * 5 + (std::process::id() as u64 % 7) * 3;
            tokio::time::sleep(Duration::from_millis(wait.min(200))).await;
        }
        Err(Error::warehouse(
            format!("models/{name}/"),
            format!(
                "model '{name}' was changed by other statements {ATTEMPTS} times while this \
                 one tried to change it; nothing was changed: run it again"
            ),
        ))
    }

    /// Forgets the model `name` with all its versions: a manifest that says so, the newest, so
    /// that a change made at the same time on the model as it was fails and reads it again
    /// (their files stay, where other models' versions may share them). A definition that
    /// cannot be read is dropped too: it is not read.
    pub async fn remove_model(&self, name: &str) -> Result<()> {
        self.commit_model(name, false, |_| {
            Ok(Manifest {
                name: name.to_string(),
                versions: Versions::default(),
                dropped: true,
            })
        })
        .await
    }

    /// Moves the definitions of a `models.json` (the layout before one file per model) to
    /// `models/`, then removes it. Definitions already in `models/` win.
    pub async fn move_legacy_models(&self) -> Result<()> {
        let path = self.object("models.json")?;
        let Some(bytes) = read_object(&self.store, &path, MODEL_DEFINITION_CAP).await? else {
            return Ok(());
        };
        let json: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::warehouse(&path, format!("models.json is not valid JSON: {e}")))?;
        if let Some(models) = json.get("models").and_then(Value::as_object) {
            for (name, source) in models {
                let Some(source) = source.as_str() else {
                    continue;
                };
                if check_name("model", name).is_err() {
                    continue;
                }
                self.change_model(name, |there| match there {
                    Some(there) => Ok(there.versions.clone()),
                    None => {
                        let version = Version::new(None, source.to_string(), source.to_string());
                        Ok(Definition::first(name, version)?.versions)
                    }
                })
                .await?;
            }
        }
        self.delete(&path).await
    }

    /// `source` as a manifest keeps it: relative to the warehouse's root where it is in the
    /// warehouse (`model-files/KEY/model.onnx`), so that a warehouse moved or copied elsewhere
    /// reads its own files.
    fn relative(&self, source: &str) -> String {
        let Ok(parsed) = crate::model::ModelSource::parse(source) else {
            return source.to_string();
        };
        match parsed.url().as_str().strip_prefix(self.root.as_str()) {
            Some(rest) if !rest.is_empty() => rest.to_string(),
            _ => source.to_string(),
        }
    }

    /// A manifest's `source` where it is read from: one relative to the warehouse's root made
    /// whole (never outside it), any other as it is.
    fn in_warehouse(&self, source: &str) -> std::result::Result<String, NotInWarehouse> {
        if source.contains("://") || source.starts_with('/') {
            return Ok(source.to_string());
        }
        if source.is_empty()
            || source.contains('\\')
            || source
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(NotInWarehouse::Path(source.to_string()));
        }
        let url = self
            .root
            .join(source)
            .map_err(|error| NotInWarehouse::Url {
                path: source.to_string(),
                error,
            })?;
        Ok(crate::model::ModelSource::from_url(url).to_string())
    }

    /// The manifests of model `name`.
    fn model_manifests(&self, name: &str) -> Result<Manifests> {
        check_name("model", name)?;
        let folder = self.object(&format!("models/{name}/"))?;
        Ok(Manifests::new(self.store.clone(), folder))
    }

    /// Where the `model.onnx` of the version of files `key` (a hex digest of them) is kept.
    pub fn kept_model(&self, key: &str) -> Result<Url> {
        self.kept_file(key, "model.onnx")
    }

    fn kept_file(&self, key: &str, file: &str) -> Result<Url> {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(Error::Internal(format!("'{key}' is not a digest")));
        }
        let path = format!("{KEPT_FOLDER}/{key}/{file}");
        self.root
            .join(&path)
            .map_err(|e| Error::warehouse(&self.root, format!("{path}: {e}")))
    }

    /// Keeps a version's files (`files`: name in the folder -> bytes, the model's `model.onnx`
    /// among them) in `model-files/KEY/`, KEY a hex digest of what they are. A file already
    /// there with the same bytes is left as it is; the model file is written last, so that a
    /// folder with one holds all the files it was kept with.
    pub async fn keep_model_files(
        &self,
        key: &str,
        files: Vec<(String, std::sync::Arc<[u8]>)>,
    ) -> Result<()> {
        let url = |file: &str| self.kept_file(key, file);
        let (model, others): (Vec<_>, Vec<_>) =
            files.into_iter().partition(|(f, _)| f == "model.onnx");
        for (file, bytes) in others.into_iter().chain(model) {
            crate::onnx::external::check_location(&file)?;
            let target = url(&file)?;
            let path = crate::storage::object_path(&target)?;
            let same = match self.store.inner().head(&path).await {
                Ok(meta) if meta.size == bytes.len() as u64 => {
                    read_object(&self.store, &path, meta.size).await?.as_deref() == Some(&bytes[..])
                }
                _ => false,
            };
            if !same {
                self.put_file(&target, bytes.to_vec()).await?;
            }
        }
        Ok(())
    }
}

/// A manifest's `source` that is no file of the warehouse.
#[derive(Debug, thiserror::Error)]
enum NotInWarehouse {
    #[error("{0:?} is not a file of the warehouse")]
    Path(String),
    #[error("{path:?}: {error}")]
    Url {
        path: String,
        error: url::ParseError,
    },
}
