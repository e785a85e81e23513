//! Models by name: the registry that maps `predict('name', ...)` to a loaded model.
//!
//! A model is registered from a path and loaded on first use, once per process; the loaded model
//! (its signature and its session) is shared by every partition of every query.

pub mod embed;
pub mod header;
pub mod labels;
pub mod listing;
mod pool;
mod registry;
pub mod score;
pub mod shared;
pub(crate) mod source;
pub mod text;
pub mod versions;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ort::session::SessionInputValue;
use ort::value::DynValue;

pub use pool::SessionOptions;

use crate::device::Target;
use crate::stop::StopToken;
pub use crate::tensor::signature::{ModelSignature, TensorSpec};
use pool::SessionPool;
pub use registry::{ModelRegistry, Picked, Totals};
pub use shared::SharedModels;
pub use source::ModelSource;

use crate::error::{Error, Result};
use crate::storage::StoreRegistry;

/// The functions that call a model, by name: what each costs is a model's compute or an
/// endpoint's request per row, so the planner calls them on as few rows as it can
/// (`rules/late_calls.rs`), and lineage names the models they call
/// (`lineage.rs`).
pub const MODEL_FUNCTIONS: &[&str] = &[
    "predict",
    "embed",
    "generate",
    "generate_details",
    "ai_filter",
    "ai_filter_score",
    "ai_classify",
    "ai_reduce",
    "ai_agg",
];

/// The largest batch dimension a model may fix: each call is padded to it.
pub const MAX_FIXED_BATCH: usize = 65_536;

/// A model's version ([`Model::version`]): `sha256`, or `sha256+beside` where files beside it
/// count.
pub fn version(sha256: &str, beside: Option<&str>) -> String {
    match beside {
        Some(beside) => format!("{sha256}+{beside}"),
        None => sha256.to_string(),
    }
}

/// The sha256 of a model's file in a [`version`].
pub fn sha256_of_version(version: &str) -> &str {
    version
        .split_once('+')
        .map_or(version, |(sha256, _)| sha256)
}

/// A model loaded into ONNX Runtime.
#[derive(Debug)]
pub struct Model {
    pub name: String,
    pub source: ModelSource,
    pub signature: ModelSignature,
    /// sha256 of the model file, recorded with the results it produces.
    pub sha256: String,
    pub size_bytes: usize,
    /// Calls into ONNX Runtime, rows scored, and nanoseconds spent inside ONNX Runtime.
    pub stats: ModelStats,
    /// Tokenizer and pooling, for a model folder with `tokenizer.json` (`embed` needs one).
    pub text: Option<text::TextConfig>,
    /// How its images are prepared, where its folder declares it (`predict` over a BLOB).
    pub image: Option<crate::images::ImageSpec>,
    /// How it reads a file's first and last bytes, where its folder declares it (`predict` over
    /// a BLOB or text).
    pub bytes: Option<crate::file_bytes::BytesSpec>,
    /// The sha256 of the files beside it that change what it computes (its tokenizer, its
    /// preprocessing, its labels: [`text::TEXT_FILES`]), where it has any.
    pub beside_sha256: Option<String>,
    /// Its class names, where its folder names them: `predict` adds `label` and `score`.
    pub labels: Option<labels::Labels>,
    /// What the model was quantized from, for a model batchinfer quantized.
    pub quantized: Option<crate::quantize::Provenance>,
    /// Its producer, doc string, operator sets and class labels, for DESCRIBE MODEL.
    pub about: header::About,
    pool: SessionPool,
}

/// A model file's bytes with the external data files it names, read from its folder.
pub struct ModelFiles {
    pub bytes: Arc<[u8]>,
    pub external: crate::onnx::external::ExternalFiles,
}

impl ModelFiles {
    /// Reads the model at `source` and its external data; errors are the reason alone.
    pub fn read(source: &ModelSource, stores: &StoreRegistry) -> crate::error::Result<Self> {
        let bytes: Arc<[u8]> = source.read(stores, crate::onnx::MODEL_CAP)?.into();
        let mut files = crate::onnx::external::ExternalFiles::new();
        for location in crate::onnx::external::locations(&bytes)? {
            crate::onnx::external::check_location(&location)?;
            let file = source.beside(&location);
            let data = file
                .read(stores, crate::onnx::external::EXTERNAL_CAP)
                .map_err(|e| Error::ModelFile(format!("its external data: {e}")))?;
            files.push((location, data.into()));
        }
        Ok(ModelFiles {
            bytes,
            external: files,
        })
    }

    /// The model's sha256 (with its external data), as [`Model::sha256`].
    pub fn sha256(&self) -> String {
        crate::onnx::external::sha256(&self.bytes, &self.external)
    }
}

/// Counters of a model's work since it was loaded.
#[derive(Debug, Default)]
pub struct ModelStats {
    pub calls: AtomicU64,
    pub rows: AtomicU64,
    pub nanos: AtomicU64,
}

impl Model {
    /// What a materialized view records of the model it scored with: its file's sha256, and
    /// that of the files beside it where it has any (a changed preprocessing is a new model).
    pub fn version(&self) -> String {
        version(&self.sha256, self.beside_sha256.as_deref())
    }

    /// What `predict` returns: the model's outputs (one as it is, several as a struct), with
    /// `label` and `score` in a struct where its folder names its classes.
    pub fn predict_type(&self) -> datafusion::arrow::datatypes::DataType {
        match &self.labels {
            Some(labels) => labels.output_type(&self.signature),
            None => self.signature.output_type.clone(),
        }
    }

    /// Reads and loads a model file, local or in S3, with the files beside it. The bytes are
    /// read once and kept, so that a file replaced while the process runs is never half-read by
    /// a later session.
    pub fn load(
        name: &str,
        source: &ModelSource,
        options: SessionOptions,
        stores: &StoreRegistry,
    ) -> Result<Model> {
        let load_error = |e: Error| Error::ModelLoad {
            model: name.to_string(),
            path: source.to_string(),
            message: e.to_string(),
        };
        let (files, beside, _checked) = std::thread::scope(|scope| {
            // ONNX Runtime's library is checked against its pinned sha256 while the files are
            // read; the check serves this model's session only (held until it is built).
            let check = scope.spawn(|| options.device.prepare());
            let read = || -> crate::error::Result<_> {
                let files = ModelFiles::read(source, stores)?;
                let beside = match source.file_name() {
                    Some("model.onnx") => text::read_text_files(source, stores)?,
                    _ => Vec::new(),
                };
                Ok((files, beside))
            };
            let read = read();
            // A check that failed leaves the library to be checked when it is loaded.
            let checked = check.join().ok();
            read.map(|(files, beside)| (files, beside, checked))
        })
        .map_err(load_error)?;
        Self::assemble(name, source, files, &beside, options)
    }

    /// A model from its files, read already: the model file with its external data, and the
    /// files `beside` it that make a text model (`source` says where they are, for messages and
    /// for a quantized model's check that they are those it was made with).
    pub fn assemble(
        name: &str,
        source: &ModelSource,
        files: ModelFiles,
        beside: &[(&str, Vec<u8>)],
        options: SessionOptions,
    ) -> Result<Model> {
        let load_error = |e: Error| Error::ModelLoad {
            model: name.to_string(),
            path: source.to_string(),
            message: e.to_string(),
        };
        let ModelFiles {
            bytes,
            external: files,
        } = files;
        let text = text::TextConfig::from_files(source, beside).map_err(load_error)?;
        let image = crate::images::ImageSpec::from_files(beside).map_err(load_error)?;
        let file_bytes = crate::file_bytes::BytesSpec::from_files(beside).map_err(load_error)?;
        // A text model sees a new shape (rows x padded length) at nearly every call, and a model
        // of files a new number of rows at the end of each batch: ONNX Runtime's memory
        // patterns, planned and kept for each shape, are no use to them.
        let options = SessionOptions {
            varying_shapes: text.is_some() || image.is_some() || file_bytes.is_some(),
            ..options
        };
        // The tokenizer is parsed while ONNX Runtime builds the session.
        let (model, text) = std::thread::scope(|scope| {
            let text = text.map(|files| scope.spawn(|| files.parse()));
            let model = Self::from_bytes(name, source.clone(), bytes, files, options);
            let text = text.map(|parsing| {
                parsing.join().unwrap_or_else(|_| {
                    Err(Error::ModelFile(
                        "parsing its tokenizer panicked".to_string(),
                    ))
                })
            });
            (model, text)
        });
        let mut model = model?;
        model.text = text.transpose().map_err(load_error)?;
        model.image = image;
        model.bytes = file_bytes;
        model.beside_sha256 = crate::quantize::text_digest(beside);
        if model.image.is_some() && model.bytes.is_some() {
            return Err(load_error(Error::ModelFile(
                "its folder declares both images and bytes as its input: one model reads a \
                 file one way (keep \"image\" or \"bytes\")"
                    .into(),
            )));
        }
        model.labels = labels::Labels::from_files(beside, &model.signature).map_err(load_error)?;
        // A quantized model's folder holds the files it was made with, and no others.
        if let Some(quantized) = &model.quantized
            && crate::quantize::text_digest(beside) != quantized.text_sha256
        {
            return Err(load_error(crate::error::Error::ModelFile(format!(
                "the files beside it ({}) are not those it was quantized with: changed, added or \
                 removed since (in a warehouse, CREATE OR REPLACE MODEL ... OPTIONS ('quantize' \
                 'int8') from its source repairs them; a copy needs the files it was made with)",
                text::TEXT_FILES.join(", ")
            ))));
        }
        Ok(model)
    }

    /// Loads a model from its bytes and the external data files it names (see [`crate::onnx::external`]);
    /// `source` says where they came from, for messages.
    pub fn from_bytes(
        name: &str,
        source: ModelSource,
        bytes: Arc<[u8]>,
        files: crate::onnx::external::ExternalFiles,
        options: SessionOptions,
    ) -> Result<Model> {
        let load_error = |e: Error| Error::ModelLoad {
            model: name.to_string(),
            path: source.to_string(),
            message: e.to_string(),
        };
        // Every file it names must be given: ONNX Runtime would look for any other in the
        // working directory.
        for location in crate::onnx::external::locations(&bytes).map_err(load_error)? {
            if !files.iter().any(|(given, _)| given == &location) {
                return Err(load_error(crate::error::Error::ModelFile(format!(
                    "it keeps data in '{location}', which was not read with it"
                ))));
            }
        }
        let size_bytes = bytes.len() + files.iter().map(|(_, f)| f.len()).sum::<usize>();
        // The sha256 is computed while ONNX Runtime builds the session.
        let (sha256, pool) = std::thread::scope(|scope| {
            let sha256 = scope.spawn(|| crate::onnx::external::sha256(&bytes, &files));
            let pool = SessionPool::new(&bytes, files.clone(), options);
            let sha256 = sha256
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (sha256, pool)
        });
        let pool = pool.map_err(load_error)?;
        let signature = ModelSignature::from_session(pool.session()).map_err(load_error)?;
        let quantized = pool.session().metadata().ok().and_then(|metadata| {
            crate::quantize::Provenance::from_metadata(|key| metadata.custom(key))
        });
        if let Some(fixed) = signature.fixed_batch()
            && fixed > MAX_FIXED_BATCH
        {
            return Err(load_error(crate::error::Error::ModelFile(format!(
                "its batch dimension is fixed at {fixed} rows; every call would be padded to \
                 that many rows, and batchinfer takes fixed batch sizes of at most \
                 {MAX_FIXED_BATCH} (export the model with a dynamic batch dimension)"
            ))));
        }
        Ok(Model {
            name: name.to_string(),
            source,
            signature,
            sha256,
            size_bytes,
            stats: ModelStats::default(),
            text: None,
            image: None,
            bytes: None,
            beside_sha256: None,
            labels: None,
            quantized,
            about: header::about(&bytes).unwrap_or_default(),
            pool,
        })
    }

    /// Runs the model on one set of input tensors (of `rows` rows) and returns its outputs in the
    /// model's order.
    pub fn run(
        &self,
        inputs: Vec<SessionInputValue<'_>>,
        rows: usize,
        stop: &StopToken,
    ) -> crate::error::Result<Vec<DynValue>> {
        let outputs = self.pool.run(&inputs, &self.stats.nanos, stop)?;
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
        Ok(outputs)
    }

    /// Where this model's sessions run.
    pub fn device(&self) -> Target {
        self.pool.device()
    }

    /// The most calls this model runs at once.
    pub fn max_sessions(&self) -> usize {
        self.pool.max_sessions()
    }

    /// Nanoseconds during which at least one of this model's calls was running.
    pub fn occupied_nanos(&self) -> u64 {
        self.pool.occupied_nanos()
    }
}
