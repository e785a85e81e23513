//! What a person chooses of an engine, as the command line's options and Python's `connect()`
//! take it ([`EngineOptions`]), made into the [`EngineConfig`] the engine runs with: the device
//! decided once here, and everything after asks the resolved device.

use std::path::PathBuf;

use crate::config::{Device, EngineConfig, GraphOptimization, Remote};
use crate::error::{Error, Result};

/// The most partitions, sessions or threads asked for: more than any machine has cores.
pub const MAX_PARALLEL: usize = 1024;
/// The most rows per record batch.
pub const MAX_BATCH_ROWS: usize = 1 << 24;

/// An engine's options as a person gives them; `None` leaves the default.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// `--models`: a folder (or s3://, gs://, az:// prefix) of ONNX models.
    pub models: Option<PathBuf>,
    /// `--partitions`: partitions scored in parallel (default: the cores).
    pub partitions: Option<usize>,
    /// `--sessions`: model calls at once per model (default: one per partition).
    pub sessions: Option<usize>,
    /// `--threads`: ONNX Runtime threads inside each call (default: cores / sessions).
    pub threads: Option<usize>,
    /// `--batch-rows`: rows per record batch read (default: the device's).
    pub batch_rows: Option<usize>,
    /// `--graph-optimization`.
    pub graph_optimization: GraphOptimization,
    /// `--memory-limit`, in bytes (default: no limit).
    pub memory_limit: Option<usize>,
    /// `--warehouse`: where models and tables persist (`None`: this engine's memory only).
    pub warehouse: Option<PathBuf>,
    /// `--device`.
    pub device: Device,
    /// `--remote`: a Ballista scheduler to run statements on.
    pub remote: Option<Remote>,
}

impl EngineOptions {
    /// The configuration an engine runs with: the counts checked, the device resolved.
    pub fn config(&self) -> Result<EngineConfig> {
        let checked = [
            ("partitions", self.partitions, MAX_PARALLEL),
            ("sessions", self.sessions, MAX_PARALLEL),
            ("threads", self.threads, MAX_PARALLEL),
            ("batch_rows", self.batch_rows, MAX_BATCH_ROWS),
        ];
        for (name, value, max) in checked {
            if let Some(n) = value {
                check_count(n, max)
                    .map_err(|problem| Error::setting(name, format!("{name} {problem}")))?;
            }
        }
        let defaults = EngineConfig::default();
        let device = self.device.resolve();
        Ok(EngineConfig {
            models_dir: self.models.clone(),
            target_partitions: self.partitions.unwrap_or(defaults.target_partitions),
            sessions_per_model: self.sessions.unwrap_or(defaults.sessions_per_model),
            intra_threads: self.threads.unwrap_or(defaults.intra_threads),
            batch_size: self.batch_rows.unwrap_or_else(|| device.batch_rows()),
            optimization: self.graph_optimization,
            memory_limit: self.memory_limit,
            warehouse: self.warehouse.clone(),
            remote: self.remote.clone(),
            device,
        })
    }
}

/// A count that is not from 1 to its most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("must be from 1 to {most}")]
pub struct OutOfRange {
    pub most: usize,
}

/// `n` when it is a count from 1 to `max`, else what was expected.
pub fn check_count(n: usize, max: usize) -> std::result::Result<usize, OutOfRange> {
    if (1..=max).contains(&n) {
        Ok(n)
    } else {
        Err(OutOfRange { most: max })
    }
}
