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
/// Whether `values` fit `element`; from a float column, an integer element takes whole numbers
/// only (a fraction is refused, not truncated).
fn fits(values: &[f64], element: E, from_float: bool) -> bool {
    let integer = !matches!(
        element,
        E::Float32 | E::Float64 | E::Float16 | E::Bool | E::String
    );
    if from_float && integer && values.iter().any(|v| v.fract() != 0.0) {
        return false;
    }
    let (lo, hi) = match element {
        E::Int32 => (i32::MIN as f64, i32::MAX as f64),
        E::Uint8 => (0.0, 255.0),
        _ => return true,
    };
    values.iter().all(|v| v.trunc() >= lo && v.trunc() <= hi)
}

/// A column of `values` (as Int64 or Float64; narrowed to 0..200 if `narrow`), sliced at
/// `offset`, with its NULL rows set aside as predict does before conversion (see
/// src/model/score.rs, whose tests feed NULLs through).
fn dense_column(values: &[Option<f64>], as_int: bool, offset: usize, narrow: bool) -> ArrayRef {
    // Narrow values too, so that every type gets columns that fit.
    let values: Vec<Option<f64>> = values
        .iter()
        .map(|v| v.map(|x| if narrow { x.abs() % 200.0 } else { x }))
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
    let keep = BooleanArray::from(
        (0..column.len())
            .map(|i| column.is_valid(i))
            .collect::<Vec<_>>(),
    );
    filter(column.as_ref(), &keep).unwrap()
}

/// Scalar columns (with NULLs, sliced at an offset) converted to each element type: the
/// tensor holds exactly the values cast, or, exactly when a value does not fit, an error
/// saying so. Counted per element type, so that a converter that refused everything (or
/// accepted what does not fit) fails the test.
#[test]
fn scalar_columns_convert_exactly_or_fail() {
    use parking_lot::Mutex;
    use proptest::test_runner::{Config, TestRunner};
    use std::collections::HashMap;
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
            let dense = dense_column(&values, as_int, offset, narrow > 0);
            let rows = dense.len();
            let from_float = dense.data_type().is_floating();
            let expected_fit = fits(&arrow_values(&dense), element, from_float);
            let result = prepare(
                &spec("x", element, &[-1]),
                &InputSource::Column(0),
                std::slice::from_ref(&dense),
                rows,
            );
            let mut counts = outcomes.lock();
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
                    let message = message.to_string();
                    entry.1 += 1;
                    prop_assert!(!expected_fit, "refused values that fit: {}", message);
                    prop_assert!(
                        message.contains("cannot convert")
                            || message.contains("not a whole number"),
                        "{}",
                        message
                    );
                }
            }
            Ok(())
        })
        .unwrap();
    let counts = outcomes.into_inner();
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
                let message = message.to_string();
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
