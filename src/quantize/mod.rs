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
pub const METHOD: &str = "dynamic int8 (weights per channel, activations at run time)";
/// The version of the rewrite, in the warehouse's key of a quantized model: a change in what it
/// writes makes a new key, never a reuse of the former rewrite's files.
pub const VERSION: &str = "v2";

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
) -> Result<Quantized, String> {
    let mut model =
        ModelProto::decode(bytes).map_err(|e| format!("it is not a readable ONNX model: {e}"))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("" | "ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(0);
    // Models of IR version 3 list every initializer among the graph's inputs.
    let inputs_are_constant = model.ir_version.unwrap_or(0) < 4;
    let graph = model.graph.as_mut().ok_or("it has no graph")?;
    check_not_quantized(graph)?;
    if opset < 11 {
        return Err(format!(
            "its ONNX opset is {opset}; int8 quantization needs opset 11 or later \
             (DynamicQuantizeLinear): export it with a newer opset"
        ));
    }
    inline_external(graph, files)?;
    let mut rewrite = rewrite::Rewrite::new(graph, inputs_are_constant);
    for node in std::mem::take(&mut graph.node) {
        rewrite.node(node, graph);
    }
    let counts = &rewrite.counts;
    if counts.matmul_done + counts.gemm_done + counts.attention_done == 0 {
        return Err(format!(
            "nothing in it can be quantized: {}",
            rewrite.counts.why_none()
        ));
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
    let bytes = model.encode_to_vec();
    if bytes.len() as u64 >= crate::onnx::MODEL_CAP {
        return Err(format!(
            "the quantized model would be {} bytes, over ONNX's 2 GiB for one file",
            bytes.len()
        ));
    }
    if let Some(location) = crate::onnx::external::locations(&bytes)?.first() {
        return Err(format!(
            "it keeps data in '{location}' for a tensor int8 quantization does not read (a \
             sparse tensor, a function or training information)"
        ));
    }
    Ok(Quantized { bytes, provenance })
}

/// Refuses a model that is quantized already: int8 operators, or weights kept in 8-bit integers
/// that the graph turns into floats itself (`Cast`).
fn check_not_quantized(graph: &GraphProto) -> Result<(), String> {
    let quantized_ops: Vec<&str> = graph
        .node
        .iter()
        .filter_map(|n| {
            let op = n.op_type.as_deref().unwrap_or("");
            QUANTIZED_OPS.iter().find(|q| **q == op).copied()
        })
        .collect();
    if let Some(op) = quantized_ops.first() {
        return Err(format!(
            "it is quantized already: it has {} quantized operator(s) ({op}, ...); use it as it \
             is, without OPTIONS ('quantize' ...)",
            quantized_ops.len()
        ));
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
        return Err(format!(
            "it is quantized already: it keeps {weights} weight(s) in 8-bit integers; use it as \
             it is, without OPTIONS ('quantize' ...)"
        ));
    }
    Ok(())
}

/// Moves the values of initializers kept in external files into the model itself (the
/// quantized model is one file).
fn inline_external(graph: &mut GraphProto, files: &ExternalFiles) -> Result<(), String> {
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
                result = Err(format!(
                    "a tensor's external data in '{location}' has the offset or length '{v}'"
                ));
                return;
            }
            (offset, length) => (offset.map_or(0, Result::unwrap_or_default), length),
        };
        let Some((_, data)) = files.iter().find(|(name, _)| *name == location) else {
            result = Err(format!("its external data file '{location}' was not read"));
            return;
        };
        let end = match length {
            Some(length) => length.ok().and_then(|l| offset.checked_add(l)),
            None => Some(data.len()),
        };
        let Some(slice) = end.and_then(|end| data.get(offset..end)) else {
            result = Err(format!(
                "a tensor's data is outside its external data file '{location}' ({} bytes)",
                data.len()
            ));
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
mod tests {
    use super::rewrite::{f32_bytes, node, tensor};
    use super::*;
    use crate::onnx::proto::{OperatorSetIdProto, ValueInfoProto};

    /// A model of `nodes` over the float initializers `weights` (name, rows, columns).
    fn model(
        nodes: Vec<crate::onnx::proto::NodeProto>,
        weights: &[(&str, i64, i64)],
    ) -> ModelProto {
        let initializer = weights
            .iter()
            .map(|&(name, k, n)| {
                let values: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 - 3.0).collect();
                tensor(name, DataType::Float, &[k, n], f32_bytes(&values))
            })
            .collect();
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                node: nodes,
                initializer,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ops(bytes: &[u8]) -> Vec<String> {
        let model = ModelProto::decode(bytes).unwrap();
        model
            .graph
            .unwrap()
            .node
            .iter()
            .map(|n| n.op_type.clone().unwrap())
            .collect()
    }

    fn count(ops: &[String], op: &str) -> usize {
        ops.iter().filter(|o| *o == op).count()
    }

    #[test]
    fn one_activation_is_quantized_once_and_one_weight_once() {
        // Two MatMuls of x (as Q, K and V read one input), one of them and a third sharing w.
        let nodes = vec![
            node("MatMul", "q", &["x", "w"], &["y1"]),
            node("MatMul", "k", &["x", "v"], &["y2"]),
            node("MatMul", "o", &["y2", "w"], &["y3"]),
        ];
        let bytes = model(nodes, &[("w", 16, 4), ("v", 16, 16)]).encode_to_vec();
        let quantized = quantize(&bytes, &Vec::new(), "abc", None).unwrap();
        assert_eq!(quantized.provenance.nodes, "3 of 3 MatMul");
        let ops = ops(&quantized.bytes);
        assert_eq!(count(&ops, "DynamicQuantizeLinear"), 2, "{ops:?}");
        assert_eq!(count(&ops, "MatMulInteger"), 3, "{ops:?}");
        let model = ModelProto::decode(quantized.bytes.as_slice()).unwrap();
        let graph = model.graph.unwrap();
        let mut names: Vec<_> = graph
            .initializer
            .iter()
            .map(|t| t.name.clone().unwrap())
            .collect();
        names.sort();
        // The float weights are gone; each int8 weight is there once.
        assert_eq!(
            names,
            [
                "v_quantized",
                "v_scale",
                "v_zero_point",
                "w_quantized",
                "w_scale",
                "w_zero_point"
            ]
        );
        // The outputs keep their names.
        assert!(graph.node.iter().any(|n| n.output == ["y3"]));
        assert_eq!(provenance_of(&quantized.bytes).unwrap().from_sha256, "abc");
    }

    #[test]
    fn a_weight_fed_as_an_input_or_read_by_a_subgraph_is_kept() {
        // w is also a graph input (a caller may feed another), v is read inside an If.
        let branch = GraphProto {
            node: vec![node("Identity", "i", &["v"], &["z"])],
            output: vec![ValueInfoProto {
                name: Some("z".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut branch_node = node("If", "if", &["c"], &["z_out"]);
        branch_node
            .attribute
            .push(crate::onnx::proto::AttributeProto {
                name: Some("then_branch".into()),
                g: Some(branch.clone()),
                ..Default::default()
            });
        let nodes = vec![
            node("MatMul", "a", &["x", "w"], &["y1"]),
            node("MatMul", "b", &["x", "v"], &["y2"]),
            branch_node,
        ];
        let mut m = model(nodes, &[("w", 16, 4), ("v", 16, 4)]);
        m.graph.as_mut().unwrap().input.push(ValueInfoProto {
            name: Some("w".into()),
            ..Default::default()
        });
        let quantized = quantize(&m.encode_to_vec(), &Vec::new(), "abc", None).unwrap();
        assert_eq!(quantized.provenance.nodes, "1 of 2 MatMul");
        let graph = ModelProto::decode(quantized.bytes.as_slice())
            .unwrap()
            .graph
            .unwrap();
        let names: HashSet<_> = graph
            .initializer
            .iter()
            .map(|t| t.name.clone().unwrap())
            .collect();
        assert!(names.contains("w") && names.contains("v"), "{names:?}");
        assert!(names.contains("v_quantized") && !names.contains("w_quantized"));
        assert_eq!(graph.input.len(), 1);
    }

    #[test]
    fn refusals_say_why() {
        let bytes = model(
            vec![node("MatMul", "a", &["x", "w"], &["y"])],
            &[("w", 16, 2)],
        )
        .encode_to_vec();
        let once = quantize(&bytes, &Vec::new(), "abc", None).unwrap();
        let again = quantize(&once.bytes, &Vec::new(), "def", None).unwrap_err();
        assert!(again.contains("quantized already"), "{again}");
        // Too few rows, three dimensions, NaN, a computed weight.
        let mut m = model(
            vec![
                node("MatMul", "a", &["x", "few"], &["y1"]),
                node("MatMul", "b", &["x", "cube"], &["y2"]),
                node("MatMul", "c", &["x", "nan"], &["y3"]),
                node("MatMul", "d", &["x", "y3"], &["y4"]),
            ],
            &[("few", 4, 2), ("cube", 16, 2), ("nan", 16, 2)],
        );
        let graph = m.graph.as_mut().unwrap();
        graph.initializer[1].dims = vec![16, 1, 2];
        graph.initializer[2].raw_data = Some(f32_bytes(&[f32::NAN; 32]));
        let err = quantize(&m.encode_to_vec(), &Vec::new(), "x", None).unwrap_err();
        assert!(err.starts_with("nothing in it can be quantized"), "{err}");
        for reason in [
            "1 read a weight computed by the graph",
            "1 read a weight that is not a matrix",
            "1 read a weight of fewer than 16 rows",
            "1 read a weight with NaN or infinite values",
        ] {
            assert!(err.contains(reason), "{reason}: {err}");
        }
        // An embedding table alone.
        let m = model(
            vec![node("Gather", "g", &["t", "ids"], &["e"])],
            &[("t", 16, 4)],
        );
        let err = quantize(&m.encode_to_vec(), &Vec::new(), "x", None).unwrap_err();
        assert!(err.contains("smaller, not faster"), "{err}");
    }

    #[test]
    fn fused_nodes_onnx_runtime_has_no_int8_form_for_stay_float() {
        let microsoft = |mut n: crate::onnx::proto::NodeProto| {
            n.domain = Some("com.microsoft".into());
            n
        };
        // An Attention without a bias; an EmbedLayerNormalization with its third output.
        let nodes = vec![
            microsoft(node("Attention", "a", &["x", "w", ""], &["y"])),
            microsoft(node(
                "EmbedLayerNormalization",
                "e",
                &["ids", "", "t", "p", "", "g", "b"],
                &["out", "mask_index", "sum"],
            )),
            node("MatMul", "m", &["out", "w"], &["z"]),
        ];
        let mut m = model(nodes, &[("w", 16, 48), ("t", 16, 16), ("p", 16, 16)]);
        let graph = m.graph.as_mut().unwrap();
        for name in ["g", "b"] {
            graph
                .initializer
                .push(tensor(name, DataType::Float, &[16], f32_bytes(&[1.0; 16])));
        }
        let quantized = quantize(&m.encode_to_vec(), &Vec::new(), "x", None).unwrap();
        assert_eq!(
            quantized.provenance.nodes,
            "1 of 1 MatMul, 0 of 1 Attention"
        );
        let ops = ops(&quantized.bytes);
        assert_eq!(count(&ops, "Attention"), 1, "{ops:?}");
        assert_eq!(count(&ops, "EmbedLayerNormalization"), 1, "{ops:?}");
    }

    /// The weights of the churn MLP's layers of 64 rows are those onnxruntime's own
    /// `quantize_dynamic(per_channel=True, weight_type=QInt8)` wrote (data/make_data.py), byte
    /// for byte; its first layer (7 rows) stays float here.
    #[test]
    fn the_weights_are_those_of_onnx_runtimes_quantizer() {
        let source = std::fs::read("data/models/churn_mlp.onnx").unwrap();
        let python = std::fs::read("data/reference/churn_mlp.int8.onnx").unwrap();
        let ours = quantize(&source, &Vec::new(), "x", None).unwrap();
        assert_eq!(ours.provenance.nodes, "2 of 3 MatMul");
        let initializers = |bytes: &[u8]| -> Vec<TensorProto> {
            ModelProto::decode(bytes)
                .unwrap()
                .graph
                .unwrap()
                .initializer
        };
        let python = initializers(&python);
        let mut compared = 0;
        for ours in initializers(&ours.bytes) {
            let name = ours.name.clone().unwrap();
            if !["_quantized", "_scale", "_zero_point"]
                .iter()
                .any(|s| name.ends_with(s))
            {
                continue;
            }
            let theirs = python
                .iter()
                .find(|t| t.name == ours.name)
                .unwrap_or_else(|| panic!("{name} is not in onnxruntime's model"));
            // The values as little-endian bytes, wherever the file keeps them.
            let bytes = |t: &TensorProto| match &t.raw_data {
                Some(raw) => raw.clone(),
                None if !t.float_data.is_empty() => f32_bytes(&t.float_data),
                None => t.int32_data.iter().map(|&v| v as u8).collect(),
            };
            assert_eq!(
                (&ours.data_type, &ours.dims, bytes(&ours)),
                (&theirs.data_type, &theirs.dims, bytes(theirs)),
                "{name}"
            );
            compared += 1;
        }
        assert_eq!(compared, 6);
    }
}
