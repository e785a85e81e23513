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
/// (`AWS_CONFIG_FILE`, else `~/.aws/config`), as the AWS SDK reads it; read once per process.
pub fn profile_region() -> Option<String> {
    use aws_config::meta::region::ProvideRegion;
    // Per process: the AWS profile file is read once.
    static REGION: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    REGION
        .get_or_init(|| {
            let provider = aws_config::profile::ProfileFileRegionProvider::new();
            super::block_on_io(async move { provider.region().await })
                .ok()
                .flatten()
                .map(|region| region.to_string())
        })
        .clone()
}
