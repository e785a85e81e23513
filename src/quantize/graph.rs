//! Pieces of ONNX graphs made and read by the rewrite: tensors, nodes, attributes, the names a
//! graph uses, an initializer's floats.

use std::collections::HashSet;

use crate::onnx::proto::tensor_proto::DataType;
use crate::onnx::proto::{AttributeProto, GraphProto, NodeProto, TensorProto};

use super::counts::Left;

/// Every name a graph and its subgraphs use.
pub(super) fn names_used(graph: &GraphProto, names: &mut HashSet<String>) {
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
pub(super) fn floats(tensor: &TensorProto) -> Result<Vec<f32>, Left> {
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

pub(super) fn attribute<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
}
