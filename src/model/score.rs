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
use crate::config::OnError;
use crate::error::{Error, Result};
use crate::stop::StopToken;
use crate::tensor::input::{InputBinding, InputTensor, prepare};
use crate::tensor::nulls::{Nulls, nan_for_nulls};
use crate::tensor::output::to_array;

/// How a batch is cut into model calls, and what a failing call does.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScoreOptions {
    /// Most rows per model call (0: no cap).
    pub max_rows: usize,
    /// Fail the batch, or give NULL to the rows the model fails on (and keep them).
    pub on_error: OnError,
    /// Stop signals: looked at before each call.
    pub stop: StopToken,
    /// What a NULL feeding a float input is: NULL (the row is not scored) or NaN.
    pub nulls: Nulls,
}

/// A batch scored: the results, how many rows went to the model, and the rows it failed on (by
/// position in the batch, with the model's message), which got NULL.
#[derive(Debug)]
pub struct Scoring {
    pub result: ArrayRef,
    pub scored: usize,
    pub failed: Vec<(usize, String)>,
}

/// Scores `rows` rows of `columns` (the feature columns) with `model`. A row with a NULL in any
/// feature column gets a NULL result.
pub fn score(
    model: &Model,
    binding: &InputBinding,
    columns: &[ArrayRef],
    rows: usize,
    options: ScoreOptions,
) -> Result<Scoring> {
    let out_type = &model.signature.output_type;
    if u32::try_from(rows).is_err() {
        return Err(too_many_rows(rows));
    }
    let done = |result, scored, failed| Scoring {
        result,
        scored,
        failed,
    };
    if rows == 0 {
        return Ok(done(new_empty_array(out_type), 0, Vec::new()));
    }
    let filled;
    let columns = match options.nulls {
        Nulls::Null => columns,
        Nulls::Nan => {
            filled = nan_for_nulls(&model.signature, binding, columns).map_err(|message| {
                Error::Inference {
                    model: model.name.clone(),
                    first_row: 0,
                    end_row: rows,
                    message: message.to_string(),
                }
            })?;
            &filled[..]
        }
    };
    let valid = columns.iter().fold(None::<NullBuffer>, |acc, c| {
        NullBuffer::union(acc.as_ref(), c.logical_nulls().as_ref())
    });
    let Some(valid) = valid.filter(|v| v.null_count() > 0) else {
        let (result, failed) = score_dense(model, binding, columns, rows, options)?;
        return Ok(done(result, rows, failed));
    };
    let present = valid.len() - valid.null_count();
    if present == 0 {
        return Ok(done(new_null_array(out_type, rows), 0, Vec::new()));
    }
    let mask = BooleanArray::new(valid.inner().clone(), None);
    let dense = columns
        .iter()
        .map(|c| filter(c.as_ref(), &mask))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let (scored, failed) = score_dense(model, binding, &dense, present, options)?;
    // The k-th dense row is the k-th row without a NULL (failures are few: looked up only then).
    let failed = match failed.is_empty() {
        true => failed,
        false => {
            let rows_of: Vec<usize> = valid.valid_indices().collect();
            failed
                .into_iter()
                .map(|(k, message)| (rows_of[k], message))
                .collect()
        }
    };
    Ok(done(
        scatter(scored.as_ref(), valid.iter())?,
        present,
        failed,
    ))
}

/// Places result k at the k-th row whose flag is true, and NULL at the others.
fn scatter(results: &dyn Array, keep: impl Iterator<Item = bool>) -> Result<ArrayRef> {
    let mut next = 0u32;
    let positions: UInt32Array = keep
        .map(|kept| {
            kept.then(|| {
                next += 1;
                next - 1
            })
        })
        .collect();
    Ok(take(results, &positions, None)?)
}

/// Scores rows that have no NULL feature, in calls of the right size.
fn score_dense(
    model: &Model,
    binding: &InputBinding,
    columns: &[ArrayRef],
    rows: usize,
    options: ScoreOptions,
) -> Result<(ArrayRef, Vec<(usize, String)>)> {
    let fixed = model.signature.fixed_batch();
    let chunk = match (fixed, options.max_rows) {
        (Some(f), _) => f,
        (None, 0) => rows,
        (None, m) => m.min(rows),
    };
    let mut scored = Scored {
        per_output: vec![Vec::new(); model.signature.outputs.len()],
        failed: Vec::new(),
    };
    let mut start = 0;
    while start < rows {
        let len = chunk.min(rows - start);
        score_range(model, binding, columns, start, len, options, &mut scored)?;
        start += len;
    }
    let joined = scored
        .per_output
        .into_iter()
        .map(|mut parts| {
            if parts.len() == 1 {
                return Ok(parts.remove(0));
            }
            let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
            concat(&refs)
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let result = assemble(&model.signature.output_type, joined)?;
    if scored.failed.is_empty() {
        return Ok((result, Vec::new()));
    }
    let rows = u32::try_from(rows).map_err(|_| too_many_rows(rows))?;
    let mut positions: Vec<Option<u32>> = (0..rows).map(Some).collect();
    for (row, _) in &scored.failed {
        positions[*row] = None;
    }
    // Through `take`, so that a struct result is NULL as a whole, not field by field.
    let result = take(result.as_ref(), &UInt32Array::from(positions), None)?;
    Ok((result, scored.failed))
}

/// Results gathered call by call, and the rows the model failed on, with its message.
struct Scored {
    per_output: Vec<Vec<ArrayRef>>,
    failed: Vec<(usize, String)>,
}

/// Scores rows `start..start + len`. With `on_error = null` (or `reject`), a failing call is split in halves
/// until the rows that fail on their own are found; they get placeholder results and are
/// recorded as failed. A row's result never depends on which rows shared its call.
fn score_range(
    model: &Model,
    binding: &InputBinding,
    columns: &[ArrayRef],
    start: usize,
    len: usize,
    options: ScoreOptions,
    scored: &mut Scored,
) -> Result<()> {
    options.stop.check()?;
    let fixed = model.signature.fixed_batch();
    let arrays = call_columns(columns, start, len, fixed)?;
    let rows = fixed.unwrap_or(len).max(len);
    let error = match call(model, binding, &arrays, rows, start, &options.stop) {
        Ok(results) => {
            for (all, result) in scored.per_output.iter_mut().zip(results) {
                all.push(if result.len() > len {
                    result.slice(0, len)
                } else {
                    result
                });
            }
            return Ok(());
        }
        Err(e) => e,
    };
    // A call cut short by a stop signal failed no row of its own.
    options.stop.check()?;
    if options.on_error == OnError::Fail {
        return Err(error);
    }
    if len == 1 {
        for (all, ty) in scored
            .per_output
            .iter_mut()
            .zip(&model.signature.output_types)
        {
            all.push(new_null_array(ty, 1));
        }
        let message = match error {
            Error::Inference { message, .. } => message,
            e => crate::message::display_error(&e),
        };
        scored.failed.push((start, message));
        return Ok(());
    }
    let half = len / 2;
    score_range(model, binding, columns, start, half, options, scored)?;
    score_range(
        model,
        binding,
        columns,
        start + half,
        len - half,
        options,
        scored,
    )
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
            let (f, last) = (u32::try_from(f), u32::try_from(len - 1));
            let (Ok(f), Ok(last)) = (f, last) else {
                return Err(too_many_rows(len));
            };
            let pad: UInt32Array = (0..f).map(|i| i.min(last)).collect();
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
    stop: &StopToken,
) -> Result<Vec<ArrayRef>> {
    let failed = |e: Error| Error::Inference {
        model: model.name.clone(),
        first_row,
        end_row: first_row + rows,
        message: e.to_string(),
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
    let outputs = model.run(values, rows, stop).map_err(failed)?;
    let signature = &model.signature;
    outputs
        .iter()
        .zip(&signature.outputs)
        .zip(&signature.output_types)
        .map(|((value, spec), declared)| {
            to_array(value, spec, declared, rows).map_err(|message| Error::Output {
                model: model.name.clone(),
                output: spec.name.clone(),
                message: message.to_string(),
            })
        })
        .collect()
}

fn too_many_rows(rows: usize) -> Error {
    Error::setting(
        "batch_rows",
        format!(
            "a batch of {rows} rows is more than batchinfer scores at once ({}); use a smaller \
         --batch-rows",
            u32::MAX
        ),
    )
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, OnceLock};

    use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float32Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Float32Type};
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use proptest::prelude::*;

    use super::{ScoreOptions, score};
    use crate::config::{EngineConfig, OnError};
    use crate::model::{Model, ModelRegistry, ModelSource};
    use crate::storage::StoreRegistry;
    use crate::tensor::input::InputBinding;

    /// Every column of a Parquet file, by name.
    fn read(path: &str) -> Vec<(String, ArrayRef)> {
        let file = std::fs::File::open(path).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .with_batch_size(1 << 20)
            .build()
            .unwrap();
        let batch = reader.into_iter().next().unwrap().unwrap();
        let schema = batch.schema();
        schema
            .fields()
            .iter()
            .zip(batch.columns())
            .map(|(f, c)| (f.name().clone(), c.clone()))
            .collect()
    }

    /// The sample features and Python onnxruntime's scores of them, by row.
    fn sample() -> &'static (Vec<ArrayRef>, Vec<f32>) {
        static SAMPLE: OnceLock<(Vec<ArrayRef>, Vec<f32>)> = OnceLock::new();
        SAMPLE.get_or_init(|| {
            let features = read("data/sample/features.parquet");
            let columns = (0..10)
                .map(|j| {
                    features
                        .iter()
                        .find(|(n, _)| *n == format!("f{j}"))
                        .unwrap()
                        .1
                        .clone()
                })
                .collect();
            let reference = read("data/reference/linear.parquet");
            let ids = reference[0]
                .1
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            let scores = reference[1].1.as_primitive::<Float32Type>();
            let mut by_id = vec![0f32; ids.len()];
            for i in 0..ids.len() {
                by_id[ids.value(i) as usize] = scores.value(i);
            }
            (columns, by_id)
        })
    }

    fn linear() -> Arc<Model> {
        static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
        MODEL
            .get_or_init(|| {
                let registry =
                    ModelRegistry::new(&EngineConfig::default(), Arc::new(StoreRegistry::new()));
                let source = ModelSource::parse("data/models/linear.onnx").unwrap();
                Arc::new(
                    Model::load(
                        "linear",
                        &source,
                        registry.session_options(),
                        registry.stores(),
                    )
                    .unwrap(),
                )
            })
            .clone()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(60))]

        /// Rows with NULLs in any of their columns go through `score` as they come: they get
        /// NULL, every other row gets Python onnxruntime's score of it, whatever the call size.
        #[test]
        fn rows_with_nulls_get_null_and_the_others_their_reference_score(
            rows in proptest::collection::vec((0usize..10_000, proptest::option::of(0usize..10)), 1..300),
            max_rows in 0usize..40,
        ) {
            let (columns, reference) = sample();
            let model = linear();
            let picked: Vec<i64> = rows.iter().map(|(id, _)| *id as i64).collect();
            let take = Int64Array::from(picked.clone());
            let inputs: Vec<ArrayRef> = (0..10)
                .map(|j| {
                    let values = datafusion::arrow::compute::take(&columns[j], &take, None).unwrap();
                    let values = values.as_primitive::<Float32Type>();
                    // Column j is NULL in the rows that chose it.
                    Arc::new(Float32Array::from_iter(
                        rows.iter().enumerate().map(|(i, (_, null))| (*null != Some(j)).then(|| values.value(i))),
                    )) as ArrayRef
                })
                .collect();
            let binding = InputBinding::plan(&model.signature, &vec![DataType::Float32; 10]).unwrap();
            let options = ScoreOptions { max_rows, on_error: OnError::Fail, ..Default::default() };
            let scored = score(&model, &binding, &inputs, rows.len(), options).unwrap().result;
            let scored = scored.as_primitive::<Float32Type>();
            let mut nulls = 0;
            for (i, (id, null)) in rows.iter().enumerate() {
                if null.is_some() {
                    prop_assert!(scored.is_null(i), "row {} has a NULL input", i);
                    nulls += 1;
                } else {
                    let (got, want) = (scored.value(i), reference[*id]);
                    prop_assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "row {}: {} vs {}", i, got, want);
                }
            }
            prop_assert_eq!(scored.null_count(), nulls);
        }
    }
}
