//! What a NULL in a float input becomes: `SET batchinfer.nulls = 'null' | 'nan'`.
//!
//! By default a row with a NULL feature gets a NULL result, unscored. Models trained with
//! missing values (scikit-learn's gradient boosting and trees take NaN as "missing") expect NaN
//! instead: with `'nan'`, a NULL in a column that feeds a float input (float16, float, double) is
//! NaN to the model, and the row is scored. Inputs of other types keep NULL in, NULL out.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, Float64Type};

pub use crate::config::Nulls;

use super::element::element_arrow_type;
use super::input::{InputBinding, InputSource};
use super::signature::ModelSignature;

/// `column` (a scalar column feeding an input whose Arrow element type is `target`) with its
/// NULLs as NaN, where `target` is a float type and the column has NULLs; None where nothing
/// changes. The values are kept as doubles: the conversion to the input's type, and its check
/// that each value fits, come later, call by call, so that one value that does not fit fails its
/// row alone where `on_error` says so.
pub fn nan_for_null(
    column: &ArrayRef,
    target: &DataType,
) -> crate::error::Result<Option<ArrayRef>> {
    if column.logical_null_count() == 0 || column.data_type().is_nested() || !target.is_floating() {
        return Ok(None);
    }
    let doubles =
        cast_with_options(column, &DataType::Float64, &CastOptions::default()).map_err(|e| {
            crate::error::Error::Tensor(format!(
                "cannot convert {} to {target}: {e}",
                column.data_type()
            ))
        })?;
    Ok(Some(filled::<Float64Type>(&doubles, f64::NAN)))
}

fn filled<T: ArrowPrimitiveType>(column: &ArrayRef, nan: T::Native) -> ArrayRef {
    let values = column.as_primitive::<T>();
    let filled: PrimitiveArray<T> = values.iter().map(|v| Some(v.unwrap_or(nan))).collect();
    Arc::new(filled)
}

/// `columns` as the model sees them with `SET batchinfer.nulls = 'nan'`: each scalar column
/// that feeds a float input of `signature` (through `binding`) with its NULLs as NaN.
pub fn nan_for_nulls(
    signature: &ModelSignature,
    binding: &InputBinding,
    columns: &[ArrayRef],
) -> crate::error::Result<Vec<ArrayRef>> {
    let mut columns = columns.to_vec();
    for (input, source) in signature.inputs.iter().zip(&binding.sources) {
        let Some(target) = input.element.and_then(element_arrow_type) else {
            continue;
        };
        let feeding = match source {
            InputSource::Column(c) => std::slice::from_ref(c),
            InputSource::Packed(cs) => cs.as_slice(),
        };
        for &c in feeding {
            let Some(column) = columns.get(c) else {
                continue;
            };
            if let Some(filled) = nan_for_null(column, &target)
                .map_err(|e| crate::error::Error::Tensor(format!("input '{}': {e}", input.name)))?
            {
                columns[c] = filled;
            }
        }
    }
    Ok(columns)
}
