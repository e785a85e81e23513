//! A classifier's class names: from `batchinfer.json`'s `"labels"` or Hugging Face's
//! `config.json` (`id2label`). With them `predict` adds `label` and `score` beside the model's
//! outputs: the top class of the output that has one value per class, and its probability (the
//! values as they are where they are probabilities, else their softmax, for logits).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float32Array, StringArray, StructArray};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Float32Type, Float64Type};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tensor::signature::ModelSignature;

/// A classifier's class names and the output they name.
#[derive(Debug, Clone, PartialEq)]
pub struct Labels {
    pub names: Vec<String>,
    /// The output with one value per class.
    pub output: usize,
    /// Which file named them.
    pub declared_in: &'static str,
}

impl Labels {
    /// The labels `files` (name, bytes) declare, where one output of `signature` has one float
    /// per label and row ([N, k]); None where none do, or no output fits (a `config.json` of a
    /// model that is no classifier names two labels by default).
    pub fn from_files(
        files: &[(&str, Vec<u8>)],
        signature: &ModelSignature,
    ) -> Result<Option<Labels>> {
        let json = |name: &str| -> Result<Option<Value>> {
            match files.iter().find(|(f, _)| *f == name) {
                Some((_, bytes)) => serde_json::from_slice(bytes)
                    .map(Some)
                    .map_err(|e| Error::ModelFile(format!("{name} is not JSON: {e}"))),
                None => Ok(None),
            }
        };
        let declared = match json("batchinfer.json")?.and_then(|v| v.get("labels").cloned()) {
            Some(Value::Array(names)) => {
                let names = names
                    .iter()
                    .map(|n| n.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        Error::ModelFile("batchinfer.json: \"labels\" is a list of names".into())
                    })?;
                Some((names, "batchinfer.json", true))
            }
            Some(_) => {
                return Err(Error::ModelFile(
                    "batchinfer.json: \"labels\" is a list of names".into(),
                ));
            }
            None => json("config.json")?
                .and_then(|c| c.get("id2label").cloned())
                .and_then(|m| id2label(&m))
                .map(|names| (names, "config.json", false)),
        };
        let Some((names, declared_in, said)) = declared else {
            return Ok(None);
        };
        let k = names.len() as i64;
        let output = signature.outputs.iter().position(|o| {
            o.row_shape() == [k]
                && matches!(
                    o.element,
                    Some(
                        ort::value::TensorElementType::Float32
                            | ort::value::TensorElementType::Float64
                    )
                )
        });
        match output {
            Some(output) if k >= 2 => Ok(Some(Labels {
                names,
                output,
                declared_in,
            })),
            // Labels batchinfer.json names for no output are a mistake to say; config.json's
            // defaults are not.
            _ if said => Err(Error::ModelFile(format!(
                "batchinfer.json names {k} labels, and no output of the model has {k} values a \
                 row (its outputs: {})",
                signature.describe_outputs()
            ))),
            _ => Ok(None),
        }
    }

    /// `predict`'s type with labels: the model's outputs (one as a field named after it) and
    /// `label`, `score`.
    pub fn output_type(&self, signature: &ModelSignature) -> DataType {
        let mut fields: Vec<Arc<Field>> = match &signature.output_type {
            DataType::Struct(fields) => fields.iter().cloned().collect(),
            other => vec![Arc::new(Field::new(
                signature.outputs[0].name.clone(),
                other.clone(),
                true,
            ))],
        };
        let [label, score] = field_names(signature);
        fields.push(Arc::new(Field::new(label, DataType::Utf8, true)));
        fields.push(Arc::new(Field::new(score, DataType::Float32, true)));
        DataType::Struct(Fields::from(fields))
    }

    /// `result` (what the model gave) with `label` and `score` beside it.
    pub fn add_to(&self, result: &ArrayRef, output_type: &DataType) -> Result<ArrayRef> {
        let DataType::Struct(fields) = output_type else {
            return Err(Error::Internal("labels without a struct type".into()));
        };
        let (mut columns, nulls) = match result.as_struct_opt() {
            Some(s) => (s.columns().to_vec(), s.nulls().cloned()),
            None => (vec![result.clone()], result.logical_nulls()),
        };
        let scores = columns
            .get(self.output)
            .ok_or_else(|| Error::Internal("labels of a missing output".into()))?;
        let (labels, best) = self.top(scores)?;
        columns.push(Arc::new(labels));
        columns.push(Arc::new(best));
        Ok(Arc::new(StructArray::try_new(
            fields.clone(),
            columns,
            nulls,
        )?))
    }

    /// Each row's top class and its probability.
    fn top(&self, scores: &ArrayRef) -> Result<(StringArray, Float32Array)> {
        let k = self.names.len();
        let (values, offsets): (Vec<f64>, Vec<Option<usize>>) = {
            let values = match scores.data_type() {
                DataType::FixedSizeList(_, _) => scores.as_fixed_size_list().values().clone(),
                DataType::List(_) => scores.as_list::<i32>().values().clone(),
                other => {
                    return Err(Error::Internal(format!("labels over a {other} output")));
                }
            };
            let flat: Vec<f64> = match values.data_type() {
                DataType::Float32 => values
                    .as_primitive::<Float32Type>()
                    .values()
                    .iter()
                    .map(|v| f64::from(*v))
                    .collect(),
                DataType::Float64 => values.as_primitive::<Float64Type>().values().to_vec(),
                other => return Err(Error::Internal(format!("labels over {other} values"))),
            };
            let starts = (0..scores.len())
                .map(|i| {
                    scores.is_valid(i).then(|| match scores.data_type() {
                        DataType::List(_) => scores.as_list::<i32>().value_offsets()[i] as usize,
                        _ => i * k,
                    })
                })
                .collect();
            (flat, starts)
        };
        let mut labels = Vec::with_capacity(offsets.len());
        let mut best = Vec::with_capacity(offsets.len());
        for start in offsets {
            match start.and_then(|s| values.get(s..s + k)) {
                Some(row) => {
                    let (index, probability) = top_class(row);
                    labels.push(index.map(|i| self.names[i].as_str()));
                    best.push(index.map(|_| probability as f32));
                }
                None => {
                    labels.push(None);
                    best.push(None);
                }
            }
        }
        Ok((StringArray::from(labels), Float32Array::from(best)))
    }

    /// What DESCRIBE MODEL says of them.
    pub fn describe(&self, signature: &ModelSignature) -> String {
        format!(
            "{} ({}, ...) for output '{}', from {}",
            self.names.len(),
            self.names
                .iter()
                .take(3)
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
            signature.outputs[self.output].name,
            self.declared_in
        )
    }
}

/// The names of the fields added: `label` and `score`, or `top_label` and `top_score` where the
/// model has an output of that name already (a scikit-learn classifier's `label`).
pub fn field_names(signature: &ModelSignature) -> [&'static str; 2] {
    let taken = |n: &str| {
        signature
            .outputs
            .iter()
            .any(|o| o.name.eq_ignore_ascii_case(n))
    };
    if taken("label") || taken("score") {
        ["top_label", "top_score"]
    } else {
        ["label", "score"]
    }
}

/// `{"0": "cat", "1": "dog"}` as names in the order of their ids (every id from 0 up, once).
fn id2label(map: &Value) -> Option<Vec<String>> {
    let map = map.as_object()?;
    let mut names = vec![None; map.len()];
    for (id, name) in map {
        let id: usize = id.parse().ok()?;
        *names.get_mut(id)? = Some(name.as_str()?.to_string());
    }
    names.into_iter().collect()
}

/// The index of the largest value (None where one is NaN) and its probability: the value where
/// the row is probabilities (none negative, summing to 1), else its softmax.
fn top_class(row: &[f64]) -> (Option<usize>, f64) {
    if row.iter().any(|v| v.is_nan()) || row.is_empty() {
        return (None, f64::NAN);
    }
    let (index, max) =
        row.iter()
            .copied()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (i, v)| {
                if v > best.1 { (i, v) } else { best }
            });
    let sum: f64 = row.iter().sum();
    if row.iter().all(|v| (0.0..=1.0).contains(v)) && (sum - 1.0).abs() < 1e-3 {
        return (Some(index), max);
    }
    let exp_sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
    (Some(index), 1.0 / exp_sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_are_kept_and_logits_made_probabilities() {
        assert_eq!(top_class(&[0.1, 0.7, 0.2]), (Some(1), 0.7));
        let (i, p) = top_class(&[1.0, 3.0, 0.0]);
        let expected = 3f64.exp() / (1f64.exp() + 3f64.exp() + 1.0);
        assert_eq!(i, Some(1));
        assert!((p - expected).abs() < 1e-12);
        assert_eq!(top_class(&[f64::NAN, 1.0]).0, None);
    }

    #[test]
    fn id2label_needs_every_id_once() {
        let names = id2label(&serde_json::json!({"1": "dog", "0": "cat"})).unwrap();
        assert_eq!(names, vec!["cat", "dog"]);
        assert!(id2label(&serde_json::json!({"0": "cat", "2": "dog"})).is_none());
        assert!(id2label(&serde_json::json!({"x": "cat"})).is_none());
    }
}
