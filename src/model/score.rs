//! Scoring one record batch: NULL rows set aside, the rest cut into model calls (the batch-size
//! cap, or the batch dimension a model fixes), results joined and put back in row order.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, StructArray, UInt32Array, new_empty_array, new_null_array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::{concat, filter, take};
use datafusion::arrow::datatypes::{DataType, Fields};

use super::Model;
use crate::error::{Error, Result};
use crate::tensor::input::{InputBinding, InputTensor, prepare};
use crate::tensor::output::to_array;

/// Scores `rows` rows of `columns` (the feature columns) with `model`; at most `max_rows` rows
/// per model call (0: no cap). A row with a NULL in any feature column gets a NULL result.
pub fn score(
    model: &Model,
    binding: &InputBinding,
    columns: &[ArrayRef],
    rows: usize,
    max_rows: usize,
) -> Result<ArrayRef> {
    let out_type = &model.signature.output_type;
    if rows == 0 {
        return Ok(new_empty_array(out_type));
    }
    let valid = columns.iter().fold(None::<NullBuffer>, |acc, c| {
        NullBuffer::union(acc.as_ref(), c.logical_nulls().as_ref())
    });
    let Some(valid) = valid.filter(|v| v.null_count() > 0) else {
        return score_dense(model, binding, columns, rows, max_rows);
    };
    let present = valid.len() - valid.null_count();
    if present == 0 {
        return Ok(new_null_array(out_type, rows));
    }
    let mask = BooleanArray::new(valid.inner().clone(), None);
    let dense = columns
        .iter()
        .map(|c| filter(c.as_ref(), &mask))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let scored = score_dense(model, binding, &dense, present, max_rows)?;
    // Row i takes result k (its rank among the valid rows), or NULL.
    let mut next = 0u32;
    let positions: UInt32Array = valid
        .iter()
        .map(|is_valid| {
            is_valid.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    Ok(take(scored.as_ref(), &positions, None)?)
}

/// Scores rows that have no NULL feature, in calls of the right size.
fn score_dense(
    model: &Model,
    binding: &InputBinding,
    columns: &[ArrayRef],
    rows: usize,
    max_rows: usize,
) -> Result<ArrayRef> {
    let fixed = model.signature.fixed_batch();
    let chunk = match (fixed, max_rows) {
        (Some(f), _) => f,
        (None, 0) => rows,
        (None, m) => m.min(rows),
    };
    let outputs = model.signature.outputs.len();
    let mut per_output: Vec<Vec<ArrayRef>> = vec![Vec::new(); outputs];
    let mut start = 0;
    while start < rows {
        let len = chunk.min(rows - start);
        let arrays = call_columns(columns, start, len, fixed)?;
        let call_rows = fixed.unwrap_or(len);
        let results = call(model, binding, &arrays, call_rows, start)?;
        for (all, result) in per_output.iter_mut().zip(results) {
            all.push(if result.len() > len {
                result.slice(0, len)
            } else {
                result
            });
        }
        start += len;
    }
    let joined = per_output
        .into_iter()
        .map(|mut parts| {
            if parts.len() == 1 {
                return Ok(parts.remove(0));
            }
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            concat(&refs)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    assemble(&model.signature.output_type, joined)
}

/// The columns for one call: a zero-copy slice, padded by repeating the last row when the model
/// fixes a batch size larger than what is left.
fn call_columns(
    columns: &[ArrayRef],
    start: usize,
    len: usize,
    fixed: Option<usize>,
) -> Result<Vec<ArrayRef>> {
    let sliced: Vec<ArrayRef> = columns.iter().map(|c| c.slice(start, len)).collect();
    match fixed {
        Some(f) if f > len => {
            let pad: UInt32Array = (0..f as u32).map(|i| i.min(len as u32 - 1)).collect();
            Ok(sliced
                .iter()
                .map(|c| take(c.as_ref(), &pad, None))
                .collect::<std::result::Result<Vec<_>, _>>()?)
        }
        _ => Ok(sliced),
    }
}

/// One model call on `rows` rows; `first_row` places them in the batch for error messages.
fn call(
    model: &Model,
    binding: &InputBinding,
    columns: &[ArrayRef],
    rows: usize,
    first_row: usize,
) -> Result<Vec<ArrayRef>> {
    let failed = |message: String| Error::Inference {
        model: model.name.clone(),
        first_row,
        end_row: first_row + rows,
        message,
    };
    let tensors: Vec<InputTensor> = model
        .signature
        .inputs
        .iter()
        .zip(&binding.sources)
        .map(|(input, source)| prepare(input, source, columns, rows))
        .collect::<std::result::Result<_, _>>()
        .map_err(failed)?;
    let values = tensors
        .iter()
        .map(InputTensor::to_value)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(failed)?;
    let outputs = model.run(values).map_err(failed)?;
    let signature = &model.signature;
    outputs
        .iter()
        .zip(&signature.outputs)
        .zip(&signature.output_types)
        .map(|((value, spec), declared)| {
            to_array(value, spec, declared, rows).map_err(|message| Error::Output {
                model: model.name.clone(),
                output: spec.name.clone(),
                message,
            })
        })
        .collect()
}

/// One output as it is, several as a struct with a field per output.
fn assemble(out_type: &DataType, mut arrays: Vec<ArrayRef>) -> Result<ArrayRef> {
    match out_type {
        DataType::Struct(fields) if arrays.len() > 1 => {
            let fields: Fields = fields.clone();
            Ok(Arc::new(StructArray::try_new(fields, arrays, None)?))
        }
        _ => Ok(arrays.remove(0)),
    }
}
