//! The settings a session changes with `SET batchinfer.NAME = 'value'`, each declared once below:
//! its name, type, default, what it does, the values it takes and how a session may change it.
//! [`BatchInferOptions`] (the values, one field each), `SET`, `SHOW ALL`, the shell's `\h set`,
//! the server's refusals and docs/settings.md are all made from that one declaration.

use std::any::Any;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions};
use datafusion::error::{DataFusionError, Result};

use super::confine;
use super::values::*;

/// How a session may change a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// To any value it takes.
    Any,
    /// Only on: once true, true for the rest of the session.
    OnlyOn,
    /// Only narrower: to a part of what it is, never more.
    OnlyNarrower,
    /// Not by a client of `batchinfer serve`, where it is the server's, for every session (set
    /// by the server's command line).
    NotUnderServe,
}

#[cfg(test)]
impl Change {
    fn described(self) -> &'static str {
        match self {
            Change::Any => "any",
            Change::OnlyOn => "only on",
            Change::OnlyNarrower => "only narrower",
            Change::NotUnderServe => "not under serve",
        }
    }
}

/// One setting: what `SET`, `SHOW ALL` and the documents know of it.
pub struct Setting {
    /// Its name after `batchinfer.`.
    pub name: &'static str,
    /// The values it takes, as one writes them.
    pub takes: &'static str,
    doc: &'static str,
    /// What `SHOW ALL` says of it: what it does and the values it takes.
    described: &'static str,
    /// How a session may change it.
    pub change: Change,
    set: fn(&mut BatchInferOptions, &str) -> Result<()>,
    show: fn(&BatchInferOptions) -> Option<String>,
}

impl Setting {
    /// `batchinfer.NAME`.
    pub fn key(&self) -> String {
        format!("batchinfer.{}", self.name)
    }

    /// What it does, on one line.
    pub fn doc(&self) -> &'static str {
        self.doc.trim()
    }

    /// Its default as `SHOW` prints it (None: unset).
    pub fn default_shown(&self) -> Option<String> {
        (self.show)(&BatchInferOptions::default())
    }
}

/// Declares the settings: the struct of their values, its defaults, and [`SETTINGS`].
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident: $ty:ty = $default:expr, takes $takes:literal, change $change:ident
            $(, set $set:expr)?;
    )*) => {
        /// The values of a session's settings (`SET batchinfer.batch_size = 1024`).
        ///
        /// Written out rather than with DataFusion's `extensions_options!`, whose entries leave
        /// out the `batchinfer.` prefix: Ballista sends a session's options to the scheduler and
        /// executors as their entries, and unprefixed keys would not be set there.
        #[derive(Debug, Clone, PartialEq)]
        pub struct BatchInferOptions {
            $( $(#[doc = $doc])+ pub $name: $ty, )*
        }

        impl Default for BatchInferOptions {
            fn default() -> Self {
                BatchInferOptions { $( $name: $default, )* }
            }
        }

        /// Every setting, in the order `SHOW ALL` lists them.
        pub static SETTINGS: &[Setting] = &[$(
            Setting {
                name: stringify!($name),
                takes: $takes,
                doc: concat!($($doc),+),
                described: concat!($($doc),+, " Takes ", $takes, "."),
                change: Change::$change,
                set: settings!(@set $name $($set)?),
                show: |options| Shown::shown(&options.$name),
            },
        )*];
    };
    (@set $name:ident) => {
        |options, value| ConfigField::set(&mut options.$name, stringify!($name), value)
    };
    (@set $name:ident $set:expr) => {
        $set
    };
}

settings! {
    /// Most rows per model call (0: the whole record batch in one call).
    batch_size: usize = 0, takes "a count", change Any;
    /// What a model failure on some rows does: 'fail' the statement, give those rows 'null', or
    /// 'reject' them (null, and kept in batchinfer.rejects).
    on_error: OnError = OnError::Fail, takes "'fail', 'null' or 'reject'", change Any;
    /// What a NULL feeding a float input is to the model: 'null' (the row gets NULL, unscored) or
    /// 'nan' (for models trained with missing values).
    nulls: Nulls = Nulls::Null, takes "'null' or 'nan'", change Any;
    /// embed: most tokens (rows x padded length) per model call, rows sorted by length (0: calls
    /// of 32 rows, unsorted; unset: 256 on the CPU, 16384 on a GPU).
    token_budget: Option<usize> = None, takes "a count ('' unsets it)", change Any,
        set |options, value| {
            options.token_budget = tokens("token_budget", value)?;
            Ok(())
        };
    /// Where models run for the session's statements (unset: the engine's --device).
    device: Option<Device> = None, takes "cpu, cuda, cuda:N or auto ('' unsets it)",
        change NotUnderServe,
        set |options, value| {
            options.device = match value.trim() {
                "" => None,
                text => Some(text.parse().map_err(value_error)?),
            };
            Ok(())
        };
    /// Read local Parquet page by page, row groups split across partitions (false: DataFusion's
    /// reader, whole row groups at once).
    streaming_scan: bool = true, takes "true or false", change Any;
    /// Where rejected rows go with on_error = 'reject': a folder or an object store prefix
    /// (empty: the warehouse's rejects/).
    rejects: String = String::new(), takes "a folder or URL", change Any;
    /// How many failed rows a statement may have before it stops: a count ('100') or a share of
    /// the rows scored ('0.5%'); unset: no limit.
    max_errors: Option<ErrorBudget> = None, takes "a count or a share ('0.5%'; '' unsets it)",
        change Any,
        set |options, value| {
            options.max_errors = match value.trim() {
                "" => None,
                text => Some(text.parse().map_err(value_error)?),
            };
            Ok(())
        };
    /// Materialized views: the most input files a refresh scores between two commits (fewer:
    /// less work lost when a refresh is killed; more: fewer commits).
    files_per_commit: usize = 64, takes "a count, at least 1", change Any,
        set |options, value| {
            let mut files = options.files_per_commit;
            files.set("files_per_commit", value)?;
            if files == 0 {
                return Err(DataFusionError::Configuration(
                    "batchinfer.files_per_commit must be at least 1".into(),
                ));
            }
            options.files_per_commit = files;
            Ok(())
        };
    /// The largest Parquet footer (file metadata) read, in bytes: a file claiming more is
    /// refused before anything is allocated for it.
    max_footer_bytes: u64 = DEFAULT_MAX_FOOTER_BYTES, takes "a size ('256M', '1G')",
        change Any,
        set |options, value| {
            options.max_footer_bytes = parse_size(value).map_err(value_error)? as u64;
            Ok(())
        };
    /// read_blob and read_text: the largest file whose content is read, in bytes: a larger one
    /// is refused, named.
    max_blob_bytes: u64 = DEFAULT_MAX_BLOB_BYTES, takes "a size ('64M'), under 2G",
        change Any,
        set |options, value| {
            let bytes = parse_size(value).map_err(value_error)? as u64;
            if bytes > MAX_BLOB_BYTES {
                return Err(DataFusionError::Configuration(format!(
                    "batchinfer.max_blob_bytes = '{value}': a file's content is at most \
                     {MAX_BLOB_BYTES} bytes (2 GiB less one byte)"
                )));
            }
            options.max_blob_bytes = bytes;
            Ok(())
        };
    /// Endpoint models: the most tokens (prompt and completion) a statement may spend; unset: no
    /// limit.
    max_llm_tokens: Option<u64> = None, takes "a count ('100_000'; '' unsets it)", change Any,
        set |options, value| {
            options.max_llm_tokens = tokens("max_llm_tokens", value)?;
            Ok(())
        };
    /// Endpoint models: the most a statement may cost, at the models' prices (their batch prices
    /// in batch mode); unset: no limit.
    /// A statement whose estimate is over it (each reply at max_tokens) is refused before it
    /// sends anything, and one that reaches it while it runs stops.
    max_cost: Option<f64> = None, takes "an amount ('2.50'; '' unsets it)", change Any,
        set |options, value| {
            options.max_cost = match value.trim() {
                "" => None,
                text => Some(
                    text.trim_start_matches('$')
                        .parse::<f64>()
                        .ok()
                        .filter(|c| c.is_finite() && *c >= 0.0)
                        .ok_or_else(|| {
                            DataFusionError::Configuration(format!(
                                "batchinfer.max_cost must be an amount of at least 0 (as \
                                 '2.50'), not '{text}'"
                            ))
                        })?,
                ),
            };
            Ok(())
        };
    /// Endpoint models' answers kept in the warehouse by request: 'on', 'read' (read, not
    /// written) or 'off'.
    cache: CacheMode = CacheMode::On, takes "'on', 'read' or 'off'", change Any,
        set |options, value| {
            options.cache = value.parse().map_err(value_error)?;
            Ok(())
        };
    /// ai_filter and ai_classify: the local text model that answers the rows it is sure of
    /// before the endpoint is asked (a cascade), instead of the endpoint model's 'proxy'; 'none'
    /// sends every row; unset: the model's own.
    llm_proxy: Option<String> = None, takes "a local text model's name, or 'none' ('' unsets it)",
        change Any,
        set |options, value| {
            let name = value.trim();
            if !name.is_empty() && !is_model_name(name) {
                return Err(DataFusionError::Configuration(format!(
                    "batchinfer.llm_proxy must name a model (letters, digits, _ - @ .), or be \
                     'none', not '{name}'"
                )));
            }
            options.llm_proxy = (!name.is_empty()).then(|| name.to_string());
            Ok(())
        };
    /// A cascade's target: the least rate at which its proxy's answers agree with the endpoint
    /// model's, over 0.5 and under 1; unset: the model's 'target' (0.9 where it sets none).
    llm_proxy_target: Option<f64> = None, takes "a rate over 0.5 and under 1 ('' unsets it)",
        change Any,
        set |options, value| {
            options.llm_proxy_target = match value.trim() {
                "" => None,
                text => Some(
                    text.parse::<f64>()
                        .ok()
                        .filter(|t| *t > 0.5 && *t < 1.0)
                        .ok_or_else(|| {
                            DataFusionError::Configuration(format!(
                                "batchinfer.llm_proxy_target must be a rate over 0.5 and under \
                                 1 (as '0.95'), not '{text}'"
                            ))
                        })?,
                ),
            };
            Ok(())
        };
    /// Endpoint models: 'on' sends a chat model's requests to the provider's Batch API at its
    /// batch price, 'off' one request each; unset: the model's 'batch'.
    llm_batch: Option<bool> = None, takes "'on' or 'off' ('' unsets it)", change Any,
        set |options, value| {
            options.llm_batch = match value.trim().to_ascii_lowercase().as_str() {
                "" => None,
                "on" | "true" => Some(true),
                "off" | "false" => Some(false),
                other => {
                    return Err(DataFusionError::Configuration(format!(
                        "batchinfer.llm_batch must be 'on' or 'off', not '{other}'"
                    )));
                }
            };
            Ok(())
        };
    /// Batch mode: the longest a statement waits for its batches, in seconds; past it, it
    /// stops and writes nothing, and its batches go on (the statement run again takes their
    /// answers); unset: until they end.
    llm_batch_wait: Option<f64> = None, takes "a duration ('0s', '10m', '2h'; '' unsets it)",
        change Any,
        set |options, value| {
            options.llm_batch_wait = match value.trim() {
                "" => None,
                text => {
                    let written = if text.chars().all(|c| c.is_ascii_digit()) {
                        format!("{text}s")
                    } else {
                        text.to_string()
                    };
                    Some(
                        humantime::parse_duration(&written)
                            .map_err(|e| {
                                DataFusionError::Configuration(format!(
                                    "batchinfer.llm_batch_wait must be a duration (as '10m'), \
                                     not '{text}': {e}"
                                ))
                            })?
                            .as_secs_f64(),
                    )
                }
            };
            Ok(())
        };
    /// VACUUM ... RETAIN n HOURS under the table's retention (delta.deletedFileRetentionDuration,
    /// 7 days) is refused, as Delta refuses it, unless this is false.
    vacuum_retention_check: bool = true, takes "true or false", change Any;
    /// No statement that writes runs (COPY, CREATE, INSERT, DROP, ALTER, VACUUM, OPTIMIZE,
    /// REFRESH, CLEAR LLM CACHE); once true, true for the rest of the session.
    read_only: bool = false, takes "true or false", change OnlyOn,
        set |options, value| {
            let mut read_only = options.read_only;
            read_only.set("read_only", value)?;
            if options.read_only && !read_only {
                return Err(DataFusionError::Configuration(
                    "batchinfer.read_only is on for this session, and stays on".into(),
                ));
            }
            options.read_only = read_only;
            Ok(())
        };
    /// The local folders statements may read and write, canonical (symbolic links resolved);
    /// unset: any; empty: no local file. A session can only narrow it.
    allowed_directories: Option<Vec<String>> = None, takes "folders, comma-separated",
        change OnlyNarrower,
        set |options, value| {
            let folders = confine::folders(value)?;
            confine::narrower(
                "allowed_directories",
                options.allowed_directories.as_deref(),
                &folders,
                |a, b| std::path::Path::new(a).starts_with(b),
            )?;
            options.allowed_directories = Some(folders);
            Ok(())
        };
    /// The object store locations (URL prefixes) statements may read and write; unset: any;
    /// empty: none. A session can only narrow it.
    allowed_urls: Option<Vec<String>> = None, takes "URL prefixes, comma-separated",
        change OnlyNarrower,
        set |options, value| {
            let prefixes = confine::url_prefixes(value)?;
            confine::narrower(
                "allowed_urls",
                options.allowed_urls.as_deref(),
                &prefixes,
                confine::url_within,
            )?;
            options.allowed_urls = Some(prefixes);
            Ok(())
        };
}

/// A whole number of tokens as one writes it ('100_000', '100,000'); None for ''.
fn tokens<T: std::str::FromStr>(name: &str, value: &str) -> Result<Option<T>> {
    match value.trim() {
        "" => Ok(None),
        text => text.replace(['_', ','], "").parse().map(Some).map_err(|_| {
            DataFusionError::Configuration(format!(
                "batchinfer.{name} must be a whole number of tokens, not '{text}'"
            ))
        }),
    }
}

fn value_error(e: ValueError) -> DataFusionError {
    DataFusionError::Configuration(e.to_string())
}

/// A setting's value as `SHOW` prints it (None: unset).
trait Shown {
    fn shown(&self) -> Option<String>;
}

macro_rules! shown_as_displayed {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}

shown_as_displayed!(
    usize,
    u64,
    f64,
    bool,
    String,
    OnError,
    Nulls,
    CacheMode,
    Device,
    ErrorBudget
);

impl<T: Shown> Shown for Option<T> {
    fn shown(&self) -> Option<String> {
        self.as_ref().and_then(Shown::shown)
    }
}

impl Shown for Vec<String> {
    fn shown(&self) -> Option<String> {
        Some(self.join(","))
    }
}

/// The setting named `batchinfer.NAME` (or `NAME`), in any case.
pub fn setting(name: &str) -> Option<&'static Setting> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("batchinfer.").unwrap_or(&name);
    SETTINGS.iter().find(|s| s.name == name)
}

/// The names of the settings, comma-separated, for messages and help.
pub fn names() -> String {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl ExtensionOptions for BatchInferOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let Some(setting) = SETTINGS.iter().find(|s| s.name == key) else {
            return Err(DataFusionError::Configuration(format!(
                "batchinfer.{key} is not an option; the options are {}",
                names()
            )));
        };
        // Every error names the setting, whatever the parser of its type says.
        (setting.set)(self, value).map_err(|e| match e {
            DataFusionError::Configuration(m) if m.contains(&format!("batchinfer.{key}")) => {
                DataFusionError::Configuration(m)
            }
            e => DataFusionError::Configuration(format!(
                "batchinfer.{key} = '{value}': {}",
                e.message()
            )),
        })
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        SETTINGS
            .iter()
            .map(|s| ConfigEntry {
                key: s.key(),
                value: (s.show)(self),
                description: s.described.trim(),
            })
            .collect()
    }
}

impl ConfigExtension for BatchInferOptions {
    const PREFIX: &'static str = "batchinfer";
}

/// The settings as a Markdown table: docs/settings.md holds it between its two markers.
#[cfg(test)]
fn markdown_table() -> String {
    let mut text = String::from(
        "| setting | takes | default | a session may change it | what it does |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for s in SETTINGS {
        let default = match s.default_shown() {
            Some(v) if v.is_empty() => "empty".to_string(),
            Some(v) => format!("`{v}`"),
            None => "unset".to_string(),
        };
        text.push_str(&format!(
            "| `batchinfer.{}` | {} | {} | {} | {} |\n",
            s.name,
            s.takes,
            default,
            s.change.described(),
            s.doc().split_whitespace().collect::<Vec<_>>().join(" ")
        ));
    }
    text
}

/// `\h set`: every setting, one line each.
pub fn help() -> String {
    let mut text = String::from(
        "SET batchinfer.NAME = 'value': a setting of this session (SHOW ALL lists them with their \
         values; docs/settings.md has more):\n",
    );
    for s in SETTINGS {
        text.push_str(&format!("  {}: {}\n", s.name, s.takes));
    }
    text.pop();
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEGIN: &str = "<!-- settings: made from src/config/settings.rs -->\n";
    const END: &str = "<!-- end of settings -->";

    /// docs/settings.md lists the settings as they are declared; `BATCHINFER_WRITE_DOCS=1 cargo
    /// test -p batchinfer --lib settings` rewrites its table.
    #[test]
    fn docs_settings_md_is_made_from_the_declarations() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/settings.md");
        let page = std::fs::read_to_string(&path).unwrap();
        let (before, rest) = page.split_once(BEGIN).expect("the opening marker");
        let (table, after) = rest.split_once(END).expect("the closing marker");
        let made = markdown_table();
        if std::env::var_os("BATCHINFER_WRITE_DOCS").is_some() {
            std::fs::write(&path, format!("{before}{BEGIN}{made}{END}{after}")).unwrap();
            return;
        }
        assert_eq!(
            table, made,
            "docs/settings.md is not the settings declared in src/config/settings.rs: \
             BATCHINFER_WRITE_DOCS=1 cargo test -p batchinfer --lib settings rewrites it"
        );
    }

    #[test]
    fn every_setting_is_shown_and_set_back_to_its_default() {
        let defaults = BatchInferOptions::default();
        let entries = defaults.entries();
        assert_eq!(entries.len(), SETTINGS.len());
        for (entry, s) in entries.iter().zip(SETTINGS) {
            assert_eq!(entry.key, s.key());
            assert!(!entry.description.is_empty(), "{}", s.name);
            // Setting a setting to its shown default leaves the defaults as they are.
            if let Some(value) = &entry.value {
                let mut options = BatchInferOptions::default();
                options
                    .set(s.name, value)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.name));
                assert_eq!(options, defaults, "{}", s.name);
            }
            // An unset setting is unset again with '' (but for the places a session may touch,
            // which only narrow: '' is none of them).
            if entry.value.is_none() && s.change != Change::OnlyNarrower {
                let mut options = BatchInferOptions::default();
                options
                    .set(s.name, "")
                    .unwrap_or_else(|e| panic!("{}: {e}", s.name));
                assert_eq!(options, defaults, "{}", s.name);
            }
            // A value refused leaves the setting as it was.
            let mut options = BatchInferOptions::default();
            if let Err(e) = options.set(s.name, "-1x") {
                assert!(e.to_string().contains(&s.key()), "{e}");
                assert_eq!(options, defaults, "{}", s.name);
            }
        }
    }

    #[test]
    fn an_unknown_setting_names_every_setting() {
        let e = BatchInferOptions::default()
            .set("batch_sise", "1")
            .unwrap_err()
            .to_string();
        for s in SETTINGS {
            assert!(e.contains(s.name), "{e}");
        }
        assert!(setting("BatchInfer.Max_Errors").is_some());
        assert!(setting("nothing").is_none());
    }
}
