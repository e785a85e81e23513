//! A model's external data: ONNX lets a tensor's values live in another file (`weights.bin`),
//! named by a path relative to the model file. batchinfer loads models from bytes, and ONNX
//! Runtime would resolve such a path against the process's working directory, where a file of
//! the same name, if any, is not the model's. So the files a model names are found here, read
//! from the model's own folder (local or S3), checked (a plain relative path that stays inside
//! that folder), handed to ONNX Runtime in memory, and counted in the model's sha256.

use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The external data files of a model: relative path -> bytes, in the order first named.
pub type ExternalFiles = Vec<(String, Arc<[u8]>)>;

/// The largest external data file read (each is held in memory while the model is loaded, and
/// by ONNX Runtime after).
pub const EXTERNAL_CAP: u64 = 16 << 30;

/// How deep subgraphs (of `If`, `Loop`, `Scan` nodes) may nest in a model this reads.
const MAX_NESTING: usize = 64;

/// The distinct files the tensors of an ONNX model (`ModelProto` bytes) keep their data in.
pub fn locations(model: &[u8]) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    // ModelProto: graph = 7, training_info = 20, functions = 25.
    for (field, value) in Fields(model) {
        match (field?, value) {
            (7, Value::Bytes(graph)) => walk_graph(graph, 0, &mut found)?,
            (20, Value::Bytes(training)) => {
                // TrainingInfoProto: initialization = 1, algorithm = 2 (graphs).
                for (field, value) in Fields(training) {
                    if let (1 | 2, Value::Bytes(graph)) = (field?, value) {
                        walk_graph(graph, 0, &mut found)?;
                    }
                }
            }
            (25, Value::Bytes(function)) => {
                // FunctionProto: node = 7.
                for (field, value) in Fields(function) {
                    if let (7, Value::Bytes(node)) = (field?, value) {
                        walk_node(node, 0, &mut found)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(found)
}

/// Refuses a location that could name a file outside the model's folder.
pub fn check_location(location: &str) -> Result<(), String> {
    let bad = location.is_empty()
        || location.starts_with('/')
        || location.contains('\\')
        || location.contains(':')
        || location.contains('\0')
        || location
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..");
    if bad {
        return Err(format!(
            "its external data file '{location}' is not a plain path inside the model's folder"
        ));
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

fn walk_graph(graph: &[u8], depth: usize, found: &mut Vec<String>) -> Result<(), String> {
    if depth > MAX_NESTING {
        return Err(format!("its subgraphs nest more than {MAX_NESTING} deep"));
    }
    // GraphProto: node = 1, initializer = 5, sparse_initializer = 15.
    for (field, value) in Fields(graph) {
        match (field?, value) {
            (1, Value::Bytes(node)) => walk_node(node, depth, found)?,
            (5, Value::Bytes(tensor)) => walk_tensor(tensor, found)?,
            (15, Value::Bytes(sparse)) => walk_sparse(sparse, found)?,
            _ => {}
        }
    }
    Ok(())
}

fn walk_node(node: &[u8], depth: usize, found: &mut Vec<String>) -> Result<(), String> {
    // NodeProto: attribute = 5. AttributeProto: t = 5, g = 6, tensors = 10, graphs = 11,
    // sparse_tensor = 22, sparse_tensors = 23.
    for (field, value) in Fields(node) {
        let (5, Value::Bytes(attribute)) = (field?, value) else {
            continue;
        };
        for (field, value) in Fields(attribute) {
            match (field?, value) {
                (5 | 10, Value::Bytes(tensor)) => walk_tensor(tensor, found)?,
                (6 | 11, Value::Bytes(graph)) => walk_graph(graph, depth + 1, found)?,
                (22 | 23, Value::Bytes(sparse)) => walk_sparse(sparse, found)?,
                _ => {}
            }
        }
    }
    Ok(())
}

fn walk_sparse(sparse: &[u8], found: &mut Vec<String>) -> Result<(), String> {
    // SparseTensorProto: values = 1, indices = 2.
    for (field, value) in Fields(sparse) {
        if let (1 | 2, Value::Bytes(tensor)) = (field?, value) {
            walk_tensor(tensor, found)?;
        }
    }
    Ok(())
}

fn walk_tensor(tensor: &[u8], found: &mut Vec<String>) -> Result<(), String> {
    // TensorProto: external_data = 13 (key = 1, value = 2), data_location = 14 (EXTERNAL = 1).
    let mut external = false;
    let mut location = None;
    for (field, value) in Fields(tensor) {
        match (field?, value) {
            (14, Value::Varint(1)) => external = true,
            (13, Value::Bytes(entry)) => {
                let (mut key, mut text) = (None, None);
                for (field, value) in Fields(entry) {
                    match (field?, value) {
                        (1, Value::Bytes(k)) => key = Some(k),
                        (2, Value::Bytes(v)) => text = Some(v),
                        _ => {}
                    }
                }
                if key == Some(b"location".as_slice()) {
                    location = text.map(|t| String::from_utf8_lossy(t).into_owned());
                }
            }
            _ => {}
        }
    }
    if external {
        let location =
            location.ok_or("a tensor's data is external, but no file is named for it")?;
        if !found.contains(&location) {
            found.push(location);
        }
    }
    Ok(())
}

/// One field's value in the protobuf wire format.
pub(crate) enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one protobuf message: (field number, value), or an error where the bytes end
/// early or are not protobuf. Groups (a wire format ONNX does not use, which a parser still
/// accepts) are skipped whole.
pub(crate) struct Fields<'a>(pub(crate) &'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = (Result<u64, String>, Value<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let broken = |why: &str| {
            Some((
                Err(format!("it is not a valid ONNX model ({why})")),
                Value::Fixed,
            ))
        };
        let Some(key) = varint(&mut self.0) else {
            self.0 = &[];
            return broken("a field ends early");
        };
        let value = match key & 7 {
            0 => varint(&mut self.0).map(Value::Varint),
            1 => take(&mut self.0, 8).map(|_| Value::Fixed),
            2 => varint(&mut self.0)
                .and_then(|n| usize::try_from(n).ok())
                .and_then(|n| take(&mut self.0, n))
                .map(Value::Bytes),
            3 => skip_group(&mut self.0, key >> 3).map(|_| Value::Fixed),
            5 => take(&mut self.0, 4).map(|_| Value::Fixed),
            _ => None,
        };
        match value {
            Some(value) => Some((Ok(key >> 3), value)),
            None => {
                self.0 = &[];
                broken("a field ends early or has an unknown wire type")
            }
        }
    }
}

/// Skips the rest of a group begun with field number `number`, through its end.
fn skip_group(buf: &mut &[u8], number: u64) -> Option<()> {
    // Protobuf's parsers nest at most 100 deep.
    let mut open = vec![number];
    while let Some(&innermost) = open.last() {
        let key = varint(buf)?;
        match key & 7 {
            0 => {
                varint(buf)?;
            }
            1 => {
                take(buf, 8)?;
            }
            2 => {
                let n = usize::try_from(varint(buf)?).ok()?;
                take(buf, n)?;
            }
            3 if open.len() < 100 => open.push(key >> 3),
            4 if key >> 3 == innermost => {
                open.pop();
            }
            5 => {
                take(buf, 4)?;
            }
            _ => return None,
        }
    }
    Some(())
}

pub(crate) fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if buf.len() < n {
        return None;
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Some(head)
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

    fn message(field: u64, body: &[u8]) -> Vec<u8> {
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
