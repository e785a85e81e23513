//! The values of settings: where models run ([`Device`], [`Target`]), a cluster's scheduler
//! ([`Remote`]), what a NULL is to a model ([`Nulls`]), what a failed row gets ([`OnError`]), how
//! many rows may fail ([`ErrorBudget`]) and sizes ([`parse_size`]). Plain values, parsed and printed here; what acts on them is in the
//! modules that use them.

use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigField, Visit};
use datafusion::error::DataFusionError;

/// A setting's value that does not parse, and what was expected instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    #[error("device '{0}': expected cpu, cuda, cuda:N (N = 0, 1, ...) or auto")]
    Device(String),
    #[error("'{0}' is not a scheduler address: expected df://HOST:PORT")]
    Remote(String),
    #[error(
        "batchinfer.max_errors '{0}': expected a count of rows ('100') or a share of the rows \
         scored ('0.5%')"
    )]
    ErrorBudget(String),
    #[error("batchinfer.cache must be 'on', 'read' or 'off', not '{0}'")]
    Cache(String),
    #[error("'{0}' is not a size: use a number with K, M, G or T")]
    NotASize(String),
    #[error("'{0}' is not a positive size")]
    NotPositive(String),
    #[error("'{0}' is less than one byte")]
    UnderOneByte(String),
    #[error("'{0}' is more memory than any machine has (at most {most_tib}T)", most_tib = MAX_SIZE >> 40)]
    MoreThanAnyMachine(String),
}

/// The device asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    #[default]
    Cpu,
    /// The NVIDIA GPU with this number (as `nvidia-smi` counts them).
    Cuda(u32),
    /// CUDA (GPU 0) where available, else the CPU.
    Auto,
}

impl FromStr for Device {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, ValueError> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "cpu" => Ok(Device::Cpu),
            "auto" => Ok(Device::Auto),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => t
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| ValueError::Device(s.to_string())),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Auto => write!(f, "auto"),
        }
    }
}

/// Where models run, `auto` decided: the one value every question about the device is asked of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Target {
    #[default]
    Cpu,
    /// The NVIDIA GPU with this number.
    Cuda(u32),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Cpu => write!(f, "cpu"),
            Target::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A cluster's scheduler: `df://host:port` (or `host:port`; the port defaults to 50050).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    host: String,
    port: u16,
}

impl FromStr for Remote {
    type Err = ValueError;

    fn from_str(text: &str) -> std::result::Result<Self, ValueError> {
        let address = text
            .strip_prefix("df://")
            .unwrap_or(text)
            .trim_end_matches('/');
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) => (host, port.parse::<u16>().ok()),
            None => (address, Some(50050)),
        };
        match port {
            Some(port) if !host.is_empty() => Ok(Remote {
                host: host.to_string(),
                port,
            }),
            _ => Err(ValueError::Remote(text.to_string())),
        }
    }
}

impl fmt::Display for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "df://{}:{}", self.host, self.port)
    }
}

impl Remote {
    /// The scheduler's gRPC address, as Ballista's client wants it.
    pub fn grpc_url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

/// `SET batchinfer.nulls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nulls {
    /// A row with a NULL feature gets a NULL result (the default).
    #[default]
    Null,
    /// A NULL feeding a float input is NaN to the model.
    Nan,
}

impl std::fmt::Display for Nulls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Nulls::Null => "null",
            Nulls::Nan => "nan",
        })
    }
}

impl ConfigField for Nulls {
    fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
        v.some(key, self, description)
    }

    fn set(&mut self, _key: &str, value: &str) -> datafusion::error::Result<()> {
        *self = match value.trim().to_ascii_lowercase().as_str() {
            "null" => Nulls::Null,
            "nan" => Nulls::Nan,
            other => {
                return Err(DataFusionError::Configuration(format!(
                    "batchinfer.nulls must be 'null' (a row with a NULL feature gets NULL) or \
                     'nan' (a NULL feeding a float input is NaN), not '{other}'"
                )));
            }
        };
        Ok(())
    }

    fn reset(&mut self, _key: &str) -> datafusion::error::Result<()> {
        *self = Nulls::Null;
        Ok(())
    }
}

/// How many failed rows a statement may have: `'100'` (a count) or `'0.5%'` (a share of the rows
/// scored, checked once at least [`SHARE_AFTER`] rows were).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ErrorBudget {
    Count(u64),
    /// A fraction, 0 to 1.
    Share(f64),
}

/// Rows scored before a share budget is checked: the first failures of a statement say little
/// about its share.
pub const SHARE_AFTER: u64 = 1_000;

impl FromStr for ErrorBudget {
    type Err = ValueError;

    fn from_str(text: &str) -> std::result::Result<Self, ValueError> {
        let text = text.trim();
        let bad = || ValueError::ErrorBudget(text.to_string());
        match text.strip_suffix('%') {
            Some(percent) => {
                let p: f64 = percent.trim().parse().map_err(|_| bad())?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(bad());
                }
                Ok(ErrorBudget::Share(p / 100.0))
            }
            None => text.parse().map(ErrorBudget::Count).map_err(|_| bad()),
        }
    }
}

impl fmt::Display for ErrorBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorBudget::Count(n) => write!(f, "{n}"),
            // As written, without the float's noise (0.9, not 0.9000000000000001).
            ErrorBudget::Share(share) => write!(f, "{}%", (share * 100.0 * 1e9).round() / 1e9),
        }
    }
}

impl ErrorBudget {
    /// Whether `failed` of `scored` rows is past the budget.
    pub fn exceeded(self, scored: u64, failed: u64) -> bool {
        match self {
            ErrorBudget::Count(n) => failed > n,
            ErrorBudget::Share(share) => {
                scored >= SHARE_AFTER && failed as f64 > share * scored as f64
            }
        }
    }
}

/// The default of `batchinfer.max_footer_bytes`: well above the metadata of very wide tables
/// with thousands of row groups.
pub const DEFAULT_MAX_FOOTER_BYTES: u64 = 256 << 20;

/// The largest file `read_blob` reads unless told otherwise.
pub const DEFAULT_MAX_BLOB_BYTES: u64 = 1 << 30;

/// The largest file `read_blob` can read: one value of a binary column.
pub const MAX_BLOB_BYTES: u64 = (2 << 30) - 1;

/// Parses a size such as `512M`, `2G`, `1.5g`, `100000` (bytes; K, M, G, T are powers of 1024).
pub fn parse_size(text: &str) -> Result<usize, ValueError> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches(['B', 'I'])
    {
        "" => 1.0,
        "K" => 1024.0,
        "M" => 1024.0 * 1024.0,
        "G" => 1024.0 * 1024.0 * 1024.0,
        "T" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(ValueError::NotASize(text.to_string()));
        }
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| ValueError::NotASize(text.to_string()))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(ValueError::NotPositive(text.to_string()));
    }
    let bytes = value * scale;
    if bytes < 1.0 {
        return Err(ValueError::UnderOneByte(text.to_string()));
    }
    if bytes > MAX_SIZE as f64 {
        return Err(ValueError::MoreThanAnyMachine(text.to_string()));
    }
    Ok(bytes as usize)
}

/// The largest size [`parse_size`] accepts: 1 PiB.
const MAX_SIZE: usize = 1 << 50;

/// `SET batchinfer.on_error = 'fail' | 'null' | 'reject'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// A model call that fails fails the statement (the default).
    #[default]
    Fail,
    /// The rows the model fails on are isolated (by bisecting the call) and get NULL; the
    /// statement goes on and the count of such rows is reported when it ends.
    Null,
    /// As `Null`, and each such row is kept in the rejects (`batchinfer.rejects`): its inputs,
    /// the model and the model's message.
    Reject,
}

impl std::fmt::Display for OnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnError::Fail => "fail",
            OnError::Null => "null",
            OnError::Reject => "reject",
        })
    }
}

impl ConfigField for OnError {
    fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
        v.some(key, self, description)
    }

    fn set(&mut self, _key: &str, value: &str) -> datafusion::error::Result<()> {
        *self = match value.trim().to_ascii_lowercase().as_str() {
            "fail" => OnError::Fail,
            "null" => OnError::Null,
            "reject" => OnError::Reject,
            other => {
                return Err(DataFusionError::Configuration(format!(
                    "batchinfer.on_error must be 'fail', 'null' or 'reject', not '{other}'"
                )));
            }
        };
        Ok(())
    }

    fn reset(&mut self, _key: &str) -> datafusion::error::Result<()> {
        *self = OnError::Fail;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert!(parse_size("0.1").is_err());
        assert_eq!(parse_size("1024T"), Ok(1 << 50));
    }
}

/// `SET batchinfer.cache = 'on' | 'read' | 'off'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// Answers are read from the cache and new ones kept (the default).
    #[default]
    On,
    /// Answers are read from the cache; new ones are not kept.
    Read,
    /// The cache is neither read nor written.
    Off,
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheMode::On => "on",
            CacheMode::Read => "read",
            CacheMode::Off => "off",
        })
    }
}

impl std::str::FromStr for CacheMode {
    type Err = ValueError;

    fn from_str(value: &str) -> Result<Self, ValueError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "on" | "true" => Ok(CacheMode::On),
            "read" => Ok(CacheMode::Read),
            "off" | "false" => Ok(CacheMode::Off),
            other => Err(ValueError::Cache(other.to_string())),
        }
    }
}

/// Whether `name` can name a model: letters, digits, `_`, `-`, `@` and `.` (a version or
/// alias), nothing else.
pub fn is_model_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || "_-@.".contains(c))
}
