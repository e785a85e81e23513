//! `batchinfer serve`: the pytest suite in `tests/serve/`, whose client is ADBC's Flight SQL
//! driver (from PyPI, in the environment `scripts/python_env.sh` makes) against the binary this
//! `cargo test` built; and the sessions a server gives its clients, over one engine's models.

mod fixtures;

use std::path::Path;
use std::process::Command;

use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::RecordBatch;
use futures::StreamExt;

#[test]
fn adbc_client_suite() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(fixtures::python_env())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-s"])
        .arg(root.join("tests/serve"))
        .current_dir(root)
        .env("BATCHINFER_CLI", env!("CARGO_BIN_EXE_batchinfer"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .status()
        .expect("pytest runs");
    assert!(
        status.success(),
        "the serve suite failed (its output is above)"
    );
}

/// Each client session has settings of its own; the models are loaded once for all of them.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_share_models_not_settings() {
    let warehouse = tempfile::tempdir().unwrap();
    let root = Engine::open(EngineConfig {
        models_dir: Some("data/models".into()),
        warehouse: Some(warehouse.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .unwrap();
    let score = "SELECT sum(predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)) AS s \
                 FROM 'data/sample/features.parquet'";
    let mut sums = Vec::new();
    let sessions: Vec<Engine> = (0..3).map(|_| root.session().unwrap()).collect();
    sessions[0]
        .sql("SET datafusion.execution.batch_size = 100")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    for session in &sessions {
        let batches = session.sql(score).await.unwrap().collect().await.unwrap();
        sums.push(format!("{:?}", batches[0].column(0)));
        let size = session.context().state().config().batch_size();
        assert_eq!(
            size,
            if std::ptr::eq(session, &sessions[0]) {
                100
            } else {
                8192
            }
        );
    }
    assert!(sums.windows(2).all(|w| w[0] == w[1]), "{sums:?}");
    assert_eq!(
        root.registry().loads(),
        1,
        "the model loaded once for every session"
    );
}

async fn run(session: &Engine, sql: &str) -> batchinfer::Result<Vec<RecordBatch>> {
    let mut batches = Vec::new();
    for statement in sql.split(';').filter(|s| !s.trim().is_empty()) {
        batches = session.sql(statement).await?.collect().await?;
    }
    Ok(batches)
}

async fn engine(warehouse: &Path) -> Engine {
    Engine::open(EngineConfig {
        models_dir: Some("data/models".into()),
        warehouse: Some(warehouse.to_path_buf()),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// A statement's error budget is its own for as long as it runs: another session running
/// hundreds of statements meanwhile (each with a tally of its own) never makes it forget what
/// it counted. 100 rows fail under `max_errors = '30'`, 25 a batch, with 300 statements of the
/// other session between two batches.
#[tokio::test(flavor = "multi_thread")]
async fn an_error_budget_holds_while_another_session_runs_hundreds_of_statements() {
    let warehouse = tempfile::tempdir().unwrap();
    let root = engine(warehouse.path()).await;
    let (long, busy) = (root.session().unwrap(), root.session().unwrap());
    run(
        &long,
        "SET batchinfer.on_error = 'null'; SET batchinfer.max_errors = '30';
         SET datafusion.execution.batch_size = 25; SET datafusion.execution.target_partitions = 1",
    )
    .await
    .unwrap();
    run(
        &busy,
        "SET batchinfer.on_error = 'null'; SET batchinfer.max_errors = '1000000'",
    )
    .await
    .unwrap();
    let df = long
        .sql("SELECT predict('lookup', value + 100) AS p FROM range(100)")
        .await
        .unwrap();
    let mut stream = df.execute_stream().await.unwrap();
    let mut outcome = Ok(0);
    while let Some(batch) = stream.next().await {
        match batch {
            Ok(batch) => outcome = outcome.map(|rows| rows + batch.num_rows()),
            Err(e) => {
                outcome = Err(e.to_string());
                break;
            }
        }
        for _ in 0..300 {
            run(
                &busy,
                "SELECT predict('lookup', v) FROM (VALUES (1), (42)) t(v)",
            )
            .await
            .unwrap();
        }
    }
    let e = outcome.expect_err("100 failed rows are past max_errors = '30'");
    assert!(e.contains("past batchinfer.max_errors = '30'"), "{e}");
}

/// `SET batchinfer.max_footer_bytes` is one session's: a session that never set it reads the
/// files another session's cap refuses, even when that session's statement starts while its
/// own is planned and not yet run. The file is new to the process (no footer cached), its
/// table declared (nothing read at planning).
#[tokio::test(flavor = "multi_thread")]
async fn a_footer_cap_set_in_one_session_leaves_the_others_alone() {
    let warehouse = tempfile::tempdir().unwrap();
    let root = engine(warehouse.path()).await;
    let (capped, other) = (root.session().unwrap(), root.session().unwrap());
    let dir = tempfile::tempdir().unwrap();
    for name in ["a.parquet", "b.parquet"] {
        std::fs::copy("data/sample/features.parquet", dir.path().join(name)).unwrap();
    }
    run(&capped, "SET batchinfer.max_footer_bytes = '100'")
        .await
        .unwrap();
    let columns: Vec<String> = (0..10).map(|i| format!("f{i} FLOAT")).collect();
    run(
        &other,
        &format!(
            "SET datafusion.execution.collect_statistics = false;
             CREATE EXTERNAL TABLE a ({}) STORED AS PARQUET LOCATION '{}'",
            columns.join(", "),
            dir.path().join("a.parquet").display()
        ),
    )
    .await
    .unwrap();
    let planned = other.sql("SELECT sum(f0) FROM a").await.unwrap();
    run(&capped, "SELECT 1").await.unwrap();
    let sum = planned
        .collect()
        .await
        .expect("the other session's cap is the default");
    assert_eq!(sum[0].num_rows(), 1);
    let e = run(
        &capped,
        &format!(
            "SELECT count(*) FROM '{}'",
            dir.path().join("b.parquet").display()
        ),
    )
    .await
    .expect_err("the capped session is held to its own cap");
    assert!(
        e.to_string().contains("batchinfer.max_footer_bytes (100)"),
        "{e}"
    );
}
