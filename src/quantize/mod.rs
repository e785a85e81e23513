//! INT8 dynamic quantization of an ONNX model, as ONNX Runtime's own `quantize_dynamic` does it
//! for the CPU (weights per channel, activations quantized at run time):
//!
//! - `MatMul` and `Gemm` with a constant float weight `W [K, N]`: the weight becomes int8, one
//!   scale per output column (symmetric, in [-127, 127]); the activation is quantized to uint8
//!   by `DynamicQuantizeLinear` (once per tensor, however many nodes read it); `MatMulInteger`
//!   multiplies, and the int32 result is scaled back to float (`Cast`, `Mul` by the product of
//!   the two scales). ONNX Runtime fuses this pattern into its `DynamicQuantizeMatMul` kernel
//!   when it loads the model. A Gemm's `alpha` goes into the weight's scales, its `C` (times
//!   `beta`) is added after.
//!   A weight with fewer than [`MIN_INNER`] rows stays float: each output of such a layer sums
//!   too few products to average out the rounding of the activations (the first layer of a
//!   small tabular model, which sees a handful of features), and there is too little work in it
//!   for int8 to gain anything.
//! - ONNX Runtime's fused self-attention (`com.microsoft` `Attention`) becomes its `QAttention`,
//!   the packed weight quantized as a MatMul's; its fused embedding layer
//!   (`EmbedLayerNormalization`) becomes `QEmbedLayerNormalization`, its tables as a Gather's.
//! - `Gather` from a constant float table (an embedding): the table becomes uint8 (one scale and
//!   zero point), followed by `DequantizeLinear`: a quarter of the size, the same speed.
//!
//! The arithmetic is ONNX Runtime's ([`arith`]): the same scales, zero points and rounding, so a
//! MatMul weight or an embedding table quantized here is bit for bit the one Python's
//! `quantize_dynamic(per_channel=True, weight_type=QInt8)` makes. Two differences: `Gemm`, which
//! `quantize_dynamic` leaves in float, is quantized the same way; a weight of fewer than
//! [`MIN_INNER`] rows, which it quantizes, is left in float. Only operators of ONNX's standard
//! domain are written (and ONNX Runtime's `QAttention` and `QEmbedLayerNormalization`, where a model
//! has their float forms).
//!
//! The quantized model names what it came from in its metadata ([`Provenance`]): the source
//! model's sha256, and that of a text model's files, which are copied beside it and checked
//! against it when it is loaded.
//!
//! The model is read and written as ONNX's protobuf messages (`onnx.rs`, generated from ONNX's
//! own `onnx-ml.proto` by `scripts/onnx_proto.sh`).

mod arith;
mod counts;
mod graph;
mod rewrite;

use std::collections::HashSet;
use std::fmt;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::onnx::proto::tensor_proto::{DataLocation, DataType};
use crate::onnx::proto::{GraphProto, ModelProto, StringStringEntryProto, TensorProto};

use crate::onnx::external::ExternalFiles;

/// The quantization batchinfer does: `OPTIONS ('quantize' 'int8')`.
pub const INT8: &str = "int8";
/// How a quantized model's metadata names the method.
pub const METHOD: &str = "dynamic int8 (weights per channel in 7 bits, activations at run time)";
/// The version of the rewrite, in the warehouse's key of a quantized model: a change in what it
/// writes makes a new key, never a reuse of the former rewrite's files.
pub const VERSION: &str = "v3";

/// The fewest rows (inputs summed per output) a weight needs to be quantized.
pub const MIN_INNER: usize = 16;

/// The metadata keys of a quantized model.
const KEY_METHOD: &str = "batchinfer.quantization";
const KEY_FROM: &str = "batchinfer.quantized_from";
const KEY_NODES: &str = "batchinfer.quantized_nodes";
const KEY_TEXT: &str = "batchinfer.text_files_sha256";

/// Operators that mean a model is quantized already.
const QUANTIZED_OPS: &[&str] = &[
    "MatMulInteger",
    "ConvInteger",
    "DynamicQuantizeLinear",
    "QuantizeLinear",
    "DequantizeLinear",
    "QLinearMatMul",
    "QLinearConv",
    "QGemm",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QAttention",
    "QEmbedLayerNormalization",
    "DynamicQuantizeLSTM",
    "MatMulNBits",
];

/// What a quantized model came from and what was done to it, as its metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// [`METHOD`].
    pub method: String,
    /// The sha256 of the source model (as batchinfer computes a model's: with its external data).
    pub from_sha256: String,
    /// What was quantized: `18 of 24 MatMul, 3 Gather`.
    pub nodes: String,
    /// For a text model, the digest of the files beside it ([`text_digest`]).
    pub text_sha256: Option<String>,
}

impl Provenance {
    /// The provenance in a model's metadata (`key -> value`), when it is a quantized model of
    /// batchinfer's.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Option<Provenance> {
        Some(Provenance {
            method: get(KEY_METHOD)?,
            from_sha256: get(KEY_FROM)?,
            nodes: get(KEY_NODES).unwrap_or_default(),
            text_sha256: get(KEY_TEXT),
        })
    }
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from sha256 {}", self.method, self.from_sha256)
    }
}

/// The digest of a text model's files (name and bytes of each, in the order given), or `None`
/// when there are none.
pub fn text_digest(files: &[(&str, Vec<u8>)]) -> Option<String> {
    if files.is_empty() {
        return None;
    }
    let mut digest = Sha256::new();
    for (name, bytes) in files {
        digest.update(name.as_bytes());
        digest.update((bytes.len() as u64).to_le_bytes());
        digest.update(bytes);
    }
    Some(hex::encode(digest.finalize()))
}

/// What [`quantize`] made: the model's bytes and what it changed.
#[derive(Debug)]
pub struct Quantized {
    pub bytes: Vec<u8>,
    pub provenance: Provenance,
}

/// Quantizes the model `bytes` (with its external data `files`, which the quantized model
/// holds inline); `sha256` is the source model's and `text_sha256` the digest of its text
/// files, recorded in the result.
pub fn quantize(
    bytes: &[u8],
    files: &ExternalFiles,
    sha256: &str,
    text_sha256: Option<&str>,
) -> crate::error::Result<Quantized> {
    let mut model = ModelProto::decode(bytes).map_err(|e| {
        crate::error::Error::ModelFile(format!("it is not a readable ONNX model: {e}"))
    })?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("" | "ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(0);
    // Models of IR version 3 list every initializer among the graph's inputs.
    let inputs_are_constant = model.ir_version.unwrap_or(0) < 4;
    let graph = model
        .graph
        .as_mut()
        .ok_or_else(|| crate::error::Error::ModelFile("it has no graph".to_string()))?;
    check_not_quantized(graph)?;
    if opset < 11 {
        return Err(crate::error::Error::ModelFile(format!(
            "its ONNX opset is {opset}; int8 quantization needs opset 11 or later \
             (DynamicQuantizeLinear): export it with a newer opset"
        )));
    }
    inline_external(graph, files)?;
    let mut rewrite = rewrite::Rewrite::new(graph, inputs_are_constant);
    for node in std::mem::take(&mut graph.node) {
        rewrite.node(node, graph);
    }
    let counts = &rewrite.counts;
    if counts.matmul_done + counts.gemm_done + counts.attention_done == 0 {
        return Err(crate::error::Error::ModelFile(format!(
            "nothing in it can be quantized: {}",
            rewrite.counts.why_none()
        )));
    }
    graph.node = std::mem::take(&mut rewrite.nodes);
    graph.initializer.append(&mut rewrite.initializers);
    remove_replaced(graph, &rewrite.replaced);
    let provenance = Provenance {
        method: METHOD.to_string(),
        from_sha256: sha256.to_string(),
        nodes: rewrite.counts.text(),
        text_sha256: text_sha256.map(str::to_string),
    };
    record(&mut model, &provenance);
    let bytes = model.encode_to_vec();
    if bytes.len() as u64 >= crate::onnx::MODEL_CAP {
        return Err(crate::error::Error::ModelFile(format!(
            "the quantized model would be {} bytes, over ONNX's 2 GiB for one file",
            bytes.len()
        )));
    }
    if let Some(location) = crate::onnx::external::locations(&bytes)?.first() {
        return Err(crate::error::Error::ModelFile(format!(
            "it keeps data in '{location}' for a tensor int8 quantization does not read (a \
             sparse tensor, a function or training information)"
        )));
    }
    Ok(Quantized { bytes, provenance })
}

/// Records `provenance` in the model's metadata, in place of any batchinfer put there before.
fn record(model: &mut ModelProto, provenance: &Provenance) {
    model.metadata_props.retain(|p| {
        !p.key
            .as_deref()
            .is_some_and(|k| k.starts_with("batchinfer."))
    });
    let mut metadata = vec![
        (KEY_METHOD, provenance.method.clone()),
        (KEY_FROM, provenance.from_sha256.clone()),
        (KEY_NODES, provenance.nodes.clone()),
    ];
    metadata.extend(provenance.text_sha256.clone().map(|t| (KEY_TEXT, t)));
    for (key, value) in metadata {
        model.metadata_props.push(StringStringEntryProto {
            key: Some(key.to_string()),
            value: Some(value),
        });
    }
}

/// Refuses a model that is quantized already: int8 operators, or weights kept in 8-bit integers
/// that the graph turns into floats itself (`Cast`).
fn check_not_quantized(graph: &GraphProto) -> crate::error::Result<()> {
    let quantized_ops: Vec<&str> = graph
        .node
        .iter()
        .filter_map(|n| {
            let op = n.op_type.as_deref().unwrap_or("");
            QUANTIZED_OPS.iter().find(|q| **q == op).copied()
        })
        .collect();
    if let Some(op) = quantized_ops.first() {
        return Err(crate::error::Error::ModelFile(format!(
            "it is quantized already: it has {} quantized operator(s) ({op}, ...); use it as it \
             is, without OPTIONS ('quantize' ...)",
            quantized_ops.len()
        )));
    }
    let cast: HashSet<&str> = graph
        .node
        .iter()
        .filter(|n| n.op_type.as_deref() == Some("Cast"))
        .flat_map(|n| n.input.iter().map(String::as_str))
        .collect();
    let int8 = [DataType::Int8 as i32, DataType::Uint8 as i32];
    let weights = graph
        .initializer
        .iter()
        .filter(|t| {
            t.data_type.is_some_and(|d| int8.contains(&d))
                && t.dims.len() >= 2
                && t.dims.iter().product::<i64>() >= 1024
                && t.name.as_deref().is_some_and(|n| cast.contains(n))
        })
        .count();
    if weights > 0 {
        return Err(crate::error::Error::ModelFile(format!(
            "it is quantized already: it keeps {weights} weight(s) in 8-bit integers; use it as \
             it is, without OPTIONS ('quantize' ...)"
        )));
    }
    Ok(())
}

/// Moves the values of initializers kept in external files into the model itself (the
/// quantized model is one file).
fn inline_external(graph: &mut GraphProto, files: &ExternalFiles) -> crate::error::Result<()> {
    let mut result = Ok(());
    for_each_tensor(graph, &mut |tensor| {
        if result.is_err() || tensor.data_location != Some(DataLocation::External as i32) {
            return;
        }
        let entry = |key: &str| {
            tensor
                .external_data
                .iter()
                .find(|e| e.key.as_deref() == Some(key))
                .and_then(|e| e.value.clone())
        };
        let location = entry("location").unwrap_or_default();
        let number = |key: &str| entry(key).map(|v| v.parse::<usize>().map_err(|_| v));
        let (offset, length) = match (number("offset"), number("length")) {
            (Some(Err(v)), _) | (_, Some(Err(v))) => {
                result = Err(crate::error::Error::ModelFile(format!(
                    "a tensor's external data in '{location}' has the offset or length '{v}'"
                )));
                return;
            }
            (offset, length) => (offset.map_or(0, Result::unwrap_or_default), length),
        };
        let Some((_, data)) = files.iter().find(|(name, _)| *name == location) else {
            result = Err(crate::error::Error::ModelFile(format!(
                "its external data file '{location}' was not read"
            )));
            return;
        };
        let end = match length {
            Some(length) => length.ok().and_then(|l| offset.checked_add(l)),
            None => Some(data.len()),
        };
        let Some(slice) = end.and_then(|end| data.get(offset..end)) else {
            result = Err(crate::error::Error::ModelFile(format!(
                "a tensor's data is outside its external data file '{location}' ({} bytes)",
                data.len()
            )));
            return;
        };
        tensor.raw_data = Some(slice.to_vec());
        tensor.external_data.clear();
        tensor.data_location = None;
    });
    result
}

/// Calls `f` on every tensor of `graph`: its initializers and the tensors of its nodes'
/// attributes, in subgraphs too.
fn for_each_tensor(graph: &mut GraphProto, f: &mut impl FnMut(&mut TensorProto)) {
    graph.initializer.iter_mut().for_each(&mut *f);
    for node in &mut graph.node {
        for attribute in &mut node.attribute {
            attribute.t.iter_mut().for_each(&mut *f);
            attribute.tensors.iter_mut().for_each(&mut *f);
            for g in attribute.g.iter_mut().chain(attribute.graphs.iter_mut()) {
                for_each_tensor(g, f);
            }
        }
    }
}

/// Calls `f` on `graph` and on every subgraph in it (of If, Loop and Scan nodes), depth first,
/// saying whether it is a subgraph.
fn visit_graphs(graph: &GraphProto, subgraph: bool, f: &mut impl FnMut(&GraphProto, bool)) {
    f(graph, subgraph);
    for node in &graph.node {
        for attribute in &node.attribute {
            for g in attribute.g.iter().chain(&attribute.graphs) {
                visit_graphs(g, true, f);
            }
        }
    }
}

/// Every name a node of `graph` (or of its subgraphs) reads, with the subgraphs' outputs.
fn names_read(graph: &GraphProto, read: &mut HashSet<String>) {
    visit_graphs(graph, false, &mut |g, subgraph| {
        read.extend(g.node.iter().flat_map(|n| n.input.iter().cloned()));
        if subgraph {
            read.extend(g.output.iter().filter_map(|o| o.name.clone()));
        }
    });
}

/// Drops the float initializers that were quantized and that nothing reads any more (a
/// subgraph or a node left in float may still read one).
fn remove_replaced(graph: &mut GraphProto, replaced: &HashSet<String>) {
    let mut read = HashSet::new();
    names_read(graph, &mut read);
    read.extend(graph.output.iter().filter_map(|o| o.name.clone()));
    let removed = |name: &Option<String>| {
        name.as_ref()
            .is_some_and(|n| replaced.contains(n) && !read.contains(n))
    };
    graph.initializer.retain(|t| !removed(&t.name));
    graph.input.retain(|i| !removed(&i.name));
    graph.value_info.retain(|i| !removed(&i.name));
}

/// The provenance recorded in an ONNX model's bytes, if batchinfer quantized it.
pub fn provenance_of(bytes: &[u8]) -> Option<Provenance> {
    let model = ModelProto::decode(bytes).ok()?;
    let get = |key: &str| {
        model
            .metadata_props
            .iter()
            .find(|p| p.key.as_deref() == Some(key))
            .and_then(|p| p.value.clone())
    };
    Provenance::from_metadata(get)
}

#[cfg(test)]
mod tests;
