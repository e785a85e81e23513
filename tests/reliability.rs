//! Faults a batch job must survive with nothing lost: bad model files, models changing under a
//! running process, concurrent queries, cancellation, and memory limits. Through the library API.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use batchinfer::error::display_error;
use batchinfer::model::ModelSource;
use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::Float32Type;
use futures::StreamExt;

fn engine_over(dir: &Path) -> Engine {
    Engine::new(EngineConfig {
        models_dir: Some(dir.to_path_buf()),
        ..Default::default()
    })
    .unwrap()
}

async fn run(engine: &Engine, sql: &str) -> batchinfer::Result<Vec<RecordBatch>> {
    Ok(engine.sql(sql).await?.collect().await?)
}

async fn error_of(engine: &Engine, sql: &str) -> String {
    match run(engine, sql).await {
        Ok(_) => panic!("expected {sql} to fail"),
        Err(e) => display_error(&e),
    }
}

fn floats(batches: &[RecordBatch], column: usize) -> Vec<f32> {
    batches
        .iter()
        .flat_map(|b| {
            b.column(column)
                .as_primitive::<Float32Type>()
                .values()
                .to_vec()
        })
        .collect()
}

const LINEAR_ON_VECTORS: &str =
    "SELECT predict('linear', features) FROM 'data/sample/vectors.parquet' ORDER BY id";

#[tokio::test]
async fn truncated_model_file_is_a_load_error_naming_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read("data/models/breast_cancer.onnx").unwrap();
    std::fs::write(dir.path().join("cut.onnx"), &bytes[..bytes.len() / 2]).unwrap();
    let engine = engine_over(dir.path());
    let err = error_of(&engine, "SELECT predict('cut', 1.0)").await;
    assert!(
        err.contains("model 'cut' could not be loaded from"),
        "{err}"
    );
    assert!(err.contains("cut.onnx"), "{err}");
}

#[tokio::test]
async fn a_file_that_is_not_onnx_is_a_load_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy("data/sample/iris.parquet", dir.path().join("table.onnx")).unwrap();
    let engine = engine_over(dir.path());
    let err = error_of(&engine, "SELECT predict('table', 1.0)").await;
    assert!(
        err.contains("model 'table' could not be loaded from"),
        "{err}"
    );
}

#[tokio::test]
async fn a_model_path_that_does_not_exist_is_a_load_error() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_over(dir.path());
    engine
        .registry()
        .register("ghost", ModelSource::File("/no/such/ghost.onnx".into()));
    let err = error_of(&engine, "SELECT predict('ghost', 1.0)").await;
    assert!(
        err.contains("model 'ghost' could not be loaded from /no/such/ghost.onnx"),
        "{err}"
    );
    assert!(err.contains("No such file"), "{err}");
}

#[tokio::test]
async fn a_model_deleted_or_replaced_on_disk_keeps_serving_until_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scorer.onnx");
    std::fs::copy("data/models/linear.onnx", &path).unwrap();
    let engine = engine_over(dir.path());
    let sql = "SELECT predict('scorer', features) FROM 'data/sample/vectors.parquet' ORDER BY id";
    let before = floats(&run(&engine, sql).await.unwrap(), 0);

    // Deleted: the loaded model lives in memory, the next query is unaffected.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(floats(&run(&engine, sql).await.unwrap(), 0), before);

    // Replaced by another model: still the loaded one until the name is registered again,
    // then the new file, read whole.
    std::fs::copy("data/models/two_inputs.onnx", &path).unwrap();
    assert_eq!(floats(&run(&engine, sql).await.unwrap(), 0), before);
    engine
        .registry()
        .register("scorer", ModelSource::File(path.clone()));
    let err = error_of(&engine, sql).await;
    assert!(
        err.contains("model 'scorer': the model takes 2 inputs, 1 columns were given"),
        "{err}"
    );
    assert_eq!(engine.registry().loads(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_queries_agree_with_sequential_runs_and_load_the_model_once() {
    let engine = Arc::new(engine_over(Path::new("data/models")));
    let sequential = floats(&run(&engine, LINEAR_ON_VECTORS).await.unwrap(), 0);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move { floats(&run(&engine, LINEAR_ON_VECTORS).await.unwrap(), 0) })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), sequential);
    }
    assert_eq!(
        engine.registry().loads(),
        1,
        "the model is loaded once for all queries"
    );
    let model = engine.registry().get("linear").unwrap();
    assert!(
        model.sessions() <= EngineConfig::default().sessions(),
        "sessions stay within the pool size"
    );
}

const ENDLESS: &str = "SELECT predict('linear', value, value, value, value, value, value, value, value, value, value) \
                       FROM range(1000000000)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_stops_the_work_and_the_engine_keeps_serving() {
    let engine = engine_over(Path::new("data/models"));
    let mut stream = engine
        .sql(ENDLESS)
        .await
        .unwrap()
        .execute_stream()
        .await
        .unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert!(first.num_rows() > 0);
    let model = engine.registry().get("linear").unwrap();
    drop(stream);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = model.stats.calls.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        model.stats.calls.load(Ordering::Relaxed),
        calls,
        "no model call after the stream is dropped"
    );
    // A billion rows would take minutes; far fewer were scored.
    assert!(model.stats.rows.load(Ordering::Relaxed) < 100_000_000);
    // And the engine still serves.
    assert_eq!(
        floats(&run(&engine, LINEAR_ON_VECTORS).await.unwrap(), 0).len(),
        10_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_copy_leaves_no_file_behind() {
    let engine = Arc::new(engine_over(Path::new("data/models")));
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("scores.parquet");
    let sql = format!(
        "COPY ({ENDLESS}) TO '{}' STORED AS PARQUET",
        target.display()
    );
    let task = {
        let engine = engine.clone();
        tokio::spawn(async move { run(&engine, &sql).await })
    };
    let model = loop {
        if let Ok(m) = engine.registry().get("linear")
            && m.stats.calls.load(Ordering::Relaxed) > 10
        {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let cancelled_at = Instant::now();
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = model.stats.calls.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        model.stats.calls.load(Ordering::Relaxed),
        calls,
        "the write stopped"
    );
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "a cancelled COPY left {left:?}");
}

#[tokio::test]
async fn a_sort_larger_than_the_memory_limit_spills_and_finishes() {
    let engine = Engine::new(EngineConfig {
        models_dir: Some("data/models".into()),
        memory_limit: Some(16 << 20),
        ..Default::default()
    })
    .unwrap();
    // 3M rows of (int64, float32) is ~36 MB to sort, over twice the limit.
    let sql = "SELECT value, predict('linear', value, value, value, value, value, value, value, value, value, value) AS s \
               FROM range(3000000) ORDER BY s, value";
    let batches = run(&engine, sql).await.unwrap();
    let scores = floats(&batches, 1);
    assert_eq!(scores.len(), 3_000_000);
    assert!(scores.windows(2).all(|w| w[0] <= w[1]), "sorted");
}

#[tokio::test]
async fn an_aggregation_that_cannot_fit_fails_with_a_clear_error() {
    let engine = Engine::new(EngineConfig {
        memory_limit: Some(1 << 20),
        ..Default::default()
    })
    .unwrap();
    let err = error_of(&engine, "SELECT count(DISTINCT value) FROM range(3000000)").await;
    assert!(err.contains("Resources exhausted"), "{err}");
}

#[tokio::test]
async fn results_after_a_failed_query_are_unaffected() {
    let engine = engine_over(Path::new("data/models"));
    let good = floats(&run(&engine, LINEAR_ON_VECTORS).await.unwrap(), 0);
    let err = error_of(
        &engine,
        "SELECT predict('lookup', v) FROM (VALUES (1), (99)) t(v)",
    )
    .await;
    assert!(err.contains("model 'lookup' failed on rows 0..2"), "{err}");
    assert_eq!(
        floats(&run(&engine, LINEAR_ON_VECTORS).await.unwrap(), 0),
        good
    );
    let values = run(
        &engine,
        "SELECT predict('lookup', v) FROM (VALUES (1), (2)) t(v)",
    )
    .await
    .unwrap();
    assert_eq!(values[0].column(0).null_count(), 0);
}
