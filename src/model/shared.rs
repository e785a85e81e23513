//! Models by content across a cluster. A client sends, with each query, the definition of every
//! model it knows (the session option `batchinfer.models`): name, source, and the sha256 of the
//! bytes it loaded. The scheduler and the executors resolve a name through the definitions of the
//! query at hand to a model kept per (source, sha256), never per name, and check that the bytes
//! they load hash to what the client loaded. So two clients that define one name differently, or
//! a model replaced since an executor first loaded it, always get the model their client meant,
//! or an error saying that the file changed; never another model's scores.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::ModelSource;
use crate::error::{Error, Result};

/// One model as a client defines it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharedModel {
    /// A path (the same on every machine) or an object store's URL (`s3://`, `gs://`, ...).
    pub source: String,
    /// The sha256 of the bytes the client loaded; `None` for a model it has not loaded.
    pub sha256: Option<String>,
}

/// The definitions a client sends with a query: name -> model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedModels(pub BTreeMap<String, SharedModel>);

impl SharedModels {
    /// The definitions in the JSON of `batchinfer.models` (empty text: none). A name mapped to a
    /// plain string is a source without a hash.
    pub fn parse(text: &str) -> Result<Self> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let invalid = |why: String| Error::Usage(format!("batchinfer.models is not usable: {why}"));
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
                (
                    name.clone(),
                    json!({"source": m.source, "sha256": m.sha256}),
                )
            })
            .collect();
        Value::Object(map).to_string()
    }

    pub fn get(&self, name: &str) -> Option<&SharedModel> {
        self.0.get(name)
    }
}

impl SharedModel {
    pub fn model_source(&self) -> Result<ModelSource> {
        ModelSource::parse(&self.source).map_err(Error::Usage)
    }

    /// The key a process keeps this model under.
    pub fn key(&self) -> (String, String) {
        (self.source.clone(), self.sha256.clone().unwrap_or_default())
    }
}

impl std::fmt::Display for SharedModels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_json())
    }
}

/// The session option `batchinfer.models` holds the definitions typed: parsed once, when the
/// option is set (on a cluster's processes, when a query's session arrives), not per batch.
impl datafusion::config::ConfigField for SharedModels {
    fn visit<V: datafusion::config::Visit>(&self, v: &mut V, key: &str, description: &'static str) {
        v.some(key, self, description)
    }

    fn set(&mut self, _key: &str, value: &str) -> datafusion::error::Result<()> {
        *self = SharedModels::parse(value)?;
        Ok(())
    }

    fn reset(&mut self, _key: &str) -> datafusion::error::Result<()> {
        *self = SharedModels::default();
        Ok(())
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
            },
        );
        assert_eq!(SharedModels::parse(&models.to_json()).unwrap(), models);
        let plain = SharedModels::parse(r#"{"x": "/m/x.onnx"}"#).unwrap();
        assert_eq!(plain.get("x").unwrap().sha256, None);
        assert!(SharedModels::parse("[1]").is_err());
        assert!(SharedModels::parse("").unwrap().0.is_empty());
    }
}
