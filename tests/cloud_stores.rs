//! What is particular to Azure Blob Storage, Google Cloud Storage and plain HTTP servers, through
//! the real binary, against real emulators the tests start: Azurite and fake-gcs-server
//! (`scripts/emulators.sh` installs them on first use). The scenarios every store shares are in
//! `storage.rs`.

mod common;
mod emulators;
mod fixtures;
use common::random_rows;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_failure, assert_ok};
use emulators::{AZURE_KEY, Azurite, FakeGcs};

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";

/// The binary with no cloud settings from the test's own environment, a warehouse in `dir`.
fn batchinfer(dir: &Path) -> Command {
    let mut command = common::bin_without_env(&["AZURE", "GOOGLE", "AWS"]);
    command.env("BATCHINFER_WAREHOUSE", dir.join("wh"));
    command
}

fn azure(server: &Azurite, dir: &Path) -> Command {
    let mut command = batchinfer(dir);
    command.envs(server.env());
    command
}

fn gcs(server: &FakeGcs, dir: &Path) -> Command {
    let mut command = batchinfer(dir);
    command
        .env("GOOGLE_SERVICE_ACCOUNT_KEY", server.service_account_key())
        .env("GOOGLE_ALLOW_HTTP", "true");
    command
}

/// Azurite with the sample features as 4 blobs in `data`, the test models in `models`, and
/// empty containers `out` and `lake`.
fn azurite_with_data(dir: &Path) -> Azurite {
    let server = Azurite::start(&dir.join("azurite"));
    for container in ["data", "models", "out", "lake"] {
        server.create_container(container);
    }
    for part in 0..4 {
        server.put_file(
            "data",
            &format!("features/part-{part}.parquet"),
            Path::new("data/sample/features.parquet"),
        );
    }
    server.put_file(
        "models",
        "linear.onnx",
        Path::new("data/models/linear.onnx"),
    );
    server
}

/// `abfss://CONTAINER/...` names the same container as `az://CONTAINER/...` (the scoring, the
/// write and the re-read in every store are in `storage.rs`).
#[test]
fn the_abfss_form_names_the_same_container() {
    let dir = tempfile::tempdir().unwrap();
    let server = azurite_with_data(dir.path());
    let out = common::run_with(
        azure(&server, dir.path()),
        &[
            "query",
            "-e",
            &format!(
                "CREATE MODEL lin FROM 'abfss://models/linear.onnx';
                 COPY (SELECT id, predict('lin', {FEATURES}) AS p FROM 'abfss://data/features/')
                 TO 'abfss://out/scores/' STORED AS PARQUET"
            ),
        ],
    );
    assert_ok(&out);
    let reread = common::run_with(
        azure(&server, dir.path()),
        &["query", "-e", "SELECT id, p FROM 'az://out/scores/'"],
    );
    common::assert_same_rows(
        &common::rows(&assert_ok(&reread)),
        &common::local_scores(4),
        1e-6,
    );
}

/// A materialized view over blobs, kept in a warehouse in Azure: a refresh scores the new blobs
/// only, and a removed blob's rows go.
#[test]
fn a_materialized_view_over_azure_scores_only_new_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = azurite_with_data(dir.path());
    let view = |sql: &str| {
        let mut command = azure(&server, dir.path());
        command.args(["--warehouse", "az://lake/wh/", "--models", "data/models"]);
        common::run_with(command, &["query", "-e", sql])
    };
    let out = view(&format!(
        "CREATE MATERIALIZED VIEW scores AS
           SELECT id, predict('linear', {FEATURES}) AS p FROM 'az://data/features/';
         REFRESH MATERIALIZED VIEW scores;
         SELECT count(*) AS n FROM scores"
    ));
    assert!(
        assert_ok(&out).ends_with("n\n40000\n"),
        "{}",
        common::stdout(&out)
    );
    server.put_file(
        "data",
        "features/part-4.parquet",
        Path::new("data/sample/features.parquet"),
    );
    let out = view("REFRESH MATERIALIZED VIEW scores; SELECT count(*) AS n FROM scores");
    let text = assert_ok(&out);
    assert!(text.ends_with("n\n50000\n"), "{text}");
    let reread = view("SELECT id, p FROM scores");
    common::assert_same_rows(
        &common::rows(&assert_ok(&reread)),
        &common::local_scores(5),
        1e-6,
    );
    server.delete("data", "features/part-0.parquet");
    let out = view("REFRESH MATERIALIZED VIEW scores; SELECT count(*) AS n FROM scores");
    let text = assert_ok(&out);
    assert!(text.ends_with("n\n40000\n"), "{text}");
}

/// COPY and CREATE TABLE into Azure that fail on a model error after blocks of their blobs were
/// uploaded: no blob appears (the block lists were never committed).
#[test]
fn azure_writes_failed_by_a_model_error_leave_no_blob() {
    let dir = tempfile::tempdir().unwrap();
    let server = azurite_with_data(dir.path());
    let failing = random_rows(600_000, 599_990);
    for (container, sql) in [
        (
            "out",
            format!("COPY ({failing}) TO 'az://out/scores/' STORED AS PARQUET"),
        ),
        ("lake", format!("CREATE TABLE scored AS {failing}")),
    ] {
        let mut command = azure(&server, dir.path());
        command
            .args(["--warehouse", "az://lake/wh/", "--models", "data/models"])
            .args(["query", "-e", &sql])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        // Blocks uploaded before the failure: blobs with uncommitted blocks only.
        let started = Instant::now();
        let mut uploaded = false;
        while child.try_wait().unwrap().is_none() {
            uploaded |= !server.blobs(container, true).is_empty();
            assert!(started.elapsed() < Duration::from_secs(300), "{sql}: hangs");
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert_failure(&out, &["model 'lookup' failed"]);
        assert!(uploaded, "{sql}: no block was uploaded before the failure");
        assert_eq!(
            server.blobs(container, false),
            Vec::<String>::new(),
            "{sql}"
        );
    }
}

#[test]
fn azure_errors_name_the_container_and_what_is_missing_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let server = azurite_with_data(dir.path());
    let out = common::run_with(
        azure(&server, dir.path()),
        &["query", "-e", "SELECT * FROM 'az://nosuch/x.parquet'"],
    );
    assert_failure(&out, &["container 'nosuch' does not exist", &server.url()]);
    let out = common::run_with(
        azure(&server, dir.path()),
        &[
            "query",
            "-e",
            "SELECT * FROM 'az://data/nothing-here.parquet'",
        ],
    );
    assert_failure(&out, &["no object at az://data/nothing-here.parquet"]);
    // No account at all.
    let out = common::run_with(
        batchinfer(dir.path()),
        &["query", "-e", "SELECT * FROM 'az://data/features/'"],
    );
    assert_failure(&out, &["az://data/features/", "AZURE_STORAGE_ACCOUNT_NAME"]);
    // A wrong key: refused, and the key is in no message.
    let wrong = "d3JvbmcgYnV0IHdlbGwgZm9ybWVkIGtleSBvZiAzMiBieXRlcyE=";
    let mut command = azure(&server, dir.path());
    command.env("AZURE_STORAGE_ACCOUNT_KEY", wrong);
    let out = common::run_with(
        command,
        &["query", "-e", "SELECT count(*) FROM 'az://data/features/'"],
    );
    let text = assert_failure(&out, &["refused", "AZURE_STORAGE_ACCOUNT_KEY"]);
    assert!(!text.contains(wrong), "{text}");
}

/// docs/storage.md's Azure example, run against Azurite: its account and key in place of the
/// example's, with the emulator's endpoint.
#[test]
fn the_storage_guides_azure_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = azurite_with_data(dir.path());
    server.put_file(
        "data",
        "customers/part-0.parquet",
        Path::new("data/sample/customers.parquet"),
    );
    let examples = common::examples_with("docs/storage.md", "az://");
    assert_eq!(examples.len(), 1, "{examples:?}");
    let example = examples[0].replace("'acme'", "'devstoreaccount1'").replace(
        "'azure.access_key' '...'",
        &format!(
            "'azure.access_key' '{AZURE_KEY}', 'azure.endpoint' '{}/devstoreaccount1', \
                 'azure.allow_http' 'true'",
            server.url()
        ),
    );
    assert!(example.contains(AZURE_KEY), "{example}");
    let sql = format!("{example}\nSELECT count(*) AS n FROM customers;");
    let out = common::run_with(batchinfer(dir.path()), &["query", "-e", &sql]);
    let local = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            "SELECT count(*) AS n FROM 'data/sample/customers.parquet'",
        ],
    );
    assert_eq!(assert_ok(&out), assert_ok(&local));
}

#[test]
fn azure_settings_in_sql_options_connect_the_container_and_are_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let server = azurite_with_data(dir.path());
    // Option names in any case, as DataFusion reads them.
    let options = format!(
        "OPTIONS ('AZURE.ACCOUNT_NAME' 'devstoreaccount1', 'azure.access_key' '{AZURE_KEY}', \
         'azure.endpoint' '{}/devstoreaccount1', 'azure.allow_http' 'true')",
        server.url()
    );
    // The endpoint of the OPTIONS, not the emulator the environment names (nothing listens
    // there).
    let mut elsewhere = batchinfer(dir.path());
    elsewhere
        .env("AZURE_STORAGE_USE_EMULATOR", "true")
        .env("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:9");
    let out = common::run_with(
        elsewhere,
        &[
            "query",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE features STORED AS PARQUET LOCATION 'az://data/features/'
                 {options};
                 SELECT count(*) AS n FROM features;
                 COPY (SELECT id FROM features WHERE id < 10) TO 'az://out/ids.parquet'
                 STORED AS PARQUET {options};
                 EXPLAIN SELECT * FROM features"
            ),
        ],
    );
    let text = assert_ok(&out);
    assert!(text.starts_with("n\n40000\n"), "{text}");
    assert!(!text.contains(AZURE_KEY), "{text}");
    assert_eq!(server.blobs("out", false), ["ids.parquet"]);
    // Settings that fail are not kept: the same container connects with the right key after.
    let wrong = options.replace(
        AZURE_KEY,
        "d3JvbmcgYnV0IHdlbGwgZm9ybWVkIGtleSBvZiAzMiBieXRlcyE=",
    );
    let mut shell = batchinfer(dir.path());
    shell
        .arg("shell")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = shell.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(
            stdin,
            "CREATE EXTERNAL TABLE w STORED AS PARQUET LOCATION 'az://data/features/' {wrong};\n\
             CREATE EXTERNAL TABLE r STORED AS PARQUET LOCATION 'az://data/features/' {options};\n\
             SELECT count(*) AS n FROM r;"
        )
        .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (common::stdout(&out), common::stderr(&out));
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(stdout.contains("n\n40000"), "{stdout}\n{stderr}");
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 'az://data/features/'
                 OPTIONS ('azure.no_such_setting' 'x', 'azure.access_key' '{AZURE_KEY}')"
            ),
        ],
    );
    let text = assert_failure(&out, &["'azure.no_such_setting'", "Azure"]);
    assert!(!text.contains(AZURE_KEY), "{text}");
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 'az://data/features/'
             OPTIONS ('gcp.service_account_key' '{}')",
        ],
    );
    assert_failure(&out, &["'gcp.*' options are not for 'az://data/features/'"]);
    // A SAS token in a URL's query is in no message.
    let out = common::run_with(
        azure(&server, dir.path()),
        &[
            "query",
            "-e",
            "SELECT * FROM 'az://data/x.parquet?sv=2024&sig=SECRETSIG'",
        ],
    );
    let text = assert_failure(&out, &["az://data/x.parquet?REDACTED"]);
    assert!(!text.contains("SECRETSIG"), "{text}");
}

/// A seed folder for fake-gcs-server: the sample features as 4 objects in `data`, the test models
/// in `models`.
fn gcs_seed(dir: &Path) -> std::path::PathBuf {
    let seed = dir.join("seed");
    std::fs::create_dir_all(seed.join("data/features")).unwrap();
    std::fs::create_dir_all(seed.join("models")).unwrap();
    for part in 0..4 {
        std::fs::copy(
            "data/sample/features.parquet",
            seed.join(format!("data/features/part-{part}.parquet")),
        )
        .unwrap();
    }
    std::fs::copy("data/models/linear.onnx", seed.join("models/linear.onnx")).unwrap();
    seed
}

#[test]
fn gcs_settings_in_sql_options_and_errors_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeGcs::start(&dir.path().join("gcs"), &gcs_seed(dir.path()));
    let key = server.service_account_key().replace('\'', "''");
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE features STORED AS PARQUET LOCATION 'gs://data/features/'
                 OPTIONS ('gcp.service_account_key' '{key}', 'gcp.allow_http' 'true');
                 SELECT count(*) AS n FROM features;
                 SHOW CREATE TABLE features"
            ),
        ],
    );
    let text = assert_ok(&out);
    assert!(text.starts_with("n\n40000\n"), "{text}");
    assert!(!text.contains("disable_oauth"), "{text}");
    // A bucket has one set of settings in a session: the same again is accepted, others are
    // refused (DataFusion finds a table's store by its bucket alone, so a second set would
    // silently read with the first, or the first with the second).
    let other = server
        .service_account_key()
        .replace(&server.url(), "http://127.0.0.1:9");
    let out = common::run_with(
        gcs(&server, dir.path()),
        &[
            "query",
            "-e",
            &format!(
                "SELECT count(*) AS n FROM 'gs://data/features/part-0.parquet';
                 CREATE EXTERNAL TABLE again STORED AS PARQUET LOCATION 'gs://data/features/'
                 OPTIONS ('gcp.service_account_key' '{other}');"
            ),
        ],
    );
    let text = assert_failure(&out, &["gs://data is connected already", "same OPTIONS"]);
    assert!(!text.contains("disable_oauth"), "{text}");
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE a STORED AS PARQUET LOCATION 'gs://data/features/'
                 OPTIONS ('gcp.service_account_key' '{key}', 'gcp.allow_http' 'true');
                 CREATE EXTERNAL TABLE b STORED AS PARQUET LOCATION 'gs://data/features/part-1.parquet'
                 OPTIONS ('gcp.allow_http' 'true', 'gcp.service_account_key' '{key}');
                 SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b) AS n"
            ),
        ],
    );
    assert_eq!(assert_ok(&out), "n\n50000\n");
    let out = common::run_with(
        gcs(&server, dir.path()),
        &["query", "-e", "SELECT * FROM 'gs://nosuch/x.parquet'"],
    );
    assert_failure(&out, &["bucket 'nosuch' does not exist", &server.url()]);
    let out = common::run_with(
        gcs(&server, dir.path()),
        &[
            "query",
            "-e",
            "SELECT * FROM 'gs://data/nothing-here.parquet'",
        ],
    );
    assert_failure(&out, &["no object at gs://data/nothing-here.parquet"]);
    let out = common::run_with(
        gcs(&server, dir.path()),
        &[
            "query",
            "-e",
            "CREATE MODEL m FROM 'gs://models/missing.onnx'",
        ],
    );
    assert_failure(&out, &["model 'm'", "gs://models/missing.onnx"]);
}

#[test]
fn http_servers_are_read_and_never_written() {
    let dir = tempfile::tempdir().unwrap();
    // fake-gcs-server serves its objects as a plain HTTP server does (HEAD, ranges).
    let server = FakeGcs::start(&dir.path().join("gcs"), &gcs_seed(dir.path()));
    let base = server.url();
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            &format!(
                "CREATE MODEL lin FROM '{base}/models/linear.onnx';
                 SELECT id, predict('lin', {FEATURES}) AS p
                 FROM '{base}/data/features/part-2.parquet'"
            ),
        ],
    );
    let mut rows = common::rows(&assert_ok(&out));
    rows.sort_by_key(|r| r.0);
    common::assert_same_rows(&rows, &common::local_scores(1), 1e-6);
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            &format!("COPY (SELECT 1 AS one) TO '{base}/data/x.parquet' STORED AS PARQUET"),
        ],
    );
    assert_failure(&out, &["reads from only"]);
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "--warehouse",
            &format!("{base}/wh/"),
            "query",
            "-e",
            "SHOW MODELS",
        ],
    );
    assert_failure(&out, &["warehouse", "reads from only"]);
    let out = common::run_with(
        batchinfer(dir.path()),
        &[
            "query",
            "-e",
            &format!("SELECT * FROM '{base}/data/nothing-here.parquet'"),
        ],
    );
    assert_failure(&out, &["no file at", "nothing-here.parquet", "404"]);
    assert_eq!(server.objects("data").len(), 4);
}
