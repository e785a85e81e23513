//! Engine configuration: what is fixed when the engine starts ([`EngineConfig`]) and what a session
//! can change with `SET batchinfer.<key> = <value>` ([`BatchInferOptions`], each setting declared
//! once in settings.rs).

use std::path::PathBuf;

mod confine;
pub use confine::url_within;
mod settings;
pub use settings::{BatchInferOptions, Change, SETTINGS, Setting, help as settings_help, setting};
mod values;

pub use values::*;

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
