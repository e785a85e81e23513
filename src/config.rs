//! Engine configuration: what is fixed when the engine starts ([`EngineConfig`]) and what a query
//! can change with `SET batchinfer.<key> = <value>` ([`BatchInferOptions`]).

use std::path::PathBuf;

use datafusion::common::config::ConfigExtension;
use datafusion::common::extensions_options;

/// Settings fixed for the life of an engine (one process, or one library `Engine`).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Folder of models: every `NAME.onnx` and `NAME/model.onnx` in it is the model `NAME`.
    pub models_dir: Option<PathBuf>,
    /// DataFusion partitions, which is how many record batches are scored at once (0: cores).
    pub target_partitions: usize,
    /// ONNX Runtime sessions per model (0: one per partition).
    pub sessions_per_model: usize,
    /// ONNX Runtime intra-op threads per session (0: cores / sessions, at least 1).
    pub intra_threads: usize,
    /// Rows per record batch that DataFusion reads and hands to `predict`.
    pub batch_size: usize,
    /// ONNX Runtime graph optimizations applied when a model is loaded.
    pub optimization: GraphOptimization,
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

    /// Sessions per model: one per partition, so partitions never wait on each other's model call.
    pub fn sessions(&self) -> usize {
        if self.sessions_per_model == 0 {
            self.partitions()
        } else {
            self.sessions_per_model
        }
    }

    /// Intra-op threads per session. Partitions x sessions' threads never exceed the cores: each
    /// partition already runs on its own core, so by default a session runs on the calling thread.
    pub fn threads_per_session(&self) -> usize {
        if self.intra_threads == 0 {
            (Self::cores() / self.sessions()).max(1)
        } else {
            self.intra_threads
        }
    }
}

extensions_options! {
    /// Options a query can set: `SET batchinfer.batch_size = 1024`.
    pub struct BatchInferOptions {
        /// Most rows per model call (0: the whole record batch in one call).
        pub batch_size: usize, default = 0
    }
}

impl ConfigExtension for BatchInferOptions {
    const PREFIX: &'static str = "batchinfer";
}
