//! An endpoint model's definition ([`Endpoint`]): its options as `CREATE MODEL ... OPTIONS`
//! gives them, checked, and kept in the warehouse as JSON, never with the key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{LlmError, canonical};

/// What an endpoint model answers: chat completions (`generate`) or embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    #[default]
    Chat,
    Embedding,
}

/// An endpoint model's definition, as `CREATE MODEL name OPTIONS (...)` gives it and the
/// warehouse keeps it (a version of `models/NAME/`, under `"endpoint"`). Never the key: only the name of
/// the environment variable that holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The API's base URL, up to `/v1`: requests go to `{endpoint}/chat/completions`.
    pub endpoint: String,
    /// The endpoint's name of the model.
    pub model: String,
    #[serde(default)]
    pub kind: Kind,
    /// The environment variable holding the key (none: requests carry no key).
    #[serde(default)]
    pub api_key_env: Option<String>,
    pub max_concurrency: usize,
    #[serde(default)]
    pub requests_per_minute: Option<f64>,
    #[serde(default)]
    pub tokens_per_minute: Option<f64>,
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub input_price_per_million: f64,
    #[serde(default)]
    pub output_price_per_million: f64,
    pub max_retries: u32,
    /// Seconds one request may take before it is tried again.
    pub timeout: f64,
    /// The length of an embedding endpoint's vectors (`embed`'s type is fixed when a query is
    /// planned).
    #[serde(default)]
    pub dimensions: Option<usize>,
    /// The tokens a request and its reply may hold together (`ai_agg` and `ai_reduce` fit
    /// their steps in it); unset: [`DEFAULT_CONTEXT_WINDOW`]. Kept only when set, so that the
    /// definitions made before it keep their sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
    /// The local text model of a cascade: it answers the rows of `ai_filter` and `ai_classify`
    /// it is sure of, the endpoint the rest ([`crate::llm::cascade`]). Kept only when set, as
    /// the two below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The least rate at which the proxy's answers agree with the model's; unset:
    /// [`DEFAULT_TARGET`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// The rows of a statement sent to the model to set the proxy's thresholds; unset:
    /// [`DEFAULT_PROXY_SAMPLE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_sample: Option<u32>,
    /// Whether its chat requests go to the provider's Batch API ([`crate::llm::batch`]);
    /// unset: one request each. Kept only when set, as the two below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<bool>,
    /// The prices of batch requests; unset: half the prices above, as providers charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_input_price_per_million: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_output_price_per_million: Option<f64>,
    /// A local Hugging Face `tokenizer.json` of the model, which counts its prompts' tokens
    /// for estimates and pacing (unset: a token per four characters). Kept only when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
}

/// A cascade's target where the definition sets none.
pub const DEFAULT_TARGET: f64 = 0.9;

/// A cascade's sample where the definition sets none.
pub const DEFAULT_PROXY_SAMPLE: u32 = 200;

/// The context window of a model that declares none.
pub const DEFAULT_CONTEXT_WINDOW: u32 = 4096;

/// The options `CREATE MODEL name OPTIONS (...)` takes for an endpoint model, for messages.
pub const OPTIONS: &[&str] = &[
    "endpoint",
    "model",
    "kind",
    "api_key_env",
    "max_concurrency",
    "requests_per_minute",
    "tokens_per_minute",
    "max_tokens",
    "temperature",
    "seed",
    "system",
    "input_price_per_million",
    "output_price_per_million",
    "max_retries",
    "timeout",
    "dimensions",
    "context_window",
    "proxy",
    "target",
    "proxy_sample",
    "batch",
    "batch_input_price_per_million",
    "batch_output_price_per_million",
    "tokenizer",
];

impl Endpoint {
    /// The definition `options` (keys lower-cased) give the model `name`; unknown options and
    /// values of the wrong kind refused, naming the option.
    pub fn from_options(name: &str, options: &BTreeMap<String, String>) -> Result<Self, LlmError> {
        let problem = |problem: String| LlmError::Definition {
            model: name.to_string(),
            problem,
        };
        for key in options.keys() {
            if key == "api_key" || key == "key" {
                return Err(problem(format!(
                    "the option '{key}' is not taken: give 'api_key_env', the NAME of an \
                     environment variable holding the key, which is read when requests are made \
                     and never kept"
                )));
            }
            if !OPTIONS.contains(&key.as_str()) {
                return Err(problem(format!(
                    "unknown option '{key}': an endpoint model takes {}",
                    OPTIONS.join(", ")
                )));
            }
        }
        let text = |key: &str| options.get(key).map(|v| v.trim().to_string());
        let number = |key: &str| -> Result<Option<f64>, LlmError> {
            match text(key) {
                None => Ok(None),
                Some(v) => match v.parse::<f64>() {
                    Ok(n) if n.is_finite() && n >= 0.0 => Ok(Some(n)),
                    _ => Err(problem(format!(
                        "'{key}' must be a number of at least 0, not '{v}'"
                    ))),
                },
            }
        };
        let whole = |key: &str, default: u64, least: u64| -> Result<u64, LlmError> {
            match text(key) {
                None => Ok(default),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n >= least && n <= u32::MAX as u64 => Ok(n),
                    _ => Err(problem(format!(
                        "'{key}' must be a whole number of at least {least}, not '{v}'"
                    ))),
                },
            }
        };
        let endpoint = text("endpoint").ok_or_else(|| {
            problem(
                "an endpoint model needs 'endpoint', the API's base URL (as \
                 'https://api.openai.com/v1' or 'http://127.0.0.1:8080/v1'), and 'model'"
                    .into(),
            )
        })?;
        let url = url::Url::parse(&endpoint).map_err(|e| {
            problem(format!(
                "'endpoint' is not a URL ({e}): {}",
                crate::storage::blank_passwords(&endpoint)
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(problem(format!(
                "'endpoint' must be an http:// or https:// URL, not {}",
                crate::storage::blank_passwords(&endpoint)
            )));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(problem(
                "'endpoint' is the API's base URL, up to /v1, without a query or fragment (a key \
                 goes in the variable 'api_key_env' names)"
                    .into(),
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(problem(
                "'endpoint' must not hold a user or password: name the environment variable \
                 holding the key with 'api_key_env'"
                    .into(),
            ));
        }
        let model = text("model").filter(|m| !m.is_empty()).ok_or_else(|| {
            problem("an endpoint model needs 'model', the endpoint's name of the model".into())
        })?;
        let kind = match text("kind")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("chat") | Some("generate") => Kind::Chat,
            Some("embedding") | Some("embeddings") => Kind::Embedding,
            Some(other) => {
                return Err(problem(format!(
                    "'kind' must be 'chat' or 'embedding', not '{other}'"
                )));
            }
        };
        let api_key_env = match text("api_key_env") {
            None => None,
            Some(var) => Some(check_key_variable(&var).map_err(|e| problem(e.to_string()))?),
        };
        let temperature = number("temperature")?;
        if temperature.is_some_and(|t| t > 2.0) {
            return Err(problem("'temperature' must be between 0 and 2".into()));
        }
        let seed = match text("seed") {
            None => None,
            Some(v) => Some(
                v.parse::<i64>()
                    .map_err(|_| problem(format!("'seed' must be a whole number, not '{v}'")))?,
            ),
        };
        let timeout = number("timeout")?.unwrap_or(120.0);
        if !(0.001..=86_400.0).contains(&timeout) {
            return Err(problem(
                "'timeout' must be seconds between 0.001 and 86400".into(),
            ));
        }
        let rate = |key: &str| -> Result<Option<f64>, LlmError> {
            match number(key)? {
                Some(r) if r < MIN_RATE => Err(problem(format!(
                    "'{key}' must be at least {MIN_RATE} (a minute's worth)"
                ))),
                r => Ok(r),
            }
        };
        let price = |key: &str| -> Result<f64, LlmError> {
            match number(key)?.unwrap_or(0.0) {
                p if p > MAX_PRICE => Err(problem(format!(
                    "'{key}' must be at most {MAX_PRICE} per million tokens"
                ))),
                p => Ok(p),
            }
        };
        let dimensions = match (kind, text("dimensions")) {
            (Kind::Embedding, None) => {
                return Err(problem(
                    "an embedding endpoint needs 'dimensions', the length of its vectors".into(),
                ));
            }
            (Kind::Chat, Some(_)) => {
                return Err(problem(
                    "'dimensions' is the length of an embedding endpoint's vectors ('kind' \
                     'embedding')"
                        .into(),
                ));
            }
            (_, None) => None,
            (_, Some(_)) => Some(whole("dimensions", 0, 1)?.min(MAX_DIMENSIONS as u64) as usize),
        };
        let proxy = text("proxy").filter(|p| !p.is_empty());
        if let Some(proxy) = &proxy {
            if kind == Kind::Embedding {
                return Err(problem(
                    "'proxy' is the local model of a chat model's cascade (ai_filter, \
                     ai_classify), not of an embedding endpoint"
                        .into(),
                ));
            }
            if !crate::config::is_model_name(proxy) {
                return Err(problem(format!(
                    "'proxy' must name a local text model (letters, digits, _ - @ .), not '{proxy}'"
                )));
            }
        }
        // As the warehouse's JSON will read it back.
        let target = number("target")?.map(|t| {
            serde_json::to_string(&t)
                .ok()
                .and_then(|json| serde_json::from_str::<f64>(&json).ok())
                .unwrap_or(t)
        });
        if let Some(t) = target
            && !(t > 0.5 && t < 1.0)
        {
            return Err(problem(format!(
                "'target' is the least rate at which the proxy's answers agree with the model's: \
                 over 0.5 and under 1, not {t}"
            )));
        }
        let proxy_sample = match text("proxy_sample") {
            None => None,
            Some(v) => match whole("proxy_sample", 0, 20)? {
                n if n <= 100_000 => Some(n as u32),
                _ => {
                    return Err(problem(format!(
                        "'proxy_sample' must be 20 to 100,000 rows, not '{v}'"
                    )));
                }
            },
        };
        if proxy.is_none() && (target.is_some() || proxy_sample.is_some()) {
            return Err(problem(
                "'target' and 'proxy_sample' set a cascade: name its local model with 'proxy'"
                    .into(),
            ));
        }
        let batch = match text("batch")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => None,
            Some("on" | "true") => Some(true),
            Some("off" | "false") => Some(false),
            Some(other) => {
                return Err(problem(format!(
                    "'batch' must be 'on' or 'off', not '{other}'"
                )));
            }
        };
        if batch == Some(true) && kind == Kind::Embedding {
            return Err(problem(
                "'batch' sends a chat model's requests to the provider's Batch API; an embedding \
                 endpoint's texts go 64 to a request"
                    .into(),
            ));
        }
        let batch_price = |key: &str| -> Result<Option<f64>, LlmError> {
            Ok(match text(key) {
                None => None,
                Some(_) => Some(price(key)?),
            })
        };
        // Kept absolute: read where the definition is used, whatever the folder then.
        let tokenizer = match text("tokenizer").filter(|t| !t.is_empty()) {
            None => None,
            Some(path) if path.contains("://") => {
                return Err(problem(format!(
                    "'tokenizer' is the path of a local tokenizer.json, not '{path}'"
                )));
            }
            Some(path) => Some(
                std::path::absolute(&path)
                    .map_err(|e| problem(format!("'tokenizer' {path}: {e}")))?
                    .display()
                    .to_string(),
            ),
        };
        Ok(Endpoint {
            tokenizer,
            batch,
            batch_input_price_per_million: batch_price("batch_input_price_per_million")?,
            batch_output_price_per_million: batch_price("batch_output_price_per_million")?,
            dimensions,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            model,
            kind,
            api_key_env,
            max_concurrency: whole("max_concurrency", 8, 1)?.min(4096) as usize,
            requests_per_minute: rate("requests_per_minute")?,
            tokens_per_minute: rate("tokens_per_minute")?,
            max_tokens: whole("max_tokens", 512, 1)? as u32,
            temperature,
            seed,
            system: text("system").filter(|s| !s.is_empty()),
            input_price_per_million: price("input_price_per_million")?,
            output_price_per_million: price("output_price_per_million")?,
            max_retries: whole("max_retries", 6, 0)?.min(100) as u32,
            timeout,
            context_window: match text("context_window") {
                None => None,
                Some(_) => Some(whole("context_window", 0, 256)?.min(10_000_000) as u32),
            },
            proxy,
            target,
            proxy_sample,
        })
    }

    /// The definition with `1 / executors` of its limits (requests at once, requests and tokens
    /// per minute), for one of `executors` processes that share them; at least one request at
    /// once each.
    pub fn share(mut self, executors: usize) -> Self {
        if executors > 1 {
            let n = executors as f64;
            self.max_concurrency = self.max_concurrency.div_ceil(executors).max(1);
            self.requests_per_minute = self.requests_per_minute.map(|r| (r / n).max(MIN_RATE));
            self.tokens_per_minute = self.tokens_per_minute.map(|r| (r / n).max(MIN_RATE));
        }
        self
    }

    /// The definition as the warehouse keeps it.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The definition a warehouse's `"endpoint"` holds, its values checked as CREATE MODEL
    /// checks them (a file edited by hand is not trusted).
    pub fn from_json(value: &serde_json::Value) -> Result<Self, KeptDefinition> {
        let endpoint: Endpoint =
            serde_json::from_value(value.clone()).map_err(KeptDefinition::NotAnEndpoint)?;
        let rate = |r: Option<f64>| r.is_none_or(|r| r.is_finite() && r >= MIN_RATE);
        let price = |p: f64| p.is_finite() && (0.0..=MAX_PRICE).contains(&p);
        let fine = (1..=4096).contains(&endpoint.max_concurrency)
            && endpoint.max_tokens >= 1
            && (0.001..=86_400.0).contains(&endpoint.timeout)
            && endpoint.max_retries <= 100
            && endpoint
                .context_window
                .is_none_or(|w| (256..=10_000_000).contains(&w))
            && endpoint.target.is_none_or(|t| t > 0.5 && t < 1.0)
            && endpoint
                .proxy_sample
                .is_none_or(|n| (20..=100_000).contains(&n))
            && (endpoint.proxy.is_some()
                || (endpoint.target.is_none() && endpoint.proxy_sample.is_none()))
            && match endpoint.kind {
                Kind::Chat => endpoint.dimensions.is_none(),
                Kind::Embedding => endpoint
                    .dimensions
                    .is_some_and(|d| (1..=MAX_DIMENSIONS).contains(&d)),
            }
            && rate(endpoint.requests_per_minute)
            && rate(endpoint.tokens_per_minute)
            && price(endpoint.input_price_per_million)
            && price(endpoint.output_price_per_million)
            && endpoint
                .tokenizer
                .as_deref()
                .is_none_or(|t| !t.contains("://") && std::path::Path::new(t).is_absolute())
            && endpoint.batch_input_price_per_million.is_none_or(price)
            && endpoint.batch_output_price_per_million.is_none_or(price)
            && (endpoint.batch != Some(true) || endpoint.kind == Kind::Chat)
            && endpoint
                .temperature
                .is_none_or(|t| (0.0..=2.0).contains(&t))
            && url::Url::parse(&endpoint.endpoint)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https"))
            && endpoint
                .api_key_env
                .as_deref()
                .is_none_or(|v| check_key_variable(v).is_ok());
        if fine {
            Ok(endpoint)
        } else {
            Err(KeptDefinition::Refused)
        }
    }

    /// The prices per million tokens of its batch requests, input and output: those the
    /// definition sets, or half its list prices.
    pub fn batch_prices(&self) -> (f64, f64) {
        (
            self.batch_input_price_per_million
                .unwrap_or(self.input_price_per_million / 2.0),
            self.batch_output_price_per_million
                .unwrap_or(self.output_price_per_million / 2.0),
        )
    }

    /// The sha256 of the definition (its canonical JSON): what lineage and rejects record of an
    /// endpoint model, as a file's sha256 for a model file. Another endpoint, model, limit or
    /// price is another definition.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(canonical(&self.to_json()).as_bytes()))
    }

    /// What a person reads of the definition (DESCRIBE MODEL, SHOW MODELS): never a key.
    pub fn described(&self) -> Vec<(String, String)> {
        let mut rows = vec![
            ("endpoint".to_string(), self.endpoint.clone()),
            ("model".to_string(), self.model.clone()),
            (
                "kind".to_string(),
                match self.kind {
                    Kind::Chat => "chat",
                    Kind::Embedding => "embedding",
                }
                .to_string(),
            ),
        ];
        let mut add = |key: &str, value: Option<String>| {
            if let Some(value) = value {
                rows.push((key.to_string(), value));
            }
        };
        add(
            "api_key_env",
            self.api_key_env
                .as_ref()
                .map(|v| format!("{v} (the key itself is never kept)")),
        );
        add("max_concurrency", Some(self.max_concurrency.to_string()));
        add(
            "requests_per_minute",
            self.requests_per_minute.map(|v| v.to_string()),
        );
        add(
            "tokens_per_minute",
            self.tokens_per_minute.map(|v| v.to_string()),
        );
        add("max_tokens", Some(self.max_tokens.to_string()));
        add("temperature", self.temperature.map(|v| v.to_string()));
        add("seed", self.seed.map(|v| v.to_string()));
        add("system", self.system.clone());
        add(
            "input_price_per_million",
            Some(self.input_price_per_million.to_string()),
        );
        add(
            "output_price_per_million",
            Some(self.output_price_per_million.to_string()),
        );
        add("max_retries", Some(self.max_retries.to_string()));
        add("timeout", Some(format!("{} s", self.timeout)));
        add("dimensions", self.dimensions.map(|d| d.to_string()));
        add(
            "context_window",
            self.context_window.map(|w| format!("{w} tokens")),
        );
        add("proxy", self.proxy.clone());
        add("target", self.target.map(|t| t.to_string()));
        add(
            "proxy_sample",
            self.proxy_sample.map(|n| format!("{n} rows")),
        );
        add("tokenizer", self.tokenizer.clone());
        add(
            "batch",
            self.batch.map(|b| if b { "on" } else { "off" }.to_string()),
        );
        if self.batch.is_some() || self.batch_input_price_per_million.is_some() {
            let (input, output) = self.batch_prices();
            add("batch_input_price_per_million", Some(input.to_string()));
            add("batch_output_price_per_million", Some(output.to_string()));
        }
        rows
    }
}

/// The longest vectors an embedding endpoint may give.
const MAX_DIMENSIONS: usize = 65_536;

/// The least `requests_per_minute` and `tokens_per_minute` take.
const MIN_RATE: f64 = 0.01;

/// The most a price per million tokens may be.
const MAX_PRICE: f64 = 1_000_000.0;

/// A definition kept in the warehouse that is not used, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeptDefinition {
    #[error("is not an endpoint model: {0}")]
    NotAnEndpoint(serde_json::Error),
    #[error("holds a value CREATE MODEL would refuse: define the model again")]
    Refused,
}

/// An `api_key_env` that may not name an endpoint's key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotAKeyVariable {
    #[error(
        "'api_key_env' must be the NAME of an environment variable (letters, digits and _), not \
         a key"
    )]
    NotAName,
    #[error(
        "'api_key_env' names {0}, which does not say it holds a key: name a variable such as \
         OPENAI_API_KEY or HF_TOKEN"
    )]
    NotSaid(String),
    #[error(
        "'api_key_env' names {0}, a credential of a store or database, which is never sent to \
         an endpoint"
    )]
    Credential(String),
}

/// Prefixes of the variables that hold the credentials of batchinfer's stores and databases:
/// never sent to an endpoint.
const NOT_A_KEY_VARIABLE: &[&str] = &["AWS_", "AZURE_", "GOOGLE_", "GCP_", "GCS_", "PG"];

/// `var` if it may name an endpoint's key: a variable name (letters, digits, _) that says it
/// holds a key or token, and not one of the stores' credentials.
fn check_key_variable(var: &str) -> Result<String, NotAKeyVariable> {
    let name = var.trim();
    let a_name = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if !a_name {
        return Err(NotAKeyVariable::NotAName);
    }
    let upper = name.to_ascii_uppercase();
    if !upper.contains("KEY") && !upper.contains("TOKEN") {
        return Err(NotAKeyVariable::NotSaid(name.to_string()));
    }
    if NOT_A_KEY_VARIABLE.iter().any(|p| upper.starts_with(p)) {
        return Err(NotAKeyVariable::Credential(name.to_string()));
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut all: BTreeMap<String, String> =
            [("endpoint", "http://127.0.0.1:8080/v1"), ("model", "m")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        for (k, v) in pairs {
            all.insert(k.to_string(), v.to_string());
        }
        all
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        Endpoint::from_options("w", &options(pairs))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn options_are_checked() {
        let e =
            Endpoint::from_options("w", &options(&[("api_key_env", "OPENAI_API_KEY")])).unwrap();
        assert_eq!(e.max_concurrency, 8);
        assert_eq!(Endpoint::from_json(&e.to_json()).unwrap(), e);
        assert!(refused(&[("colour", "red")]).contains("unknown option 'colour'"));
        assert!(refused(&[("api_key", "sk-1")]).contains("api_key_env"));
        assert!(refused(&[("api_key_env", "sk-abc-123")]).contains("NAME"));
        assert!(refused(&[("api_key_env", "HOME")]).contains("does not say it holds a key"));
        assert!(refused(&[("api_key_env", "AWS_SECRET_ACCESS_KEY")]).contains("credential"));
        assert!(refused(&[("endpoint", "http://h/v1?key=sk-1")]).contains("without a query"));
        assert!(refused(&[("endpoint", "file:///etc/passwd")]).contains("http://"));
        assert!(refused(&[("requests_per_minute", "1e-300")]).contains("at least"));
        assert!(refused(&[("output_price_per_million", "1e308")]).contains("at most"));
        assert!(refused(&[("max_concurrency", "0")]).contains("at least 1"));
        assert!(refused(&[("timeout", "-1")]).contains("'timeout'"));
        assert!(refused(&[("temperature", "NaN")]).contains("'temperature'"));
        assert!(refused(&[("target", "0.9")]).contains("name its local model with 'proxy'"));
        assert!(refused(&[("proxy", "m"), ("target", "1")]).contains("under 1"));
        assert!(
            refused(&[("proxy", "m"), ("target", "0.9999999999999999")]).contains("under 1")
                || Endpoint::from_json(
                    &Endpoint::from_options(
                        "w",
                        &options(&[("proxy", "m"), ("target", "0.9999999999999999")])
                    )
                    .unwrap()
                    .to_json()
                )
                .is_ok()
        );
        assert!(refused(&[("proxy", "m"), ("proxy_sample", "5")]).contains("at least 20"));
        assert!(refused(&[("proxy", "m x")]).contains("local text model"));
        // A proxy's name is only ever a model's name, never a path.
        for hostile in ["../minilm", "/etc/passwd", "a/b", "mini lm", "s3://b/m"] {
            assert!(
                refused(&[("proxy", hostile)]).contains("local text model"),
                "{hostile:?}"
            );
        }
        let cascade = Endpoint::from_options("w", &options(&[("proxy", "minilm")])).unwrap();
        assert_eq!(Endpoint::from_json(&cascade.to_json()).unwrap(), cascade);
        // A definition without a cascade keeps its sha256: the options are kept only when set.
        assert!(!e.to_json().to_string().contains("proxy"));
    }

    #[test]
    fn a_definition_edited_by_hand_is_checked_again() {
        let e = Endpoint::from_options("w", &options(&[])).unwrap();
        for (key, value) in [
            ("max_concurrency", serde_json::json!(0)),
            ("timeout", serde_json::json!(1e300)),
            ("requests_per_minute", serde_json::json!(0.0)),
            ("api_key_env", serde_json::json!("AWS_SECRET_ACCESS_KEY")),
        ] {
            let mut json = e.to_json();
            json[key] = value;
            assert!(Endpoint::from_json(&json).is_err(), "{key}");
        }
    }
}
