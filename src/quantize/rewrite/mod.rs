//! The rewrite of a graph's nodes: each MatMul, Gemm and Gather that can be quantized replaced
//! by its int8 form, in place (the graph stays in topological order), the other nodes kept.

use std::collections::{HashMap, HashSet};

use super::MIN_INNER;

mod gather;
pub use super::counts::{Counts, Left};
use super::graph::{attribute, floats, names_used};
pub use super::graph::{f32_bytes, node, tensor};

/// ONNX Runtime's operator domain.
const MICROSOFT: &str = "com.microsoft";
use super::arith::{quantize_columns, quantize_table};
use crate::onnx::proto::attribute_proto::AttributeType;
use crate::onnx::proto::tensor_proto::DataType;
use crate::onnx::proto::{AttributeProto, GraphProto, NodeProto, TensorProto};

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
}
