//! ONNX's messages as far as a model is read without its weights: its interface, its metadata,
//! its class labels and where its tensors keep their data. Each is a subset of the message of
//! the same tag numbers in ONNX's schema (`proto.rs` has them whole); prost skips the fields left
//! out (a tensor's values among them) without copying them, so that reading what a 2 GB model
//! declares costs what its declarations take. Text is kept as bytes and read leniently, as ONNX
//! Runtime's own parser does: a name that is not UTF-8 is shown, not refused.

use prost::Message;

/// What is read of a model, as [`decode`] returns it.
#[derive(Clone, PartialEq, Message)]
pub struct Model {
    #[prost(bytes = "vec", optional, tag = "2")]
    pub producer_name: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub producer_version: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "6")]
    pub doc_string: Option<Vec<u8>>,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<Graph>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSet>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<Entry>,
    #[prost(message, repeated, tag = "20")]
    pub training_info: Vec<TrainingInfo>,
    #[prost(message, repeated, tag = "25")]
    pub functions: Vec<Function>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Graph {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<Node>,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<Tensor>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfo>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfo>,
    #[prost(message, repeated, tag = "15")]
    pub sparse_initializer: Vec<SparseTensor>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TrainingInfo {
    #[prost(message, optional, tag = "1")]
    pub initialization: Option<Graph>,
    #[prost(message, optional, tag = "2")]
    pub algorithm: Option<Graph>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(message, repeated, tag = "7")]
    pub node: Vec<Node>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Node {
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<Attribute>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Attribute {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub name: Option<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<Tensor>,
    #[prost(message, optional, boxed, tag = "6")]
    pub g: Option<Box<Graph>>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<Tensor>,
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<Graph>,
    #[prost(message, optional, tag = "22")]
    pub sparse_tensor: Option<SparseTensor>,
    #[prost(message, repeated, tag = "23")]
    pub sparse_tensors: Vec<SparseTensor>,
}

/// A tensor's name and where its data is, not the data.
#[derive(Clone, PartialEq, Message)]
pub struct Tensor {
    #[prost(bytes = "vec", optional, tag = "8")]
    pub name: Option<Vec<u8>>,
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<Entry>,
    /// `DataLocation`: `DEFAULT` = 0, `EXTERNAL` = 1.
    #[prost(int32, optional, tag = "14")]
    pub data_location: Option<i32>,
}

/// `TensorProto.DataLocation.EXTERNAL`.
pub const EXTERNAL: i32 = 1;

#[derive(Clone, PartialEq, Message)]
pub struct SparseTensor {
    #[prost(message, optional, tag = "1")]
    pub values: Option<Tensor>,
    #[prost(message, optional, tag = "2")]
    pub indices: Option<Tensor>,
}

/// `StringStringEntryProto`.
#[derive(Clone, PartialEq, Message)]
pub struct Entry {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub key: Option<Vec<u8>>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub value: Option<Vec<u8>>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, Message)]
pub struct OperatorSet {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub domain: Option<Vec<u8>>,
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

/// `ValueInfoProto`: a graph's input or output.
#[derive(Clone, PartialEq, Message)]
pub struct ValueInfo {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub name: Option<Vec<u8>>,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<Type>,
}

/// `TypeProto`, of which only a tensor's type is read (a sequence, map or optional value is
/// not described here).
#[derive(Clone, PartialEq, Message)]
pub struct Type {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorType>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorType {
    /// `TensorProto.DataType`.
    #[prost(int32, optional, tag = "1")]
    pub elem_type: Option<i32>,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<Shape>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Shape {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// A dimension: fixed (`dim_value`) or named, so open (`dim_param`, not read).
#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
}

/// What a serialized `ModelProto` says of itself, or the error that it is not one.
pub fn decode(model: &[u8]) -> crate::error::Result<Model> {
    Model::decode(model)
        .map_err(|e| crate::error::Error::ModelFile(format!("it is not a valid ONNX model ({e})")))
}

/// Bytes of ONNX text as a string, leniently.
pub fn text(bytes: &Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(bytes.as_deref().unwrap_or_default()).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    /// Field `field` of a message, length-delimited, holding `body`.
    pub(crate) fn message(field: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for mut n in [field << 3 | 2, body.len() as u64] {
            while n >= 0x80 {
                out.push((n as u8 & 0x7f) | 0x80);
                n >>= 7;
            }
            out.push(n as u8);
        }
        out.extend_from_slice(body);
        out
    }

    /// A model whose graph nests `depth` subgraphs, each an attribute of a node of the one above.
    pub(crate) fn nested(depth: usize) -> Vec<u8> {
        let mut graph = Vec::new();
        for _ in 0..depth {
            graph = message(1, &message(5, &message(6, &graph)));
        }
        message(7, &graph)
    }

    #[test]
    fn models_nested_past_protobufs_limit_are_an_error_not_a_stack_overflow() {
        assert!(super::decode(&nested(10)).is_ok());
        for depth in [1_000, 100_000] {
            let error = super::decode(&nested(depth)).unwrap_err().to_string();
            assert!(error.contains("not a valid ONNX model"), "{error}");
        }
    }
}
