//! S3 clients: the environment's settings, a statement's options over them, and the timeouts and
//! retries every request has.

use std::sync::Arc;

use datafusion_cli::object_storage::AwsOptions;
use object_store::ClientConfigKey;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use url::Url;

use super::credentials;
use crate::error::{Error, Result};

/// An S3 client for `bucket`: the environment's settings, then `options` over them.
pub(super) fn s3_builder(bucket: &str, options: &AwsOptions) -> Result<AmazonS3Builder> {
    let builder = with_options(
        AmazonS3Builder::from_env().with_bucket_name(bucket),
        options,
    );
    let builder = with_endpoint_checked(with_profile_region(builder))?;
    let mut builder = with_credential_chain(builder).with_retry(super::cloud::retry());
    for (key, value) in super::cloud::client_timeouts() {
        builder = builder.with_config(AmazonS3ConfigKey::Client(key), value);
    }
    Ok(builder)
}

/// A statement's `OPTIONS` over the environment's settings.
fn with_options(mut builder: AmazonS3Builder, options: &AwsOptions) -> AmazonS3Builder {
    let AwsOptions {
        access_key_id,
        secret_access_key,
        session_token,
        region,
        endpoint,
        allow_http,
        skip_signature,
    } = options;
    if let (Some(key), Some(secret)) = (access_key_id, secret_access_key) {
        builder = builder
            .with_access_key_id(key)
            .with_secret_access_key(secret);
        if let Some(token) = session_token {
            builder = builder.with_token(token);
        }
    }
    if let Some(region) = region {
        builder = builder.with_region(region);
    }
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(allow_http) = allow_http {
        builder = builder.with_allow_http(*allow_http);
    }
    if let Some(skip) = skip_signature {
        builder = builder.with_skip_signature(*skip);
    }
    builder
}

/// The profile's region where neither the environment nor the options name one.
fn with_profile_region(mut builder: AmazonS3Builder) -> AmazonS3Builder {
    if builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .is_none()
        && std::env::var_os("AWS_DEFAULT_REGION").is_none()
        && let Some(region) = credentials::profile_region()
    {
        builder = builder.with_region(region);
    }
    builder
}

/// Refuses an endpoint object_store cannot use, and a plain-HTTP one not allowed.
fn with_endpoint_checked(builder: AmazonS3Builder) -> Result<AmazonS3Builder> {
    if let Some(endpoint) = builder.get_config_value(&AmazonS3ConfigKey::Endpoint) {
        check_endpoint(&endpoint)?;
        let allow_http = builder
            .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if endpoint.starts_with("http://") && !allow_http {
            return Err(Error::store(
                super::blank_passwords(&endpoint),
                format!(
                    "the S3 endpoint '{}' is plain HTTP: set AWS_ALLOW_HTTP=true (or \
                 'aws.allow_http' 'true') to use it",
                    super::blank_passwords(&endpoint)
                ),
            ));
        }
    }
    Ok(builder)
}

/// The AWS SDK's credential chain where no static keys, unsigned requests or credential provider
/// from the environment are set.
fn with_credential_chain(mut builder: AmazonS3Builder) -> AmazonS3Builder {
    let has_static_keys = builder
        .get_config_value(&AmazonS3ConfigKey::AccessKeyId)
        .is_some();
    let skips = builder
        .get_config_value(&AmazonS3ConfigKey::SkipSignature)
        .is_some_and(|v| v == "true");
    let has_env_provider = [
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some());
    if !has_static_keys && !skips && !has_env_provider {
        builder = builder.with_credentials(Arc::new(credentials::SdkCredentials::default()));
    }
    builder
}

/// Refuses an S3 endpoint that is not an `http(s)://host[:port]` URL (object_store would panic on
/// it at the first request).
fn check_endpoint(endpoint: &str) -> Result<()> {
    // object_store joins the endpoint and the key as text and parses that as a URI.
    let as_sent = format!("{}/bucket/key", endpoint.trim_end_matches('/'))
        .parse::<http::Uri>()
        .map_err(|e| e.to_string())
        .and_then(|uri| match (uri.scheme_str(), uri.authority()) {
            (Some("http" | "https"), Some(_)) => Ok(()),
            _ => Err("it is not http(s)://host[:port]".to_string()),
        });
    let problem = match Url::parse(endpoint) {
        _ if endpoint != endpoint.trim() => Some("it has spaces around it".to_string()),
        _ if endpoint.contains('%') => Some("it has a percent-encoded character".to_string()),
        Err(e) => Some(e.to_string()),
        Ok(_) if as_sent.is_err() => as_sent.err(),
        Ok(url) if !matches!(url.scheme(), "http" | "https") => Some(format!(
            "the scheme is '{}', not http or https",
            url.scheme()
        )),
        Ok(url) if url.host_str().is_none_or(str::is_empty) => Some("it has no host".into()),
        Ok(_) => None,
    };
    match problem {
        None => Ok(()),
        Some(why) => Err(Error::setting(
            "aws.endpoint",
            format!(
                "the S3 endpoint '{}' (AWS_ENDPOINT_URL or 'aws.endpoint') is not usable: {why}; \
             expected a URL such as http://localhost:9000",
                super::blank_passwords(endpoint)
            ),
        )),
    }
}
