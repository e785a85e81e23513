//! Conversions between Arrow arrays and ONNX Runtime tensors, checked value by value, and the
//! zero-copy paths checked by address.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, Float32Array, Float64Array,
    Int32Array, ListArray, StringArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type};
use ort::value::TensorElementType as E;

use super::input::{InputBinding, InputSource, InputTensor, prepare};
use super::signature::{ModelSignature, TensorSpec};

fn spec(name: &str, element: E, shape: &[i64]) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        element: Some(element),
        shape: shape.to_vec(),
        description: String::new(),
    }
}

fn signature(inputs: Vec<TensorSpec>) -> ModelSignature {
    ModelSignature {
        inputs,
        outputs: vec![spec("y", E::Float32, &[-1])],
        output_type: DataType::Float32,
        output_types: vec![DataType::Float32],
    }
}

fn vectors(rows: usize, k: usize) -> FixedSizeListArray {
    let values = Float32Array::from_iter_values((0..rows * k).map(|v| v as f32));
    FixedSizeListArray::new(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        k as i32,
        Arc::new(values),
        None,
    )
}

fn environment() {
    crate::device::Target::Cpu
        .environment()
        .expect("ONNX Runtime loads");
}

#[test]
fn fixed_size_list_of_the_model_type_is_passed_without_copying() {
    environment();
    // A slice with an offset: the tensor must point at row 3 of the child buffer, not a copy.
    let column = vectors(10, 4).slice(3, 5);
    let child = column.values().as_primitive::<Float32Type>();
    let arrow_ptr = child.values().as_ptr();
    let input = spec("x", E::Float32, &[-1, 4]);
    let columns: Vec<ArrayRef> = vec![Arc::new(column)];
    let tensor = prepare(&input, &InputSource::Column(0), &columns, 5).unwrap();
    assert_eq!(tensor.shape(), &[5, 4]);
    let value = tensor.to_value().unwrap();
    let (shape, data) = value.try_extract_tensor::<f32>().unwrap();
    assert_eq!(**shape, [5, 4]);
    assert_eq!(
        data.as_ptr(),
        arrow_ptr,
        "the tensor must read the Arrow buffer in place"
    );
    assert_eq!(data[0], 12.0);
    assert_eq!(data[19], 31.0);
}

#[test]
fn primitive_column_of_the_model_type_is_passed_without_copying() {
    environment();
    let column = Float32Array::from_iter_values((0..100).map(|v| v as f32)).slice(10, 50);
    let arrow_ptr = column.values().as_ptr();
    let columns: Vec<ArrayRef> = vec![Arc::new(column)];
    let tensor = prepare(
        &spec("x", E::Float32, &[-1]),
        &InputSource::Column(0),
        &columns,
        50,
    )
    .unwrap();
    let value = tensor.to_value().unwrap();
    let (_, data) = value.try_extract_tensor::<f32>().unwrap();
    assert_eq!(data.as_ptr(), arrow_ptr);
    assert_eq!(data[0], 10.0);
}

#[test]
fn list_column_is_passed_without_copying_when_rows_are_even() {
    environment();
    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(
        (0..6).map(|r| Some((0..3).map(move |j| Some((r * 3 + j) as f32)))),
    );
    let sliced = list.slice(2, 3);
    let child_ptr = list.values().as_primitive::<Float32Type>().values()[6..].as_ptr();
    let columns: Vec<ArrayRef> = vec![Arc::new(sliced)];
    let tensor = prepare(
        &spec("x", E::Float32, &[-1, 3]),
        &InputSource::Column(0),
        &columns,
        3,
    )
    .unwrap();
    let value = tensor.to_value().unwrap();
    let (shape, data) = value.try_extract_tensor::<f32>().unwrap();
    assert_eq!(**shape, [3, 3]);
    assert_eq!(data.as_ptr(), child_ptr);
    assert_eq!(data, &[6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0]);
}

#[test]
fn scalar_columns_are_packed_row_major_and_cast() {
    environment();
    let a: ArrayRef = Arc::new(Int32Array::from(vec![1, 2, 3]));
    let b: ArrayRef = Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5]));
    let c: ArrayRef = Arc::new(Float32Array::from(vec![-1.0, -2.0, -3.0]));
    let tensor = prepare(
        &spec("x", E::Float32, &[-1, 3]),
        &InputSource::Packed(vec![0, 1, 2]),
        &[a, b, c],
        3,
    )
    .unwrap();
    let value = tensor.to_value().unwrap();
    let (shape, data) = value.try_extract_tensor::<f32>().unwrap();
    assert_eq!(**shape, [3, 3]);
    assert_eq!(data, &[1.0, 0.5, -1.0, 2.0, 1.5, -2.0, 3.0, 2.5, -3.0]);
}

#[test]
fn booleans_and_strings_become_onnx_tensors() {
    environment();
    let flags: ArrayRef = Arc::new(BooleanArray::from(vec![true, false, true]));
    let tensor = prepare(
        &spec("d", E::Bool, &[-1]),
        &InputSource::Column(0),
        &[flags],
        3,
    )
    .unwrap();
    let value = tensor.to_value().unwrap();
    assert_eq!(
        value.try_extract_tensor::<bool>().unwrap().1,
        &[true, false, true]
    );

    let words: ArrayRef = Arc::new(StringArray::from(vec!["lagos", "", "osaka"]));
    let tensor = prepare(
        &spec("city", E::String, &[-1, 1]),
        &InputSource::Column(0),
        &[words],
        3,
    )
    .unwrap();
    assert!(matches!(tensor, InputTensor::Strings { .. }));
    let value = tensor.to_value().unwrap();
    let (shape, strings) = value.try_extract_strings().unwrap();
    assert_eq!(**shape, [3, 1]);
    assert_eq!(strings, vec!["lagos", "", "osaka"]);
}

#[test]
fn out_of_range_values_are_an_error_not_a_wrap() {
    let big: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 1e12]));
    let err = prepare(
        &spec("x", E::Int32, &[-1]),
        &InputSource::Column(0),
        &[big],
        2,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot convert Float64 to Int32"), "{err}");
}

#[test]
fn list_rows_of_the_wrong_length_are_rejected() {
    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0), Some(3.0)]),
        Some(vec![Some(1.0), Some(2.0)]),
    ]);
    let err = prepare(
        &spec("x", E::Float32, &[-1, 3]),
        &InputSource::Column(0),
        &[Arc::new(list)],
        2,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("row 1 of the batch holds 2 value(s), input 'x' takes 3 per row"),
        "{err}"
    );
}

#[test]
fn null_elements_inside_lists_are_rejected() {
    let list =
        ListArray::from_iter_primitive::<Float32Type, _, _>(vec![Some(vec![Some(1.0), None])]);
    let err = prepare(
        &spec("x", E::Float32, &[-1, 2]),
        &InputSource::Column(0),
        &[Arc::new(list)],
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("NULL elements inside its lists"), "{err}");
}

#[test]
fn binding_packs_scalar_columns_or_takes_one_column_per_input() {
    let one = signature(vec![spec("x", E::Float32, &[-1, 3])]);
    let binding = InputBinding::plan(
        &one,
        &[DataType::Float64, DataType::Int64, DataType::Float32],
    )
    .unwrap();
    assert_eq!(binding.sources, vec![InputSource::Packed(vec![0, 1, 2])]);

    let list = DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, true)), 3);
    let binding = InputBinding::plan(&one, std::slice::from_ref(&list)).unwrap();
    assert_eq!(binding.sources, vec![InputSource::Column(0)]);

    let two = signature(vec![
        spec("x", E::Float32, &[-1, 3]),
        spec("w", E::Float32, &[-1]),
    ]);
    let binding = InputBinding::plan(&two, &[list, DataType::Float32]).unwrap();
    assert_eq!(
        binding.sources,
        vec![InputSource::Column(0), InputSource::Column(1)]
    );
}

#[test]
fn binding_rejects_what_does_not_fit() {
    let one = signature(vec![spec("x", E::Float32, &[-1, 3])]);
    let err = InputBinding::plan(&one, &[DataType::Float32, DataType::Float32])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("input 'x' takes 3 values per row, 2 columns were given"),
        "{err}"
    );
    assert!(err.contains("x: float [N, 3]"), "{err}");

    let err = InputBinding::plan(
        &one,
        &[DataType::Utf8, DataType::Float32, DataType::Float32],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("column 1 is Utf8, which cannot be converted to input 'x' (float)"),
        "{err}"
    );

    let half = signature(vec![spec("x", E::Float16, &[-1, 2])]);
    let err = InputBinding::plan(&half, &[DataType::Float32, DataType::Float32])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("element type float16, which batchinfer does not support yet"),
        "{err}"
    );
}

#[test]
fn outputs_nest_into_fixed_size_lists_per_declared_dimension() {
    use super::output::to_array;
    environment();
    let value = ort::value::Tensor::from_array((
        [2usize, 2, 3],
        (0..12).map(|v| v as f32).collect::<Vec<_>>(),
    ))
    .unwrap();
    let inner =
        DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, true)), 3);
    let declared = DataType::FixedSizeList(Arc::new(Field::new_list_field(inner, true)), 2);
    let out = to_array(
        &value.into_dyn(),
        &spec("y", E::Float32, &[-1, 2, 3]),
        &declared,
        2,
    )
    .unwrap();
    assert_eq!(out.data_type(), &declared);
    let rows = out.as_fixed_size_list();
    let second_row = rows.value(1);
    let second_row_last = second_row.as_fixed_size_list().value(1);
    assert_eq!(
        second_row_last.as_primitive::<Float32Type>().values(),
        &[9.0, 10.0, 11.0]
    );
}

#[test]
fn open_output_dimensions_become_lists() {
    use super::output::to_array;
    environment();
    let value = ort::value::Tensor::from_array(([3usize, 2], vec![1i64, 2, 3, 4, 5, 6])).unwrap();
    let declared = DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true)));
    let out = to_array(
        &value.into_dyn(),
        &spec("y", E::Int64, &[-1, -1]),
        &declared,
        3,
    )
    .unwrap();
    let lists = out.as_list::<i32>();
    assert_eq!(lists.len(), 3);
    assert_eq!(
        lists
            .value(2)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .values(),
        &[5, 6]
    );
}

#[test]
fn an_output_without_a_row_per_input_row_is_an_error() {
    use super::output::to_array;
    environment();
    let value = ort::value::Tensor::from_array(([1usize], vec![1.0f32])).unwrap();
    let err = to_array(
        &value.into_dyn(),
        &spec("y", E::Float32, &[-1]),
        &DataType::Float32,
        4,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("expected its first dimension to be the 4 rows of the call"),
        "{err}"
    );
}

mod properties;
