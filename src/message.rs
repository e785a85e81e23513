//! An error as a person reads it: DataFusion wraps errors in layers ("External error: ...", "IO
//! error: ..."), and the innermost one says what happened; an object store's error gets what
//! to check ([`crate::storage::hints`]).

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

use crate::error::Error;
use crate::storage::hints;

/// The error for a person: the innermost message, with an object store's hint.
pub fn display_error(err: &Error) -> String {
    // Whatever part of a message quotes a URL the user gave, its password is not shown.
    crate::storage::blank_passwords(&match err {
        Error::DataFusion(e) => display_datafusion_error(e),
        Error::ObjectStore(e) => hints::describe(e).unwrap_or_else(|| e.to_string()),
        e => e.to_string(),
    })
}

fn display_external(inner: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    if let Some(e) = inner.downcast_ref::<Error>() {
        return display_error(e);
    }
    if let Some(e) = inner.downcast_ref::<DataFusionError>() {
        return display_datafusion_error(e);
    }
    hints::describe(inner).unwrap_or_else(|| inner.to_string())
}

fn display_datafusion_error(err: &DataFusionError) -> String {
    match err {
        DataFusionError::External(inner) => display_external(inner.as_ref()),
        DataFusionError::ObjectStore(e) => {
            hints::describe(e.as_ref()).unwrap_or_else(|| e.to_string())
        }
        DataFusionError::Context(ctx, inner) => {
            format!("{ctx}: {}", display_datafusion_error(inner))
        }
        DataFusionError::Shared(inner) => display_datafusion_error(inner),
        DataFusionError::Diagnostic(_, inner) => display_datafusion_error(inner),
        DataFusionError::Plan(msg) => msg.clone(),
        DataFusionError::ArrowError(e, _) => match e.as_ref() {
            ArrowError::ExternalError(inner) => display_external(inner.as_ref()),
            _ => err.strip_backtrace(),
        },
        DataFusionError::IoError(e) => hints::describe(e).unwrap_or_else(|| err.strip_backtrace()),
        _ => err.strip_backtrace(),
    }
}

/// Where what the engine says as it works goes (a model created, a view refreshed, a warning):
/// standard error, unless [`say_to`] named a function (Python's `sys.stderr`, which a notebook
/// shows).
/// Per process: the process's standard error (or Python's `sys.stderr`) is one.
static SAY_TO: parking_lot::RwLock<Option<Sayer>> = parking_lot::RwLock::new(None);

/// A function that takes each line the engine says.
pub type Sayer = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// Sends what the engine says to `sayer`, for the rest of the process.
pub fn say_to(sayer: Sayer) {
    *SAY_TO.write() = Some(sayer);
}

/// Says `line` where [`say_to`] sent the engine's lines (standard error by default).
pub fn say(line: &str) {
    let sayer = SAY_TO.read().clone();
    match sayer {
        Some(sayer) => sayer(line),
        None => eprintln!("{line}"),
    }
}

/// `eprintln!` for what the engine says: through [`say`].
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::message::say(&format!($($arg)*))
    };
}

/// Warnings said once each on standard error (a table that cannot be read is named at the
/// first statement that meets it, not at every one).
#[derive(Debug, Default)]
pub struct Warnings(parking_lot::Mutex<std::collections::BTreeSet<String>>);

impl Warnings {
    /// Says `warning` on standard error, unless it was said before.
    pub fn say_once(&self, warning: String) {
        let mut said = self.0.lock();
        if said.insert(warning.clone()) {
            crate::say!("warning: {warning}");
        }
    }
}

/// An error's text with what it says under it (its sources), each said once: some libraries'
/// own text stops at "error sending request" or "db error", and the reason is a source of theirs.
pub fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// 10000 as "10,000".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
