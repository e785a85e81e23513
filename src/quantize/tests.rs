use super::rewrite::{f32_bytes, node, tensor};
use super::*;
use crate::onnx::proto::{OperatorSetIdProto, ValueInfoProto};

/// A model of `nodes` over the float initializers `weights` (name, rows, columns).
fn model(nodes: Vec<crate::onnx::proto::NodeProto>, weights: &[(&str, i64, i64)]) -> ModelProto {
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
    let again = quantize(&once.bytes, &Vec::new(), "def", None)
        .unwrap_err()
        .to_string();
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
    let err = quantize(&m.encode_to_vec(), &Vec::new(), "x", None)
        .unwrap_err()
        .to_string();
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
    let err = quantize(&m.encode_to_vec(), &Vec::new(), "x", None)
        .unwrap_err()
        .to_string();
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
