//! What a model file says of itself, read from its protobuf without building a session: its
//! inputs and outputs (as declared in the graph) and its metadata. `SHOW MODELS` and `models()`
//! list models this way, so that listing 10,000 models reads 10,000 files and loads none.

use ort::value::TensorElementType as E;

use crate::onnx::external::{Fields, Value};
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
pub fn read(model: &[u8]) -> Result<Option<Header>, String> {
    let mut header = Header::default();
    let mut graph = None;
    for (field, value) in Fields(model) {
        match (field?, value) {
            // ModelProto.graph
            (7, Value::Bytes(bytes)) => graph = Some(bytes),
            // ModelProto.metadata_props: StringStringEntryProto { key = 1, value = 2 }
            (14, Value::Bytes(entry)) => {
                let (mut key, mut text) = (String::new(), String::new());
                for (field, value) in Fields(entry) {
                    match (field?, value) {
                        (1, Value::Bytes(b)) => key = String::from_utf8_lossy(b).into_owned(),
                        (2, Value::Bytes(b)) => text = String::from_utf8_lossy(b).into_owned(),
                        _ => {}
                    }
                }
                header.metadata.push((key, text));
            }
            _ => {}
        }
    }
    let Some(graph) = graph else {
        return Err("it is not a valid ONNX model (it has no graph)".into());
    };
    let (mut initializers, mut inputs, mut outputs) = (Vec::new(), Vec::new(), Vec::new());
    for (field, value) in Fields(graph) {
        match (field?, value) {
            // GraphProto.initializer: TensorProto, name = 8
            (5, Value::Bytes(tensor)) => initializers.push(string_field(tensor, 8)?),
            // GraphProto.sparse_initializer: SparseTensorProto, values = 1 (a TensorProto)
            (15, Value::Bytes(sparse)) => {
                if let Some(values) = bytes_field(sparse, 1)? {
                    initializers.push(string_field(values, 8)?);
                }
            }
            (11, Value::Bytes(info)) => inputs.push(info),
            (12, Value::Bytes(info)) => outputs.push(info),
            _ => {}
        }
    }
    for info in inputs {
        let Some(spec) = value_info(info)? else {
            return Ok(None);
        };
        // An input that is also an initializer has a default: ONNX Runtime does not list it.
        if !initializers.contains(&spec.name) {
            header.inputs.push(spec);
        }
    }
    for info in outputs {
        let Some(spec) = value_info(info)? else {
            return Ok(None);
        };
        header.outputs.push(spec);
    }
    Ok(Some(header))
}

/// A `ValueInfoProto` (name = 1, type = 2) as a tensor's spec; `None` for anything else.
fn value_info(info: &[u8]) -> Result<Option<TensorSpec>, String> {
    let name = string_field(info, 1)?;
    // TypeProto.tensor_type = 1: { elem_type = 1, shape = 2 }
    let Some(tensor) = bytes_field(info, 2)?
        .map(|t| bytes_field(t, 1))
        .transpose()?
    else {
        return Ok(None);
    };
    let Some(tensor) = tensor else {
        return Ok(None);
    };
    let Some(element) = varint_field(tensor, 1)?.and_then(element_of) else {
        return Ok(None);
    };
    let Some(shape) = bytes_field(tensor, 2)? else {
        return Ok(None);
    };
    let mut dims = Vec::new();
    for (field, value) in Fields(shape) {
        if let (1, Value::Bytes(dim)) = (field?, value) {
            // Dimension: dim_value = 1 | dim_param = 2 (open)
            let fixed = varint_field(dim, 1)?.and_then(|d| i64::try_from(d).ok());
            dims.push(fixed.unwrap_or(-1));
        }
    }
    Ok(Some(TensorSpec {
        description: format!("{element:?}"),
        name,
        element: Some(element),
        shape: dims,
    }))
}

/// ONNX's `TensorProto.DataType` codes ONNX Runtime's element types stand for.
fn element_of(code: u64) -> Option<E> {
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

/// The last value of length-delimited field `number` of `message`, if any.
fn bytes_field(message: &[u8], number: u64) -> Result<Option<&[u8]>, String> {
    let mut found = None;
    for (field, value) in Fields(message) {
        if let (n, Value::Bytes(bytes)) = (field?, value)
            && n == number
        {
            found = Some(bytes);
        }
    }
    Ok(found)
}

/// Field `number` of `message` as text (empty where absent).
fn string_field(message: &[u8], number: u64) -> Result<String, String> {
    Ok(bytes_field(message, number)?
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default())
}

/// The last varint field `number` of `message`, if any.
fn varint_field(message: &[u8], number: u64) -> Result<Option<u64>, String> {
    let mut found = None;
    for (field, value) in Fields(message) {
        if let (n, Value::Varint(v)) = (field?, value)
            && n == number
        {
            found = Some(v);
        }
    }
    Ok(found)
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
pub fn about(model: &[u8]) -> Result<About, String> {
    let mut about = About::default();
    let (mut name, mut version) = (String::new(), String::new());
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    for (field, value) in Fields(model) {
        match (field?, value) {
            (2, Value::Bytes(b)) => name = text(b),
            (3, Value::Bytes(b)) => version = text(b),
            (6, Value::Bytes(b)) => about.doc_string = text(b),
            // OperatorSetIdProto { domain = 1, version = 2 }
            (8, Value::Bytes(opset)) => {
                let (mut domain, mut version) = (String::new(), 0);
                for (field, value) in Fields(opset) {
                    match (field?, value) {
                        (1, Value::Bytes(b)) => domain = text(b),
                        (2, Value::Varint(v)) => version = v as i64,
                        _ => {}
                    }
                }
                if !about.opsets.contains(&(domain.clone(), version)) {
                    about.opsets.push((domain, version));
                }
            }
            (7, Value::Bytes(graph)) => about.labels = class_labels(graph)?,
            _ => {}
        }
    }
    about.producer = format!("{name} {version}").trim().to_string();
    Ok(about)
}

/// The class labels of the first node of `graph` that declares some (GraphProto.node = 1;
/// NodeProto.attribute = 5; AttributeProto { name = 1, ints = 8, strings = 9 }).
fn class_labels(graph: &[u8]) -> Result<Vec<String>, String> {
    for (field, value) in Fields(graph) {
        let (1, Value::Bytes(node)) = (field?, value) else {
            continue;
        };
        for (field, value) in Fields(node) {
            let (5, Value::Bytes(attribute)) = (field?, value) else {
                continue;
            };
            let name = string_field(attribute, 1)?;
            if !matches!(
                name.as_str(),
                "classlabels_strings" | "classlabels_int64s" | "classlabels_ints"
            ) {
                continue;
            }
            let mut labels = Vec::new();
            for (field, value) in Fields(attribute) {
                match (field?, value) {
                    (8, Value::Varint(v)) => labels.push((v as i64).to_string()),
                    // Packed ints.
                    (8, Value::Bytes(mut packed)) => {
                        while !packed.is_empty() {
                            let v = crate::onnx::external::varint(&mut packed)
                                .ok_or("a class label list ends early")?;
                            labels.push((v as i64).to_string());
                        }
                    }
                    (9, Value::Bytes(b)) => labels.push(String::from_utf8_lossy(b).into_owned()),
                    _ => {}
                }
            }
            if !labels.is_empty() {
                return Ok(labels);
            }
        }
    }
    Ok(Vec::new())
}
