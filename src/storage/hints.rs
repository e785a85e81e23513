//! What went wrong with an object store, and what to do about it. object_store's errors print
//! the HTTP exchange ("Generic S3 error: Error performing GET http://host/bucket/key in 3ms,
//! after 3 retries ... <Code>NoSuchBucket</Code>"); a person needs the cause and the remedy.
//!
//! The cause is read from the error's chain of sources: object_store's variants (`NotFound`,
//! `PermissionDenied`, `Unauthenticated`), its HTTP error kinds (connect, timeout, request), and
//! the request's URL from reqwest's error. What only S3 itself says, its error code
//! (`<Code>PermanentRedirect</Code>` in the response body), object_store passes on as text, so
//! that, and the URL where no reqwest error carries it, is read from the text.

use std::error::Error as StdError;

use object_store::client::{HttpError, HttpErrorKind};
use url::Url;

use super::{CONNECT_TIMEOUT, Cloud, REQUEST_TIMEOUT, RETRY_TIMEOUT};

/// A sentence for a person saying what went wrong with an object store request and what to
/// check, when `err` (or one of its sources) is an object store error batchinfer knows.
pub fn describe(err: &(dyn StdError + 'static)) -> Option<String> {
    let facts = Facts::of(err)?;
    facts
        .by_code()
        .or_else(|| facts.by_text())
        .or_else(|| facts.by_kind())
}

/// What an object store error tells: the error, S3's error code, the HTTP error's kind, the
/// request's endpoint and bucket, and the credentials to check.
struct Facts<'a> {
    store: &'a object_store::Error,
    code: Option<String>,
    http: Option<HttpErrorKind>,
    text: String,
    cloud: Option<Cloud>,
    server: &'static str,
    endpoint: String,
    bucket: String,
    check: &'static str,
}

impl<'a> Facts<'a> {
    fn of(err: &'a (dyn StdError + 'static)) -> Option<Self> {
        let mut chain: Vec<&(dyn StdError + 'static)> = vec![err];
        while let Some(next) = inner_of(chain[chain.len() - 1]) {
            chain.push(next);
        }
        let store = chain
            .iter()
            .find_map(|e| e.downcast_ref::<object_store::Error>())?;
        let http = chain
            .iter()
            .find_map(|e| e.downcast_ref::<HttpError>())
            .map(HttpError::kind);
        let text = store.to_string();
        let request = request_of(&chain, &text);
        let code = text
            .split_once("<Code>")
            .and_then(|(_, rest)| rest.split_once("</Code>"))
            .map(|(code, _)| code);
        let cloud = cloud_of(store, code, request.as_ref());
        let server = cloud.map_or("object store", Cloud::name);
        let endpoint = request
            .as_ref()
            .map(|u| format!(" {}", u.origin().ascii_serialization()))
            .unwrap_or_default();
        let bucket = request
            .as_ref()
            .and_then(|u| bucket_of(u, cloud))
            .unwrap_or_default();
        let check = credentials_of(cloud);
        Some(Facts {
            store,
            code: code.map(str::to_string),
            http,
            cloud,
            server,
            endpoint,
            bucket,
            check,
            text,
        })
    }

    /// batchinfer's own refusals, and what the server's error code says.
    fn by_code(&self) -> Option<String> {
        let Facts {
            store,
            http,
            server,
            endpoint,
            bucket,
            check,
            ..
        } = self;
        Some(match (*store, self.code.as_deref(), http) {
            // batchinfer's own refusals (a FIFO where a file belongs) say all there is to say.
            (
                object_store::Error::Generic {
                    store: "LocalFileSystem" | "batchinfer",
                    source,
                },
                _,
                _,
            ) => source.to_string(),
            (
                _,
                Some(
                    code @ ("SignatureDoesNotMatch"
                    | "InvalidAccessKeyId"
                    | "AccessDenied"
                    | "AuthenticationFailed"
                    | "AuthorizationFailure"
                    | "InvalidAuthenticationInfo"),
                ),
                _,
            ) => {
                format!(
                    "the {server} server{endpoint} refused access: it rejected the credentials \
                         ({code}); check {check}"
                )
            }
            (_, Some(code @ ("PermanentRedirect" | "AuthorizationHeaderMalformed")), _) => format!(
                "bucket '{bucket}' is in another region than the one requested ({code}): set \
                     AWS_REGION (or 'aws.region') to the bucket's region"
            ),
            (_, Some("NoSuchBucket"), _) => {
                format!("bucket '{bucket}' does not exist on the {server} server{endpoint}")
            }
            (_, Some("ContainerNotFound"), _) => {
                format!("container '{bucket}' does not exist on the {server} server{endpoint}")
            }
            _ => return None,
        })
    }

    /// What only the error's text says (fake-gcs-server, token requests, range requests).
    fn by_text(&self) -> Option<String> {
        let Facts {
            cloud,
            server,
            endpoint,
            bucket,
            check,
            text,
            ..
        } = self;
        let (cloud, text) = (*cloud, text.as_str());
        Some(match () {
            // fake-gcs-server's word for it.
            _ if cloud == Some(Cloud::Gcs) && text.contains("no bucket named") => {
                format!("bucket '{bucket}' does not exist on the {server} server{endpoint}")
            }
            // No credentials set: object_store asked the instance metadata server, which there is not.
            _ if cloud == Some(Cloud::Gcs) && text.contains("Error performing token request") => {
                format!(
                    "no Google Cloud credentials: none is set and the instance metadata server gave \
                         none; set {check}"
                )
            }
            _ if text.contains("Range request not supported") => format!(
                "the server{endpoint} does not answer range requests, which reading Parquet needs \
                     (a static file server or CDN does)"
            ),
            _ => return None,
        })
    }

    /// What the error's variant or its HTTP kind says.
    fn by_kind(&self) -> Option<String> {
        let Facts {
            store,
            http,
            cloud,
            server,
            endpoint,
            bucket,
            check,
            text,
            ..
        } = self;
        let (cloud, text) = (*cloud, text.as_str());
        Some(match (*store, self.code.as_deref(), *http) {
            (_, Some(code), _) if code.contains("NotFound") => format!(
                "the {server} server{endpoint} has no such {} ({code}){}",
                match cloud {
                    Some(Cloud::Azure) => "account, container or blob",
                    _ => "bucket or object",
                },
                match bucket.as_str() {
                    "" => String::new(),
                    bucket => format!(" for '{bucket}'"),
                }
            ),
            _ if cloud == Some(Cloud::Http) && text.contains("PROPFIND") => format!(
                "the HTTP server{endpoint} does not list folders (WebDAV's PROPFIND is refused): \
                     read its files by their full URL"
            ),
            (
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. },
                _,
                _,
            ) => format!(
                "the {server} server{endpoint} refused access (403): check {check}, and the \
                     permissions of the bucket or container"
            ),
            (
                _,
                None,
                Some(
                    HttpErrorKind::Connect
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Request
                    | HttpErrorKind::Interrupted,
                ),
            ) => format!(
                "could not reach the {} endpoint{endpoint} (no connection within {} s or no answer \
                     within {} s, retried for up to {} s): is the server running, and is {} right?",
                cloud.map_or("object store", |c| c.short_name()),
                CONNECT_TIMEOUT.as_secs(),
                REQUEST_TIMEOUT.as_secs(),
                RETRY_TIMEOUT.as_secs(),
                match cloud {
                    Some(Cloud::S3) | None => "AWS_ENDPOINT_URL / aws.endpoint",
                    Some(Cloud::Gcs) => "the service account's gcs_base_url",
                    Some(Cloud::Azure) => "AZURE_STORAGE_ENDPOINT / AZURITE_BLOB_STORAGE_URL",
                    Some(Cloud::Http) => "the URL",
                }
            ),
            _ => return None,
        })
    }
}

/// Which store an error came from: the store object_store names, else what the server's error
/// code or the request's host tells.
fn cloud_of(err: &object_store::Error, code: Option<&str>, request: Option<&Url>) -> Option<Cloud> {
    if let object_store::Error::Generic { store, .. } = err {
        match *store {
            "S3" => return Some(Cloud::S3),
            "GCS" => return Some(Cloud::Gcs),
            "MicrosoftAzure" => return Some(Cloud::Azure),
            "HTTP" => return Some(Cloud::Http),
            _ => {}
        }
    }
    if matches!(
        code,
        Some("AuthenticationFailed" | "AuthorizationFailure" | "InvalidAuthenticationInfo")
    ) {
        return Some(Cloud::Azure);
    }
    let request = request?;
    let host = request.host_str()?;
    // Azure's requests say what they ask of the service in the query (`restype=container`,
    // `comp=list`, `comp=block`), as S3's and Google's never do.
    let azure_query = request
        .query_pairs()
        .any(|(key, _)| key == "restype" || key == "comp");
    if host.ends_with(".windows.net") || azure_query {
        Some(Cloud::Azure)
    } else if host.ends_with("googleapis.com") {
        Some(Cloud::Gcs)
    } else if host.contains("amazonaws.com") {
        Some(Cloud::S3)
    } else {
        None
    }
}

/// Where a store's credentials come from, for a message that asks to check them.
fn credentials_of(cloud: Option<Cloud>) -> &'static str {
    match cloud {
        Some(Cloud::S3) => "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS profile)",
        Some(Cloud::Gcs) => {
            "GOOGLE_SERVICE_ACCOUNT, GOOGLE_SERVICE_ACCOUNT_KEY or \
             GOOGLE_APPLICATION_CREDENTIALS (or 'gcp.*' options)"
        }
        Some(Cloud::Azure) => {
            "AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY, or a SAS or bearer token \
             (or 'azure.*' options)"
        }
        Some(Cloud::Http) => "that the server allows reading the URL",
        None => {
            "the credentials: for S3 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the AWS \
             profile), for Google Cloud Storage GOOGLE_SERVICE_ACCOUNT or \
             GOOGLE_APPLICATION_CREDENTIALS, for Azure AZURE_STORAGE_ACCOUNT_NAME and \
             AZURE_STORAGE_ACCOUNT_KEY"
        }
    }
}

/// The bucket (or container) of a request: the first segment of its path, or for an Azure
/// request in the path style of an emulator (`/ACCOUNT/CONTAINER/...`), the second.
fn bucket_of(request: &Url, cloud: Option<Cloud>) -> Option<String> {
    let mut segments = request.path_segments()?;
    let path_style_azure = cloud == Some(Cloud::Azure)
        && !request
            .host_str()
            .is_some_and(|h| h.ends_with(".windows.net"));
    if path_style_azure {
        segments.next();
    }
    segments.next().map(str::to_string)
}

/// The URL of the request that failed, as far as the errors in `chain` or the message `text`
/// tell it.
fn request_of(chain: &[&(dyn StdError + 'static)], text: &str) -> Option<Url> {
    chain
        .iter()
        .find_map(|e| e.downcast_ref::<reqwest::Error>()?.url().cloned())
        .or_else(|| request_url(text))
}

/// The error under `err`: its source, or for an I/O error that wraps another, that one (an
/// `io::Error`'s source skips the error it wraps).
fn inner_of<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    if let Some(io) = err.downcast_ref::<std::io::Error>()
        && let Some(wrapped) = io.get_ref()
    {
        return Some(wrapped);
    }
    err.source()
}

/// The URL of the request in object_store's text ("Error performing GET http://h/b/k in 3ms").
fn request_url(text: &str) -> Option<Url> {
    let (_, rest) = text.rsplit_once("Error performing ")?;
    Url::parse(rest.split_whitespace().nth(1)?).ok()
}

#[cfg(test)]
mod tests {
    use super::describe;

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: text.into(),
        }
    }

    #[test]
    fn s3_errors_say_what_went_wrong_and_what_to_check() {
        let bucket = generic(
            "Error performing list request: Error performing GET \
             http://127.0.0.1:9000/nb?list-type=2 in 1ms - Server returned non-2xx status code: \
             404 Not Found: <Error><Code>NoSuchBucket</Code></Error>",
        );
        assert_eq!(
            describe(&bucket).unwrap(),
            "bucket 'nb' does not exist on the S3 server http://127.0.0.1:9000"
        );
        let region = generic(
            "Error performing GET https://s3.amazonaws.com/far/k in 9ms - Server returned \
             non-2xx status code: 301 Moved Permanently: <Code>PermanentRedirect</Code>",
        );
        assert!(describe(&region).unwrap().contains("set AWS_REGION"));
        let denied = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "Error performing HEAD http://h:1/b/k in 2ms - 403 Forbidden".into(),
        };
        assert!(describe(&denied).unwrap().contains("refused access (403)"));
        let down = object_store::Error::Generic {
            store: "S3",
            source: Box::new(object_store::client::HttpError::new(
                object_store::client::HttpErrorKind::Connect,
                std::io::Error::other("connection refused"),
            )),
        };
        assert!(
            describe(&down)
                .unwrap()
                .starts_with("could not reach the S3 endpoint")
        );
        assert_eq!(describe(&generic("model 'm' failed")), None);
        let no_container = object_store::Error::Generic {
            store: "MicrosoftAzure",
            source: "Error performing GET http://127.0.0.1:10000/devstoreaccount1/c1?restype=\
                     container in 3ms - Server returned non-2xx status code: 404 Not Found: \
                     <Error><Code>ContainerNotFound</Code></Error>"
                .into(),
        };
        assert_eq!(
            describe(&no_container).unwrap(),
            "container 'c1' does not exist on the Azure Blob Storage server \
             http://127.0.0.1:10000"
        );
        let real_azure = object_store::Error::Generic {
            store: "MicrosoftAzure",
            source: "Error performing GET https://acct.blob.core.windows.net/c2/k in 3ms - \
                     Server returned non-2xx status code: 404 Not Found: \
                     <Error><Code>ContainerNotFound</Code></Error>"
                .into(),
        };
        assert!(
            describe(&real_azure)
                .unwrap()
                .starts_with("container 'c2' ")
        );
        let azure_key = object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "Error performing GET https://acct.blob.core.windows.net/c/k in 2ms - 403: \
                     <Code>AuthenticationFailed</Code>"
                .into(),
        };
        let text = describe(&azure_key).unwrap();
        assert!(
            text.contains("Azure Blob Storage") && text.contains("AZURE_STORAGE_ACCOUNT_KEY"),
            "{text}"
        );
        assert_eq!(describe(&std::io::Error::other("not a store")), None);
    }
}
