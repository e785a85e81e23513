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
//! - `Gather` from a constant float table (an embedding): the table becomes uint8 (one scale and
//!   zero point), followed by `DequantizeLinear`: a quarter of the size, the same speed.
//!
//! The arithmetic is ONNX Runtime's (`quant_utils.compute_scale_zp`, `quantize_nparray`): the
//! same scales, zero points and rounding (half to even), so a model quantized here and one
//! quantized by Python's `quantize_dynamic(per_channel=True, weight_type=QInt8)` hold the same
//! weights. Only operators of ONNX's standard domain are written.
//!
//! The quantized model names what it came from in its metadata ([`Provenance`]), so any process
//! that loads it can say so (`DESCRIBE MODEL`, the output files' metadata).
//!
//! The model is read and written as ONNX's protobuf messages (`onnx.rs`, generated from ONNX's
//! own `onnx-ml.proto` by `scripts/onnx_proto.sh`).

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod onnx;

use std::collections::{HashMap, HashSet};
use std::fmt;

use prost::Message;

use onnx::tensor_proto::{DataLocation, DataType};
use onnx::{
    AttributeProto, GraphProto, ModelProto, NodeProto, StringStringEntryProto, TensorProto,
    attribute_proto::AttributeType,
};

use crate::model::external::ExternalFiles;

/// The quantization batchinfer does: `OPTIONS ('quantize' 'int8')`.
pub const INT8: &str = "int8";
/// How a quantized model's metadata names the method.
pub const METHOD: &str = "dynamic int8 (weights per channel, activations at run time)";

/// The fewest rows (inputs summed per output) a weight needs to be quantized.
pub const MIN_INNER: usize = 16;

/// The metadata keys of a quantized model.
const KEY_METHOD: &str = "batchinfer.quantization";
const KEY_FROM: &str = "batchinfer.quantized_from";
const KEY_SOURCE: &str = "batchinfer.quantized_source";
const KEY_NODES: &str = "batchinfer.quantized_nodes";

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

/// Where a quantized model came from and what was done to it, as its metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// [`METHOD`].
    pub method: String,
    /// The sha256 of the source model (as batchinfer computes a model's: with its external data).
    pub from_sha256: String,
    /// Where the source model was read.
    pub source: String,
    /// What was quantized: `18 of 24 MatMul, 3 Gather`.
    pub nodes: String,
}

impl Provenance {
    /// The provenance in a model's metadata (`key -> value`), when it is a quantized model of
    /// batchinfer's.
    pub fn from_metadata(get: impl Fn(&str) -> Option<String>) -> Option<Provenance> {
        Some(Provenance {
            method: get(KEY_METHOD)?,
            from_sha256: get(KEY_FROM)?,
            source: get(KEY_SOURCE).unwrap_or_default(),
            nodes: get(KEY_NODES).unwrap_or_default(),
        })
    }
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} from sha256 {}", self.method, self.from_sha256)
    }
}

/// What [`quantize`] made: the model's bytes and what it changed.
#[derive(Debug)]
pub struct Quantized {
    pub bytes: Vec<u8>,
    pub provenance: Provenance,
}

/// Nodes counted while quantizing.
#[derive(Debug, Default)]
struct Counts {
    matmul: usize,
    matmul_done: usize,
    gemm: usize,
    gemm_done: usize,
    gather_done: usize,
}

impl Counts {
    fn text(&self) -> String {
        let mut parts = vec![format!("{} of {} MatMul", self.matmul_done, self.matmul)];
        if self.gemm > 0 {
            parts.push(format!("{} of {} Gemm", self.gemm_done, self.gemm));
        }
        if self.gather_done > 0 {
            parts.push(format!("{} Gather", self.gather_done));
        }
        parts.join(", ")
    }
}

/// Quantizes the model `bytes` (with its external data `files`, which the quantized model
/// holds inline); `sha256` and `source` are the source model's, recorded in the result.
pub fn quantize(
    bytes: &[u8],
    files: &ExternalFiles,
    sha256: &str,
    source: &str,
) -> Result<Quantized, String> {
    let mut model =
        ModelProto::decode(bytes).map_err(|e| format!("it is not a readable ONNX model: {e}"))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("" | "ai.onnx")))
        .and_then(|o| o.version)
        .unwrap_or(0);
    let graph = model.graph.as_mut().ok_or("it has no graph")?;
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
    // Weights stored in int8 and dequantized by the graph's own float operators (Cast, Mul):
    // quantized by whoever exported it.
    let int8_weights = graph
        .initializer
        .iter()
        .filter(|t| {
            let elements = t.dims.iter().product::<i64>();
            let int8 = [DataType::Int8 as i32, DataType::Uint8 as i32];
            t.data_type.is_some_and(|d| int8.contains(&d)) && t.dims.len() >= 2 && elements >= 1024
        })
        .count();
    if int8_weights > 0 {
        return Err(format!(
            "it is quantized already: it keeps {int8_weights} weight(s) in 8-bit integers; use \
             it as it is, without OPTIONS ('quantize' ...)"
        ));
    }
    if opset < 11 {
        return Err(format!(
            "its ONNX opset is {opset}; int8 quantization needs opset 11 or later \
             (DynamicQuantizeLinear): export it with a newer opset"
        ));
    }
    inline_external(graph, files)?;
    let mut rewrite = Rewrite::new(graph);
    let nodes = std::mem::take(&mut graph.node);
    for node in nodes {
        rewrite.node(node, graph);
    }
    let counts = std::mem::take(&mut rewrite.counts);
    if counts.matmul_done + counts.gemm_done == 0 {
        return Err(format!(
            "nothing in it can be quantized: it has {} MatMul and {} Gemm node(s), none with a \
             constant float weight of two dimensions and at least {MIN_INNER} rows (int8 \
             quantization speeds up those)",
            counts.matmul, counts.gemm
        ));
    }
    graph.node = rewrite.nodes;
    graph.initializer.extend(rewrite.initializers);
    remove_unused_initializers(graph);
    let provenance = Provenance {
        method: METHOD.to_string(),
        from_sha256: sha256.to_string(),
        source: source.to_string(),
        nodes: counts.text(),
    };
    model.metadata_props.retain(|p| {
        !p.key
            .as_deref()
            .is_some_and(|k| k.starts_with("batchinfer."))
    });
    for (key, value) in [
        (KEY_METHOD, &provenance.method),
        (KEY_FROM, &provenance.from_sha256),
        (KEY_SOURCE, &provenance.source),
        (KEY_NODES, &provenance.nodes),
    ] {
        model.metadata_props.push(StringStringEntryProto {
            key: Some(key.to_string()),
            value: Some(value.clone()),
        });
    }
    let bytes = model.encode_to_vec();
    if bytes.len() as u64 >= crate::model::source::MODEL_CAP {
        return Err(format!(
            "the quantized model would be {} bytes, over ONNX's 2 GiB for one file",
            bytes.len()
        ));
    }
    Ok(Quantized { bytes, provenance })
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
        let offset: usize = entry("offset").and_then(|v| v.parse().ok()).unwrap_or(0);
        let Some((_, data)) = files.iter().find(|(name, _)| *name == location) else {
            result = Err(format!("its external data file '{location}' was not read"));
            return;
        };
        let end = match entry("length").and_then(|v| v.parse::<usize>().ok()) {
            Some(length) => offset.checked_add(length),
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

/// Every name a node of `graph` (or of its subgraphs) reads.
fn names_read(graph: &GraphProto, read: &mut HashSet<String>) {
    for node in &graph.node {
        read.extend(node.input.iter().cloned());
        for attribute in &node.attribute {
            for g in attribute.g.iter().chain(attribute.graphs.iter()) {
                names_read(g, read);
                read.extend(g.output.iter().filter_map(|o| o.name.clone()));
            }
        }
    }
}

/// Drops the initializers nothing reads any more (the float weights that were quantized), with
/// their entries among the graph's inputs and value infos.
fn remove_unused_initializers(graph: &mut GraphProto) {
    let mut read = HashSet::new();
    names_read(graph, &mut read);
    read.extend(graph.output.iter().filter_map(|o| o.name.clone()));
    let mut removed = HashSet::new();
    graph.initializer.retain(|t| {
        let name = t.name.clone().unwrap_or_default();
        let keep = read.contains(&name);
        if !keep {
            removed.insert(name);
        }
        keep
    });
    let unused = |name: &Option<String>| name.as_ref().is_some_and(|n| removed.contains(n));
    graph.input.retain(|i| !unused(&i.name));
    graph.value_info.retain(|i| !unused(&i.name));
}

/// The float values of a FLOAT tensor, when it holds them (inline).
fn floats(tensor: &TensorProto) -> Option<Vec<f32>> {
    if tensor.data_type != Some(DataType::Float as i32) {
        return None;
    }
    let count = tensor
        .dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))?;
    let values: Vec<f32> = match &tensor.raw_data {
        Some(raw) => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        None => tensor.float_data.clone(),
    };
    (values.len() == count && values.iter().all(|v| v.is_finite())).then_some(values)
}

fn tensor(name: &str, data_type: DataType, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        data_type: Some(data_type as i32),
        dims: dims.to_vec(),
        raw_data: Some(raw),
        ..Default::default()
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.to_string()),
        name: Some(name.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        domain: Some(String::new()),
        ..Default::default()
    }
}

fn int_attribute(node: &NodeProto, name: &str, default: i64) -> i64 {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .and_then(|a| a.i)
        .unwrap_or(default)
}

fn float_attribute(node: &NodeProto, name: &str, default: f32) -> f32 {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .and_then(|a| a.f)
        .unwrap_or(default)
}

/// Symmetric int8 per output column of `w [k, n]` (row-major): the weights and one scale per
/// column, as ONNX Runtime computes them (the range in f64, the scale kept as f32; values
/// rounded half to even).
pub fn quantize_columns(w: &[f32], k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scales = vec![0f32; n];
    for (j, scale) in scales.iter_mut().enumerate() {
        let absmax = (0..k).map(|r| w[r * n + j].abs()).fold(0f32, f32::max);
        let range = 2.0 * f64::from(absmax) / 254.0;
        *scale = if range < f64::from(f32::MIN_POSITIVE) {
            1.0
        } else {
            range as f32
        };
    }
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| (v / scales[i % n]).round_ties_even().clamp(-128.0, 127.0) as i8)
        .collect();
    (q, scales)
}

/// Asymmetric uint8 over the whole tensor (an embedding table): the values, the scale and the
/// zero point, as ONNX Runtime computes them for a uint8 activation type.
pub fn quantize_table(values: &[f32]) -> (Vec<u8>, f32, u8) {
    let rmin = values.iter().copied().fold(0f32, f32::min);
    let rmax = values.iter().copied().fold(0f32, f32::max);
    let range = (f64::from(rmax) - f64::from(rmin)) / 255.0;
    let (scale, zero) = if range < f64::from(f32::MIN_POSITIVE) {
        (1f32, 0u8)
    } else {
        let zero = (0.0 - f64::from(rmin) / range)
            .round_ties_even()
            .clamp(0.0, 255.0);
        (range as f32, zero as u8)
    };
    let q = values
        .iter()
        .map(|&v| ((v / scale).round_ties_even() + f32::from(zero)).clamp(0.0, 255.0) as u8)
        .collect();
    (q, scale, zero)
}

/// The quantized weight of a MatMul or Gemm: names of its int8 values, scales and zero points.
#[derive(Clone)]
struct Weight {
    values: String,
    scales: String,
    zeros: String,
}

/// The rewrite of one graph's nodes, in order.
struct Rewrite {
    /// Every name in use (values and nodes), so that new ones never clash.
    names: HashSet<String>,
    /// Float initializers by name: index into the graph's initializers.
    constants: HashMap<String, usize>,
    /// Activations quantized already: name -> (values, scale, zero point).
    activations: HashMap<String, (String, String, String)>,
    /// Weights quantized already (a weight read by several nodes is quantized once), by the
    /// name of the float weight and whether it was transposed (Gemm's `transB`) and scaled.
    weights: HashMap<(String, bool, u32), Weight>,
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    counts: Counts,
}

impl Rewrite {
    fn new(graph: &GraphProto) -> Self {
        let mut names = HashSet::new();
        for node in &graph.node {
            names.extend(node.input.iter().cloned());
            names.extend(node.output.iter().cloned());
            names.extend(node.name.clone());
        }
        for info in graph
            .input
            .iter()
            .chain(&graph.output)
            .chain(&graph.value_info)
        {
            names.extend(info.name.clone());
        }
        let constants = graph
            .initializer
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((t.name.clone()?, i)))
            .collect::<HashMap<_, _>>();
        names.extend(constants.keys().cloned());
        // An initializer that is also a graph input can be fed another value: not a constant.
        let mut constants = constants;
        for input in &graph.input {
            if let Some(name) = &input.name {
                constants.remove(name);
            }
        }
        Rewrite {
            names,
            constants,
            activations: HashMap::new(),
            weights: HashMap::new(),
            nodes: Vec::new(),
            initializers: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// A name starting with `base` that nothing uses yet.
    fn name(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut n = 1;
        while !self.names.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        name
    }

    fn constant<'g>(&self, graph: &'g GraphProto, name: &str) -> Option<&'g TensorProto> {
        self.constants.get(name).map(|&i| &graph.initializer[i])
    }

    fn node(&mut self, node: NodeProto, graph: &GraphProto) {
        let standard = matches!(node.domain.as_deref(), None | Some("" | "ai.onnx"));
        let op = node.op_type.clone().unwrap_or_default();
        let done = match (standard, op.as_str()) {
            (true, "MatMul") => {
                self.counts.matmul += 1;
                let done = self.matmul(&node, graph);
                self.counts.matmul_done += usize::from(done);
                done
            }
            (true, "Gemm") => {
                self.counts.gemm += 1;
                let done = self.gemm(&node, graph);
                self.counts.gemm_done += usize::from(done);
                done
            }
            (true, "Gather") => {
                let done = self.gather(&node, graph);
                self.counts.gather_done += usize::from(done);
                done
            }
            _ => false,
        };
        if !done {
            self.nodes.push(node);
        }
    }

    /// The activation `name` quantized to uint8 at run time (one DynamicQuantizeLinear per
    /// tensor).
    fn activation(&mut self, name: &str) -> (String, String, String) {
        if let Some(found) = self.activations.get(name) {
            return found.clone();
        }
        let values = self.name(&format!("{name}_quantized"));
        let scale = self.name(&format!("{name}_scale"));
        let zero = self.name(&format!("{name}_zero_point"));
        let node_name = self.name(&format!("{name}_QuantizeLinear"));
        self.nodes.push(node(
            "DynamicQuantizeLinear",
            &node_name,
            &[name],
            &[&values, &scale, &zero],
        ));
        let found = (values, scale, zero);
        self.activations.insert(name.to_string(), found.clone());
        found
    }

    /// The int8 weight of `name` ([k, n] after an optional transposition), with its scales
    /// multiplied by `alpha`; `None` when it is not a constant float matrix.
    fn weight(
        &mut self,
        graph: &GraphProto,
        name: &str,
        transpose: bool,
        alpha: f32,
    ) -> Option<Weight> {
        let float = self.constant(graph, name)?;
        let [rows, cols] = float.dims[..] else {
            return None;
        };
        let (rows, cols) = (usize::try_from(rows).ok()?, usize::try_from(cols).ok()?);
        let key = (name.to_string(), transpose, alpha.to_bits());
        let (k, n) = if transpose {
            (cols, rows)
        } else {
            (rows, cols)
        };
        if k < MIN_INNER {
            return None;
        }
        if let Some(found) = self.weights.get(&key) {
            return Some(found.clone());
        }
        let mut values = floats(float)?;
        if transpose {
            let mut t = vec![0f32; values.len()];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = values[r * cols + c];
                }
            }
            values = t;
        }
        let (q, mut scales) = quantize_columns(&values, k, n);
        if alpha != 1.0 {
            scales.iter_mut().for_each(|s| *s *= alpha);
        }
        let base = if transpose {
            format!("{name}_transposed")
        } else {
            name.to_string()
        };
        let weight = Weight {
            values: self.name(&format!("{base}_quantized")),
            scales: self.name(&format!("{base}_scale")),
            zeros: self.name(&format!("{base}_zero_point")),
        };
        let dims = [k as i64, n as i64];
        let q = q.into_iter().map(|v| v as u8).collect();
        self.initializers
            .push(tensor(&weight.values, DataType::Int8, &dims, q));
        self.initializers.push(tensor(
            &weight.scales,
            DataType::Float,
            &[n as i64],
            f32_bytes(&scales),
        ));
        self.initializers.push(tensor(
            &weight.zeros,
            DataType::Int8,
            &[n as i64],
            vec![0; n],
        ));
        self.weights.insert(key, weight.clone());
        Some(weight)
    }

    /// `input x weight` in int8, scaled back to float into `output`.
    fn integer_matmul(&mut self, node_name: &str, input: &str, weight: &Weight, output: &str) {
        let (a, a_scale, a_zero) = self.activation(input);
        let product = self.name(&format!("{output}_int32"));
        let float = self.name(&format!("{output}_float"));
        let scales = self.name(&format!("{output}_scales"));
        let names = [
            self.name(&format!("{node_name}_quant")),
            self.name(&format!("{node_name}_cast")),
            self.name(&format!("{node_name}_scales_mul")),
            self.name(&format!("{node_name}_output_scale_mul")),
        ];
        self.nodes.push(node(
            "MatMulInteger",
            &names[0],
            &[&a, &weight.values, &a_zero, &weight.zeros],
            &[&product],
        ));
        let mut cast = node("Cast", &names[1], &[&product], &[&float]);
        cast.attribute.push(AttributeProto {
            name: Some("to".to_string()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(DataType::Float as i64),
            ..Default::default()
        });
        self.nodes.push(cast);
        self.nodes.push(node(
            "Mul",
            &names[2],
            &[&a_scale, &weight.scales],
            &[&scales],
        ));
        self.nodes
            .push(node("Mul", &names[3], &[&float, &scales], &[output]));
    }

    fn matmul(&mut self, node: &NodeProto, graph: &GraphProto) -> bool {
        let [input, b] = &node.input[..] else {
            return false;
        };
        if self.constants.contains_key(input) {
            return false;
        }
        let Some(weight) = self.weight(graph, b, false, 1.0) else {
            return false;
        };
        let name = node.name.clone().unwrap_or_else(|| node.output[0].clone());
        self.integer_matmul(&name, input, &weight, &node.output[0]);
        true
    }

    fn gemm(&mut self, gemm: &NodeProto, graph: &GraphProto) -> bool {
        let (Some(input), Some(b)) = (gemm.input.first(), gemm.input.get(1)) else {
            return false;
        };
        let c = gemm.input.get(2).filter(|c| !c.is_empty());
        if int_attribute(gemm, "transA", 0) != 0 || self.constants.contains_key(input) {
            return false;
        }
        let transpose = int_attribute(gemm, "transB", 0) != 0;
        let alpha = float_attribute(gemm, "alpha", 1.0);
        let beta = float_attribute(gemm, "beta", 1.0);
        let Some(weight) = self.weight(graph, b, transpose, alpha) else {
            return false;
        };
        // C times beta, as a constant when C is one.
        let bias = match c {
            None => None,
            Some(c) if beta == 1.0 => Some(c.clone()),
            Some(c) => match self.constant(graph, c).and_then(floats) {
                Some(values) => {
                    let dims = self.constant(graph, c).map(|t| t.dims.clone());
                    let scaled: Vec<f32> = values.iter().map(|v| v * beta).collect();
                    let name = self.name(&format!("{c}_beta"));
                    self.initializers.push(tensor(
                        &name,
                        DataType::Float,
                        &dims.unwrap_or_default(),
                        f32_bytes(&scaled),
                    ));
                    Some(name)
                }
                None => {
                    let beta_name = self.name(&format!("{c}_beta_value"));
                    self.initializers.push(tensor(
                        &beta_name,
                        DataType::Float,
                        &[],
                        f32_bytes(&[beta]),
                    ));
                    let scaled = self.name(&format!("{c}_times_beta"));
                    let mul = self.name(&format!("{c}_beta_mul"));
                    self.nodes
                        .push(node("Mul", &mul, &[c, &beta_name], &[&scaled]));
                    Some(scaled)
                }
            },
        };
        let name = gemm.name.clone().unwrap_or_else(|| gemm.output[0].clone());
        let output = &gemm.output[0];
        match bias {
            None => self.integer_matmul(&name, input, &weight, output),
            Some(bias) => {
                let product = self.name(&format!("{output}_product"));
                self.integer_matmul(&name, input, &weight, &product);
                let add = self.name(&format!("{name}_bias_add"));
                self.nodes
                    .push(node("Add", &add, &[&product, &bias], &[output]));
            }
        }
        true
    }

    fn gather(&mut self, gather: &NodeProto, graph: &GraphProto) -> bool {
        let [table, indices] = &gather.input[..] else {
            return false;
        };
        let Some(tensor_proto) = self.constant(graph, table) else {
            return false;
        };
        let dims = tensor_proto.dims.clone();
        let Some(values) = floats(tensor_proto) else {
            return false;
        };
        let key = (table.clone(), false, 0);
        let weight = match self.weights.get(&key) {
            Some(found) => found.clone(),
            None => {
                let (q, scale, zero) = quantize_table(&values);
                let weight = Weight {
                    values: self.name(&format!("{table}_quantized")),
                    scales: self.name(&format!("{table}_scale")),
                    zeros: self.name(&format!("{table}_zero_point")),
                };
                self.initializers
                    .push(tensor(&weight.values, DataType::Uint8, &dims, q));
                self.initializers.push(tensor(
                    &weight.scales,
                    DataType::Float,
                    &[],
                    f32_bytes(&[scale]),
                ));
                self.initializers
                    .push(tensor(&weight.zeros, DataType::Uint8, &[], vec![zero]));
                self.weights.insert(key, weight.clone());
                weight
            }
        };
        let output = &gather.output[0];
        let quantized = self.name(&format!("{output}_quantized"));
        let mut new = gather.clone();
        new.input = vec![weight.values.clone(), indices.clone()];
        new.output = vec![quantized.clone()];
        self.nodes.push(new);
        let name = self.name(&format!("{output}_DequantizeLinear"));
        self.nodes.push(node(
            "DequantizeLinear",
            &name,
            &[&quantized, &weight.scales, &weight.zeros],
            &[output],
        ));
        true
    }
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
    use super::*;

    #[test]
    fn columns_take_onnx_runtimes_scales_and_rounding() {
        // k = 2, n = 3: column 0 [1, -2], column 1 [0, 0], column 2 [0.5, 0.25].
        let w = [1.0, 0.0, 0.5, -2.0, 0.0, 0.25];
        let (q, scales) = quantize_columns(&w, 2, 3);
        assert_eq!(
            scales,
            [(4.0f64 / 254.0) as f32, 1.0, (1.0f64 / 254.0) as f32]
        );
        assert_eq!(q, [64, 0, 127, -127, 0, 64]);
        // 63.5 rounds to 64 (half to even); -2 / scale is exactly -127.
        let (q, _) = quantize_columns(&[0.5, 1.0], 2, 1);
        assert_eq!(q, [64, 127]);
    }

    #[test]
    fn a_table_takes_a_zero_point_that_represents_zero() {
        let (q, scale, zero) = quantize_table(&[-1.0, 0.0, 3.0]);
        assert_eq!(scale, (4.0f64 / 255.0) as f32);
        assert_eq!(zero, 64);
        assert_eq!(q, [0, 64, 255]);
        // All positive: the range still includes 0.
        let (_, _, zero) = quantize_table(&[1.0, 2.0]);
        assert_eq!(zero, 0);
    }

    fn matmul_model(weight: &[f32], k: i64, n: i64) -> Vec<u8> {
        let mut weight = weight.to_vec();
        weight.resize((k * n) as usize, 0.5);
        let graph = GraphProto {
            node: vec![
                node("MatMul", "mm", &["x", "w"], &["y"]),
                node("MatMul", "mm2", &["y2", "w"], &["z"]),
            ],
            initializer: vec![tensor("w", DataType::Float, &[k, n], f32_bytes(&weight))],
            ..Default::default()
        };
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![onnx::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(graph),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn a_weight_read_twice_is_quantized_once_and_the_float_one_dropped() {
        let bytes = matmul_model(&[1.0, 2.0, 3.0, 4.0], 16, 2);
        let quantized = quantize(&bytes, &Vec::new(), "abc", "w.onnx").unwrap();
        assert_eq!(quantized.provenance.nodes, "2 of 2 MatMul");
        let model = ModelProto::decode(quantized.bytes.as_slice()).unwrap();
        let graph = model.graph.unwrap();
        let names: Vec<_> = graph
            .initializer
            .iter()
            .map(|t| t.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["w_quantized", "w_scale", "w_zero_point"]);
        let ops: Vec<_> = graph
            .node
            .iter()
            .map(|n| n.op_type.clone().unwrap())
            .collect();
        assert_eq!(
            ops.iter().filter(|o| *o == "DynamicQuantizeLinear").count(),
            2
        );
        assert_eq!(ops.iter().filter(|o| *o == "MatMulInteger").count(), 2);
        // The outputs keep their names.
        assert!(graph.node.iter().any(|n| n.output == ["y"]));
        assert_eq!(
            provenance_of(&quantized.bytes).unwrap().from_sha256,
            "abc".to_string()
        );
    }

    #[test]
    fn a_quantized_model_is_refused_and_so_is_one_without_weights() {
        let bytes = matmul_model(&[1.0, 2.0, 3.0, 4.0], 16, 2);
        let once = quantize(&bytes, &Vec::new(), "abc", "w.onnx").unwrap();
        let again = quantize(&once.bytes, &Vec::new(), "def", "w8.onnx").unwrap_err();
        assert!(again.contains("quantized already"), "{again}");
        // A weight of three dimensions is not one int8 matmul takes.
        let bytes = matmul_model(&[1.0; 8], 16, 2);
        let mut model = ModelProto::decode(bytes.as_slice()).unwrap();
        model.graph.as_mut().unwrap().initializer[0].dims = vec![16, 1, 2];
        let err = quantize(&model.encode_to_vec(), &Vec::new(), "x", "x").unwrap_err();
        assert!(err.contains("nothing in it can be quantized"), "{err}");
        // Nor is one of too few rows.
        let bytes = matmul_model(&[1.0; 8], 4, 2);
        let err = quantize(&bytes, &Vec::new(), "x", "x").unwrap_err();
        assert!(err.contains("nothing in it can be quantized"), "{err}");
    }
}
