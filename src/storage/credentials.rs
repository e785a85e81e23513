//! Credentials and region from the AWS SDK's configuration (profiles, `~/.aws/credentials`, SSO,
//! instance metadata), for S3 stores given no static keys.

use std::sync::Arc;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use object_store::CredentialProvider;
use object_store::aws::AwsCredential;
use tokio::sync::OnceCell;

/// The AWS SDK's default credential chain, loaded on the first signed request.
#[derive(Debug, Default)]
pub struct SdkCredentials {
    provider: OnceCell<Option<SharedCredentialsProvider>>,
}

fn credential_error(message: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: message.into(),
    }
}

#[async_trait]
impl CredentialProvider for SdkCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let provider = self
            .provider
            .get_or_init(|| async {
                let config = Box::pin(aws_config::defaults(BehaviorVersion::latest()).load()).await;
                config.credentials_provider()
            })
            .await;
        let no_credentials = || {
            credential_error(
                "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
                 AWS_PROFILE with ~/.aws/credentials; for a public bucket set \
                 AWS_SKIP_SIGNATURE=true"
                    .to_string(),
            )
        };
        let provider = provider.as_ref().ok_or_else(no_credentials)?;
        let credentials = provider.provide_credentials().await.map_err(|e| match e {
            CredentialsError::CredentialsNotLoaded(_) => no_credentials(),
            e => credential_error(format!(
                "the AWS credential chain failed: {}",
                error_chain(&e)
            )),
        })?;
        Ok(Arc::new(AwsCredential {
            key_id: credentials.access_key_id().to_string(),
            secret_key: credentials.secret_access_key().to_string(),
            token: credentials.session_token().map(str::to_string),
        }))
    }
}

/// An error with its chain of causes, on one line.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The `region` of the active profile (`AWS_PROFILE`, else `default`) in the AWS config file
/// (`AWS_CONFIG_FILE`, else `~/.aws/config`).
pub fn profile_region() -> Option<String> {
    let path = match std::env::var_os("AWS_CONFIG_FILE") {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::PathBuf::from(std::env::var_os("HOME")?).join(".aws/config"),
    };
    let text = std::fs::read_to_string(path).ok()?;
    let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".to_string());
    region_of_profile(&text, &profile)
}

fn region_of_profile(config: &str, profile: &str) -> Option<String> {
    let mut in_profile = false;
    for line in config.lines().map(str::trim) {
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let section = section.trim();
            let name = section.strip_prefix("profile ").unwrap_or(section).trim();
            in_profile = name == profile;
        } else if in_profile
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "region"
        {
            return Some(value.trim().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::region_of_profile;

    #[test]
    fn region_is_read_from_the_named_profile_only() {
        let config =
            "[default]\nregion = eu-west-1\n\n[profile prod]\noutput=json\nregion=us-west-2\n";
        assert_eq!(
            region_of_profile(config, "default").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            region_of_profile(config, "prod").as_deref(),
            Some("us-west-2")
        );
        assert_eq!(region_of_profile(config, "dev"), None);
    }
}
