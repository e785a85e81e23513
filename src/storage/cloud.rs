//! The object stores a URL names: which store each scheme is, the settings a statement gives it
//! over the environment's, and the clients of Google Cloud Storage, Azure Blob Storage and plain
//! HTTP(S) (S3's are in `s3.rs`). Every client has the same timeouts and retries.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion_cli::object_storage::AwsOptions;
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::{BackoffConfig, ClientConfigKey, ObjectStore, RetryConfig};
use url::Url;

use super::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, RETRIES, RETRY_TIMEOUT, blank_passwords};
use crate::error::{Error, Result};

/// The kinds of object store, by URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// `s3://BUCKET/...` (and `s3a://`).
    S3,
    /// `gs://BUCKET/...` (and `gcs://`).
    Gcs,
    /// `az://CONTAINER/...`, `abfs[s]://CONTAINER/...` or
    /// `abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/...` (and `azure://`, `adl://`).
    Azure,
    /// `https://HOST/...` and `http://`: read only.
    Http,
}

impl Cloud {
    /// The store `url` is in; `None` for a local file or a scheme batchinfer has no store for.
    pub fn of(url: &Url) -> Option<Cloud> {
        Some(match url.scheme() {
            "s3" | "s3a" => Cloud::S3,
            "gs" | "gcs" => Cloud::Gcs,
            "az" | "azure" | "abfs" | "abfss" | "adl" => Cloud::Azure,
            "http" | "https" => Cloud::Http,
            _ => return None,
        })
    }

    /// The prefix of the SQL options that configure this store (`'gcp.service_account_key'`).
    pub fn option_prefix(self) -> Option<&'static str> {
        match self {
            Cloud::S3 => Some("aws"),
            Cloud::Gcs => Some("gcp"),
            Cloud::Azure => Some("azure"),
            Cloud::Http => None,
        }
    }

    /// The store as a person names it.
    pub fn name(self) -> &'static str {
        match self {
            Cloud::S3 => "S3",
            Cloud::Gcs => "Google Cloud Storage",
            Cloud::Azure => "Azure Blob Storage",
            Cloud::Http => "HTTP",
        }
    }

    /// The store's name in a phrase such as "the S3 endpoint".
    pub fn short_name(self) -> &'static str {
        match self {
            Cloud::Gcs => "GCS",
            Cloud::Azure => "Azure",
            other => other.name(),
        }
    }

    /// What names the bucket (or container) in a URL of this store.
    fn bucket_word(self) -> &'static str {
        match self {
            Cloud::Azure => "container",
            Cloud::Http => "host",
            _ => "bucket",
        }
    }
}

/// What a statement's `OPTIONS` say of a store, over the environment's settings: `aws.*` as
/// datafusion-cli reads them, `gcp.*` and `azure.*` as object_store's configuration keys
/// (`'gcp.service_account_key'`, `'azure.account_name'`, `'azure.use_emulator'`, ...).
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    pub aws: AwsOptions,
    pub gcp: Vec<(GoogleConfigKey, String)>,
    pub azure: Vec<(AzureConfigKey, String)>,
}

impl StoreOptions {
    /// Reads one option (`aws.region`, `gcp.service_account_key`, ...); `false` when its prefix
    /// is no store's.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        // As DataFusion reads option names: in any case.
        let key = key.to_ascii_lowercase();
        let key = key.as_str();
        let Some((prefix, name)) = key.split_once('.') else {
            return Ok(false);
        };
        let unknown = |store: &str| {
            Error::setting(
                key,
                format!(
                    "'{key}' is not a {store} setting batchinfer knows (object_store's \
                 configuration keys, e.g. {})",
                    match store {
                        "Google Cloud Storage" => "'gcp.service_account_key', 'gcp.bucket'",
                        _ => "'azure.account_name', 'azure.access_key', 'azure.use_emulator'",
                    }
                ),
            )
        };
        match prefix {
            "aws" => self.aws.set(key, value)?,
            "gcp" => {
                let key = name.parse().map_err(|_| unknown(Cloud::Gcs.name()))?;
                self.gcp.push((key, value.to_string()));
            }
            "azure" => {
                let key = name.parse().map_err(|_| unknown(Cloud::Azure.name()))?;
                self.azure.push((key, value.to_string()));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Whether no option is given: the environment's settings alone.
    pub fn is_empty(&self) -> bool {
        !self.aws_given() && self.gcp.is_empty() && self.azure.is_empty()
    }

    /// Whether `other` says the same (the same options, in any order).
    pub fn same_as(&self, other: &StoreOptions) -> bool {
        aws_settings(&self.aws) == aws_settings(&other.aws)
            && sorted(&self.gcp) == sorted(&other.gcp)
            && sorted(&self.azure) == sorted(&other.azure)
    }

    fn aws_given(&self) -> bool {
        aws_settings(&self.aws).iter().any(Option::is_some)
    }

    /// Whether any option was given for a store other than `cloud`.
    pub fn for_other_than(&self, cloud: Cloud) -> Option<&'static str> {
        let aws = self.aws_given();
        [
            (aws, Cloud::S3, "aws.*"),
            (!self.gcp.is_empty(), Cloud::Gcs, "gcp.*"),
            (!self.azure.is_empty(), Cloud::Azure, "azure.*"),
        ]
        .into_iter()
        .find(|(given, of, _)| *given && *of != cloud)
        .map(|(_, _, which)| which)
    }
}

/// Every setting of datafusion-cli's `AwsOptions`, as text (a field it gains is a compile error
/// here, not a setting left out of a comparison).
fn aws_settings(options: &AwsOptions) -> [Option<String>; 7] {
    let AwsOptions {
        access_key_id,
        secret_access_key,
        session_token,
        region,
        endpoint,
        allow_http,
        skip_signature,
    } = options;
    [
        access_key_id.clone(),
        secret_access_key.clone(),
        session_token.clone(),
        region.clone(),
        endpoint.clone(),
        allow_http.map(|b| b.to_string()),
        skip_signature.map(|b| b.to_string()),
    ]
}

/// Settings as sorted `(name, value)` pairs, to compare them whatever their order.
fn sorted<K: AsRef<str>>(settings: &[(K, String)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.as_ref().to_string(), v.clone()))
        .collect();
    pairs.sort();
    pairs
}

/// The timeouts and retries of every client (see the constants in `storage`).
pub(super) fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: RETRIES,
        retry_timeout: RETRY_TIMEOUT,
    }
}

/// Client settings every store has: how long a connection and a request may take.
pub(super) fn client_timeouts() -> [(ClientConfigKey, String); 2] {
    let seconds = |d: Duration| format!("{}s", d.as_secs());
    [
        (ClientConfigKey::ConnectTimeout, seconds(CONNECT_TIMEOUT)),
        (ClientConfigKey::Timeout, seconds(REQUEST_TIMEOUT)),
    ]
}

/// The bucket (or container, or host) of `url`, or an error saying what a URL of `cloud` looks
/// like.
pub(super) fn bucket_of(url: &Url, cloud: Cloud) -> Result<&str> {
    url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| {
        let example = match cloud {
            Cloud::S3 => "s3://BUCKET/...",
            Cloud::Gcs => "gs://BUCKET/...",
            Cloud::Azure => {
                "az://CONTAINER/... or abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/..."
            }
            Cloud::Http => "https://HOST/...",
        };
        Error::location(
            blank_passwords(url.as_str()),
            format!(
                "no {} in '{}': expected {example}",
                cloud.bucket_word(),
                blank_passwords(url.as_str())
            ),
        )
    })
}

/// A client of the Google Cloud Storage bucket of `url`: `GOOGLE_*` variables, then `options`.
pub(super) fn gcs(url: &Url, options: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    let bucket = bucket_of(url, Cloud::Gcs)?;
    let mut builder = GoogleCloudStorageBuilder::from_env();
    for (key, value) in &options.gcp {
        builder = builder.with_config(*key, value);
    }
    for (key, value) in client_timeouts() {
        builder = builder.with_config(GoogleConfigKey::Client(key), value);
    }
    let store = builder
        .with_bucket_name(bucket)
        .with_retry(retry())
        .build()
        .map_err(|e| not_configured(url, Cloud::Gcs, e))?;
    Ok(Arc::new(store))
}

/// A client of the Azure container of `url`: `AZURE_*` variables, then `options`.
pub(super) fn azure(url: &Url, options: &StoreOptions) -> Result<Arc<dyn ObjectStore>> {
    bucket_of(url, Cloud::Azure)?;
    let mut builder = MicrosoftAzureBuilder::from_env();
    // An endpoint given in OPTIONS is where the statement means: not the emulator that
    // AZURE_STORAGE_USE_EMULATOR points at (object_store would prefer the emulator).
    if options
        .azure
        .iter()
        .any(|(key, _)| *key == AzureConfigKey::Endpoint)
    {
        builder = builder.with_config(AzureConfigKey::UseEmulator, "false");
    }
    for (key, value) in &options.azure {
        builder = builder.with_config(*key, value);
    }
    for (key, value) in client_timeouts() {
        builder = builder.with_config(AzureConfigKey::Client(key), value);
    }
    let store = builder
        .with_url(url.as_str())
        .with_retry(retry())
        .build()
        .map_err(|e| not_configured(url, Cloud::Azure, e))?;
    Ok(Arc::new(store))
}

/// A client of the HTTP(S) server of `url` (read only).
pub(super) fn http(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    bucket_of(url, Cloud::Http)?;
    let mut builder = HttpBuilder::new()
        .with_url(url.origin().ascii_serialization())
        .with_config(ClientConfigKey::AllowHttp, "true")
        .with_retry(retry())
        .with_http_connector(SameHostRedirects);
    for (key, value) in client_timeouts() {
        builder = builder.with_config(key, value);
    }
    Ok(Arc::new(
        builder
            .build()
            .map_err(|e| not_configured(url, Cloud::Http, e))?,
    ))
}

/// HTTP(S) clients that follow a redirect only to the host it came from: a server must not
/// send batchinfer's requests (and what they carry) to another host, or have data of another
/// host read as its own. A redirect elsewhere is answered as the server sent it (an error
/// naming the status).
#[derive(Debug)]
struct SameHostRedirects;

impl object_store::client::HttpConnector for SameHostRedirects {
    fn connect(
        &self,
        _options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            let to = attempt.url();
            // The same origin, or the same host upgraded from http to https.
            let same = attempt.previous().first().is_some_and(|from| {
                from.host_str() == to.host_str()
                    && ((from.scheme() == to.scheme()
                        && from.port_or_known_default() == to.port_or_known_default())
                        || (from.scheme() == "http" && to.scheme() == "https"))
            });
            if same && attempt.previous().len() < 10 {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("batchinfer/", env!("CARGO_PKG_VERSION")))
            .redirect(policy)
            .build()
            .map_err(|e| object_store::Error::Generic {
                store: "HTTP",
                source: Box::new(e),
            })?;
        Ok(object_store::client::HttpClient::new(client))
    }
}

/// A store that cannot be made from the settings there are: the URL, what is missing and where
/// it is set.
fn not_configured(url: &Url, cloud: Cloud, err: object_store::Error) -> Error {
    let text = err.to_string();
    let remedy = match cloud {
        Cloud::Azure if text.contains("Account must be specified") => {
            " (no storage account: set AZURE_STORAGE_ACCOUNT_NAME or 'azure.account_name', or \
             AZURE_STORAGE_USE_EMULATOR=true for Azurite)"
        }
        Cloud::Azure => {
            " (set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, or \
             AZURE_STORAGE_USE_EMULATOR=true for Azurite, or their 'azure.*' options)"
        }
        Cloud::Gcs => {
            " (credentials come from GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY or \
             GOOGLE_APPLICATION_CREDENTIALS, or their 'gcp.*' options)"
        }
        _ => "",
    };
    Error::store(
        blank_passwords(url.as_str()),
        format!(
            "cannot connect to {} for '{}': {}{remedy}",
            cloud.name(),
            blank_passwords(url.as_str()),
            blank_passwords(&text)
        ),
    )
}

/// SQL `OPTIONS ('gcp.*' ...)` and `('azure.*' ...)` as DataFusion's table options take them:
/// any key under the prefix (batchinfer reads and checks them when it connects the store).
#[derive(Debug, Clone, Default)]
pub struct SqlStoreOptions<P> {
    values: BTreeMap<String, String>,
    prefix: PhantomData<P>,
}

/// The prefix of a [`SqlStoreOptions`].
pub trait OptionPrefix: Debug + Clone + Default + Send + Sync + 'static {
    const PREFIX: &'static str;
}

/// `gcp.*`.
#[derive(Debug, Clone, Default)]
pub struct Gcp;
impl OptionPrefix for Gcp {
    const PREFIX: &'static str = "gcp";
}

/// `azure.*`.
#[derive(Debug, Clone, Default)]
pub struct Azure;
impl OptionPrefix for Azure {
    const PREFIX: &'static str = "azure";
}

impl<P: OptionPrefix> ExtensionOptions for SqlStoreOptions<P> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::common::Result<()> {
        let name = key.split_once('.').map_or(key, |(_, name)| name);
        self.values.insert(name.to_string(), value.to_string());
        Ok(())
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        self.values
            .keys()
            .map(|key| ConfigEntry {
                key: format!("{}.{key}", P::PREFIX),
                // Values are not shown: some are keys.
                value: None,
                description: "an object_store setting",
            })
            .collect()
    }
}

impl<P: OptionPrefix> ConfigExtension for SqlStoreOptions<P> {
    const PREFIX: &'static str = P::PREFIX;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_name_their_store_and_options_belong_to_one() {
        let of = |u: &str| Cloud::of(&Url::parse(u).unwrap());
        assert_eq!(of("s3a://b/k"), Some(Cloud::S3));
        assert_eq!(of("gcs://b/k"), Some(Cloud::Gcs));
        assert_eq!(
            of("abfss://c@acct.dfs.core.windows.net/k"),
            Some(Cloud::Azure)
        );
        assert_eq!(of("https://h/k.parquet"), Some(Cloud::Http));
        assert_eq!(of("ftp://h/k"), None);
        let mut options = StoreOptions::default();
        assert!(options.set("azure.account_name", "acme").unwrap());
        assert!(options.set("azure.azure_storage_account_key", "k").unwrap());
        assert!(!options.set("format.compression", "zstd").unwrap());
        assert!(options.set("azure.nope", "x").is_err());
        assert!(options.set("gcp.nope", "x").is_err());
        assert_eq!(options.for_other_than(Cloud::Azure), None);
        assert_eq!(options.for_other_than(Cloud::Gcs), Some("azure.*"));
        let mut aws = StoreOptions::default();
        aws.set("aws.region", "eu-west-1").unwrap();
        assert_eq!(aws.for_other_than(Cloud::Azure), Some("aws.*"));
        let url = Url::parse("az:///k").unwrap();
        let no_container = bucket_of(&url, Cloud::Azure).unwrap_err().to_string();
        assert!(no_container.contains("no container"), "{no_container}");
    }
}
