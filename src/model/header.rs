//! What a model file says of itself, read from its protobuf without building a session: its
//! inputs and outputs (as declared in the graph) and its metadata. `SHOW MODELS` and `models()`
//! list models this way, so that listing 10,000 models reads 10,000 files and loads none.

use ort::value::TensorElementType as E;

use crate::onnx::outline;
use crate::tensor::signature::TensorSpec;

/// A model's declared interface.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    /// `metadata_props`: key, value.
    pub metadata: Vec<(String, String)>,
}

impl Header {
    /// The metadata value of `key`, if any.
    pub fn metadata(&self, key: &str) -> Option<String> {
        // ONNX Runtime keeps the last of repeated keys.
        self.metadata
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }
}

/// The header of `model` (a serialized `ModelProto`); `None` where it declares something this
/// reader does not describe as ONNX Runtime would (a value that is not a tensor, a tensor
/// without a shape, an element type outside ONNX's first sixteen): the caller then loads the
/// model for its description.
pub fn read(model: &[u8]) -> crate::error::Result<Option<Header>> {
    let model = outline::decode(model)?;
    let Some(graph) = &model.graph else {
        return Err(crate::error::Error::ModelFile(
            "it is not a valid ONNX model (it has no graph)".to_string(),
        ));
    };
    let sparse = graph
        .sparse_initializer
        .iter()
        .filter_map(|s| s.values.as_ref());
    let initializers: Vec<String> = (graph.initializer.iter().chain(sparse))
        .map(|tensor| outline::text(&tensor.name))
        .collect();
    let mut header = Header {
        metadata: (model.metadata_props.iter())
            .map(|entry| (outline::text(&entry.key), outline::text(&entry.value)))
            .collect(),
        ..Header::default()
    };
    for info in &graph.input {
        let Some(spec) = value_info(info) else {
            return Ok(None);
        };
        // An input that is also an initializer has a default: ONNX Runtime does not list it.
        if !initializers.contains(&spec.name) {
            header.inputs.push(spec);
        }
    }
    for info in &graph.output {
        let Some(spec) = value_info(info) else {
            return Ok(None);
        };
        header.outputs.push(spec);
    }
    Ok(Some(header))
}

/// A graph's input or output as a tensor's spec; `None` for anything else.
fn value_info(info: &outline::ValueInfo) -> Option<TensorSpec> {
    let tensor = info.r#type.as_ref()?.tensor_type.as_ref()?;
    let element = element_of(tensor.elem_type?)?;
    let shape = (tensor.shape.as_ref()?.dim.iter())
        // A named dimension, or none, is open.
        .map(|dim| dim.dim_value.filter(|d| *d >= 0).unwrap_or(-1))
        .collect();
    Some(TensorSpec {
        description: format!("{element:?}"),
        name: outline::text(&info.name),
        element: Some(element),
        shape,
    })
}

/// ONNX's `TensorProto.DataType` codes ONNX Runtime's element types stand for.
fn element_of(code: i32) -> Option<E> {
    Some(match code {
        1 => E::Float32,
        2 => E::Uint8,
        3 => E::Int8,
        4 => E::Uint16,
        5 => E::Int16,
        6 => E::Int32,
        7 => E::Int64,
        8 => E::String,
        9 => E::Bool,
        10 => E::Float16,
        11 => E::Float64,
        12 => E::Uint32,
        13 => E::Uint64,
        14 => E::Complex64,
        15 => E::Complex128,
        16 => E::Bfloat16,
        _ => return None,
    })
}

/// What DESCRIBE MODEL says of a model beside its inputs and outputs: who made it, its doc
/// string, the operator sets it needs, and a classifier's class labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct About {
    /// `producer_name` and `producer_version`, as one text ("skl2onnx 1.20.0").
    pub producer: String,
    pub doc_string: String,
    /// Each operator set: domain ("" is ONNX's own, shown as `ai.onnx`) and version.
    pub opsets: Vec<(String, i64)>,
    /// The class labels of the graph's classifier (`classlabels_strings` or
    /// `classlabels_int64s` or `classlabels_ints` of a node of the `ai.onnx.ml` domain), in order.
    pub labels: Vec<String>,
}

/// The [`About`] of `model` (a serialized `ModelProto`).
pub fn about(model: &[u8]) -> crate::error::Result<About> {
    let model = outline::decode(model)?;
    let mut opsets = Vec::new();
    for opset in &model.opset_import {
        let opset = (outline::text(&opset.domain), opset.version.unwrap_or(0));
        if !opsets.contains(&opset) {
            opsets.push(opset);
        }
    }
    let producer = format!(
        "{} {}",
        outline::text(&model.producer_name),
        outline::text(&model.producer_version)
    );
    Ok(About {
        producer: producer.trim().to_string(),
        doc_string: outline::text(&model.doc_string),
        opsets,
        labels: model.graph.as_ref().map(class_labels).unwrap_or_default(),
    })
}

/// The class labels of the first node of `graph` that declares some.
fn class_labels(graph: &outline::Graph) -> Vec<String> {
    let named = |a: &&outline::Attribute| {
        matches!(
            outline::text(&a.name).as_str(),
            "classlabels_strings" | "classlabels_int64s" | "classlabels_ints"
        )
    };
    let attributes = graph.node.iter().flat_map(|node| &node.attribute);
    for attribute in attributes.filter(named) {
        let ints = attribute.ints.iter().map(i64::to_string);
        let strings = (attribute.strings.iter()).map(|s| String::from_utf8_lossy(s).into_owned());
        let labels: Vec<String> = ints.chain(strings).collect();
        if !labels.is_empty() {
            return labels;
        }
    }
    Vec::new()
}
