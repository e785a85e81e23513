//! `CREATE MODEL ... OPTIONS ('quantize' 'int8')`: the model quantized once ([`crate::quantize`])
//! and kept in the warehouse by content, so that every process (and every executor of a
//! cluster) loads the same quantized file, and none quantizes it again.

use std::time::Instant;

use sha2::{Digest, Sha256};

use super::*;
use crate::model::ModelFiles;
use crate::model::text::TEXT_FILES;
use crate::quantize::{self, METHOD};

impl Engine {
    /// The quantized model of `source` in the warehouse's `quantized/KEY/`, made there unless
    /// it is there already. KEY is the sha256 of the model and of the files beside it that make
    /// a text model (its tokenizer, pooling, ...), which are copied with it.
    pub(super) async fn quantized_source(
        &self,
        name: &str,
        source: &ModelSource,
    ) -> Result<ModelSource> {
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
        let mut text_files = Vec::new();
        if source.file_name() == Some("model.onnx") {
            for file in TEXT_FILES {
                let cap = crate::model::source::TOKENIZER_CAP;
                if let Some(bytes) = source
                    .beside(file)
                    .read_if_exists(stores, cap)
                    .map_err(load_error)?
                {
                    text_files.push((*file, bytes));
                }
            }
        }
        let mut key = Sha256::new();
        key.update(sha256.as_bytes());
        for (file, bytes) in &text_files {
            key.update(file.as_bytes());
            key.update((bytes.len() as u64).to_le_bytes());
            key.update(bytes);
        }
        let folder = warehouse.quantized_folder(&format!(
            "{}-{}",
            quantize::INT8,
            hex::encode(key.finalize())
        ))?;
        let file = |name: &str| {
            folder
                .join(name)
                .map_err(|e| Error::Usage(format!("{folder}{name}: {e}")))
        };
        let target = ModelSource::from_url(file("model.onnx")?);
        // Made before (by this process or another): the model file is written last, so a
        // folder with one is complete; one whose metadata does not match is made again.
        let made = target
            .read_if_exists(stores, crate::model::source::MODEL_CAP)
            .ok()
            .flatten()
            .and_then(|bytes| quantize::provenance_of(&bytes))
            .is_some_and(|p| p.from_sha256 == sha256 && p.method == METHOD);
        if made {
            return Ok(target);
        }
        let started = Instant::now();
        let quantized =
            quantize::quantize(&files.bytes, &files.external, &sha256, &source.to_string())
                .map_err(|e| load_error(format!("it cannot be quantized to int8: {e}")))?;
        for (name, bytes) in text_files {
            warehouse.put_file(&file(name)?, bytes).await?;
        }
        let size = quantized.bytes.len();
        warehouse.put_file(target.url(), quantized.bytes).await?;
        eprintln!(
            "model '{name}' quantized to int8 in {:.1} s: {}; {} -> {} bytes, kept in {target}",
            started.elapsed().as_secs_f64(),
            quantized.provenance.nodes,
            files.bytes.len() + files.external.iter().map(|(_, f)| f.len()).sum::<usize>(),
            size,
        );
        Ok(target)
    }
}
