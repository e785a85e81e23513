//! Embedding texts with a text model: tokenize (without character offsets, which nothing here
//! reads), sort by token count, cut micro-batches by a token budget, run them on the model's
//! session in parallel, longest first, pool and normalize, and put the vectors back in the order
//! of the texts.
//!
//! Sorting keeps padding small (a micro-batch's rows have similar lengths, so little of each call
//! is spent on padding); the token budget (rows x padded length) keeps calls of long texts from
//! growing large. Each worker prepares its next micro-batch (padding into tensors) while the
//! other workers' model calls run, so preparation overlaps with inference.

use crate::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};

use ort::value::{TensorElementType, TensorRef};
use parking_lot::Mutex;
use tokenizers::Encoding;

use super::Model;
use super::text::{Pooling, TextConfig};
use crate::stop::StopToken;

/// How texts are cut into model calls.
#[derive(Debug, Clone, Copy)]
pub struct EmbedOptions {
    /// Most tokens (rows x padded length) per model call; 0: no sorting, calls of
    /// `rows_per_call` rows in the texts' own order (the naive way, for comparison). 256 by
    /// default: on one core, calls of a few hundred tokens keep the activations in cache and
    /// run faster per row than larger ones (measured in `benches/embed.rs`).
    pub token_budget: usize,
    /// Rows per call when `token_budget` is 0.
    pub rows_per_call: usize,
    /// Stop signals: looked at before each call.
    pub stop: StopToken,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions {
            token_budget: 256,
            rows_per_call: 32,
            stop: StopToken::default(),
        }
    }
}

/// What each call of a text model takes and gives: where its inputs go, which output holds the
/// vectors, and their size.
struct Call<'a> {
    inputs: &'a TextInputs,
    output: usize,
    dim: usize,
}

/// The names of a text model's inputs, found by name.
struct TextInputs {
    ids: usize,
    mask: usize,
    types: Option<usize>,
}

fn text_inputs(model: &Model) -> crate::error::Result<TextInputs> {
    let find = |name: &str| model.signature.inputs.iter().position(|i| i.name == name);
    let (Some(ids), Some(mask)) = (find("input_ids"), find("attention_mask")) else {
        return Err(crate::error::Error::ModelFile(format!(
            "a text model takes input_ids and attention_mask (and optionally token_type_ids); this one takes:\n{}",
            model.signature.describe_inputs()
        )));
    };
    let types = find("token_type_ids");
    let known = 2 + usize::from(types.is_some());
    if model.signature.inputs.len() != known {
        return Err(crate::error::Error::ModelFile(format!(
            "a text model takes only input_ids, attention_mask and token_type_ids; this one takes:\n{}",
            model.signature.describe_inputs()
        )));
    }
    Ok(TextInputs { ids, mask, types })
}

/// The output of a text model that holds its vectors, and their size: the output
/// `batchinfer.json` names, else the first float output shaped `[N, tokens, dim]` or `[N, dim]`
/// (an export may also return its inputs, or a pooled vector after the token vectors).
pub fn text_output(model: &Model) -> crate::error::Result<(usize, usize)> {
    let Some(config) = &model.text else {
        return Err(crate::error::Error::ModelFile(format!(
            "model '{}' is not a text model: its folder needs a tokenizer.json beside model.onnx",
            model.name
        )));
    };
    text_inputs(model)?;
    let outputs = &model.signature.outputs;
    let dim = |spec: &super::TensorSpec| match spec.shape.as_slice() {
        [_, _, d] | [_, d] if *d > 0 && spec.element == Some(TensorElementType::Float32) => {
            Some(*d as usize)
        }
        _ => None,
    };
    let shapes = || {
        outputs
            .iter()
            .map(|o| format!("'{}' {} {}", o.name, o.description, o.shape_text()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(name) = &config.output {
        let Some(index) = outputs.iter().position(|o| &o.name == name) else {
            return Err(crate::error::Error::ModelFile(format!(
                "batchinfer.json names the output '{name}', which model '{}' does not have; its \
                 outputs are: {}",
                model.name,
                shapes()
            )));
        };
        return dim(&outputs[index]).map(|d| (index, d)).ok_or_else(|| {
            Error::ModelFile(format!(
                "output '{name}' of model '{}' is {} {}; a text model's vectors are float \
                 [N, tokens, dim] or [N, dim] with a fixed dim",
                model.name,
                outputs[index].description,
                outputs[index].shape_text()
            ))
        });
    }
    outputs
        .iter()
        .enumerate()
        .find_map(|(i, o)| dim(o).map(|d| (i, d)))
        .ok_or_else(|| {
            Error::ModelFile(format!(
                "model '{}' has no float output shaped [N, tokens, dim] or [N, dim] with a fixed \
                 dim; its outputs are: {}",
                model.name,
                shapes()
            ))
        })
}

/// The vector size a text model produces.
pub fn embedding_dim(model: &Model) -> crate::error::Result<usize> {
    text_output(model).map(|(_, dim)| dim)
}

/// Embeds `texts`; returns `texts.len() * dim` values, row-major, in the order of `texts`.
pub fn embed_texts(
    model: &Model,
    texts: &[&str],
    options: EmbedOptions,
) -> crate::error::Result<Vec<f32>> {
    let config = model
        .text
        .as_ref()
        .ok_or_else(|| crate::error::Error::ModelFile("not a text model".to_string()))?;
    let inputs = text_inputs(model)?;
    let (output, dim) = text_output(model)?;
    if texts.is_empty() {
        return Ok(Vec::new());
    }
    let encodings = tokenize(config, texts, &options.stop)?;
    let calls = plan_calls(&encodings, options);
    let out = Mutex::new(vec![0f32; texts.len() * dim]);
    let next = AtomicUsize::new(0);
    let workers = model.max_sessions().min(calls.len()).max(1);
    let worker = || -> crate::error::Result<()> {
        loop {
            // The longest texts first: the calls that end the work are the shortest, so the
            // workers finish together.
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(rows) = calls.len().checked_sub(i + 1).map(|last| &calls[last]) else {
                return Ok(());
            };
            if options.stop.requested().is_some() {
                return Err(crate::error::Error::ModelFile("cancelled".to_string()));
            }
            let call = Call {
                inputs: &inputs,
                output,
                dim,
            };
            let vectors = run_call(model, config, &call, &encodings, rows, &options.stop)?;
            let mut out = out.lock();
            for (row, vector) in rows.iter().zip(vectors.chunks_exact(dim)) {
                out[row * dim..(row + 1) * dim].copy_from_slice(vector);
            }
        }
    };
    if workers == 1 {
        worker()?;
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers).map(|_| scope.spawn(worker)).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(crate::error::Error::ModelFile(
                            "an embedding worker panicked".to_string(),
                        ))
                    })
                })
                .collect::<crate::error::Result<Vec<()>>>()
        })?;
    }
    Ok(out.into_inner())
}

/// Most bytes of text tokenized at once: a stop signal is looked for between two such parts,
/// so that long texts (tokenized whole before being cut at the model's length) do not delay it.
const TOKENIZE_BYTES: usize = 1 << 20;

/// The texts' tokens, in parts of at most [`TOKENIZE_BYTES`] (or one text).
fn tokenize(
    config: &TextConfig,
    texts: &[&str],
    stop: &StopToken,
) -> crate::error::Result<Vec<Encoding>> {
    let mut encodings = Vec::with_capacity(texts.len());
    let mut rest = texts;
    while !rest.is_empty() {
        if stop.requested().is_some() {
            return Err(crate::error::Error::ModelFile("cancelled".to_string()));
        }
        let mut bytes = 0;
        let part = rest
            .iter()
            .take_while(|t| {
                bytes += t.len();
                bytes <= TOKENIZE_BYTES
            })
            .count()
            .max(1);
        let (now, later) = rest.split_at(part);
        // `encode_batch_fast` skips the character offsets (nothing here reads them); it gives
        // every token type id 0, which is right for single texts, all `embed` takes.
        encodings.extend(
            config
                .tokenizer
                .encode_batch_fast(now.to_vec(), true)
                .map_err(|e| crate::error::Error::ModelFile(format!("tokenizing: {e}")))?,
        );
        rest = later;
    }
    Ok(encodings)
}

/// The rows of each model call. Sorted by token count and cut by the token budget, or in order.
fn plan_calls(encodings: &[Encoding], options: EmbedOptions) -> Vec<Vec<usize>> {
    if options.token_budget == 0 {
        let per_call = options.rows_per_call.max(1);
        return (0..encodings.len())
            .collect::<Vec<_>>()
            .chunks(per_call)
            .map(|c| c.to_vec())
            .collect();
    }
    let mut order: Vec<usize> = (0..encodings.len()).collect();
    order.sort_by_key(|&i| encodings[i].len());
    let mut calls = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    for row in order {
        // Sorted ascending: this row is the longest so far, so it sets the padded length.
        let padded = encodings[row].len().max(1);
        if !current.is_empty() && (current.len() + 1) * padded > options.token_budget {
            calls.push(std::mem::take(&mut current));
        }
        current.push(row);
    }
    if !current.is_empty() {
        calls.push(current);
    }
    calls
}

/// One model call: pads the rows' tokens into tensors, runs, pools; one vector per row.
fn run_call(
    model: &Model,
    config: &TextConfig,
    call: &Call<'_>,
    encodings: &[Encoding],
    rows: &[usize],
    stop: &StopToken,
) -> crate::error::Result<Vec<f32>> {
    let Call {
        inputs,
        output,
        dim,
    } = *call;
    let n = rows.len();
    let (len, [ids, mask, types]) = padded(encodings, rows);
    let shape = [n, len];
    let err = Error::from;
    let mut values: Vec<Option<ort::session::SessionInputValue<'_>>> =
        (0..model.signature.inputs.len()).map(|_| None).collect();
    values[inputs.ids] = Some(
        TensorRef::from_array_view((shape, ids.as_slice()))
            .map_err(err)?
            .into(),
    );
    values[inputs.mask] = Some(
        TensorRef::from_array_view((shape, mask.as_slice()))
            .map_err(err)?
            .into(),
    );
    if let Some(t) = inputs.types {
        values[t] = Some(
            TensorRef::from_array_view((shape, types.as_slice()))
                .map_err(err)?
                .into(),
        );
    }
    let values: Vec<_> = values
        .into_iter()
        .map(|v| v.expect("every input is set"))
        .collect();
    let outputs = model.run(values, n, stop)?;
    let (out_shape, hidden) = outputs[output].try_extract_tensor::<f32>().map_err(err)?;
    let mut vectors = match **out_shape {
        [b, t, d] if b as usize == n && d as usize == dim => {
            pool(hidden, &mask, n, t as usize, dim, config.pooling)
        }
        [b, d] if b as usize == n && d as usize == dim => hidden.to_vec(),
        _ => {
            return Err(crate::error::Error::ModelFile(format!(
                "output shape {:?} is not [{n}, tokens, {dim}]",
                &**out_shape
            )));
        }
    };
    if config.normalize {
        for v in vectors.chunks_exact_mut(dim) {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
    }
    Ok(vectors)
}

/// The rows' token ids, attention masks and type ids, padded to the longest row: its length
/// (at least 1) and the three `[rows, length]` arrays.
fn padded(encodings: &[Encoding], rows: &[usize]) -> (usize, [Vec<i64>; 3]) {
    let n = rows.len();
    let len = rows
        .iter()
        .map(|&r| encodings[r].len())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut ids = vec![0i64; n * len];
    let mut mask = vec![0i64; n * len];
    let mut types = vec![0i64; n * len];
    for (i, &row) in rows.iter().enumerate() {
        let e = &encodings[row];
        for (t, ((&id, &m), &ty)) in e
            .get_ids()
            .iter()
            .zip(e.get_attention_mask())
            .zip(e.get_type_ids())
            .enumerate()
        {
            ids[i * len + t] = id as i64;
            mask[i * len + t] = m as i64;
            types[i * len + t] = ty as i64;
        }
    }
    (len, [ids, mask, types])
}

/// Pools [n, tokens, dim] token vectors into [n, dim] over the attention mask.
fn pool(
    hidden: &[f32],
    mask: &[i64],
    n: usize,
    tokens: usize,
    dim: usize,
    pooling: Pooling,
) -> Vec<f32> {
    let mut out = vec![0f32; n * dim];
    for i in 0..n {
        let row = &mut out[i * dim..(i + 1) * dim];
        let token = |t: usize| &hidden[(i * tokens + t) * dim..(i * tokens + t + 1) * dim];
        let present = (0..tokens).filter(|&t| mask.get(i * tokens + t).copied().unwrap_or(0) != 0);
        match pooling {
            Pooling::Cls => row.copy_from_slice(token(0)),
            Pooling::Mean => {
                let mut count = 0f32;
                for t in present {
                    row.iter_mut().zip(token(t)).for_each(|(r, h)| *r += h);
                    count += 1.0;
                }
                let count = count.max(1e-9);
                row.iter_mut().for_each(|r| *r /= count);
            }
            Pooling::Max => {
                row.fill(f32::NEG_INFINITY);
                for t in present {
                    row.iter_mut()
                        .zip(token(t))
                        .for_each(|(r, h)| *r = r.max(*h));
                }
            }
        }
    }
    out
}
