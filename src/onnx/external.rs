//! A model's external data: ONNX lets a tensor's values live in another file (`weights.bin`),
//! named by a path relative to the model file. batchinfer loads models from bytes, and ONNX
//! Runtime would resolve such a path against the process's working directory, where a file of
//! the same name, if any, is not the model's. So the files a model names are found here, read
//! from the model's own folder (local or S3), checked (a plain relative path that stays inside
//! that folder), handed to ONNX Runtime in memory, and counted in the model's sha256.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::outline::{self, Graph, Node, SparseTensor, Tensor};

/// The external data files of a model: relative path -> bytes, in the order first named.
pub type ExternalFiles = Vec<(String, Arc<[u8]>)>;

/// The largest external data file read (each is held in memory while the model is loaded, and
/// by ONNX Runtime after).
pub const EXTERNAL_CAP: u64 = 16 << 30;

/// The distinct files the tensors of an ONNX model (`ModelProto` bytes) keep their data in: of
/// the main graph, its subgraphs (of `If`, `Loop`, `Scan` nodes, nested as deep as prost's
/// recursion limit lets a message nest), the training graphs and the functions.
pub fn locations(model: &[u8]) -> crate::error::Result<Vec<String>> {
    let model = outline::decode(model)?;
    let mut found = Vec::new();
    let training = model.training_info.iter();
    let graphs = training.flat_map(|t| t.initialization.iter().chain(t.algorithm.iter()));
    for graph in model.graph.iter().chain(graphs) {
        walk_graph(graph, &mut found)?;
    }
    for function in &model.functions {
        for node in &function.node {
            walk_node(node, &mut found)?;
        }
    }
    Ok(found)
}

/// Refuses a location that could name a file outside the model's folder.
pub fn check_location(location: &str) -> crate::error::Result<()> {
    let bad = location.is_empty()
        || location.starts_with('/')
        || location.contains('\\')
        || location.contains(':')
        || location.contains('\0')
        || location
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(crate::error::Error::ModelFile(format!(
            "its external data file '{location}' is not a plain path inside the model's folder"
        )));
    }
    Ok(())
}

/// The sha256 of a model: of its bytes alone, or with external data, of its bytes followed by
/// each file's path, length and bytes.
pub fn sha256(model: &[u8], external: &ExternalFiles) -> String {
    let mut hasher = Sha256::new();
    hasher.update(model);
    for (location, bytes) in external {
        hasher.update(location.as_bytes());
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    hex::encode(hasher.finalize())
}

fn walk_graph(graph: &Graph, found: &mut Vec<String>) -> crate::error::Result<()> {
    for node in &graph.node {
        walk_node(node, found)?;
    }
    for tensor in &graph.initializer {
        walk_tensor(tensor, found)?;
    }
    for sparse in &graph.sparse_initializer {
        walk_sparse(sparse, found)?;
    }
    Ok(())
}

fn walk_node(node: &Node, found: &mut Vec<String>) -> crate::error::Result<()> {
    for attribute in &node.attribute {
        for tensor in attribute.t.iter().chain(&attribute.tensors) {
            walk_tensor(tensor, found)?;
        }
        for graph in attribute.g.as_deref().into_iter().chain(&attribute.graphs) {
            walk_graph(graph, found)?;
        }
        for sparse in attribute
            .sparse_tensor
            .iter()
            .chain(&attribute.sparse_tensors)
        {
            walk_sparse(sparse, found)?;
        }
    }
    Ok(())
}

fn walk_sparse(sparse: &SparseTensor, found: &mut Vec<String>) -> crate::error::Result<()> {
    for tensor in sparse.values.iter().chain(sparse.indices.iter()) {
        walk_tensor(tensor, found)?;
    }
    Ok(())
}

fn walk_tensor(tensor: &Tensor, found: &mut Vec<String>) -> crate::error::Result<()> {
    if tensor.data_location != Some(outline::EXTERNAL) {
        return Ok(());
    }
    // Of repeated `location` entries, the last counts.
    let location = tensor
        .external_data
        .iter()
        .rev()
        .find(|entry| entry.key.as_deref() == Some(b"location".as_slice()))
        .map(|entry| outline::text(&entry.value))
        .ok_or_else(|| {
            crate::error::Error::ModelFile(
                "a tensor's data is external, but no file is named for it".to_string(),
            )
        })?;
    if !found.contains(&location) {
        found.push(location);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_without_external_data_name_no_file() {
        let bytes = std::fs::read("data/models/linear.onnx").unwrap();
        assert_eq!(locations(&bytes).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn the_external_data_fixture_names_its_weights() {
        let bytes = std::fs::read("data/fixtures/external/model.onnx").unwrap();
        assert_eq!(locations(&bytes).unwrap(), vec!["weights.bin".to_string()]);
    }

    #[test]
    fn locations_outside_the_folder_are_refused() {
        for bad in [
            "../w.bin",
            "/etc/passwd",
            "a/../../w",
            "",
            "a//b",
            "C:\\w.bin",
            "./w",
        ] {
            assert!(check_location(bad).is_err(), "{bad}");
        }
        assert!(check_location("weights/part-1.bin").is_ok());
    }

    #[test]
    fn groups_are_skipped_and_functions_walked() {
        let mut bytes = std::fs::read("data/fixtures/external/model.onnx").unwrap();
        // Field 99 as a group holding a varint, a nested group and bytes.
        bytes.extend_from_slice(&[
            0x9b, 0x06, 0x08, 0x01, 0x13, 0x14, 0x12, 0x01, 0x00, 0x9c, 0x06,
        ]);
        assert_eq!(locations(&bytes).unwrap(), vec!["weights.bin".to_string()]);
        // A group left open is an error, not an empty list.
        assert!(locations(&bytes[..bytes.len() - 2]).is_err());
        // The model's graph, as a function's node would hold it: a tensor attribute.
        let tensor = external_tensor(b"f.bin");
        let attribute = message(5, &tensor);
        let node = message(5, &attribute);
        let function = message(7, &node);
        assert_eq!(
            locations(&message(25, &function)).unwrap(),
            vec!["f.bin".to_string()]
        );
    }

    use super::outline::tests::message;

    fn external_tensor(location: &[u8]) -> Vec<u8> {
        let mut entry = message(1, b"location");
        entry.extend(message(2, location));
        let mut tensor = message(13, &entry);
        tensor.extend_from_slice(&[14 << 3, 1]);
        tensor
    }

    #[test]
    fn truncated_bytes_are_an_error_not_a_panic() {
        let bytes = std::fs::read("data/fixtures/external/model.onnx").unwrap();
        for cut in 0..bytes.len() {
            let _ = locations(&bytes[..cut]);
        }
    }
}
