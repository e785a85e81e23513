//! What went wrong with an object store, and what to do about it. object_store's S3 errors print
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

use super::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, RETRY_TIMEOUT};

/// A sentence for a person saying what went wrong with an object store request and what to
/// check, when `err` (or one of its sources) is an object store error batchinfer knows.
pub fn describe(err: &(dyn StdError + 'static)) -> Option<String> {
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
    let (endpoint, bucket) = endpoint_and_bucket(&chain, &text);
    let code = text
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code);
    Some(match (store, code, http) {
        // batchinfer's own refusals (a FIFO where a file belongs) say all there is to say.
        (
            object_store::Error::Generic {
                store: "LocalFileSystem",
                source,
            },
            _,
            _,
        ) => source.to_string(),
        (_, Some(code @ ("SignatureDoesNotMatch" | "InvalidAccessKeyId" | "AccessDenied")), _) => {
            format!(
                "the S3 server{endpoint} rejected the credentials ({code}): check \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the AWS profile"
            )
        }
        (_, Some(code @ ("PermanentRedirect" | "AuthorizationHeaderMalformed")), _) => format!(
            "bucket '{bucket}' is in another region than the one requested ({code}): set \
             AWS_REGION (or 'aws.region') to the bucket's region"
        ),
        (_, Some("NoSuchBucket"), _) => {
            format!("bucket '{bucket}' does not exist on the S3 server{endpoint}")
        }
        (
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. },
            _,
            _,
        ) => format!(
            "the S3 server{endpoint} refused access (403): check AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY (or the AWS profile), and the bucket's permissions"
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
            "could not reach the S3 endpoint{endpoint} (no connection within {} s or no answer \
             within {} s, retried for up to {} s): is the server running, and are \
             AWS_ENDPOINT_URL / aws.endpoint right?",
            CONNECT_TIMEOUT.as_secs(),
            REQUEST_TIMEOUT.as_secs(),
            RETRY_TIMEOUT.as_secs()
        ),
        _ => return None,
    })
}

/// The endpoint (with a space before it) and the bucket of the request that failed, as far as
/// the errors in `chain` or the message `text` tell them.
fn endpoint_and_bucket(chain: &[&(dyn StdError + 'static)], text: &str) -> (String, String) {
    let request = chain
        .iter()
        .find_map(|e| e.downcast_ref::<reqwest::Error>()?.url().cloned())
        .or_else(|| request_url(text));
    let endpoint = request
        .as_ref()
        .map(|u| format!(" {}", u.origin().ascii_serialization()))
        .unwrap_or_default();
    let bucket = request
        .as_ref()
        .and_then(|u| u.path_segments()?.next().map(str::to_string))
        .unwrap_or_default();
    (endpoint, bucket)
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
        assert_eq!(describe(&std::io::Error::other("not a store")), None);
    }
}
