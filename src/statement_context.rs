//! The statement at hand, as the engine tags it before planning: its id and text (kept with its
//! rejects), where its rejects go, the model definitions a cluster client sends with it, and the
//! stop signals that came before it. Not settings: the engine sets them for each statement, and
//! `SET batchinfer_statement.*` is refused ([`crate::statements::limits::check_setting`]). They
//! travel with the query as session options (prefix `batchinfer_statement`), so that a cluster's
//! scheduler and executors see the statement as its client does.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::DataFusionError;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::stop::StopToken;

/// The statement at hand (see the module's text).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatementContext {
    /// Its id: the name of its rejects' folder.
    pub id: String,
    /// Its text, secrets blanked, shortened (kept with its rejects).
    pub text: String,
    /// Where rejected rows go: `batchinfer.rejects` made absolute, or the warehouse's `rejects/`.
    pub rejects: String,
    /// Model definitions (name -> source and sha256) that a cluster client sends with each
    /// query, so that the scheduler and the executors resolve model names as it does.
    pub models: SharedModels,
    /// Stop signals received when the statement was tagged ([`crate::stop`]): its scoring loops
    /// stop at any later one. Each process counts its own, so this one does not travel.
    pub stop_signals_before: u64,
    /// Whether it keeps its rejected rows (`on_error = 'reject'` when it was tagged), as the
    /// engine that tagged it counts them when it ends.
    pub keeps_rejects: bool,
    /// On a cluster, the executors alive when the scheduler planned it (0 elsewhere): each
    /// takes this share of an endpoint model's limits ([`crate::llm`]).
    pub executors: usize,
    /// The part of the statement a query is (a view refresh's unit; "" for the rest): what
    /// endpoint models do for it is counted apart, for the files it writes
    /// ([`crate::llm::spend`]). Set on the query's own session state; it does not travel.
    pub part: String,
    /// Where a view's refresh keeps what its calls learn for the next refresh (a folder of the
    /// view's generation, a URL: a cascade's thresholds, [`crate::llm::cascade`]); "" for the
    /// rest. Set on
    /// the query's own session state, as `part`; it does not travel.
    pub keeps: String,
    /// What the statement counts while it runs (its spending, its failed rows), owned by it.
    pub ledger: Ledger,
}

/// What one statement counts while it runs: each feature keeps its own value here (the LLM
/// spending of [`crate::llm::spend`], the failed rows of [`crate::rejects`]), made on first use.
/// Every clone of the statement (its plans, its tasks) shares it, and it is dropped with the
/// last of them: a statement's budget is never forgotten while it runs, and never outlives it.
/// Each process counts its own: it does not travel with the query.
#[derive(Clone, Default)]
pub struct Ledger(Arc<LedgerValues>);

impl Ledger {
    /// The statement's value of type `T` (a feature's own type), made the first time it is asked.
    pub fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut values = self.0.lock();
        if let Some(found) = values.iter().find_map(|v| v.clone().downcast::<T>().ok()) {
            return found;
        }
        let made = Arc::new(T::default());
        values.push(made.clone());
        made
    }

    /// The ledger of the statement `id` in a process that runs its tasks from their options (a
    /// cluster's executor): tasks of one statement running at once share it.
    fn of_tasks(id: &str) -> Ledger {
        // Per process: the statements whose tasks run here, each held only by its tasks (a
        // weak reference), so that nothing is kept past them and no running one is dropped.
        static RUNNING: parking_lot::Mutex<BTreeMap<String, Weak<LedgerValues>>> =
            parking_lot::Mutex::new(BTreeMap::new());
        let mut running = RUNNING.lock();
        running.retain(|_, ledger| ledger.strong_count() > 0);
        if let Some(ledger) = running.get(id).and_then(Weak::upgrade) {
            return Ledger(ledger);
        }
        let ledger = Ledger::default();
        running.insert(id.to_string(), Arc::downgrade(&ledger.0));
        ledger
    }
}

type LedgerValues = parking_lot::Mutex<Vec<Arc<dyn Any + Send + Sync>>>;

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ledger")
    }
}

/// What a statement counted is not what it is: two statements are equal by their parts.
impl PartialEq for Ledger {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The prefix of the statement's entries among a session's options.
pub const PREFIX: &str = "batchinfer_statement";

impl StatementContext {
    /// The statement's view of stop signals.
    pub fn stop(&self) -> StopToken {
        StopToken::after(self.stop_signals_before)
    }

    /// The statement at hand in a session's options (the default where none was tagged).
    pub fn of(config: Option<&datafusion::config::ConfigOptions>) -> Option<&StatementContext> {
        config?.extensions.get::<StatementContext>()
    }
}

impl ConfigExtension for StatementContext {
    const PREFIX: &'static str = PREFIX;
}

impl ExtensionOptions for StatementContext {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::error::Result<()> {
        match key {
            "id" => {
                self.id = value.to_string();
                self.ledger = Ledger::of_tasks(value);
            }
            "text" => self.text = value.to_string(),
            "rejects" => self.rejects = value.to_string(),
            "models" => self.models = SharedModels::parse(value)?,
            "executors" => {
                self.executors = value.parse().map_err(|_| {
                    DataFusionError::Configuration(format!(
                        "{PREFIX}.executors is a count, not '{value}'"
                    ))
                })?
            }
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "{PREFIX}.{key} is not a part of a statement"
                )));
            }
        }
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        let entry = |key: &str, value: String, description: &'static str| ConfigEntry {
            key: format!("{PREFIX}.{key}"),
            value: Some(value),
            description,
        };
        vec![
            entry("id", self.id.clone(), "The id of the statement at hand."),
            entry(
                "text",
                self.text.clone(),
                "The text of the statement at hand.",
            ),
            entry(
                "rejects",
                self.rejects.clone(),
                "Where the statement's rejected rows go.",
            ),
            entry(
                "executors",
                self.executors.to_string(),
                "The executors that share an endpoint model's limits (0: not on a cluster).",
            ),
            entry(
                "models",
                self.models.to_json(),
                "The model definitions (JSON: name -> source and sha256) the statement's client \
                 resolves names with.",
            ),
        ]
    }
}

/// One model as a client defines it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedModel {
    /// A path (the same on every machine) or an object store's URL (`s3://`, `gs://`, ...).
    pub source: String,
    /// The sha256 of the bytes the client loaded; `None` for a model it has not loaded. Of an
    /// endpoint model, its definition's.
    pub sha256: Option<String>,
    /// An endpoint model's definition (its JSON, [`crate::llm::Endpoint`]); `source` is then its
    /// URL.
    pub endpoint: Option<String>,
    /// Where an endpoint model's answers are kept: the URL of the client's warehouse's cache.
    pub cache: Option<String>,
}

/// The definitions a client sends with a query: name -> model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedModels(pub BTreeMap<String, SharedModel>);

impl SharedModels {
    /// The definitions in the JSON of `batchinfer_statement.models` (empty text: none). A name
    /// mapped to a plain string is a source without a hash.
    pub fn parse(text: &str) -> Result<Self> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let invalid =
            |why: String| Error::Internal(format!("{PREFIX}.models is not usable: {why}"));
        let json: Value = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let Value::Object(map) = json else {
            return Err(invalid("expected an object of model definitions".into()));
        };
        let mut models = BTreeMap::new();
        for (name, definition) in map {
            let model = match &definition {
                Value::String(source) => SharedModel {
                    source: source.clone(),
                    sha256: None,
                    endpoint: None,
                    cache: None,
                },
                Value::Object(fields) => SharedModel {
                    source: fields
                        .get("source")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid(format!("model '{name}' has no source")))?
                        .to_string(),
                    sha256: fields
                        .get("sha256")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    endpoint: fields
                        .get("endpoint")
                        .filter(|e| !e.is_null())
                        .map(Value::to_string),
                    cache: fields
                        .get("cache")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                },
                _ => return Err(invalid(format!("model '{name}' is not a definition"))),
            };
            models.insert(name, model);
        }
        Ok(SharedModels(models))
    }

    /// The JSON a client sends.
    pub fn to_json(&self) -> String {
        let map: serde_json::Map<String, Value> = self
            .0
            .iter()
            .map(|(name, m)| {
                let mut definition = json!({"source": m.source, "sha256": m.sha256});
                if let Some(endpoint) = &m.endpoint {
                    definition["endpoint"] = serde_json::from_str(endpoint).unwrap_or(Value::Null);
                    definition["cache"] = json!(m.cache);
                }
                (name.clone(), definition)
            })
            .collect();
        Value::Object(map).to_string()
    }

    pub fn get(&self, name: &str) -> Option<&SharedModel> {
        self.0.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definitions_round_trip_and_plain_sources_parse() {
        let mut models = SharedModels::default();
        models.0.insert(
            "churn".into(),
            SharedModel {
                source: "s3://m/churn.onnx".into(),
                sha256: Some("ab".into()),
                endpoint: None,
                cache: None,
            },
        );
        assert_eq!(SharedModels::parse(&models.to_json()).unwrap(), models);
        let plain = SharedModels::parse(r#"{"x": "/m/x.onnx"}"#).unwrap();
        assert_eq!(plain.get("x").unwrap().sha256, None);
        assert!(SharedModels::parse("[1]").is_err());
        assert!(SharedModels::parse("").unwrap().0.is_empty());
    }

    #[test]
    fn a_statement_travels_as_its_entries() {
        let mut statement = StatementContext {
            id: "s1".into(),
            text: "SELECT 1".into(),
            rejects: "/tmp/rejects/".into(),
            stop_signals_before: 3,
            executors: 2,
            ..Default::default()
        };
        statement.models = SharedModels::parse(r#"{"x": "/m/x.onnx"}"#).unwrap();
        let mut copy = StatementContext::default();
        for entry in statement.entries() {
            let key = entry.key.strip_prefix("batchinfer_statement.").unwrap();
            copy.set(key, &entry.value.unwrap()).unwrap();
        }
        assert_eq!(copy.stop_signals_before, 0);
        copy.stop_signals_before = 3;
        assert_eq!(copy, statement);
        assert!(copy.set("nulls", "nan").is_err());
    }
}
