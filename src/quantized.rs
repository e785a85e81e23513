//! `CREATE MODEL ... OPTIONS ('quantize' 'int8')`: the model quantized ([`crate::quantize`])
//! and kept in the warehouse by content, so that every process (and every executor of a
//! cluster) loads the same quantized file from its definition, without quantizing again. Given
//! the warehouse and the model registry (its stores and session settings), nothing more.

use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::model::text::{TEXT_FILES, read_text_files};
use crate::model::{Model, ModelFiles, ModelRegistry, ModelSource};
use crate::quantize;
use crate::storage::StoreRegistry;
use crate::warehouse::Warehouse;

/// The quantized model of `source`, loaded from the warehouse's `quantized/int8-VERSION-KEY/`
/// (with what was done, for the statement to say), KEY the sha256 of the model and of the files
/// beside it that make a text model (its tokenizer, pooling, ...), which are copied with it. The
/// model is quantized each time (a second or so for a transformer of 70 MB) and the files there
/// are rewritten only where they differ from what it makes: files damaged since are repaired,
/// and a folder made by another process at the same time gets the same bytes. The model file is
/// written last.
pub async fn quantized_model(
    warehouse: Option<&Warehouse>,
    registry: &ModelRegistry,
    name: &str,
    source: &ModelSource,
) -> Result<(Model, String)> {
    let Some(warehouse) = warehouse else {
        return Err(Error::model(
            name,
            format!(
                "model '{name}': OPTIONS ('quantize' ...) keeps the quantized model in the \
                 warehouse, and this engine has none (start it with --warehouse)"
            ),
        ));
    };
    let stores = registry.stores();
    let load_error = |e: Error| Error::ModelLoad {
        model: name.to_string(),
        path: source.to_string(),
        message: e.to_string(),
    };
    let files = ModelFiles::read(source, stores).map_err(load_error)?;
    let sha256 = files.sha256();
    let text_files = match source.file_name() {
        Some("model.onnx") => read_text_files(source, stores).map_err(load_error)?,
        _ => Vec::new(),
    };
    let text_sha256 = quantize::text_digest(&text_files);
    let folder = warehouse.quantized_folder(&folder_key(&sha256, text_sha256.as_deref()))?;
    let file = |name: &str| {
        folder
            .join(name)
            .map_err(|e| Error::warehouse(&folder, format!("{folder}{name}: {e}")))
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
    .map_err(|e| {
        load_error(crate::error::Error::ModelFile(format!(
            "quantizing it failed: {e}"
        )))
    })?;
    let (quantized, files) = quantized.map_err(|e| {
        load_error(crate::error::Error::ModelFile(format!(
            "it cannot be quantized to int8: {e}"
        )))
    })?;

    let size = quantized.bytes.len();
    let target = ModelSource::from_url(file("model.onnx")?);
    let model = load_quantized(
        name,
        &target,
        &quantized.bytes,
        &text_files,
        registry.session_options(),
    )
    .await
    .map_err(load_error)?;
    let written = keep(name, warehouse, stores, &file, text_files, quantized.bytes).await?;
    let kept = if written { "kept in" } else { "already in" };
    let message = format!(
        "quantized to int8 in {:.1} s: {}; {} -> {size} bytes, {kept} {target}",
        started.elapsed().as_secs_f64(),
        quantized.provenance.nodes,
        files.bytes.len() + files.external.iter().map(|(_, f)| f.len()).sum::<usize>(),
    );
    Ok((model, message))
}

/// The quantized model loaded (by ONNX Runtime, with its text files) before anything is
/// written: a folder other processes may read (the same key, the same bytes) only ever gets a
/// model that loads, and the statement registers this model without reading it back.
async fn load_quantized(
    name: &str,
    target: &ModelSource,
    bytes: &[u8],
    text_files: &[(&'static str, Vec<u8>)],
    options: crate::model::SessionOptions,
) -> Result<Model> {
    let (name, target, text_files) = (name.to_string(), target.clone(), text_files.to_vec());
    let model_files = ModelFiles {
        bytes: bytes.into(),
        external: Vec::new(),
    };
    let assembled = tokio::task::spawn_blocking(move || {
        Model::assemble(&name, &target, model_files, &text_files, options)
    })
    .await
    .map_err(|e| Error::ModelFile(format!("loading its quantized form failed: {e}")))?;
    assembled.map_err(|e| {
        Error::ModelFile(format!(
            "ONNX Runtime refuses its quantized form: {}",
            crate::message::display_error(&e)
        ))
    })
}

/// The name of the folder a model's quantized form is kept in: the method, its version and the
/// sha256 of the model's digest with its text files' (`text_sha256`).
fn folder_key(sha256: &str, text_sha256: Option<&str>) -> String {
    let mut key = Sha256::new();
    key.update(sha256.as_bytes());
    key.update(text_sha256.unwrap_or("").as_bytes());
    format!(
        "{}-{}-{}",
        quantize::INT8,
        quantize::VERSION,
        hex::encode(key.finalize())
    )
}

/// Writes the text files and then the model file where they differ from what the folder holds
/// (`file` names a file of it); a text file the source no longer has is removed. Whether
/// anything was written.
async fn keep(
    name: &str,
    warehouse: &Warehouse,
    stores: &StoreRegistry,
    file: &(dyn Fn(&str) -> Result<url::Url> + Sync),
    text_files: Vec<(&'static str, Vec<u8>)>,
    model: Vec<u8>,
) -> Result<bool> {
    let mut written = false;
    let wanted: Vec<&str> = text_files.iter().map(|(f, _)| *f).collect();
    for stray in TEXT_FILES.iter().filter(|f| !wanted.contains(f)) {
        warehouse.delete_file(&file(stray)?).await?;
    }
    for (file_name, bytes) in text_files.into_iter().chain([("model.onnx", model)]) {
        let url = file(file_name)?;
        let there = ModelSource::from_url(url.clone())
            .read_if_exists(stores, crate::model::source::MODEL_CAP)
            .map_err(|e| Error::model(name, format!("model '{name}': {e}")))?;
        if there.as_ref() != Some(&bytes) {
            warehouse.put_file(&url, bytes).await?;
            written = true;
        }
    }
    Ok(written)
}
