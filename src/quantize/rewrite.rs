//! The rewrite of a graph's nodes: each MatMul, Gemm and Gather that can be quantized replaced
//! by its int8 form, in place (the graph stays in topological order), the other nodes kept.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::MIN_INNER;

/// ONNX Runtime's operator domain.
const MICROSOFT: &str = "com.microsoft";
use super::arith::{quantize_columns, quantize_table};
use crate::onnx::proto::attribute_proto::AttributeType;
use crate::onnx::proto::tensor_proto::DataType;
use crate::onnx::proto::{AttributeProto, GraphProto, NodeProto, TensorProto};

/// Why a MatMul or Gemm was left in float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Left {
    NotConstant,
    NotFloat32,
    NotMatrix,
    FewRows,
    NotFinite,
    Unusual,
}

impl Left {
    fn text(self) -> String {
        match self {
            Left::NotConstant => "a weight computed by the graph (not a constant)".into(),
            Left::NotFloat32 => "a weight that is not float32".into(),
            Left::NotMatrix => "a weight that is not a matrix (two dimensions)".into(),
            Left::FewRows => format!("a weight of fewer than {MIN_INNER} rows"),
            Left::NotFinite => "a weight with NaN or infinite values".into(),
            Left::Unusual => {
                "an unusual form (a transposed input, missing inputs or outputs)".into()
            }
        }
    }
}

/// What the rewrite did.
#[derive(Debug, Default)]
pub struct Counts {
    pub matmul: usize,
    pub matmul_done: usize,
    pub gemm: usize,
    pub gemm_done: usize,
    pub gather_done: usize,
    pub embed_done: usize,
    pub attention: usize,
    pub attention_done: usize,
    pub left: BTreeMap<Left, usize>,
}

impl Counts {
    /// `18 of 24 MatMul, 3 Gather`.
    pub fn text(&self) -> String {
        let mut parts = Vec::new();
        if self.matmul > 0 {
            parts.push(format!("{} of {} MatMul", self.matmul_done, self.matmul));
        }
        if self.gemm > 0 {
            parts.push(format!("{} of {} Gemm", self.gemm_done, self.gemm));
        }
        if self.attention > 0 {
            parts.push(format!(
                "{} of {} Attention",
                self.attention_done, self.attention
            ));
        }
        if self.gather_done > 0 {
            parts.push(format!("{} Gather", self.gather_done));
        }
        if self.embed_done > 0 {
            parts.push(format!("{} EmbedLayerNormalization", self.embed_done));
        }
        parts.join(", ")
    }

    /// Why nothing was quantized.
    pub fn why_none(&self) -> String {
        if self.matmul + self.gemm + self.attention == 0 {
            let tables = if self.gather_done + self.embed_done > 0 {
                "; its embedding tables alone would make it smaller, not faster"
            } else {
                ""
            };
            return format!(
                "it has no MatMul, Gemm or Attention node (int8 quantization speeds up those){tables}"
            );
        }
        let reasons: Vec<String> = self
            .left
            .iter()
            .map(|(why, n)| format!("{n} read {}", why.text()))
            .collect();
        format!(
            "of its {} MatMul, {} Gemm and {} Attention node(s), {}",
            self.matmul,
            self.gemm,
            self.attention,
            reasons.join(", ")
        )
    }
}

/// A quantized weight: the names of its 8-bit values, scales and zero points.
#[derive(Clone)]
struct Weight {
    values: String,
    scales: String,
    zeros: String,
}

/// What a quantized weight was made of: a MatMul's or Gemm's matrix (transposed or not, its
/// scales multiplied by Gemm's alpha), or a Gather's table.
#[derive(PartialEq, Eq, Hash)]
enum Key {
    Columns {
        name: String,
        transposed: bool,
        alpha: u32,
    },
    Table(String),
}

/// The rewrite of one graph's nodes, in order.
pub struct Rewrite {
    /// Every name in use (values and nodes, in subgraphs too), so that new ones never clash.
    names: HashSet<String>,
    /// Constant initializers by name: index into the graph's initializers.
    constants: HashMap<String, usize>,
    /// Activations quantized already: name -> (values, scale, zero point).
    activations: HashMap<String, (String, String, String)>,
    /// Weights quantized already: a weight read by several nodes is quantized once.
    weights: HashMap<Key, Weight>,
    /// The float initializers that were quantized (removed once nothing reads them).
    pub replaced: HashSet<String>,
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    pub counts: Counts,
}

/// Every name a graph and its subgraphs use.
fn names_used(graph: &GraphProto, names: &mut HashSet<String>) {
    super::visit_graphs(graph, false, &mut |g, _| {
        for node in &g.node {
            names.extend(node.input.iter().chain(&node.output).cloned());
            names.extend(node.name.clone());
        }
        let infos = g.input.iter().chain(&g.output).chain(&g.value_info);
        names.extend(infos.filter_map(|info| info.name.clone()));
        names.extend(g.initializer.iter().filter_map(|t| t.name.clone()));
    });
}

/// The float values of a tensor: `Err` when it is not float32 or not all finite.
fn floats(tensor: &TensorProto) -> Result<Vec<f32>, Left> {
    if tensor.data_type != Some(DataType::Float as i32) {
        return Err(Left::NotFloat32);
    }
    let count = tensor
        .dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
        .ok_or(Left::NotMatrix)?;
    let values: Vec<f32> = match &tensor.raw_data {
        Some(raw) => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        None => tensor.float_data.clone(),
    };
    if values.len() != count {
        return Err(Left::Unusual);
    }
    if !values.iter().all(|v| v.is_finite()) {
        return Err(Left::NotFinite);
    }
    Ok(values)
}

pub fn tensor(name: &str, data_type: DataType, dims: &[i64], raw: Vec<u8>) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        data_type: Some(data_type as i32),
        dims: dims.to_vec(),
        raw_data: Some(raw),
        ..Default::default()
    }
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.to_string()),
        name: Some(name.to_string()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        domain: Some(String::new()),
        ..Default::default()
    }
}

fn attribute<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
}

impl Rewrite {
    /// A rewrite of `graph`; `inputs_are_constant` for models of IR version 3 and before, whose
    /// initializers are all listed among the graph's inputs.
    pub fn new(graph: &GraphProto, inputs_are_constant: bool) -> Self {
        let mut names = HashSet::new();
        names_used(graph, &mut names);
        let mut constants: HashMap<String, usize> = graph
            .initializer
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((t.name.clone()?, i)))
            .collect();
        // An initializer that is also a graph input can be fed another value: not a constant.
        if !inputs_are_constant {
            for input in &graph.input {
                if let Some(name) = &input.name {
                    constants.remove(name);
                }
            }
        }
        Rewrite {
            names,
            constants,
            activations: HashMap::new(),
            weights: HashMap::new(),
            replaced: HashSet::new(),
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

    /// Rewrites `node` (quantized) or keeps it.
    pub fn node(&mut self, node: NodeProto, graph: &GraphProto) {
        let standard = matches!(node.domain.as_deref(), None | Some("" | "ai.onnx"));
        let op = node.op_type.clone().unwrap_or_default();
        let done = match (standard, op.as_str()) {
            (true, "MatMul") => {
                self.counts.matmul += 1;
                let done = self.matmul(&node, graph);
                self.count(done, |c| &mut c.matmul_done)
            }
            (true, "Gemm") => {
                self.counts.gemm += 1;
                let done = self.gemm(&node, graph);
                self.count(done, |c| &mut c.gemm_done)
            }
            (false, "Attention") if node.domain.as_deref() == Some(MICROSOFT) => {
                self.counts.attention += 1;
                let done = self.attention(&node, graph);
                self.count(done, |c| &mut c.attention_done)
            }
            (true, "Gather") => {
                let done = self.gather(&node, graph);
                self.counts.gather_done += usize::from(done);
                done
            }
            (false, "EmbedLayerNormalization") if node.domain.as_deref() == Some(MICROSOFT) => {
                let done = self.embed_layer_norm(&node, graph);
                self.counts.embed_done += usize::from(done);
                done
            }
            _ => false,
        };
        if !done {
            self.nodes.push(node);
        }
    }

    fn count(&mut self, done: Result<(), Left>, field: fn(&mut Counts) -> &mut usize) -> bool {
        match done {
            Ok(()) => {
                *field(&mut self.counts) += 1;
                true
            }
            Err(why) => {
                *self.counts.left.entry(why).or_default() += 1;
                false
            }
        }
    }

    /// The activation `name` quantized to uint8 as the model runs (one DynamicQuantizeLinear
    /// per tensor, however many nodes read it).
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
    /// multiplied by `alpha`.
    fn weight(
        &mut self,
        graph: &GraphProto,
        name: &str,
        transpose: bool,
        alpha: f32,
    ) -> Result<Weight, Left> {
        let float = self.constant(graph, name).ok_or(Left::NotConstant)?;
        let [rows, cols] = float.dims[..] else {
            return Err(Left::NotMatrix);
        };
        let size = |d: i64| usize::try_from(d).map_err(|_| Left::NotMatrix);
        let (rows, cols) = (size(rows)?, size(cols)?);
        let (k, n) = if transpose {
            (cols, rows)
        } else {
            (rows, cols)
        };
        if k < MIN_INNER {
            return Err(Left::FewRows);
        }
        let key = Key::Columns {
            name: name.to_string(),
            transposed: transpose,
            alpha: alpha.to_bits(),
        };
        if let Some(found) = self.weights.get(&key) {
            return Ok(found.clone());
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
        self.replaced.insert(name.to_string());
        Ok(weight)
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

    fn matmul(&mut self, matmul: &NodeProto, graph: &GraphProto) -> Result<(), Left> {
        let ([input, b], Some(output)) = (&matmul.input[..], matmul.output.first()) else {
            return Err(Left::Unusual);
        };
        if self.constants.contains_key(input) {
            return Err(Left::Unusual);
        }
        let weight = self.weight(graph, b, false, 1.0)?;
        let name = matmul.name.clone().unwrap_or_else(|| output.clone());
        self.integer_matmul(&name, input, &weight, output);
        Ok(())
    }

    fn gemm(&mut self, gemm: &NodeProto, graph: &GraphProto) -> Result<(), Left> {
        let (Some(input), Some(b), Some(output)) =
            (gemm.input.first(), gemm.input.get(1), gemm.output.first())
        else {
            return Err(Left::Unusual);
        };
        let int = |name: &str| attribute(gemm, name).and_then(|a| a.i).unwrap_or(0);
        let float = |name: &str| attribute(gemm, name).and_then(|a| a.f).unwrap_or(1.0);
        if int("transA") != 0 || self.constants.contains_key(input) {
            return Err(Left::Unusual);
        }
        let (alpha, beta) = (float("alpha"), float("beta"));
        let weight = self.weight(graph, b, int("transB") != 0, alpha)?;
        // C times beta: a constant when C is one.
        let bias = match gemm.input.get(2).filter(|c| !c.is_empty()) {
            None => None,
            Some(c) if beta == 1.0 => Some(c.clone()),
            Some(c) => match self.constant(graph, c).map(|t| (t.dims.clone(), floats(t))) {
                Some((dims, Ok(values))) => {
                    self.replaced.insert(c.clone());
                    let scaled: Vec<f32> = values.iter().map(|v| v * beta).collect();
                    let name = self.name(&format!("{c}_beta"));
                    self.initializers.push(tensor(
                        &name,
                        DataType::Float,
                        &dims,
                        f32_bytes(&scaled),
                    ));
                    Some(name)
                }
                _ => {
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
        let name = gemm.name.clone().unwrap_or_else(|| output.clone());
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
        Ok(())
    }

    /// ONNX Runtime's fused self-attention (`com.microsoft` `Attention`: input, the packed Q, K, V
    /// weight [hidden, 3 x hidden], bias, mask, past) as its int8 form `QAttention`, as the Python
    /// quantizer writes it. Inputs beyond the past state (attention biases, lengths) have no
    /// place in `QAttention`: such a node stays float.
    fn attention(&mut self, attention: &NodeProto, graph: &GraphProto) -> Result<(), Left> {
        let (Some(input), Some(w), Some(bias)) = (
            attention.input.first(),
            attention.input.get(1),
            attention.input.get(2),
        ) else {
            return Err(Left::Unusual);
        };
        // The attributes QAttention has (not qkv_hidden_sizes, rotary embeddings, ...).
        let known = ["num_heads", "unidirectional", "mask_filter_value", "scale"];
        let unknown = attention
            .attribute
            .iter()
            .any(|a| !known.contains(&a.name.as_deref().unwrap_or("")));
        if attention.input.len() > 5
            || attention.output.len() > 2
            || bias.is_empty()
            || unknown
            || self.constants.contains_key(input)
        {
            return Err(Left::Unusual);
        }
        let weight = self.weight(graph, w, false, 1.0)?;
        let (a, a_scale, a_zero) = self.activation(input);
        let optional = |i: usize| attention.input.get(i).cloned().unwrap_or_default();
        let (mask, past) = (optional(3), optional(4));
        let mut quantized = attention.clone();
        quantized.op_type = Some("QAttention".to_string());
        let base = attention.name.clone().unwrap_or_else(|| "Attention".into());
        quantized.name = Some(self.name(&format!("{base}_quant")));
        quantized.input = vec![
            a,
            weight.values,
            bias.clone(),
            a_scale,
            weight.scales,
            mask,
            a_zero,
            weight.zeros,
            past,
        ];
        self.nodes.push(quantized);
        Ok(())
    }

    /// The constant float tensor `name` as uint8 (a table: one scale and zero point), once.
    fn table(&mut self, graph: &GraphProto, name: &str) -> Option<Weight> {
        let key = Key::Table(name.to_string());
        if let Some(found) = self.weights.get(&key) {
            return Some(found.clone());
        }
        let float = self.constant(graph, name)?;
        let dims = float.dims.clone();
        let values = floats(float).ok()?;
        let (q, scale, zero) = quantize_table(&values);
        let weight = Weight {
            values: self.name(&format!("{name}_quantized")),
            scales: self.name(&format!("{name}_scale")),
            zeros: self.name(&format!("{name}_zero_point")),
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
        self.replaced.insert(name.to_string());
        Some(weight)
    }

    fn gather(&mut self, gather: &NodeProto, graph: &GraphProto) -> bool {
        let ([table, indices], Some(output)) = (&gather.input[..], gather.output.first()) else {
            return false;
        };
        let Some(weight) = self.table(graph, table) else {
            return false;
        };
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

    /// ONNX Runtime's fused embedding layer (`com.microsoft` `EmbedLayerNormalization`: token,
    /// segment and position tables, then LayerNormalization) as its `QEmbedLayerNormalization`,
    /// every table and the normalization's gamma and beta in uint8, as the Python quantizer
    /// writes it. One with position ids or a mask index type given stays float.
    fn embed_layer_norm(&mut self, embed: &NodeProto, graph: &GraphProto) -> bool {
        let input = |i: usize| embed.input.get(i).cloned().unwrap_or_default();
        let known = embed
            .attribute
            .iter()
            .all(|a| a.name.as_deref() == Some("epsilon"));
        // QEmbedLayerNormalization has no `embedding_sum` output.
        if embed.input.len() < 7 || embed.input.len() > 8 || embed.output.len() > 2 || !known {
            return false;
        }
        let segments = !input(4).is_empty();
        // Word, position, gamma and beta must be constants; the segment table when given.
        let names = [input(2), input(3), input(5), input(6)];
        let usable = |n: &String| self.constant(graph, n).is_some_and(|t| floats(t).is_ok());
        if !names.iter().all(usable) || (segments && !usable(&input(4))) {
            return false;
        }
        let mut tables = Vec::new();
        for (i, name) in [2, 3, 4, 5, 6].into_iter().map(|i| (i, input(i))) {
            if i == 4 && !segments {
                tables.push(None);
                continue;
            }
            match self.table(graph, &name) {
                Some(table) => tables.push(Some(table)),
                None => return false,
            }
        }
        let part = |f: fn(&Weight) -> &String| -> Vec<String> {
            tables
                .iter()
                .map(|t| t.as_ref().map(|t| f(t).clone()).unwrap_or_default())
                .collect()
        };
        let mut quantized = embed.clone();
        quantized.op_type = Some("QEmbedLayerNormalization".to_string());
        let base = embed
            .name
            .clone()
            .unwrap_or_else(|| "EmbedLayerNormalization".into());
        quantized.name = Some(self.name(&format!("{base}_quant")));
        quantized.input = [input(0), input(1)]
            .into_iter()
            .chain(part(|t| &t.values))
            .chain([input(7)])
            .chain(part(|t| &t.scales))
            .chain(part(|t| &t.zeros))
            .collect();
        self.nodes.push(quantized);
        true
    }
}
