//! Model outputs to Arrow arrays, shaped as the signature declared at planning time.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, ListArray, PrimitiveArray, StringArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType, FieldRef};
use ort::value::{DynValue, TensorElementType};

use super::signature::TensorSpec;
use super::with_arrow_primitive;

/// Converts one output of a call on `rows` rows into an array of `rows` values of type `declared`.
pub fn to_array(
    value: &DynValue,
    spec: &TensorSpec,
    declared: &DataType,
    rows: usize,
) -> crate::error::Result<ArrayRef> {
    let element = spec.element.ok_or_else(|| {
        crate::error::Error::Tensor(format!("output '{}' is not a tensor", spec.name))
    })?;
    let (shape, values): (Vec<i64>, ArrayRef) = match element {
        TensorElementType::String => {
            let (shape, strings) = value
                .try_extract_strings()
                .map_err(crate::error::Error::from)?;
            (shape.to_vec(), Arc::new(StringArray::from(strings)))
        }
        TensorElementType::Bool => {
            let (shape, data) = value
                .try_extract_tensor::<bool>()
                .map_err(crate::error::Error::from)?;
            (shape.to_vec(), Arc::new(BooleanArray::from(data.to_vec())))
        }
        e => with_arrow_primitive!(e, T => extract_primitive::<T>(value)?,
            _ => return Err(crate::error::Error::Tensor(format!("output '{}' has an element type batchinfer does not convert", spec.name)))),
    };
    if shape.first().copied() != Some(rows as i64) {
        return Err(crate::error::Error::Tensor(format!(
            "output '{}' has shape {shape:?}; expected its first dimension to be the {rows} rows of the call",
            spec.name
        )));
    }
    nest(values, rows, &shape[1..], declared)
        .map_err(|e| crate::error::Error::Tensor(format!("output '{}': {e}", spec.name)))
}

fn extract_primitive<T: ArrowPrimitiveType>(
    value: &DynValue,
) -> crate::error::Result<(Vec<i64>, ArrayRef)>
where
    T::Native: ort::value::PrimitiveTensorElementType,
{
    let (shape, data) = value
        .try_extract_tensor::<T::Native>()
        .map_err(crate::error::Error::from)?;
    let array = PrimitiveArray::<T>::new(data.to_vec().into(), None);
    Ok((shape.to_vec(), Arc::new(array)))
}

/// Wraps flat row-major `values` into the list levels of `declared`, one per row dimension.
fn nest(
    values: ArrayRef,
    rows: usize,
    row_dims: &[i64],
    declared: &DataType,
) -> crate::error::Result<ArrayRef> {
    let mut levels: Vec<(Option<i32>, FieldRef)> = Vec::new();
    let mut t = declared;
    loop {
        let (size, field) = match t {
            DataType::FixedSizeList(f, k) => (Some(*k), f),
            DataType::List(f) => (None, f),
            _ => break,
        };
        levels.push((size, field.clone()));
        t = field.data_type();
    }
    if levels.is_empty() {
        if values.len() != rows {
            return Err(crate::error::Error::Tensor(format!(
                "{} values per row where one was declared",
                values.len() / rows.max(1)
            )));
        }
        return Ok(values);
    }
    if levels.len() != row_dims.len() {
        return Err(crate::error::Error::Tensor(format!(
            "shape {row_dims:?} per row does not match the declared type {declared}"
        )));
    }
    let mut array = values;
    for (level, ((size, field), &dim)) in levels.iter().zip(row_dims).enumerate().rev() {
        let dim = usize::try_from(dim)
            .map_err(|_| crate::error::Error::Tensor(format!("negative dimension {dim}")))?;
        // As many lists at this level as rows times the dimensions above it.
        let lists = row_dims[..level]
            .iter()
            .try_fold(rows, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| {
                crate::error::Error::Tensor(format!(
                    "shape {row_dims:?} of {rows} rows is too large"
                ))
            })?;
        array = match size {
            Some(k) => {
                if *k as usize != dim {
                    return Err(crate::error::Error::Tensor(format!(
                        "dimension {dim} where the model declared {k}"
                    )));
                }
                Arc::new(
                    FixedSizeListArray::try_new(field.clone(), *k, array, None)
                        .map_err(crate::error::Error::from)?,
                )
            }
            None => {
                let offsets = OffsetBuffer::from_lengths(std::iter::repeat_n(dim, lists));
                Arc::new(
                    ListArray::try_new(field.clone(), offsets, array, None)
                        .map_err(crate::error::Error::from)?,
                )
            }
        };
    }
    Ok(array)
}
