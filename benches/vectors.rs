//! batchinfer's `cosine_similarity` (a thin alias of `1 - cosine_distance` that keeps its own
//! length check) next to DataFusion's `cosine_distance` called directly, in SQL over 8,192
//! embeddings of 384 float32 values: against one constant vector (a search) and row against row.
//! `dot_product` is DataFusion's `inner_product` by its alias.
//!
//! ```sh
//! cargo bench --bench vectors
//! ```

use std::sync::Arc;

use batchinfer::udf::CosineSimilarity;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use datafusion::arrow::array::{Array, FixedSizeListArray, Float32Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionContext;

const ROWS: usize = 8192;
const DIM: i32 = 384;

fn vectors(seed: usize) -> FixedSizeListArray {
    let values: Vec<f32> = (0..ROWS * DIM as usize)
        .map(|i| ((i * 7919 + seed) % 1000) as f32 * 0.001 - 0.5)
        .collect();
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    FixedSizeListArray::new(item, DIM, Arc::new(Float32Array::from(values)), None)
}

fn context(runtime: &tokio::runtime::Runtime) -> SessionContext {
    let ctx = SessionContext::new();
    ctx.register_udf(ScalarUDF::from(CosineSimilarity::default()));
    let (a, b) = (vectors(1), vectors(2));
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", a.data_type().clone(), true),
        Field::new("b", b.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(a), Arc::new(b)]).unwrap();
    let table = MemTable::try_new(schema, vec![vec![batch]]).unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    // One constant vector, as `embed('m', 'query text')` gives after constant folding.
    runtime
        .block_on(ctx.sql("CREATE TABLE q AS SELECT a AS v FROM t LIMIT 1"))
        .unwrap();
    ctx
}

fn similarity(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ctx = context(&runtime);
    let constant = runtime
        .block_on(async {
            let df = ctx.sql("SELECT v FROM q").await?;
            df.collect().await
        })
        .unwrap();
    let list = constant[0]
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeListArray>();
    let literal: Vec<String> = list
        .unwrap()
        .value(0)
        .as_any()
        .downcast_ref::<Float32Array>()
        .unwrap()
        .values()
        .iter()
        .map(|v| format!("{v:?}"))
        .collect();
    let query = format!(
        "arrow_cast(make_array({}), 'FixedSizeList(384, Float32)')",
        literal.join(", ")
    );
    let mut group = c.benchmark_group("similarity");
    group.throughput(Throughput::Elements(ROWS as u64));
    for (name, expr) in [
        (
            "cosine_similarity/constant",
            format!("cosine_similarity(a, {query})"),
        ),
        (
            "1-cosine_distance/constant",
            format!("1 - cosine_distance(a, {query})"),
        ),
        (
            "cosine_similarity/rows",
            "cosine_similarity(a, b)".to_string(),
        ),
        (
            "1-cosine_distance/rows",
            "1 - cosine_distance(a, b)".to_string(),
        ),
        ("dot_product/rows", "dot_product(a, b)".to_string()),
    ] {
        let sql = format!("SELECT sum({expr}) FROM t");
        // Planned once: what is timed is the function over the batch.
        let plan = runtime
            .block_on(async { ctx.sql(&sql).await?.create_physical_plan().await })
            .unwrap();
        group.bench_function(name, |bench| {
            bench.iter(|| {
                runtime
                    .block_on(datafusion::physical_plan::collect(
                        plan.clone(),
                        ctx.task_ctx(),
                    ))
                    .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, similarity);
criterion_main!(benches);
