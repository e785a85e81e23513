//! Microbenchmarks of what batchinfer adds around the model: Arrow -> tensor and tensor -> Arrow
//! conversion per type and layout, and `predict` on one 8192-row batch next to the model call
//! alone (the difference is batchinfer's overhead).
//!
//! ```sh
//! cargo bench --bench conversions
//! ```

use std::sync::Arc;

use batchinfer::model::score::score;
use batchinfer::model::{Model, ModelSource, SessionOptions, TensorSpec};
use batchinfer::storage::StoreRegistry;
use batchinfer::tensor::input::{InputBinding, InputSource, prepare};
use batchinfer::tensor::output::to_array;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, Float64Array, ListArray, StringArray,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field};
use ort::value::{DynValue, Tensor, TensorElementType as E, TensorRef};

const ROWS: usize = 8192;
const K: usize = 10;

fn spec(element: E, shape: &[i64]) -> TensorSpec {
    TensorSpec {
        name: "x".into(),
        element: Some(element),
        shape: shape.to_vec(),
        description: String::new(),
    }
}

fn floats(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 1000) as f32 * 0.001).collect()
}

fn columns_f32() -> Vec<ArrayRef> {
    (0..K)
        .map(|_| Arc::new(Float32Array::from(floats(ROWS))) as ArrayRef)
        .collect()
}

fn arrow_to_tensor(c: &mut Criterion) {
    batchinfer::device::Target::Cpu.environment().unwrap();
    let mut group = c.benchmark_group("arrow_to_tensor");
    group.throughput(Throughput::Elements((ROWS * K) as u64));
    let input = spec(E::Float32, &[-1, K as i64]);
    let item = Arc::new(Field::new_list_field(DataType::Float32, false));

    let fixed: Vec<ArrayRef> = vec![Arc::new(FixedSizeListArray::new(
        item.clone(),
        K as i32,
        Arc::new(Float32Array::from(floats(ROWS * K))),
        None,
    ))];
    group.bench_function("fixed_size_list_f32x10_zero_copy", |b| {
        b.iter(|| {
            let t = prepare(&input, &InputSource::Column(0), &fixed, ROWS).unwrap();
            std::hint::black_box(t.to_value().unwrap());
        })
    });

    let list: Vec<ArrayRef> = vec![Arc::new(ListArray::new(
        item,
        OffsetBuffer::from_lengths(std::iter::repeat_n(K, ROWS)),
        Arc::new(Float32Array::from(floats(ROWS * K))),
        None,
    ))];
    group.bench_function("list_f32x10_zero_copy", |b| {
        b.iter(|| {
            let t = prepare(&input, &InputSource::Column(0), &list, ROWS).unwrap();
            std::hint::black_box(t.to_value().unwrap());
        })
    });

    let packed_source = InputSource::Packed((0..K).collect());
    let f32_columns = columns_f32();
    group.bench_function("10_f32_columns_packed", |b| {
        b.iter(|| {
            let t = prepare(&input, &packed_source, &f32_columns, ROWS).unwrap();
            std::hint::black_box(t.to_value().unwrap());
        })
    });

    let f64_columns: Vec<ArrayRef> = (0..K)
        .map(|_| Arc::new(Float64Array::from_iter_values((0..ROWS).map(|i| i as f64))) as ArrayRef)
        .collect();
    group.bench_function("10_f64_columns_cast_and_packed", |b| {
        b.iter(|| {
            let t = prepare(&input, &packed_source, &f64_columns, ROWS).unwrap();
            std::hint::black_box(t.to_value().unwrap());
        })
    });
    group.finish();

    let mut group = c.benchmark_group("arrow_to_tensor_one_column");
    group.throughput(Throughput::Elements(ROWS as u64));
    let strings: Vec<ArrayRef> = vec![Arc::new(StringArray::from_iter_values(
        (0..ROWS).map(|i| format!("city-{}", i % 50)),
    ))];
    group.bench_function("string_column", |b| {
        b.iter(|| {
            let t = prepare(
                &spec(E::String, &[-1, 1]),
                &InputSource::Column(0),
                &strings,
                ROWS,
            )
            .unwrap();
            std::hint::black_box(t.to_value().unwrap());
        })
    });
    let bools: Vec<ArrayRef> = vec![Arc::new(BooleanArray::from_iter(
        (0..ROWS).map(|i| Some(i % 3 == 0)),
    ))];
    group.bench_function("bool_column", |b| {
        b.iter(|| {
            let t = prepare(&spec(E::Bool, &[-1]), &InputSource::Column(0), &bools, ROWS).unwrap();
            std::hint::black_box(t.to_value().unwrap());
        })
    });
    group.finish();
}

fn tensor_to_arrow(c: &mut Criterion) {
    batchinfer::device::Target::Cpu.environment().unwrap();
    let mut group = c.benchmark_group("tensor_to_arrow");
    let scalar: DynValue = Tensor::from_array(([ROWS, 1], floats(ROWS)))
        .unwrap()
        .into_dyn();
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("f32_n_by_1_to_scalar_column", |b| {
        b.iter(|| {
            std::hint::black_box(to_array(
                &scalar,
                &spec(E::Float32, &[-1, 1]),
                &DataType::Float32,
                ROWS,
            ))
        })
    });
    let probabilities: DynValue = Tensor::from_array(([ROWS, 3], floats(ROWS * 3)))
        .unwrap()
        .into_dyn();
    let declared =
        DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, true)), 3);
    group.bench_function("f32_n_by_3_to_fixed_size_list", |b| {
        b.iter(|| {
            std::hint::black_box(to_array(
                &probabilities,
                &spec(E::Float32, &[-1, 3]),
                &declared,
                ROWS,
            ))
        })
    });
    let labels: Vec<String> = (0..ROWS).map(|i| format!("label-{}", i % 7)).collect();
    let strings: DynValue = Tensor::from_string_array(([ROWS], labels.as_slice()))
        .unwrap()
        .into_dyn();
    group.bench_function("string_n_to_utf8_column", |b| {
        b.iter(|| {
            std::hint::black_box(to_array(
                &strings,
                &spec(E::String, &[-1]),
                &DataType::Utf8,
                ROWS,
            ))
        })
    });
    group.finish();
}

fn predict_overhead(c: &mut Criterion) {
    let options = SessionOptions {
        max_sessions: 1,
        intra_threads: 1,
        optimization: Default::default(),
        varying_shapes: false,
        device: Default::default(),
    };
    let model = Model::load(
        "linear",
        &ModelSource::parse("data/models/linear.onnx").unwrap(),
        options,
        &StoreRegistry::new(),
    )
    .unwrap();
    let columns = columns_f32();
    let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
    let binding = InputBinding::plan(&model.signature, &types).unwrap();
    let mut group = c.benchmark_group("predict_8192_rows");
    group.throughput(Throughput::Elements(ROWS as u64));
    group.bench_function("whole_udf_10_columns", |b| {
        b.iter(|| {
            std::hint::black_box(
                score(&model, &binding, &columns, ROWS, Default::default()).unwrap(),
            )
        })
    });
    let packed = floats(ROWS * K);
    group.bench_function("model_call_alone", |b| {
        b.iter(|| {
            let input = TensorRef::from_array_view(([ROWS, K], packed.as_slice())).unwrap();
            std::hint::black_box(
                model
                    .run(vec![input.into()], ROWS, &Default::default())
                    .unwrap(),
            );
        })
    });
    group.finish();
}

criterion_group!(benches, arrow_to_tensor, tensor_to_arrow, predict_overhead);
criterion_main!(benches);
