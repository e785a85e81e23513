//! The crate's one error type, and its conversions to and from DataFusion's.
//!
//! Errors raised inside `predict` travel through DataFusion as `DataFusionError`; the messages are
//! written for a person at a terminal: which model, which input, what was expected, what was given.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Everything that can go wrong in batchinfer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The ONNX Runtime library could not be found, fetched or loaded.
    #[error("ONNX Runtime is not available: {0}")]
    Runtime(String),

    /// `predict('name', ...)` named a model that is not registered.
    #[error("unknown model '{name}'; {available}")]
    UnknownModel { name: String, available: String },

    /// A model file could not be read or is not a model ONNX Runtime accepts.
    #[error("model '{model}' could not be loaded from {path}: {message}")]
    ModelLoad {
        model: String,
        path: String,
        message: String,
    },

    /// The columns given to a model do not fit its inputs (a planning-time error).
    #[error("model '{model}': {message}")]
    Binding { model: String, message: String },

    /// ONNX Runtime failed while running a model on a batch.
    #[error("model '{model}' failed on rows {first_row}..{end_row} of a batch: {message}")]
    Inference {
        model: String,
        first_row: usize,
        end_row: usize,
        message: String,
    },

    /// A model produced an output batchinfer cannot turn into an Arrow column.
    #[error("model '{model}', output '{output}': {message}")]
    Output {
        model: String,
        output: String,
        message: String,
    },

    /// A signal stopped the statement; what it wrote was discarded.
    #[error("cancelled by {0}: the statement stopped, and nothing it wrote was kept")]
    Cancelled(&'static str),

    /// The command line or a SQL file was not usable.
    #[error("{0}")]
    Usage(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Arrow(#[from] ArrowError),

    #[error(transparent)]
    ObjectStore(#[from] object_store::Error),

    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error with what was being done and to which path.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl From<Error> for DataFusionError {
    fn from(err: Error) -> Self {
        match err {
            Error::DataFusion(e) => e,
            Error::Arrow(e) => DataFusionError::ArrowError(Box::new(e), None),
            Error::ObjectStore(e) => DataFusionError::ObjectStore(Box::new(e)),
            // Planning-time mistakes read as plan errors, the way DataFusion reports its own.
            e @ (Error::UnknownModel { .. } | Error::Binding { .. }) => {
                DataFusionError::Plan(e.to_string())
            }
            e => DataFusionError::External(Box::new(e)),
        }
    }
}

/// Renders an error for a person: DataFusion wraps errors in layers ("External error: ..."),
/// and the innermost message is the one that says what happened.
pub fn display_error(err: &Error) -> String {
    let message = match err {
        Error::DataFusion(e) => display_datafusion_error(e),
        e => e.to_string(),
    };
    describe_s3_error(&message).unwrap_or(message)
}

/// object_store's S3 errors print the HTTP exchange ("Generic S3 error: Error performing GET
/// http://host/bucket/key in 3ms, after 3 retries ... <Code>NoSuchBucket</Code>..."); a person
/// needs what went wrong and what to do about it.
fn describe_s3_error(message: &str) -> Option<String> {
    let start = [
        "Generic S3 error: ",
        "The operation lacked the necessary privileges",
        "The operation lacked valid authentication credentials",
    ]
    .iter()
    .filter_map(|marker| message.find(marker))
    .min()?;
    let (before, s3) = message.split_at(start);
    let request = s3
        .rsplit_once("Error performing ")
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|u| url::Url::parse(u).ok());
    let endpoint = request
        .as_ref()
        .map(|u| format!(" {}", u.origin().ascii_serialization()))
        .unwrap_or_default();
    let bucket = request
        .as_ref()
        .and_then(|u| u.path_segments()?.next().map(str::to_string))
        .unwrap_or_default();
    let code = s3
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code);
    let what = match code {
        Some(code @ ("SignatureDoesNotMatch" | "InvalidAccessKeyId" | "AccessDenied")) => format!(
            "the S3 server{endpoint} rejected the credentials ({code}): check \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the AWS profile"
        ),
        None if s3.contains("403 Forbidden") || s3.starts_with("The operation lacked") => format!(
            "the S3 server{endpoint} refused access (403): check AWS_ACCESS_KEY_ID and \
             AWS_SECRET_ACCESS_KEY (or the AWS profile), and the bucket's permissions"
        ),
        Some(code @ ("PermanentRedirect" | "AuthorizationHeaderMalformed")) => format!(
            "bucket '{bucket}' is in another region than the one requested ({code}): set \
             AWS_REGION (or 'aws.region') to the bucket's region"
        ),
        Some("NoSuchBucket") => {
            format!("bucket '{bucket}' does not exist on the S3 server{endpoint}")
        }
        _ if ["error sending request", "onnect", "timed out", "dns error"]
            .iter()
            .any(|t| s3.contains(t)) =>
        {
            format!(
                "could not reach the S3 endpoint{endpoint} (no connection within {} s or no \
                 answer within {} s, retried for up to {} s): is the server running, and are \
                 AWS_ENDPOINT_URL / aws.endpoint right?",
                crate::storage::CONNECT_TIMEOUT.as_secs(),
                crate::storage::REQUEST_TIMEOUT.as_secs(),
                crate::storage::RETRY_TIMEOUT.as_secs()
            )
        }
        _ => return None,
    };
    // Keep our own context ("cannot read s3://..."), drop DataFusion's ("IO error: ").
    let context = before
        .trim_end()
        .trim_end_matches("IO error:")
        .trim_end_matches("Object Store error:")
        .trim_end_matches("External error:")
        .trim();
    Some(if context.is_empty() {
        what
    } else {
        format!("{context} {what}")
    })
}

fn display_datafusion_error(err: &DataFusionError) -> String {
    match err {
        DataFusionError::External(inner) => match inner.downcast_ref::<Error>() {
            Some(e) => display_error(e),
            None => match inner.downcast_ref::<DataFusionError>() {
                Some(e) => display_datafusion_error(e),
                None => inner.to_string(),
            },
        },
        DataFusionError::Context(ctx, inner) => {
            format!("{ctx}: {}", display_datafusion_error(inner))
        }
        DataFusionError::Shared(inner) => display_datafusion_error(inner),
        DataFusionError::Diagnostic(_, inner) => display_datafusion_error(inner),
        DataFusionError::Plan(msg) => msg.clone(),
        DataFusionError::ArrowError(e, _) => match e.as_ref() {
            ArrowError::ExternalError(inner) => match inner.downcast_ref::<DataFusionError>() {
                Some(e) => display_datafusion_error(e),
                None => match inner.downcast_ref::<Error>() {
                    Some(e) => display_error(e),
                    None => e.to_string(),
                },
            },
            _ => err.strip_backtrace(),
        },
        _ => err.strip_backtrace(),
    }
}

#[cfg(test)]
mod tests {
    use super::describe_s3_error;

    #[test]
    fn s3_errors_say_what_went_wrong_and_what_to_check() {
        let bucket = "cannot read s3://nb/x.parquet: Generic S3 error: Error performing list request: \
            Error performing GET http://127.0.0.1:9000/nb?list-type=2 in 1ms - Server returned \
            non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>";
        assert_eq!(
            describe_s3_error(bucket).unwrap(),
            "cannot read s3://nb/x.parquet: bucket 'nb' does not exist on the S3 server http://127.0.0.1:9000"
        );
        let region = "Generic S3 error: Error performing GET https://s3.amazonaws.com/far/k in 9ms - \
            Server returned non-2xx status code: 301 Moved Permanently: <Code>PermanentRedirect</Code>";
        assert!(
            describe_s3_error(region)
                .unwrap()
                .contains("set AWS_REGION")
        );
        let denied = "The operation lacked the necessary privileges to complete for path k: Error \
            performing HEAD http://h:1/b/k in 2ms - Server returned non-2xx status code: 403 Forbidden: ";
        assert!(
            describe_s3_error(denied)
                .unwrap()
                .contains("refused access (403)")
        );
        let down = "IO error: Generic S3 error: Error performing POST http://h:1/b/k?uploads= in \
            438ms, after 3 retries, max_retries: 3, retry_timeout: 15s  - HTTP error: error sending request";
        assert!(
            describe_s3_error(down)
                .unwrap()
                .starts_with("could not reach the S3 endpoint http://h:1")
        );
        assert_eq!(describe_s3_error("model 'm' failed on rows 0..3"), None);
    }
}
