//! One batch's arrays turned into a model input's data ([`prepare`]): row-major, in the model's
//! element type, borrowed where the layout already is one, packed side by side otherwise.

use crate::error::Error;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, PrimitiveArray};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{ArrowPrimitiveType, DataType};
use ort::session::SessionInputValue;
use ort::value::{Tensor, TensorElementType, TensorRef};

use super::element::{element_arrow_type, numeric_element_of};
use super::signature::TensorSpec;
use super::with_arrow_primitive;

use super::input::*;

/// One input's data for one call, in the model's element type and row-major order.
#[derive(Debug)]
pub enum InputTensor {
    /// A primitive array with no nulls whose values buffer is the tensor's data.
    Primitive { values: ArrayRef, shape: Vec<i64> },
    /// ONNX booleans are one byte each; Arrow's are bits, so they are unpacked.
    Bool { values: Vec<bool>, shape: Vec<i64> },
    /// UTF-8 strings; ONNX Runtime copies them into its own string tensor.
    Strings { values: ArrayRef, shape: Vec<i64> },
}

impl InputTensor {
    /// The tensor's shape.
    pub fn shape(&self) -> &[i64] {
        match self {
            InputTensor::Primitive { shape, .. }
            | InputTensor::Bool { shape, .. }
            | InputTensor::Strings { shape, .. } => shape,
        }
    }

    /// An ONNX Runtime value over this data; numeric tensors borrow the Arrow buffer.
    pub fn to_value(&self) -> crate::error::Result<SessionInputValue<'_>> {
        let err = crate::error::Error::from;
        match self {
            InputTensor::Primitive { values, shape } => {
                let element = numeric_element_of(values.data_type()).ok_or_else(|| {
                    crate::error::Error::Tensor(format!(
                        "no tensor type for {}",
                        values.data_type()
                    ))
                })?;
                with_arrow_primitive!(element, T => borrow_primitive::<T>(values, shape),
                    _ => Err(crate::error::Error::Tensor(format!("no tensor type for {}", values.data_type()))))
            }
            InputTensor::Bool { values, shape } => Ok(TensorRef::from_array_view((
                shape.clone(),
                values.as_slice(),
            ))
            .map_err(err)?
            .into()),
            InputTensor::Strings { values, shape } => {
                // ONNX Runtime copies strings into its own tensor; the owned copy here is the price of
                // `ort` taking only `'static` string types.
                let strings: Vec<String> = values
                    .as_string::<i32>()
                    .iter()
                    .map(|s| s.unwrap_or_default().to_string())
                    .collect();
                Ok(
                    Tensor::from_string_array((shape.clone(), strings.as_slice()))
                        .map_err(err)?
                        .into(),
                )
            }
        }
    }
}

fn borrow_primitive<'a, T: ArrowPrimitiveType>(
    values: &'a ArrayRef,
    shape: &[i64],
) -> crate::error::Result<SessionInputValue<'a>>
where
    T::Native: ort::value::PrimitiveTensorElementType + std::fmt::Debug,
{
    let data: &[T::Native] = values.as_primitive::<T>().values();
    Ok(TensorRef::from_array_view((shape.to_vec(), data))
        .map_err(crate::error::Error::from)?
        .into())
}

/// Turns the columns of `rows` rows (no row NULL in any column) into the data for `input`.
pub fn prepare(
    input: &TensorSpec,
    source: &InputSource,
    columns: &[ArrayRef],
    rows: usize,
) -> crate::error::Result<InputTensor> {
    prepare_values(input, source, columns, rows)
        .map_err(|e| crate::error::Error::Tensor(format!("input '{}': {e}", input.name)))
}

fn prepare_values(
    input: &TensorSpec,
    source: &InputSource,
    columns: &[ArrayRef],
    rows: usize,
) -> crate::error::Result<InputTensor> {
    let element = input
        .element
        .ok_or_else(|| crate::error::Error::Tensor("not a tensor".to_string()))?;
    let target = element_arrow_type(element).ok_or_else(|| {
        crate::error::Error::Tensor(format!("input '{}': unsupported element type", input.name))
    })?;
    let (values, shape) = match source {
        InputSource::Column(c) => {
            let column = &columns[*c];
            match column.data_type() {
                DataType::FixedSizeList(_, _) | DataType::List(_) | DataType::LargeList(_) => {
                    let (values, per_row) = list_values(column, input, c + 1)?;
                    let shape = row_major_shape(input, rows, per_row, c + 1)?;
                    (convert(&values, &target)?, shape)
                }
                _ => {
                    let shape = if input.row_shape().is_empty() {
                        vec![rows as i64]
                    } else {
                        vec![rows as i64, 1]
                    };
                    (convert(column, &target)?, shape)
                }
            }
        }
        InputSource::Packed(indices) => {
            let converted = indices
                .iter()
                .map(|&c| convert(&columns[c], &target))
                .collect::<Result<Vec<_>, _>>()?;
            let shape = row_major_shape(input, rows, indices.len(), indices[0] + 1)?;
            (pack(&converted, element, rows)?, shape)
        }
    };
    Ok(match element {
        TensorElementType::Bool => InputTensor::Bool {
            values: values.as_boolean().values().iter().collect(),
            shape,
        },
        TensorElementType::String => InputTensor::Strings { values, shape },
        _ => InputTensor::Primitive { values, shape },
    })
}

/// The values of a list column, checked to be one rectangular block: every row the same length
/// and no NULL element. The result is a slice of the list's child array (no copy).
fn list_values(
    column: &ArrayRef,
    input: &TensorSpec,
    arg: usize,
) -> crate::error::Result<(ArrayRef, usize)> {
    let (values, per_row) = match column.data_type() {
        DataType::FixedSizeList(_, k) => {
            let list = column.as_fixed_size_list();
            (list.values().clone(), *k as usize)
        }
        DataType::List(_) => {
            let list = column.as_list::<i32>();
            let offsets: Vec<usize> = list.offsets().iter().map(|&o| o as usize).collect();
            let per_row = uniform_length(&offsets, input, arg)?;
            let (start, end) = (offsets[0], offsets[offsets.len() - 1]);
            (list.values().slice(start, end - start), per_row)
        }
        DataType::LargeList(_) => {
            let list = column.as_list::<i64>();
            let offsets: Vec<usize> = list.offsets().iter().map(|&o| o as usize).collect();
            let per_row = uniform_length(&offsets, input, arg)?;
            let (start, end) = (offsets[0], offsets[offsets.len() - 1]);
            (list.values().slice(start, end - start), per_row)
        }
        other => {
            return Err(crate::error::Error::Tensor(format!(
                "column {arg} is {other}, not a list"
            )));
        }
    };
    if values.null_count() > 0 {
        return Err(crate::error::Error::Tensor(format!(
            "column {arg} has NULL elements inside its lists; input '{}' needs every element",
            input.name
        )));
    }
    Ok((values, per_row))
}

fn uniform_length(
    offsets: &[usize],
    input: &TensorSpec,
    arg: usize,
) -> crate::error::Result<usize> {
    let lengths = offsets.windows(2).map(|w| w[1] - w[0]);
    let expected = input.row_elements();
    let mut first = None;
    for (row, len) in lengths.enumerate() {
        let want = *first.get_or_insert(expected.unwrap_or(len));
        if len != want {
            return Err(crate::error::Error::Tensor(format!(
                "column {arg}: row {row} of the batch holds {len} value(s), input '{}' takes {want} per row",
                input.name
            )));
        }
    }
    Ok(first.or(expected).unwrap_or(0))
}

/// The tensor shape for `rows` rows of `per_row` values: the model's row dimensions, with one
/// open dimension resolved from `per_row`.
fn row_major_shape(
    input: &TensorSpec,
    rows: usize,
    per_row: usize,
    arg: usize,
) -> crate::error::Result<Vec<i64>> {
    let dims = input.row_shape();
    let known = dims
        .iter()
        .filter_map(|&d| usize::try_from(d).ok())
        .try_fold(1usize, usize::checked_mul)
        .ok_or_else(|| {
            Error::Tensor(format!(
                "input '{}' has a shape too large: {:?}",
                input.name, input.shape
            ))
        })?;
    let open = dims.iter().filter(|&&d| d < 0).count();
    let mut shape = vec![rows as i64];
    match open {
        0 if known == per_row => shape.extend_from_slice(dims),
        0 if dims.is_empty() && per_row == 1 => {}
        1 if known > 0 && per_row.is_multiple_of(known) => shape.extend(
            dims.iter()
                .map(|&d| if d < 0 { (per_row / known) as i64 } else { d }),
        ),
        _ if dims.len() <= 1 => shape.push(per_row as i64),
        _ => {
            return Err(crate::error::Error::Tensor(format!(
                "column {arg} holds {per_row} values per row, which does not fit input '{}' of shape {:?}",
                input.name, input.shape
            )));
        }
    }
    Ok(shape)
}

/// Casts to the model's element type; the array is returned as is (no copy) when it already is.
fn convert(array: &ArrayRef, target: &DataType) -> crate::error::Result<ArrayRef> {
    if array.data_type() == target {
        return Ok(array.clone());
    }
    // `safe: false`: a value that does not fit (300 into int8) is an error, not a silent NULL.
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let converted = cast_with_options(array, target, &options).map_err(|e| {
        crate::error::Error::Tensor(format!(
            "cannot convert {} to {target}: {e}",
            array.data_type()
        ))
    })?;
    check_fits(array, &converted)?;
    Ok(converted)
}

/// Refuses a finite value that became infinite on the way to a narrower float (1e40 into a
/// float input): Arrow's cast rounds it to infinity without a word.
pub(super) fn check_fits(from: &ArrayRef, to: &ArrayRef) -> crate::error::Result<()> {
    use datafusion::arrow::datatypes::{Float16Type, Float32Type, Float64Type};
    // A fraction into an integer input: Arrow's cast drops it without a word.
    let fractional = |t: &DataType| {
        t.is_floating()
            || matches!(t, DataType::Decimal128(_, s) | DataType::Decimal256(_, s) if *s > 0)
    };
    if to.data_type().is_integer() && fractional(from.data_type()) {
        let before = cast_with_options(from, &DataType::Float64, &CastOptions::default())
            .map_err(crate::error::Error::from)?;
        let before = before.as_primitive::<Float64Type>();
        if let Some(v) = before.iter().flatten().find(|v| v.fract() != 0.0) {
            return Err(crate::error::Error::Tensor(format!(
                "the value {v} is not a whole number, and the input takes {} (round it in the \
                 query: round(x))",
                to.data_type()
            )));
        }
        return Ok(());
    }
    let overflowed = match to.data_type() {
        DataType::Float32 => to
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .any(|v| v.is_infinite()),
        DataType::Float16 => to
            .as_primitive::<Float16Type>()
            .values()
            .iter()
            .any(|v| v.is_infinite()),
        _ => false,
    };
    if !overflowed {
        return Ok(());
    }
    let before = cast_with_options(from, &DataType::Float64, &CastOptions::default())
        .map_err(crate::error::Error::from)?;
    let after = cast_with_options(to, &DataType::Float64, &CastOptions::default())
        .map_err(crate::error::Error::from)?;
    let (before, after) = (
        before.as_primitive::<Float64Type>(),
        after.as_primitive::<Float64Type>(),
    );
    for i in 0..after.len() {
        if after.is_valid(i) && after.value(i).is_infinite() && before.value(i).is_finite() {
            return Err(crate::error::Error::Tensor(format!(
                "the value {:e} does not fit {} (its largest value is {})",
                before.value(i),
                element_of(to.data_type()),
                if *to.data_type() == DataType::Float16 {
                    "65504"
                } else {
                    "3.4028235e38"
                },
            )));
        }
    }
    Ok(())
}

fn element_of(t: &DataType) -> &'static str {
    match t {
        DataType::Float16 => "float16",
        _ => "float",
    }
}

/// Packs k columns of one element type side by side: row i is `[c0[i], c1[i], ...]`.
fn pack(
    columns: &[ArrayRef],
    element: TensorElementType,
    rows: usize,
) -> crate::error::Result<ArrayRef> {
    with_arrow_primitive!(element, T => Ok(pack_primitive::<T>(columns, rows)),
        _ => pack_other(columns, rows))
}

fn pack_primitive<T: ArrowPrimitiveType>(columns: &[ArrayRef], rows: usize) -> ArrayRef {
    let values: Vec<&[T::Native]> = columns
        .iter()
        .map(|c| &c.as_primitive::<T>().values()[..rows])
        .collect();
    // The common widths get a loop whose row is a fixed-size array: written in one go, with the
    // column reads unrolled. Others take the general loop.
    let out = match values.len() {
        1 => values[0].to_vec(),
        2 => pack_rows::<T::Native, 2>(&values, rows),
        3 => pack_rows::<T::Native, 3>(&values, rows),
        4 => pack_rows::<T::Native, 4>(&values, rows),
        5 => pack_rows::<T::Native, 5>(&values, rows),
        6 => pack_rows::<T::Native, 6>(&values, rows),
        7 => pack_rows::<T::Native, 7>(&values, rows),
        8 => pack_rows::<T::Native, 8>(&values, rows),
        9 => pack_rows::<T::Native, 9>(&values, rows),
        10 => pack_rows::<T::Native, 10>(&values, rows),
        11 => pack_rows::<T::Native, 11>(&values, rows),
        12 => pack_rows::<T::Native, 12>(&values, rows),
        13 => pack_rows::<T::Native, 13>(&values, rows),
        14 => pack_rows::<T::Native, 14>(&values, rows),
        15 => pack_rows::<T::Native, 15>(&values, rows),
        16 => pack_rows::<T::Native, 16>(&values, rows),
        _ => pack_any(&values, rows),
    };
    Arc::new(PrimitiveArray::<T>::new(out.into(), None))
}

/// Row `i` of the result is `[c0[i], .., c{K-1}[i]]`. The output is written once, front to back
/// (no zeroing pass); each column is read once, front to back.
fn pack_rows<V: Copy, const K: usize>(columns: &[&[V]], rows: usize) -> Vec<V> {
    let columns: [&[V]; K] = std::array::from_fn(|j| &columns[j][..rows]);
    (0..rows)
        .map(|i| std::array::from_fn::<V, K, _>(|j| columns[j][i]))
        .collect::<Vec<[V; K]>>()
        .into_flattened()
}

/// The general case: rows are packed in blocks so that the block being written (BLOCK x k values)
/// stays in the L1 cache while every column is read once, sequentially.
fn pack_any<V: Copy + Default>(columns: &[&[V]], rows: usize) -> Vec<V> {
    const BLOCK: usize = 256;
    let k = columns.len();
    let mut out = vec![V::default(); rows * k];
    for (block, chunk) in out.chunks_mut(BLOCK * k).enumerate() {
        let first = block * BLOCK;
        for (j, column) in columns.iter().enumerate() {
            let column = &column[first..first + chunk.len() / k];
            for (row, value) in chunk.chunks_exact_mut(k).zip(column) {
                row[j] = *value;
            }
        }
    }
    out
}

/// Packing for booleans and strings, which are rare enough to leave to `interleave`.
fn pack_other(columns: &[ArrayRef], rows: usize) -> crate::error::Result<ArrayRef> {
    use datafusion::arrow::compute::interleave;
    let k = columns.len();
    let refs: Vec<&dyn Array> = columns.iter().map(|c| c.as_ref()).collect();
    let indices: Vec<(usize, usize)> = (0..rows)
        .flat_map(|r| (0..k).map(move |j| (j, r)))
        .collect();
    interleave(&refs, &indices).map_err(crate::error::Error::from)
}
