//! Faults a batch job must survive with nothing lost: bad model files, models changing under a
//! running process, concurrent queries, cancellation, and memory limits. Through the library API.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use batchinfer::message::display_error;
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
        .register("ghost", ModelSource::parse("/no/such/ghost.onnx").unwrap());
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
        .register("scorer", ModelSource::from_path(&path).unwrap());
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
    // Time inside the model over the time it ran: how many calls ran at once, on average.
    let inside = model.stats.nanos.load(std::sync::atomic::Ordering::Relaxed) as f64;
    let at_once = inside / model.occupied_nanos() as f64;
    let most = EngineConfig::default().sessions() as f64;
    assert!(
        at_once > 0.0 && at_once <= most + 0.01,
        "{at_once:.2} calls ran at once; at most {most} may"
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

/// Every file under `dir`, hidden ones too, with its bytes.
fn files_in(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    files_under(dir)
}

/// Fails, naming what was added, removed or changed, when `dir` no longer holds `before`.
fn assert_unchanged(
    dir: &Path,
    before: &std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>,
    what: &str,
) {
    let after = files_under(dir);
    let mut changed: Vec<String> = before
        .iter()
        .filter(|(path, bytes)| after.get(*path) != Some(bytes))
        .map(|(path, _)| format!("changed or removed {}", path.display()))
        .collect();
    changed.extend(
        after
            .keys()
            .filter(|p| !before.contains_key(*p))
            .map(|p| format!("added {}", p.display())),
    );
    assert!(changed.is_empty(), "{what}: {changed:?}");
}

fn files_under(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files.insert(path.clone(), Vec::new());
                pending.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    files
}

/// Starts `sql` on a task, waits until the model has scored `rows` rows (more than the output's
/// row groups of 256Ki rows: several were written), then cancels it: the work stops promptly.
async fn cancel_after(engine: &Arc<Engine>, sql: String, rows: u64) {
    let before = engine
        .registry()
        .get("linear")
        .map(|m| m.stats.rows.load(Ordering::Relaxed))
        .unwrap_or(0);
    let task = {
        let engine = engine.clone();
        tokio::spawn(async move { run(&engine, &sql).await })
    };
    let model = loop {
        if let Ok(m) = engine.registry().get("linear")
            && m.stats.rows.load(Ordering::Relaxed) > before + rows
        {
            break m;
        }
        assert!(
            !task.is_finished(),
            "the statement ended before it was cancelled"
        );
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
    batchinfer::storage::discards_done().await;
}

/// Endless rows of ten random doubles (incompressible: past 1.5M rows each output file has sent
/// far more than the writer's 10 MiB buffer to disk) with a score.
const ENDLESS_WIDE: &str = "SELECT value, random() AS r0, random() AS r1, random() AS r2, random() AS r3, \
    random() AS r4, random() AS r5, random() AS r6, random() AS r7, random() AS r8, random() AS r9, \
    predict('linear', value, value, value, value, value, value, value, value, value, value) AS p \
    FROM range(1000000000)";

/// COPY to a file and to a folder, cancelled after several row groups were written (and tens
/// of MiB reached the disk): what was there stays as it was, and a new target is not created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_cancelled_after_several_row_groups_leaves_what_was_there() {
    let engine = Arc::new(engine_over(Path::new("data/models")));
    let dir = tempfile::tempdir().unwrap();
    let (file, folder) = (dir.path().join("old.parquet"), dir.path().join("old"));
    run(
        &engine,
        &format!(
            "COPY (SELECT 1 AS kept) TO '{}' STORED AS PARQUET",
            file.display()
        ),
    )
    .await
    .unwrap();
    run(
        &engine,
        &format!(
            "COPY (SELECT 2 AS kept) TO '{}/' STORED AS PARQUET",
            folder.display()
        ),
    )
    .await
    .unwrap();
    let before = files_in(dir.path());
    for target in [
        file.display().to_string(),
        format!("{}/", folder.display()),
        dir.path().join("new.parquet").display().to_string(),
        format!("{}/new/", dir.path().display()),
    ] {
        let sql = format!("COPY ({ENDLESS_WIDE}) TO '{target}' STORED AS PARQUET");
        cancel_after(&engine, sql, 1_500_000).await;
        assert_unchanged(dir.path(), &before, &target);
    }
}

/// COPY to a file and to a folder that fails after 1.5M rows (several row groups) were written:
/// what was there stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_failing_after_several_row_groups_leaves_what_was_there() {
    let engine = engine_over(Path::new("data/models"));
    let dir = tempfile::tempdir().unwrap();
    let (file, folder) = (dir.path().join("old.parquet"), dir.path().join("old"));
    for (target, slash) in [(&file, ""), (&folder, "/")] {
        let sql = format!(
            "COPY (SELECT 1 AS kept) TO '{}{slash}' STORED AS PARQUET",
            target.display()
        );
        run(&engine, &sql).await.unwrap();
    }
    let before = files_in(dir.path());
    for (target, slash) in [(&file, ""), (&folder, "/")] {
        let sql = format!(
            "COPY (SELECT value, predict('linear', value, value, value, value, value, value, value, value, value, value) AS p, 10 / (value - 1500000) AS q \
             FROM range(2000000)) TO '{}{slash}' STORED AS PARQUET",
            target.display()
        );
        let err = error_of(&engine, &sql).await;
        assert!(err.contains("Divide by zero"), "{err}");
        assert_unchanged(dir.path(), &before, "a failed COPY");
    }
    let rows = engine
        .registry()
        .get("linear")
        .unwrap()
        .stats
        .rows
        .load(Ordering::Relaxed);
    assert!(
        rows > 1_000_000,
        "the failure came after rows were written ({rows} scored)"
    );
}

fn engine_with_warehouse(warehouse: &Path) -> Engine {
    Engine::new(EngineConfig {
        models_dir: Some("data/models".into()),
        warehouse: Some(warehouse.to_path_buf()),
        ..Default::default()
    })
    .unwrap()
}

const FAILS_AFTER_ROW_GROUPS: &str = "SELECT value, predict('linear', value, value, value, value, value, value, value, value, value, value) AS p, 10 / (value - 1500000) AS q FROM range(2000000)";

/// CREATE TABLE that fails after rows were written: no table and no file; CREATE OR REPLACE
/// TABLE that fails, or is cancelled: the old table whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_table_failing_after_rows_were_written_leaves_the_old_state() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let engine = Arc::new(engine_with_warehouse(&wh));
    let err = error_of(
        &engine,
        &format!("CREATE TABLE t AS {FAILS_AFTER_ROW_GROUPS}"),
    )
    .await;
    assert!(err.contains("Divide by zero"), "{err}");
    let rows = engine
        .registry()
        .get("linear")
        .unwrap()
        .stats
        .rows
        .load(Ordering::Relaxed);
    assert!(
        rows > 1_000_000,
        "the failure came after rows were written ({rows} scored)"
    );
    assert!(
        files_in(&wh.join("tables")).is_empty(),
        "{:?}",
        files_in(&wh)
    );
    assert!(
        error_of(&engine, "SELECT * FROM t")
            .await
            .contains("not found")
    );

    run(&engine, "CREATE TABLE t AS SELECT 41 AS x")
        .await
        .unwrap();
    let before = files_in(&wh.join("tables"));
    let err = error_of(
        &engine,
        &format!("CREATE OR REPLACE TABLE t AS {FAILS_AFTER_ROW_GROUPS}"),
    )
    .await;
    assert!(err.contains("Divide by zero"), "{err}");
    assert_unchanged(
        &wh.join("tables"),
        &before,
        "a failed CREATE OR REPLACE TABLE",
    );
    cancel_after(
        &engine,
        format!("CREATE OR REPLACE TABLE t AS {ENDLESS}"),
        700_000,
    )
    .await;
    assert_unchanged(
        &wh.join("tables"),
        &before,
        "a cancelled CREATE OR REPLACE TABLE",
    );
    // And in the next process too.
    let reopened = Engine::open(EngineConfig {
        warehouse: Some(wh.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    let batches = run(&reopened, "SELECT x FROM t").await.unwrap();
    assert_eq!(
        batches[0]
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
            .value(0),
        41
    );
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
    let frame = engine.sql(sql).await.unwrap();
    let task = Arc::new(frame.task_ctx());
    let plan = frame.create_physical_plan().await.unwrap();
    let batches = datafusion::physical_plan::collect(plan.clone(), task)
        .await
        .unwrap();
    let scores = floats(&batches, 1);
    assert_eq!(scores.len(), 3_000_000);
    assert!(scores.windows(2).all(|w| w[0] <= w[1]), "sorted");
    // It finished because it spilled, not because it fit.
    fn spills(plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>) -> usize {
        let own = plan.metrics().and_then(|m| m.spill_count()).unwrap_or(0);
        own + plan.children().into_iter().map(spills).sum::<usize>()
    }
    let spilled = spills(&plan);
    assert!(spilled > 0, "the sort did not spill");
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

/// One session of a model, called from 16 threads at once (16 partitions of 7-row batches), gives
/// the results of calls made one at a time, bit for bit: the tree ensemble's label and
/// probabilities, the linear model, and the rows `lookup` fails on with `on_error = 'null'`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_calls_at_once_on_one_session_give_the_results_of_one_at_a_time() {
    let engine_with = |calls: usize| {
        Engine::new(EngineConfig {
            models_dir: Some("data/models".into()),
            target_partitions: calls,
            sessions_per_model: calls,
            // ONNX Runtime's own threads change a tree ensemble's sums in the last bit.
            intra_threads: 1,
            batch_size: 7,
            ..Default::default()
        })
        .unwrap()
    };
    let (one, many) = (engine_with(1), engine_with(16));
    // The model's 30 inputs: every column of its table but the id.
    let table = one
        .sql("SELECT * FROM 'data/sample/breast_cancer.parquet'")
        .await
        .unwrap();
    let columns: Vec<&str> = table
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|name| *name != "id")
        .collect();
    let columns = columns.join(", ");
    let queries = [
        format!(
            "SELECT b.id * 10 + r.value AS id, predict('breast_cancer', {columns}) AS p \
             FROM 'data/sample/breast_cancer.parquet' b CROSS JOIN range(10) r ORDER BY id"
        ),
        "SELECT id, predict('linear', features) AS p FROM 'data/sample/vectors.parquet' ORDER BY id"
            .to_string(),
        "SELECT value AS id, predict('lookup', CAST(value % 40 AS BIGINT)) AS p FROM range(20000) ORDER BY id"
            .to_string(),
    ];
    for engine in [&one, &many] {
        run(engine, "SET batchinfer.on_error = 'null'")
            .await
            .unwrap();
    }
    for sql in &queries {
        let alone = run(&one, sql).await.unwrap();
        let together = run(&many, sql).await.unwrap();
        let concat = |batches: &[RecordBatch]| {
            datafusion::arrow::compute::concat_batches(&batches[0].schema(), batches).unwrap()
        };
        let (alone, together) = (concat(&alone), concat(&together));
        assert!(alone.num_rows() > 0, "{sql}");
        assert_eq!(alone, together, "{sql}");
    }
    let lookup = run(
        &many,
        "SELECT count(*) FILTER (WHERE p IS NULL) AS failed FROM \
         (SELECT predict('lookup', CAST(value % 40 AS BIGINT)) AS p FROM range(20000))",
    )
    .await
    .unwrap();
    let failed = lookup[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    assert!(
        failed.value(0) > 0,
        "lookup failed on no row: the test tests nothing"
    );
    let model = many.registry().get("breast_cancer").unwrap();
    assert_eq!(model.max_sessions(), 16);
}

/// `models()` as CSV-like text: one line per model.
async fn listed(engine: &Engine) -> Vec<String> {
    let batches = run(engine, "SELECT * FROM models() ORDER BY name")
        .await
        .unwrap();
    let mut lines = Vec::new();
    for batch in &batches {
        for row in 0..batch.num_rows() {
            let values: Vec<String> = batch
                .columns()
                .iter()
                .map(|c| datafusion::arrow::util::display::array_value_to_string(c, row).unwrap())
                .collect();
            lines.push(values.join(" | "));
        }
    }
    lines
}

/// Listing models reads what it lists and loads nothing: `models()` and SHOW MODELS over 500
/// models build no session, and say of each model exactly what ONNX Runtime says of it once it
/// is loaded (every model of data/models, inputs, outputs, size and sha256).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_models_loads_none_and_says_what_onnx_runtime_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir("data/models").unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "onnx") {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
            files += 1;
        }
    }
    for i in 0..500 {
        std::fs::copy(
            "data/models/linear.onnx",
            dir.path().join(format!("m{i:03}.onnx")),
        )
        .unwrap();
    }
    let engine = engine_over(dir.path());
    let before = listed(&engine).await;
    run(&engine, "SHOW MODELS").await.unwrap();
    assert_eq!(engine.registry().loads(), 0, "listing loaded models");
    assert_eq!(before.len(), files + 500);
    // Each model loaded: the same lines, now from its session.
    let names: Vec<String> = before
        .iter()
        .map(|l| l.split(" | ").next().unwrap().to_string())
        .filter(|n| !n.starts_with('m') || n == "m000")
        .collect();
    for name in &names {
        engine.registry().get(name).unwrap();
    }
    let after = listed(&engine).await;
    for (was, now) in before.iter().zip(&after) {
        let name = was.split(" | ").next().unwrap();
        if names.iter().any(|n| n == name) {
            assert_eq!(
                was, now,
                "{name}: listed from its file, then from its session"
            );
        }
    }
}

/// A running process reads a table another process dropped and created again as it is now,
/// with its new columns, however quickly it comes back: a folder made anew can get the inode
/// number of the one removed, which alone does not tell them apart. Rounds of DROP and CREATE
/// by one engine, each read by another over the same warehouse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_and_created_again_elsewhere_is_read_with_its_new_columns() {
    let dir = tempfile::tempdir().unwrap();
    let over = |dir: &Path| {
        Engine::new(EngineConfig {
            warehouse: Some(dir.join("wh")),
            ..Default::default()
        })
        .unwrap()
    };
    let (reader, writer) = (over(dir.path()), over(dir.path()));
    let folder = dir.path().join("wh/tables/t");
    let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&folder).unwrap());
    // Until the inode number has come back a few times (it mostly does at once on ext4).
    let (mut last, mut reused) = (None, 0);
    for round in 0..400 {
        if reused == 5 {
            break;
        }
        let columns = format!("c{round}");
        run(&writer, "DROP TABLE IF EXISTS t").await.unwrap();
        let create = format!("CREATE TABLE t AS SELECT {round} AS {columns}, 'x' AS s{round}");
        run(&writer, &create).await.unwrap();
        reused += usize::from(last == Some(inode()));
        last = Some(inode());
        let read = run(&reader, "SELECT * FROM t").await.unwrap();
        let schema = read[0].schema();
        let names: Vec<&String> = schema.fields().iter().map(|f| f.name()).collect();
        assert_eq!(names, [&columns, &format!("s{round}")], "round {round}");
        let value = read[0]
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(value.value(0), round, "round {round}");
    }
    eprintln!("the folder's inode number came back {reused} times");
}
