//! A column of image bytes (BLOB) made the rows of a model's input: each image prepared
//! ([`super::decode::prepare`]) on the CPU cores at once, into one list column of floats (one
//! prepared image a row), NULL where the bytes were NULL or could not be read, with why.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field};

use super::ImageSpec;
use super::decode::{Unreadable, prepare};
use crate::error::{Error, Result};

/// The type of the prepared images of `spec`: a fixed-size list of floats, one image a row.
pub fn prepared_type(spec: &ImageSpec) -> DataType {
    DataType::FixedSizeList(
        Arc::new(Field::new_list_field(DataType::Float32, false)),
        spec.values_per_image() as i32,
    )
}

/// Whether `t` is a column of bytes images are read from.
pub fn is_bytes(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    )
}

/// The images of `column` prepared as `spec` says: the column of their values, and the rows
/// that could not be read (by position) with why.
pub fn prepare_column(
    spec: &ImageSpec,
    column: &ArrayRef,
) -> Result<(ArrayRef, Vec<(usize, String)>)> {
    let rows = column.len();
    let per_image = spec.values_per_image();
    let bytes_of = bytes_reader(column)?;
    let mut values = vec![0f32; rows * per_image];
    let mut outcome: Vec<Option<Result<(), Unreadable>>> = vec![None; rows];
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(rows.max(1));
    let per_thread = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        for ((out, results), first) in values
            .chunks_mut(per_thread * per_image.max(1))
            .zip(outcome.chunks_mut(per_thread))
            .zip((0..rows).step_by(per_thread))
        {
            let bytes_of = &bytes_of;
            scope.spawn(move || {
                for (k, result) in results.iter_mut().enumerate() {
                    let row = first + k;
                    let Some(bytes) = bytes_of(row) else {
                        continue;
                    };
                    let out = &mut out[k * per_image..(k + 1) * per_image];
                    // A decoder's panic is this image's error, not the process's.
                    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        prepare(bytes, spec, out)
                    }))
                    .unwrap_or_else(|_| Err(Unreadable::Panicked));
                    *result = Some(done);
                }
            });
        }
    });
    let mut failed = Vec::new();
    let valid: Vec<bool> = outcome
        .into_iter()
        .enumerate()
        .map(|(row, o)| match o {
            Some(Ok(())) => true,
            Some(Err(why)) => {
                failed.push((row, why.to_string()));
                false
            }
            None => false,
        })
        .collect();
    let field = Arc::new(Field::new_list_field(DataType::Float32, false));
    let list = FixedSizeListArray::try_new(
        field,
        per_image as i32,
        Arc::new(Float32Array::from(values)),
        Some(NullBuffer::from(valid)),
    )?;
    Ok((Arc::new(list), failed))
}

/// Row `i`'s bytes, None where NULL.
type BytesOf<'a> = Box<dyn Fn(usize) -> Option<&'a [u8]> + Sync + 'a>;

/// Row `i`'s bytes, None where NULL, of a binary column of any kind.
fn bytes_reader<'a>(column: &'a ArrayRef) -> Result<BytesOf<'a>> {
    let column = column.as_ref();
    Ok(match column.data_type() {
        DataType::Binary => {
            let a = column.as_binary::<i32>();
            Box::new(move |i| a.is_valid(i).then(|| a.value(i)))
        }
        DataType::LargeBinary => {
            let a = column.as_binary::<i64>();
            Box::new(move |i| a.is_valid(i).then(|| a.value(i)))
        }
        DataType::BinaryView => {
            let a = column.as_binary_view();
            Box::new(move |i| a.is_valid(i).then(|| a.value(i)))
        }
        other => {
            return Err(Error::Tensor(format!(
                "images are read from a BLOB column, not {other}"
            )));
        }
    })
}
