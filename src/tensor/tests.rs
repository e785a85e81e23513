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
    crate::runtime::environment().expect("ONNX Runtime loads");
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
    .unwrap_err();
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
    .unwrap_err();
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
    .unwrap_err();
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
    let err = InputBinding::plan(&one, &[DataType::Float32, DataType::Float32]).unwrap_err();
    assert!(
        err.contains("input 'x' takes 3 values per row, 2 columns were given"),
        "{err}"
    );
    assert!(err.contains("x: float [N, 3]"), "{err}");

    let err = InputBinding::plan(
        &one,
        &[DataType::Utf8, DataType::Float32, DataType::Float32],
    )
    .unwrap_err();
    assert!(
        err.contains("column 1 is Utf8, which cannot be converted to input 'x' (float)"),
        "{err}"
    );

    let half = signature(vec![spec("x", E::Float16, &[-1, 2])]);
    let err = InputBinding::plan(&half, &[DataType::Float32, DataType::Float32]).unwrap_err();
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
    .unwrap_err();
    assert!(
        err.contains("expected its first dimension to be the 4 rows of the call"),
        "{err}"
    );
}

mod properties {
    //! Random arrays (every numeric type, NULLs, slices with offsets, lists of varied lengths):
    //! conversion to tensors is exact or an error, never a panic or wrong data.

    use std::sync::Arc;

    use datafusion::arrow::array::{
        Array, ArrayRef, BooleanArray, Float64Array, Int64Array, ListArray,
    };
    use datafusion::arrow::compute::{cast, filter};
    use datafusion::arrow::datatypes::{DataType, Field, Float32Type};
    use ort::value::TensorElementType as E;
    use proptest::prelude::*;

    use super::spec;
    use crate::tensor::input::{InputSource, prepare};
    use crate::tensor::output::to_array;

    fn element() -> impl Strategy<Value = E> {
        prop_oneof![
            Just(E::Float32),
            Just(E::Float64),
            Just(E::Int32),
            Just(E::Int64),
            Just(E::Uint8)
        ]
    }

    /// The tensor's data as f64, whatever its element type.
    fn tensor_values(value: &ort::session::SessionInputValue<'_>, element: E) -> Vec<f64> {
        match element {
            E::Float32 => value
                .try_extract_tensor::<f32>()
                .unwrap()
                .1
                .iter()
                .map(|&v| v as f64)
                .collect(),
            E::Float64 => value.try_extract_tensor::<f64>().unwrap().1.to_vec(),
            E::Int32 => value
                .try_extract_tensor::<i32>()
                .unwrap()
                .1
                .iter()
                .map(|&v| v as f64)
                .collect(),
            E::Int64 => value
                .try_extract_tensor::<i64>()
                .unwrap()
                .1
                .iter()
                .map(|&v| v as f64)
                .collect(),
            E::Uint8 => value
                .try_extract_tensor::<u8>()
                .unwrap()
                .1
                .iter()
                .map(|&v| v as f64)
                .collect(),
            _ => unreachable!(),
        }
    }

    fn arrow_values(array: &ArrayRef) -> Vec<f64> {
        let as_f64 = cast(array, &DataType::Float64).unwrap();
        as_f64
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    /// Whether every value fits `element` (integers: in range; floats: always).
    fn fits(values: &[f64], element: E) -> bool {
        let (lo, hi) = match element {
            E::Int32 => (i32::MIN as f64, i32::MAX as f64),
            E::Uint8 => (0.0, 255.0),
            _ => return true,
        };
        values.iter().all(|v| v.trunc() >= lo && v.trunc() <= hi)
    }

    /// Scalar columns (with NULLs, sliced at an offset) converted to each element type: the
    /// tensor holds exactly the values cast, or, exactly when a value does not fit, an error
    /// saying so. Counted per element type, so that a converter that refused everything (or
    /// accepted what does not fit) fails the test.
    #[test]
    fn scalar_columns_convert_exactly_or_fail() {
        use proptest::test_runner::{Config, TestRunner};
        use std::collections::HashMap;
        use std::sync::Mutex;
        super::environment();
        let outcomes: Mutex<HashMap<String, (usize, usize)>> = Mutex::new(HashMap::new());
        let strategy = (
            proptest::collection::vec(proptest::option::of(-1e6f64..1e6), 1..300),
            any::<bool>(),
            0usize..50,
            element(),
            0u8..3,
        );
        let mut runner = TestRunner::new(Config::with_cases(400));
        runner
            .run(&strategy, |(values, as_int, offset, element, narrow)| {
                // Narrow values too, so that every type gets columns that fit.
                let values: Vec<Option<f64>> = values
                    .iter()
                    .map(|v| v.map(|x| if narrow > 0 { x.abs() % 200.0 } else { x }))
                    .collect();
                let column: ArrayRef = if as_int {
                    Arc::new(
                        values
                            .iter()
                            .map(|v| v.map(|x| x as i64))
                            .collect::<Int64Array>(),
                    )
                } else {
                    Arc::new(values.iter().copied().collect::<Float64Array>())
                };
                let offset = offset.min(column.len() - 1);
                let column = column.slice(offset, column.len() - offset);
                // predict sets NULL rows aside before conversion (see src/model/score.rs, whose
                // tests feed NULLs through): do the same.
                let keep = BooleanArray::from(
                    (0..column.len())
                        .map(|i| column.is_valid(i))
                        .collect::<Vec<_>>(),
                );
                let dense = filter(column.as_ref(), &keep).unwrap();
                let rows = dense.len();
                let expected_fit = fits(&arrow_values(&dense), element);
                let result = prepare(
                    &spec("x", element, &[-1]),
                    &InputSource::Column(0),
                    std::slice::from_ref(&dense),
                    rows,
                );
                let mut counts = outcomes.lock().unwrap();
                let entry = counts.entry(format!("{element:?}")).or_default();
                match result {
                    Ok(tensor) => {
                        entry.0 += 1;
                        prop_assert!(expected_fit, "a value that does not fit converted");
                        let value = tensor.to_value().unwrap();
                        let target = crate::tensor::element::element_arrow_type(element).unwrap();
                        let expected = arrow_values(&cast(&dense, &target).unwrap());
                        prop_assert_eq!(tensor_values(&value, element), expected);
                    }
                    Err(message) => {
                        entry.1 += 1;
                        prop_assert!(!expected_fit, "refused values that fit: {}", message);
                        prop_assert!(message.contains("cannot convert"), "{}", message);
                    }
                }
                Ok(())
            })
            .unwrap();
        let counts = outcomes.into_inner().unwrap();
        for element in ["Float32", "Float64", "Int32", "Int64", "Uint8"] {
            let (converted, refused) = counts.get(element).copied().unwrap_or_default();
            assert!(
                converted >= 10,
                "{element}: only {converted} conversions ({refused} refused)"
            );
        }
        // A narrow type refuses what does not fit.
        assert!(counts["Uint8"].1 > 0, "{counts:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn list_columns_convert_exactly_when_rows_fit_and_fail_otherwise(
            rows in proptest::collection::vec(proptest::collection::vec(-1e3f32..1e3, 0..6), 1..60),
            k in 1usize..6,
            offset in 0usize..10,
        ) {
            super::environment();
            let list = ListArray::from_iter_primitive::<Float32Type, _, _>(
                rows.iter().map(|r| Some(r.iter().map(|v| Some(*v)).collect::<Vec<_>>())),
            );
            let offset = offset.min(rows.len() - 1);
            let sliced = list.slice(offset, rows.len() - offset);
            let expected_rows = &rows[offset..];
            let fits = expected_rows.iter().all(|r| r.len() == k);
            let column: Vec<ArrayRef> = vec![Arc::new(sliced)];
            match prepare(&spec("x", E::Float32, &[-1, k as i64]), &InputSource::Column(0), &column, expected_rows.len()) {
                Ok(tensor) => {
                    prop_assert!(fits);
                    let value = tensor.to_value().unwrap();
                    let flat: Vec<f32> = expected_rows.iter().flatten().copied().collect();
                    prop_assert_eq!(value.try_extract_tensor::<f32>().unwrap().1, flat.as_slice());
                }
                Err(message) => {
                    prop_assert!(!fits);
                    prop_assert!(message.contains("value(s), input 'x' takes"), "{}", message);
                }
            }
        }

        #[test]
        fn packed_columns_are_row_major(
            rows in 1usize..200,
            k in 1usize..8,
            seed in any::<u64>(),
            element in element(),
        ) {
            super::environment();
            let columns: Vec<ArrayRef> = (0..k)
                .map(|j| {
                    let values: Vec<i64> = (0..rows).map(|i| ((seed as usize).wrapping_add(i * 31 + j * 7) % 200) as i64).collect();
                    Arc::new(Int64Array::from(values)) as ArrayRef
                })
                .collect();
            let tensor = prepare(&spec("x", element, &[-1, k as i64]), &InputSource::Packed((0..k).collect()), &columns, rows).unwrap();
            prop_assert_eq!(tensor.shape(), &[rows as i64, k as i64]);
            let value = tensor.to_value().unwrap();
            let got = tensor_values(&value, element);
            let per_column: Vec<Vec<f64>> = columns.iter().map(arrow_values).collect();
            for i in 0..rows {
                for j in 0..k {
                    prop_assert_eq!(got[i * k + j], per_column[j][i]);
                }
            }
        }

        #[test]
        fn outputs_round_trip_through_nested_lists(
            rows in 1usize..50,
            a in 1usize..5,
            b in 1usize..5,
            open_inner in any::<bool>(),
        ) {
            super::environment();
            let data: Vec<f64> = (0..rows * a * b).map(|v| v as f64 * 0.5).collect();
            let value = ort::value::Tensor::from_array(([rows, a, b], data.clone())).unwrap().into_dyn();
            let inner = if open_inner {
                DataType::List(Arc::new(Field::new_list_field(DataType::Float64, true)))
            } else {
                DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float64, true)), b as i32)
            };
            let declared = DataType::FixedSizeList(Arc::new(Field::new_list_field(inner, true)), a as i32);
            let shape = [-1, a as i64, if open_inner { -1 } else { b as i64 }];
            let out = to_array(&value, &spec("y", E::Float64, &shape), &declared, rows).unwrap();
            prop_assert_eq!(out.len(), rows);
            prop_assert_eq!(out.data_type(), &declared);
            // Flatten both list levels and compare with the tensor's data.
            let level1 = out.as_any().downcast_ref::<datafusion::arrow::array::FixedSizeListArray>().unwrap().values().clone();
            let leaves = match level1.data_type() {
                DataType::List(_) => level1.as_any().downcast_ref::<ListArray>().unwrap().values().clone(),
                _ => level1.as_any().downcast_ref::<datafusion::arrow::array::FixedSizeListArray>().unwrap().values().clone(),
            };
            prop_assert_eq!(leaves.as_any().downcast_ref::<Float64Array>().unwrap().values().to_vec(), data);
        }
    }
}
