//! Text models: an ONNX transformer with the files that turn text into its inputs and its
//! outputs into one vector per text.
//!
//! A model folder is a text model when it holds `tokenizer.json` beside `model.onnx`. The rest
//! follows sentence-transformers' layout, read when present:
//! - `1_Pooling/config.json`: `pooling_mode_mean_tokens` (the default) or `pooling_mode_cls_token`
//!   or `pooling_mode_max_tokens`;
//! - `modules.json`: L2 normalization when it lists a `Normalize` module (without `modules.json`,
//!   vectors are normalized);
//! - `sentence_bert_config.json`: `max_seq_length`, where texts are truncated (else
//!   `tokenizer_config.json`'s `model_max_length`, else 512);
//! - `batchinfer.json` (optional, batchinfer's own): `{"pooling": "mean" | "cls" | "max",
//!   "normalize": true | false, "max_tokens": N}` overrides any of the above, and `"output":
//!   "name"` names the model output that holds the token vectors (by default the first float
//!   output shaped `[N, tokens, dim]` or `[N, dim]`).

use crate::error::Error;
use serde_json::Value;
use tokenizers::{Tokenizer, TruncationParams};

use super::ModelSource;
use crate::storage::StoreRegistry;

/// How token vectors become one text vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of the token vectors, over the attention mask.
    Mean,
    /// The first token's vector ([CLS]).
    Cls,
    /// The element-wise maximum over the attention mask.
    Max,
}

impl Pooling {
    fn parse(name: &str) -> crate::error::Result<Self> {
        match name {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "max" => Ok(Pooling::Max),
            other => Err(crate::error::Error::ModelFile(format!(
                "pooling '{other}' is not one of mean, cls, max"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
        }
    }
}

/// The tokenizer and the pooling settings of a text model.
pub struct TextConfig {
    pub tokenizer: Tokenizer,
    pub max_tokens: usize,
    pub pooling: Pooling,
    pub normalize: bool,
    /// The output `batchinfer.json` names, if it names one.
    pub output: Option<String>,
}

impl std::fmt::Debug for TextConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextConfig")
            .field("max_tokens", &self.max_tokens)
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .field("output", &self.output)
            .finish_non_exhaustive()
    }
}

/// The JSON of `name` among `files` (read beside `model`), if it is there.
fn json_of(
    model: &ModelSource,
    files: &[(&str, Vec<u8>)],
    name: &str,
) -> crate::error::Result<Option<Value>> {
    match files.iter().find(|(file, _)| *file == name) {
        Some((_, bytes)) => serde_json::from_slice(bytes).map(Some).map_err(|e| {
            crate::error::Error::ModelFile(format!("{} is not valid JSON: {e}", model.beside(name)))
        }),
        None => Ok(None),
    }
}

/// What a text model's folder holds besides the model, read but not yet parsed: the tokenizer
/// is parsed apart ([`TextFiles::parse`]), while ONNX Runtime builds the model's session.
pub struct TextFiles {
    tokenizer_file: String,
    tokenizer_bytes: Vec<u8>,
    max_tokens: usize,
    pooling: Pooling,
    normalize: bool,
    output: Option<String>,
}

/// The files beside a text or image model's `model.onnx` that make it one, copied with a model
/// that is derived from it (a quantized model).
pub const TEXT_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "1_Pooling/config.json",
    "modules.json",
    "sentence_bert_config.json",
    "batchinfer.json",
    "preprocessor_config.json",
    "config.json",
];

/// The [`TEXT_FILES`] beside `model` that are there, with their bytes: each read once, so that
/// what is parsed and what is checked (a quantized model's digest of them) are the same bytes.
pub fn read_text_files(
    model: &ModelSource,
    stores: &StoreRegistry,
) -> crate::error::Result<Vec<(&'static str, Vec<u8>)>> {
    let mut files = Vec::new();
    for name in TEXT_FILES {
        let cap = match *name {
            "tokenizer.json" => super::source::TOKENIZER_CAP,
            _ => super::source::CONFIG_CAP,
        };
        if let Some(bytes) = model.beside(name).read_if_exists(stores, cap)? {
            files.push((*name, bytes));
        }
    }
    Ok(files)
}

impl TextConfig {
    /// The text settings of the folder of `model` (its `model.onnx`) from its `files`
    /// ([`read_text_files`]), or `None` when the folder has no tokenizer.
    pub fn from_files(
        model: &ModelSource,
        files: &[(&str, Vec<u8>)],
    ) -> crate::error::Result<Option<TextFiles>> {
        let tokenizer_file = model.beside("tokenizer.json");
        let Some((_, tokenizer_bytes)) = files.iter().find(|(f, _)| *f == "tokenizer.json") else {
            return Ok(None);
        };
        let tokenizer_bytes = tokenizer_bytes.clone();
        let read_json = |name: &str| json_of(model, files, name);

        let mut pooling = Pooling::Mean;
        if let Some(config) = read_json("1_Pooling/config.json")? {
            let on = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
            if on("pooling_mode_cls_token") {
                pooling = Pooling::Cls;
            } else if on("pooling_mode_max_tokens") {
                pooling = Pooling::Max;
            }
        }
        let mut normalize = match read_json("modules.json")? {
            Some(Value::Array(modules)) => modules.iter().any(|m| {
                m.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with("Normalize"))
            }),
            _ => true,
        };
        let mut max_tokens = read_json("sentence_bert_config.json")?
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
            .or_else(|| {
                read_json("tokenizer_config.json")
                    .ok()
                    .flatten()
                    .and_then(|c| c.get("model_max_length").and_then(Value::as_u64))
                    .filter(|&n| n <= 1 << 20)
            })
            .unwrap_or(512) as usize;
        let mut output = None;
        if let Some(overrides) = read_json("batchinfer.json")? {
            if let Some(name) = overrides.get("output") {
                let name = name.as_str().ok_or_else(|| {
                    Error::ModelFile(format!(
                        "{}: \"output\" is not a string",
                        model.beside("batchinfer.json")
                    ))
                })?;
                output = Some(name.to_string());
            }
            if let Some(p) = overrides.get("pooling").and_then(Value::as_str) {
                pooling = Pooling::parse(p)?;
            }
            if let Some(n) = overrides.get("normalize").and_then(Value::as_bool) {
                normalize = n;
            }
            if let Some(m) = overrides.get("max_tokens").and_then(Value::as_u64) {
                max_tokens = m as usize;
            }
        }
        Ok(Some(TextFiles {
            tokenizer_file: tokenizer_file.to_string(),
            tokenizer_bytes,
            max_tokens,
            pooling,
            normalize,
            output,
        }))
    }
}

impl TextFiles {
    /// The tokenizer parsed, truncating at the model's length, without padding.
    pub fn parse(self) -> crate::error::Result<TextConfig> {
        let mut tokenizer = Tokenizer::from_bytes(&self.tokenizer_bytes).map_err(|e| {
            crate::error::Error::ModelFile(format!(
                "{} is not a usable tokenizer: {e}",
                self.tokenizer_file
            ))
        })?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: self.max_tokens,
                ..Default::default()
            }))
            .map_err(|e| crate::error::Error::ModelFile(e.to_string()))?;
        tokenizer.with_padding(None);
        Ok(TextConfig {
            tokenizer,
            max_tokens: self.max_tokens,
            pooling: self.pooling,
            normalize: self.normalize,
            output: self.output,
        })
    }
}
