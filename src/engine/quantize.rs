//! `CREATE MODEL ... OPTIONS ('quantize' 'int8')`: the model quantized ([`crate::quantize`])
//! and kept in the warehouse by content, so that every process (and every executor of a
//! cluster) loads the same quantized file from its definition, without quantizing again.

use std::time::Instant;

use sha2::{Digest, Sha256};

use super::*;
use crate::model::ModelFiles;
use crate::model::text::{TEXT_FILES, read_text_files};
use crate::quantize;

impl Engine {
    /// The quantized model of `source` in the warehouse's `quantized/int8-VERSION-KEY/`, KEY the
    /// sha256 of the model and of the files beside it that make a text model (its tokenizer,
    /// pooling, ...), which are copied with it. The model is quantized each time (a second or
    /// so for a transformer of 70 MB) and the files there are rewritten only where they differ
    /// from what it makes: files damaged since are repaired, and a folder made by another
    /// process at the same time gets the same bytes. The model file is written last.
    pub(super) async fn quantized_source(
        &self,
        name: &str,
        source: &ModelSource,
    ) -> Result<QuantizedSource> {
        let Some(warehouse) = &self.warehouse else {
            return Err(Error::Usage(format!(
                "model '{name}': OPTIONS ('quantize' ...) keeps the quantized model in the \
                 warehouse, and this engine has none (start it with --warehouse)"
            )));
        };
        let stores = self.registry.stores();
        let load_error = |message: String| Error::ModelLoad {
            model: name.to_string(),
            path: source.to_string(),
            message,
        };
        let files = ModelFiles::read(source, stores).map_err(load_error)?;
        let sha256 = files.sha256();
        let text_files = match source.file_name() {
            Some("model.onnx") => read_text_files(source, stores).map_err(load_error)?,
            _ => Vec::new(),
        };
        let text_sha256 = quantize::text_digest(&text_files);
        let mut key = Sha256::new();
        key.update(sha256.as_bytes());
        key.update(text_sha256.as_deref().unwrap_or("").as_bytes());
        let folder = warehouse.quantized_folder(&format!(
            "{}-{}-{}",
            quantize::INT8,
            quantize::VERSION,
            hex::encode(key.finalize())
        ))?;
        let file = |name: &str| {
            folder
                .join(name)
                .map_err(|e| Error::Usage(format!("{folder}{name}: {e}")))
        };

        let started = Instant::now();
        let quantized = tokio::task::spawn_blocking(move || {
            quantize::quantize(
                &files.bytes,
                &files.external,
                &sha256,
                text_sha256.as_deref(),
            )
            .map(|q| (q, files))
        })
        .await
        .map_err(|e| load_error(format!("quantizing it failed: {e}")))?;
        let (quantized, files) =
            quantized.map_err(|e| load_error(format!("it cannot be quantized to int8: {e}")))?;

        let size = quantized.bytes.len();
        let mut written = Vec::new();
        // A text file the source has no such file for (added there since) is removed; the
        // model file is written last.
        let wanted: Vec<&str> = text_files.iter().map(|(f, _)| *f).collect();
        for stray in TEXT_FILES.iter().filter(|f| !wanted.contains(f)) {
            warehouse.delete_file(&file(stray)?).await?;
        }
        for (file_name, bytes) in text_files
            .into_iter()
            .chain([("model.onnx", quantized.bytes)])
        {
            let url = file(file_name)?;
            let there = ModelSource::from_url(url.clone())
                .read_if_exists(stores, crate::model::source::MODEL_CAP)
                .map_err(|e| Error::Usage(format!("model '{name}': {e}")))?;
            if there.as_ref() != Some(&bytes) {
                warehouse.put_file(&url, bytes).await?;
                written.push(url);
            }
        }
        Ok(QuantizedSource {
            target: ModelSource::from_url(file("model.onnx")?),
            written,
            message: format!(
                "quantized to int8 in {:.1} s: {}; {} -> {size} bytes",
                started.elapsed().as_secs_f64(),
                quantized.provenance.nodes,
                files.bytes.len() + files.external.iter().map(|(_, f)| f.len()).sum::<usize>(),
            ),
        })
    }

    /// After a quantized model failed to load: the files this statement wrote go, the model file
    /// first (a folder without it is not a model).
    pub(super) async fn remove_quantized(&self, quantized: &QuantizedSource) {
        let Some(warehouse) = &self.warehouse else {
            return;
        };
        for url in quantized.written.iter().rev() {
            let _ = warehouse.delete_file(url).await;
        }
    }
}

/// Where [`Engine::quantized_source`] put a quantized model, what it wrote, and what it did.
pub(super) struct QuantizedSource {
    pub target: ModelSource,
    /// The files written by this statement (none when the folder held them already).
    pub written: Vec<url::Url>,
    pub message: String,
}
