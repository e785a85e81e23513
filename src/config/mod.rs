//! Engine configuration: what is fixed when the engine starts ([`EngineConfig`]) and what a query
//! can change with `SET batchinfer.<key> = <value>` ([`BatchInferOptions`]).

use std::path::PathBuf;

mod confine;
pub use confine::url_within;
mod values;

pub use values::*;

use std::any::Any;

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions, Visit,
};
use datafusion::error::DataFusionError;

/// Settings fixed for the life of an engine (one process, or one library `Engine`).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Folder of models: every `NAME.onnx` and `NAME/model.onnx` in it is the model `NAME`.
    pub models_dir: Option<PathBuf>,
    /// DataFusion partitions, which is how many record batches are scored at once (0: cores).
    pub target_partitions: usize,
    /// Model calls that run at once per model, on its one session (0: one per partition).
    pub sessions_per_model: usize,
    /// ONNX Runtime intra-op threads inside each call (0: cores / sessions, at least 1).
    pub intra_threads: usize,
    /// Rows per record batch that DataFusion reads and hands to `predict`.
    pub batch_size: usize,
    /// ONNX Runtime graph optimizations applied when a model is loaded.
    pub optimization: GraphOptimization,
    /// Bytes that DataFusion's buffering operators may hold before they spill (None: no limit).
    pub memory_limit: Option<usize>,
    /// Where model definitions and `CREATE TABLE ... AS` tables persist (None: in memory only).
    pub warehouse: Option<PathBuf>,
    /// A Ballista scheduler (`df://host:port`) to run queries on, instead of this process.
    pub remote: Option<Remote>,
    /// Where models run: the CPU, a CUDA GPU, or `auto`.
    pub device: Target,
}

/// ONNX Runtime's graph optimization levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GraphOptimization {
    /// No graph rewrites.
    Disable,
    /// Constant folding and redundant-node removal.
    Basic,
    /// Basic, plus fusions of common node patterns.
    Extended,
    /// Everything, including layout optimizations (the default).
    #[default]
    All,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            models_dir: None,
            target_partitions: 0,
            sessions_per_model: 0,
            intra_threads: 0,
            batch_size: 8192,
            optimization: GraphOptimization::All,
            memory_limit: None,
            warehouse: None,
            remote: None,
            device: Target::Cpu,
        }
    }
}

impl EngineConfig {
    /// Cores this process may use.
    pub fn cores() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// Partitions DataFusion runs in parallel.
    pub fn partitions(&self) -> usize {
        if self.target_partitions == 0 {
            Self::cores()
        } else {
            self.target_partitions
        }
    }

    /// Calls at once per model: one per partition, so partitions never wait on each other's
    /// model call.
    pub fn sessions(&self) -> usize {
        if self.sessions_per_model == 0 {
            self.partitions()
        } else {
            self.sessions_per_model
        }
    }

    /// Intra-op threads inside each call. Calls x threads never exceed the cores: each partition
    /// already runs on its own core, so by default a call runs on the calling thread.
    pub fn threads_per_session(&self) -> usize {
        if self.intra_threads == 0 {
            (Self::cores() / self.sessions()).max(1)
        } else {
            self.intra_threads
        }
    }
}

/// Options a query can set: `SET batchinfer.batch_size = 1024`.
///
/// Written out rather than with DataFusion's `extensions_options!`, whose entries leave out the
/// `batchinfer.` prefix: Ballista sends a session's options to the scheduler and executors as
/// their entries, and unprefixed keys would not be set there.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchInferOptions {
    /// Most rows per model call (0: the whole record batch in one call).
    pub batch_size: usize,
    /// What a model failure on some rows does: 'fail' the statement, or give those rows 'null'.
    pub on_error: OnError,
    /// What a NULL feeding a float input is to the model: 'null' (the row gets NULL, unscored)
    /// or 'nan'.
    pub nulls: Nulls,
    /// embed: most tokens (rows x padded length) per model call, rows sorted by length (0: no
    /// sorting, calls of 32 rows in the input's order). Unset: 256 on the CPU, 16,384 on a GPU.
    pub token_budget: Option<usize>,
    /// Where models run for this session's queries (unset: the engine's `--device`).
    pub device: Option<Device>,
    /// Local Parquet files are read by batchinfer's streaming reader (page by page, row groups
    /// split across partitions); false: by DataFusion's reader (whole row groups at once).
    pub streaming_scan: bool,
    /// Where rejected rows go (`on_error = 'reject'`): a folder or an object store prefix
    /// (empty: the warehouse's `rejects/`).
    pub rejects: String,
    /// How many failed rows a statement may have before it stops: a count or a share of the rows
    /// scored (unset: no limit).
    pub max_errors: Option<ErrorBudget>,
    /// Materialized views: the most input files a refresh scores between two commits (fewer:
    /// less work lost when a refresh is killed; more: fewer commits).
    pub files_per_commit: usize,
    /// The largest Parquet footer (metadata) read, in bytes: a file claiming more is refused
    /// before anything is allocated for it.
    pub max_footer_bytes: u64,
    /// Endpoint models: the most tokens (prompt and completion) a statement may spend.
    pub max_llm_tokens: Option<u64>,
    /// Endpoint models: the most a statement may cost, at the models' prices.
    pub max_cost: Option<f64>,
    /// Endpoint models' answers kept in the warehouse: 'on', 'read' (not written) or 'off'.
    pub cache: CacheMode,
    /// `read_blob` and `read_text`: the largest file whose content is read, in bytes; a larger
    /// one is refused, named.
    pub max_blob_bytes: u64,
    /// No statement that writes runs (COPY, CREATE, INSERT, DROP, ALTER, VACUUM, OPTIMIZE,
    /// REFRESH, CLEAR LLM CACHE); once on, on for the rest of the session.
    pub read_only: bool,
    /// The local folders statements may read and write, canonical (symbolic links resolved);
    /// unset: any; empty: no local file. A session can only narrow it.
    pub allowed_directories: Option<Vec<String>>,
    /// The object store locations (URL prefixes) statements may read and write; unset: any;
    /// empty: none. A session can only narrow it.
    pub allowed_urls: Option<Vec<String>>,
    /// `VACUUM ... RETAIN n HOURS` under the table's retention (`delta.deletedFileRetentionDuration`,
    /// 7 days) is refused, as Delta does, unless this is false.
    pub vacuum_retention_check: bool,
}

impl Default for BatchInferOptions {
    fn default() -> Self {
        BatchInferOptions {
            batch_size: 0,
            on_error: OnError::Fail,
            nulls: Default::default(),
            token_budget: None,
            device: None,
            streaming_scan: true,
            rejects: String::new(),
            max_errors: None,
            files_per_commit: 64,
            max_footer_bytes: DEFAULT_MAX_FOOTER_BYTES,
            max_llm_tokens: None,
            max_cost: None,
            cache: Default::default(),
            max_blob_bytes: DEFAULT_MAX_BLOB_BYTES,
            read_only: false,
            allowed_directories: None,
            allowed_urls: None,
            vacuum_retention_check: true,
        }
    }
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

    fn set(&mut self, key: &str, value: &str) -> datafusion::error::Result<()> {
        // Every error names the setting, whatever the parser of its type says.
        self.set_value(key, value).map_err(|e| match e {
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
        self.config_entries()
    }
}

impl BatchInferOptions {
    fn set_value(&mut self, key: &str, value: &str) -> datafusion::error::Result<()> {
        match key {
            "batch_size" => self.batch_size.set(key, value),
            "on_error" => self.on_error.set(key, value),
            "nulls" => self.nulls.set(key, value),
            "token_budget" => self.token_budget.set(key, value),
            "device" => {
                self.device = Some(value.parse().map_err(
                    |e: crate::config::values::ValueError| {
                        DataFusionError::Configuration(e.to_string())
                    },
                )?);
                Ok(())
            }
            "streaming_scan" => self.streaming_scan.set(key, value),
            "rejects" => self.rejects.set(key, value),
            "max_errors" => {
                self.max_errors = match value.trim() {
                    "" => None,
                    text => Some(text.parse().map_err(
                        |e: crate::config::values::ValueError| {
                            DataFusionError::Configuration(e.to_string())
                        },
                    )?),
                };
                Ok(())
            }
            "files_per_commit" => {
                self.files_per_commit.set(key, value)?;
                if self.files_per_commit == 0 {
                    self.files_per_commit = 1;
                    return Err(DataFusionError::Configuration(
                        "batchinfer.files_per_commit must be at least 1".into(),
                    ));
                }
                Ok(())
            }
            "max_footer_bytes" => {
                self.max_footer_bytes = parse_size(value)
                    .map_err(|e| DataFusionError::Configuration(e.to_string()))?
                    as u64;
                Ok(())
            }
            "max_llm_tokens" => {
                self.max_llm_tokens = match value.trim() {
                    "" => None,
                    text => Some(text.replace(['_', ','], "").parse().map_err(|_| {
                        DataFusionError::Configuration(format!(
                            "batchinfer.max_llm_tokens must be a whole number of tokens, not '{text}'"
                        ))
                    })?),
                };
                Ok(())
            }
            "max_cost" => {
                self.max_cost = match value.trim() {
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
            }
            "cache" => {
                self.cache = value.parse().map_err(DataFusionError::Configuration)?;
                Ok(())
            }
            "max_blob_bytes" => {
                let bytes = parse_size(value)
                    .map_err(|e| DataFusionError::Configuration(e.to_string()))?
                    as u64;
                if bytes > MAX_BLOB_BYTES {
                    return Err(DataFusionError::Configuration(format!(
                        "batchinfer.max_blob_bytes = '{value}': a file's content is at most \
                         {MAX_BLOB_BYTES} bytes (2 GiB less one byte)"
                    )));
                }
                self.max_blob_bytes = bytes;
                Ok(())
            }
            "vacuum_retention_check" => self.vacuum_retention_check.set(key, value),
            "read_only" => {
                let mut read_only = self.read_only;
                read_only.set(key, value)?;
                if self.read_only && !read_only {
                    return Err(DataFusionError::Configuration(
                        "batchinfer.read_only is on for this session, and stays on".into(),
                    ));
                }
                self.read_only = read_only;
                Ok(())
            }
            "allowed_directories" => {
                let folders = confine::folders(value)?;
                confine::narrower(
                    key,
                    self.allowed_directories.as_deref(),
                    &folders,
                    |a, b| std::path::Path::new(a).starts_with(b),
                )?;
                self.allowed_directories = Some(folders);
                Ok(())
            }
            "allowed_urls" => {
                let prefixes = confine::url_prefixes(value)?;
                confine::narrower(
                    key,
                    self.allowed_urls.as_deref(),
                    &prefixes,
                    confine::url_within,
                )?;
                self.allowed_urls = Some(prefixes);
                Ok(())
            }
            _ => Err(DataFusionError::Configuration(format!(
                "batchinfer.{key} is not an option; the options are batch_size, on_error, \
                 nulls, token_budget, device, streaming_scan, rejects, max_errors, files_per_commit, \
                 max_footer_bytes, max_llm_tokens, max_cost, cache, max_blob_bytes, read_only, \
                 allowed_directories, allowed_urls, vacuum_retention_check"
            ))),
        }
    }

    fn config_entries(&self) -> Vec<ConfigEntry> {
        struct Entries(Vec<ConfigEntry>);
        impl Visit for Entries {
            fn some<V: std::fmt::Display>(
                &mut self,
                key: &str,
                value: V,
                description: &'static str,
            ) {
                self.0.push(ConfigEntry {
                    key: key.to_string(),
                    value: Some(value.to_string()),
                    description,
                });
            }
            fn none(&mut self, key: &str, description: &'static str) {
                self.0.push(ConfigEntry {
                    key: key.to_string(),
                    value: None,
                    description,
                });
            }
        }
        let mut entries = Entries(Vec::new());
        let v = &mut entries;
        self.batch_size.visit(
            v,
            "batchinfer.batch_size",
            "Most rows per model call (0: the whole record batch in one call).",
        );
        self.on_error.visit(
            v,
            "batchinfer.on_error",
            "What a model failure on some rows does: 'fail' the statement, give those rows 'null', or 'reject' them (null, and kept in batchinfer.rejects).",
        );
        self.nulls.visit(
            v,
            "batchinfer.nulls",
            "What a NULL feeding a float input is to the model: 'null' (the row gets NULL, unscored) or 'nan' (for models trained with missing values).",
        );
        self.token_budget.visit(
            v,
            "batchinfer.token_budget",
            "embed: most tokens (rows x padded length) per model call (0: calls of 32 rows, unsorted; unset: 256 on the CPU, 16384 on a GPU).",
        );
        let about = "Where models run: cpu, cuda, cuda:N or auto (unset: the engine's --device).";
        match self.device {
            Some(device) => v.some("batchinfer.device", device, about),
            None => v.none("batchinfer.device", about),
        }
        self.streaming_scan.visit(
            v,
            "batchinfer.streaming_scan",
            "Read local Parquet page by page, row groups split across partitions (false: DataFusion's reader).",
        );
        self.rejects.visit(
            v,
            "batchinfer.rejects",
            "Where rejected rows go with on_error = 'reject': a folder or an object store prefix (empty: the warehouse's rejects/).",
        );
        let about = "How many failed rows a statement may have: a count ('100') or a share of the rows scored ('0.5%'); unset: no limit.";
        match &self.max_errors {
            Some(budget) => v.some("batchinfer.max_errors", budget, about),
            None => v.none("batchinfer.max_errors", about),
        }
        self.files_per_commit.visit(
            v,
            "batchinfer.files_per_commit",
            "Materialized views: the most input files a refresh scores between two commits.",
        );
        self.max_footer_bytes.visit(
            v,
            "batchinfer.max_footer_bytes",
            "The largest Parquet footer (file metadata) read, in bytes ('256M', '1G'): a file claiming more is refused.",
        );
        self.max_blob_bytes.visit(
            v,
            "batchinfer.max_blob_bytes",
            "read_blob and read_text: the largest file whose content is read, in bytes ('64M', '1G'): a larger one is refused.",
        );
        let about = "Endpoint models: the most tokens (prompt and completion) a statement may spend; unset: no limit.";
        match self.max_llm_tokens {
            Some(n) => v.some("batchinfer.max_llm_tokens", n, about),
            None => v.none("batchinfer.max_llm_tokens", about),
        }
        let about = "Endpoint models: the most a statement may cost at the models' prices; unset: no limit.";
        match self.max_cost {
            Some(c) => v.some("batchinfer.max_cost", c, about),
            None => v.none("batchinfer.max_cost", about),
        }
        v.some(
            "batchinfer.cache",
            self.cache,
            "Endpoint models' answers kept in the warehouse by request: 'on', 'read' (read, not written) or 'off'.",
        );
        self.vacuum_retention_check.visit(
            v,
            "batchinfer.vacuum_retention_check",
            "VACUUM ... RETAIN n HOURS under the table's retention (delta.deletedFileRetentionDuration, 7 days) is refused unless false.",
        );
        self.read_only.visit(
            v,
            "batchinfer.read_only",
            "No statement that writes (COPY, CREATE, INSERT, DROP, ALTER, VACUUM, OPTIMIZE, REFRESH); once true, true for the session.",
        );
        let about = "The local folders statements may read and write, comma-separated (unset: any; empty: no local file); a session can only narrow it.";
        match &self.allowed_directories {
            Some(folders) => v.some("batchinfer.allowed_directories", folders.join(","), about),
            None => v.none("batchinfer.allowed_directories", about),
        }
        let about = "The object store locations (URL prefixes, comma-separated) statements may read and write (unset: any; empty: none); a session can only narrow it.";
        match &self.allowed_urls {
            Some(prefixes) => v.some("batchinfer.allowed_urls", prefixes.join(","), about),
            None => v.none("batchinfer.allowed_urls", about),
        }
        entries.0
    }
}

impl ConfigExtension for BatchInferOptions {
    const PREFIX: &'static str = "batchinfer";
}
