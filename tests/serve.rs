//! `batchinfer serve`: the pytest suite in `tests/serve/`, whose client is ADBC's Flight SQL
//! driver (from PyPI, in the environment `scripts/python_env.sh` makes) against the binary this
//! `cargo test` built; and the sessions a server gives its clients, over one engine's models.

mod fixtures;

use std::path::Path;
use std::process::Command;

use batchinfer::{Engine, EngineConfig};

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
