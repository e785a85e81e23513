//! Data safety, through the real binary with hostile but plausible input: no statement touches
//! what it does not name, a failed statement leaves the old state, concurrent writers lose
//! nothing, and no input makes batchinfer allocate without bound, hang or crash. Each test is
//! named after the guarantee it checks, and each compares the whole folder around its target
//! before and after (nothing outside the target is touched).

mod common;
mod fixtures;
mod s3_server;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    assert_failure, assert_ok, bin, changes, query, snapshot, stdout, wait_with_deadline,
};

/// Table names that are paths, or that would land on the warehouse's own files.
fn hostile_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "../../victim",
        "..",
        ".",
        "a/b",
        "a\\b",
        "/tmp/victim",
        ".staging-x",
        ".hidden",
        "%2e%2e",
        "a?b",
        "a#b",
        "tab\tname",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push("x".repeat(201));
    names
}

/// A base folder holding a warehouse (with a model and a table) and, beside it, a victim folder.
fn warehouse_with_neighbours() -> (tempfile::TempDir, std::path::PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let wh = base.path().join("wh");
    std::fs::create_dir_all(base.path().join("victim")).unwrap();
    std::fs::write(base.path().join("victim/keep.txt"), "keep").unwrap();
    assert_ok(&query(
        &wh,
        "CREATE MODEL kept FROM 'data/models/linear.onnx'; CREATE TABLE kept AS SELECT 1 AS x",
    ));
    (base, wh)
}

#[test]
fn table_names_are_names_never_paths_in_a_local_warehouse() {
    let (base, wh) = warehouse_with_neighbours();
    let before = snapshot(base.path());
    for name in hostile_names() {
        let quoted = name.replace('"', "\"\"");
        for sql in [
            format!("CREATE TABLE \"{quoted}\" AS SELECT 1 AS x"),
            format!("CREATE OR REPLACE TABLE \"{quoted}\" AS SELECT 1 AS x"),
            format!("DROP TABLE \"{quoted}\""),
            format!("DROP TABLE IF EXISTS \"{quoted}\""),
        ] {
            let out = query(&wh, &sql);
            assert_failure(&out, &["is not usable"]);
            let changed = changes(&before, &snapshot(base.path()));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    // The statements of a Delta table's upkeep and its older versions name tables the same way.
    let mut travelled: Vec<String> = hostile_names().iter().map(|n| format!("{n}@v0")).collect();
    travelled.extend(["kept@v0/../../victim", "kept@../../victim"].map(String::from));
    for name in hostile_names().into_iter().chain(travelled) {
        let quoted = name.replace('"', "\"\"");
        for sql in [
            format!("VACUUM \"{quoted}\" RETAIN 0 HOURS"),
            format!("OPTIMIZE \"{quoted}\""),
            format!("INSERT INTO \"{quoted}\" SELECT 1"),
            format!("SELECT * FROM \"{quoted}\""),
            format!("SELECT * FROM \"{quoted}\" VERSION AS OF 0"),
        ] {
            assert_failure(&query(&wh, &sql), &[]);
            let changed = changes(&before, &snapshot(base.path()));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    // The empty name, which SQL cannot even quote.
    let out = query(&wh, "DROP TABLE IF EXISTS \"\"");
    assert_failure(&out, &[]);
    assert!(changes(&before, &snapshot(base.path())).is_empty());
    // Model names are names too: they become the warehouse's model definition files, endpoint
    // models' as model files'.
    for name in hostile_names() {
        let name = name.replace('"', "\"\"");
        let out = query(
            &wh,
            &format!("CREATE MODEL \"{name}\" FROM 'data/models/linear.onnx'"),
        );
        assert_failure(&out, &["is not usable"]);
        let out = query(
            &wh,
            &format!(
                "CREATE OR REPLACE MODEL \"{name}\" OPTIONS ('endpoint' 'http://127.0.0.1:9/v1', \
                 'model' 'm')"
            ),
        );
        assert_failure(&out, &["is not usable"]);
        let out = query(&wh, &format!("DROP MODEL IF EXISTS \"{name}\""));
        assert_failure(&out, &["is not usable"]);
    }
    assert!(changes(&before, &snapshot(base.path())).is_empty());
    // And the table that is there still reads.
    assert_eq!(assert_ok(&query(&wh, "SELECT x FROM kept")), "x\n1\n");
}

#[test]
fn table_names_are_names_never_paths_in_an_s3_warehouse() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    std::fs::create_dir_all(server.root.join("lake/other")).unwrap();
    std::fs::write(server.root.join("lake/other/keep.txt"), "keep").unwrap();
    let run = |sql: &str| {
        server
            .client(&mut bin())
            .args(["--warehouse", "s3://lake/wh/", "query", "-e", sql])
            .output()
            .unwrap()
    };
    assert_ok(&run("CREATE TABLE kept AS SELECT 1 AS x"));
    let before = snapshot(&server.root);
    for name in hostile_names() {
        for sql in [
            format!("CREATE TABLE \"{name}\" AS SELECT 1 AS x"),
            format!("DROP TABLE IF EXISTS \"{name}\""),
        ] {
            assert_failure(&run(&sql), &["is not usable"]);
            let changed = changes(&before, &snapshot(&server.root));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    assert_eq!(assert_ok(&run("SELECT x FROM kept")), "x\n1\n");
}

/// A statement that fails after 1.5M of its 2M rows were written: division by zero.
const FAILS_LATE: &str = "SELECT value AS id, 10 / (value - 1500000) AS q FROM range(2000000)";
/// The same through a model error: `lookup` fails on an index outside 0..9.
const MODEL_FAILS_LATE: &str = "SELECT value AS id, predict('lookup', CASE WHEN value = 1500000 THEN 99 ELSE value % 10 END) AS q FROM range(2000000)";

#[test]
fn a_failed_copy_leaves_what_was_there_before() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let file = dir.path().join("out.parquet");
    let folder = dir.path().join("out");
    assert_ok(&query(
        &wh,
        &format!(
            "COPY (SELECT 7 AS old) TO '{}' STORED AS PARQUET;
             COPY (SELECT 8 AS old) TO '{}/' STORED AS PARQUET",
            file.display(),
            folder.display()
        ),
    ));
    let before = snapshot(dir.path());
    for failing in [FAILS_LATE, MODEL_FAILS_LATE] {
        for target in [file.display().to_string(), format!("{}/", folder.display())] {
            let sql = format!("COPY ({failing}) TO '{target}' STORED AS PARQUET");
            assert_failure(&query(&wh, &sql), &[]);
            let changed = changes(&before, &snapshot(dir.path()));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    // Failing into targets that did not exist leaves nothing at all.
    for target in ["new.parquet", "new/"] {
        let target = dir.path().join(target);
        let sql = format!(
            "COPY ({FAILS_LATE}) TO '{}' STORED AS PARQUET",
            target.display()
        );
        assert_failure(&query(&wh, &sql), &["Divide by zero"]);
        assert!(changes(&before, &snapshot(dir.path())).is_empty());
    }
    assert_eq!(
        assert_ok(&query(
            &wh,
            &format!("SELECT old FROM '{}'", file.display())
        )),
        "old\n7\n"
    );
}

/// An external table `t` in `dir/t/` holding two rows; the statement that defines it, for each
/// process to run before its own.
fn table_of_two_rows(dir: &Path, wh: &Path) -> String {
    let define = format!(
        "CREATE EXTERNAL TABLE t (id BIGINT, q BIGINT) STORED AS PARQUET LOCATION '{}/'",
        dir.join("t").display()
    );
    assert_ok(&query(
        wh,
        &format!("{define}; INSERT INTO t VALUES (1, 1), (2, 2)"),
    ));
    define
}

#[test]
fn a_failed_insert_adds_none_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let define = table_of_two_rows(dir.path(), &wh);
    let before = snapshot(dir.path());
    for failing in [FAILS_LATE, MODEL_FAILS_LATE] {
        let out = query(&wh, &format!("{define}; INSERT INTO t {failing}"));
        assert_failure(&out, &[]);
        let changed = changes(&before, &snapshot(dir.path()));
        assert!(changed.is_empty(), "INSERT changed {changed:?}");
    }
    let out = query(&wh, &format!("{define}; SELECT count(*) AS n FROM t"));
    assert_eq!(assert_ok(&out), "n\n2\n");
    // A successful INSERT adds all of its rows.
    let out = query(
        &wh,
        &format!(
            "{define}; INSERT INTO t SELECT value AS id, value AS q FROM range(300000); SELECT count(*) AS n FROM t"
        ),
    );
    assert!(assert_ok(&out).ends_with("n\n300002\n"));
}

#[test]
fn concurrent_catalog_changes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let spawn = |sql: String| {
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .args(["query", "-e", &sql])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut children: Vec<_> = (0..16)
        .map(|i| spawn(format!("CREATE MODEL m{i} FROM 'data/models/linear.onnx'")))
        .chain((0..8).map(|i| spawn(format!("CREATE TABLE t{i} AS SELECT {i} AS x"))))
        .collect();
    for child in &mut children {
        let status = wait_with_deadline(child, Duration::from_secs(120), "a CREATE");
        assert!(status.success());
    }
    let out = query(&wh, "SELECT name FROM models() ORDER BY name");
    let listed = assert_ok(&out);
    for i in 0..16 {
        assert!(
            listed.contains(&format!("\nm{i}\n")),
            "m{i} is lost:\n{listed}"
        );
    }
    let out = query(
        &wh,
        &(0..8)
            .map(|i| format!("SELECT x FROM t{i}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL "),
    );
    let mut xs: Vec<String> = stdout(&out).lines().skip(1).map(str::to_string).collect();
    xs.sort();
    assert_eq!(xs, (0..8).map(|i| i.to_string()).collect::<Vec<_>>());
    // Nothing half-written is left in the warehouse.
    let leftovers: Vec<_> = snapshot(&wh)
        .into_keys()
        .filter(|p| p.to_string_lossy().contains("/."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn secrets_stay_secret() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("bkt");
    let secret = "SuperSecretValue42";
    let token = "SessionTokenValue42";
    let options = format!(
        "OPTIONS ('aws.access_key_id' 'AKIAEXAMPLE', 'aws.secret_access_key' '{secret}', \
         'aws.session_token' '{token}', 'aws.region' 'us-east-1', \
         'aws.endpoint' '{}', 'aws.allow_http' 'true')",
        server.endpoint()
    );
    let wh = dir.path().join("wh");
    let statements = [
        format!("EXPLAIN COPY (SELECT 1 AS x) TO 's3://bkt/out/' STORED AS PARQUET {options}"),
        format!(
            "EXPLAIN VERBOSE COPY (SELECT 1 AS x) TO 's3://bkt/out/' STORED AS PARQUET {options}"
        ),
        // Refused by the server (the key is wrong): the error names neither.
        format!("COPY (SELECT 1 AS x) TO 's3://bkt/out/' STORED AS PARQUET {options}"),
        format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://bkt/t/' {options}; \
             SHOW CREATE TABLE t"
        ),
    ];
    for sql in statements {
        let out = query(&wh, &sql);
        let shown = format!("{}{}", stdout(&out), common::stderr(&out));
        assert!(
            !shown.contains(secret) && !shown.contains(token),
            "{sql}\nshows a secret:\n{shown}"
        );
        assert!(!shown.contains("panicked"), "{shown}");
    }
}

#[test]
fn the_cluster_warns_that_it_is_not_an_open_door() {
    let listen = |role: &str, address: &str| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = common::binary();
        match role {
            "scheduler" => command.args(["scheduler", "--bind", &format!("{address}:{port}")]),
            _ => command.args([
                "executor",
                "--bind-host",
                address,
                "--port",
                &port.to_string(),
                "--scheduler",
                "127.0.0.1:1",
            ]),
        };
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr");
        let mut child = command
            .env("BATCHINFER_WAREHOUSE", dir.path().join("wh"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut text = String::new();
        common::poll_until(Duration::from_secs(30), "the banner", || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains(&format!("batchinfer {role}"))
        });
        let _ = child.kill();
        let _ = child.wait();
        text
    };
    let exposed = listen("scheduler", "0.0.0.0");
    assert!(
        exposed.contains("warning:") && exposed.contains("no authentication"),
        "{exposed}"
    );
    assert!(!listen("scheduler", "127.0.0.1").contains("warning:"));
    let exposed = listen("executor", "0.0.0.0");
    assert!(exposed.contains("no authentication"), "{exposed}");
}

#[test]
fn predict_table_reads_s3_paths_as_every_path_does() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.put_file(
        "data",
        "customers.parquet",
        Path::new("data/sample/customers.parquet"),
    );
    let sql = |from: &str| {
        format!(
            "SELECT id, label, probabilities[2] AS p FROM predict_table('churn', '{from}') ORDER BY id"
        )
    };
    let out = server
        .client(&mut bin())
        .arg("--warehouse")
        .arg(dir.path().join("wh"))
        .args(["--models", "data/models", "query", "-e"])
        .arg(sql("s3://data/customers.parquet"))
        .output()
        .unwrap();
    let remote = assert_ok(&out);
    let local = assert_ok(&query(
        &dir.path().join("wh"),
        &sql("data/sample/customers.parquet"),
    ));
    assert_eq!(remote.lines().count(), 2001);
    assert_eq!(remote, local);
}

/// The same through the library, on a single-threaded runtime (as `#[tokio::test]` gives): the
/// look-up of the S3 path needs a runtime to drive its requests while planning waits for it.
#[test]
fn predict_table_reads_s3_paths_on_a_single_threaded_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.put_file(
        "data",
        "customers.parquet",
        Path::new("data/sample/customers.parquet"),
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(predict_table_over_s3(&server));
}

async fn predict_table_over_s3(server: &s3_server::S3Server) {
    let engine = batchinfer::Engine::new(batchinfer::EngineConfig {
        models_dir: Some("data/models".into()),
        ..Default::default()
    })
    .unwrap();
    let connect = format!(
        "CREATE EXTERNAL TABLE c STORED AS PARQUET LOCATION 's3://data/customers.parquet' \
         OPTIONS ('aws.access_key_id' '{}', 'aws.secret_access_key' '{}', 'aws.region' \
         'us-east-1', 'aws.endpoint' '{}', 'aws.allow_http' 'true')",
        s3_server::ACCESS_KEY,
        s3_server::SECRET_KEY,
        server.endpoint()
    );
    engine.sql(&connect).await.unwrap().collect().await.unwrap();
    let counted = tokio::time::timeout(Duration::from_secs(60), async {
        let frame = engine
            .sql("SELECT count(label) AS n FROM predict_table('churn', 's3://data/customers.parquet')")
            .await
            .map_err(|e| batchinfer::message::display_error(&e))?;
        frame.collect().await.map_err(|e| e.to_string())
    })
    .await
    .expect("predict_table over S3 did not finish within 60 s")
    .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&counted)
        .unwrap()
        .to_string();
    assert!(text.contains("| 2000 |"), "{text}");
}

/// Targets are named plainly: a folder with a space, the same as a `file://` URL (where the space
/// is `%20`), and never a pattern (`*`, `?`, `[`), which DataFusion would read as one and write
/// beside.
#[test]
fn writes_land_exactly_where_they_are_named() {
    let base = tempfile::tempdir().unwrap();
    let spaced = base.path().join("with space");
    std::fs::create_dir_all(&spaced).unwrap();
    std::fs::create_dir_all(base.path().join("g")).unwrap();
    let wh = base.path().join("wh");
    let url = format!("file://{}/with%20space/b.parquet", base.path().display());
    let sql = format!(
        "COPY (SELECT 1 AS x) TO '{}/a.parquet' STORED AS PARQUET;
         COPY (SELECT 2 AS x) TO '{url}' STORED AS PARQUET;
         CREATE EXTERNAL TABLE e STORED AS PARQUET LOCATION '{}/';
         INSERT INTO e SELECT 3 AS x;
         SELECT x FROM e ORDER BY x",
        spaced.display(),
        spaced.display()
    );
    assert_eq!(
        assert_ok(&query(&wh, &sql)),
        "count\n1\ncount\n1\ncount\n1\nx\n1\n2\n3\n"
    );
    let names: Vec<String> = std::fs::read_dir(&spaced)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    let before = snapshot(base.path());
    for target in ["g/*.parquet", "g/?.parquet", "g/[ab].parquet", "g/*/"] {
        let sql = format!(
            "COPY (SELECT 1 AS x) TO '{}/{target}' STORED AS PARQUET",
            base.path().display()
        );
        assert_failure(&query(&wh, &sql), &["glob character", target]);
    }
    let out = query(&base.path().join("w[1]"), "CREATE TABLE t AS SELECT 1 AS x");
    assert_failure(&out, &["warehouse cannot be used", "glob character '['"]);
    assert!(changes(&before, &snapshot(base.path())).is_empty());
}

/// A quoted name keeps its case, an unquoted one is lower-cased (as DataFusion does): `"T"` and
/// `t` are two tables, and dropping one leaves the other.
#[test]
fn table_names_differing_in_case_are_two_tables() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let out = query(
        &wh,
        "CREATE TABLE \"T\" AS SELECT 1 AS x; CREATE TABLE t AS SELECT 2 AS x;
         SELECT x FROM \"T\"; SELECT x FROM T",
    );
    assert_eq!(assert_ok(&out), "x\n1\nx\n2\n");
    assert_eq!(
        assert_ok(&query(&wh, "DROP TABLE t; SELECT x FROM \"T\"")),
        "x\n1\n"
    );
    assert_failure(&query(&wh, "SELECT x FROM t"), &["t"]);
}

/// Two processes create the same table in one S3 warehouse: the one that commits second fails,
/// deletes its own files and nothing of the first's.
#[test]
fn a_table_created_meanwhile_in_s3_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let run = server.lake_warehouse();
    // Incompressible rows, enough for a few seconds of writing.
    let columns: Vec<String> = (0..10).map(|i| format!("random() AS f{i}")).collect();
    let sql = format!(
        "CREATE TABLE t AS SELECT value AS id, {} FROM range(1500000)",
        columns.join(", ")
    );
    let mut slow = run(&sql)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it writes, another process creates the table and commits first.
    common::poll_until(Duration::from_secs(120), "an upload", || {
        std::fs::read_dir(&server.root)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".upload"))
    });
    assert_ok(&run("CREATE TABLE t AS SELECT 7 AS id").output().unwrap());
    let theirs = server.keys("lake", "wh/tables/");
    wait_with_deadline(&mut slow, common::DEADLINE, "the CREATE TABLE");
    let out = slow.wait_with_output().unwrap();
    assert_failure(&out, &["table 't' already exists"]);
    assert_eq!(server.keys("lake", "wh/tables/"), theirs);
    let out = run("SELECT id FROM t").output().unwrap();
    assert_eq!(assert_ok(&out), "id\n7\n");
}

/// Of two CREATE TABLEs of one name in an S3 warehouse, the one whose commit comes second fails,
/// even where it began first: a commit is a conditional PUT of the table's first log entry.
#[test]
fn of_two_s3_create_tables_of_one_name_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let run = server.lake_warehouse();
    // The first's commit held: its files are written, its log entry not yet.
    let held = server.hold_write_under("lake/wh/tables/t/_delta_log/", 1);
    let mut first = run("CREATE TABLE t AS SELECT 1 AS who")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    held.recv_timeout(Duration::from_secs(120))
        .expect("the first CREATE TABLE reaches its commit");
    assert_ok(&run("CREATE TABLE t AS SELECT 2 AS who").output().unwrap());
    let _ = first.kill();
    let _ = first.wait();
    let out = run("SELECT who FROM t").output().unwrap();
    assert_eq!(assert_ok(&out), "who\n2\n");
    let again = run("CREATE TABLE t AS SELECT 3 AS who").output().unwrap();
    assert_failure(&again, &["table 't' already exists"]);
}

/// Every spelling DataFusion reads as a URL is written as it reads it: `S3://`, `FILE:///`,
/// `file:/path` targets are committed like any other (a failed COPY leaves nothing), a
/// `file://` warehouse is its folder (not a folder named `file:` in the working directory), and
/// a scheme with no store is one clear error.
#[test]
fn url_spellings_are_written_as_they_are_read() {
    let base = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&base.path().join("s3"));
    server.bucket("lake");
    let cwd = base.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let out_dir = base.path().join("out");
    let before = snapshot(base.path());
    let root = out_dir.display().to_string();
    for target in [
        format!("file:{root}/a/"),
        format!("FILE://{root}/b/"),
        format!("file://{root}/c.parquet"),
        "S3://lake/up/".to_string(),
    ] {
        let sql = format!("COPY ({FAILS_LATE}) TO '{target}' STORED AS PARQUET");
        let out = server.lake_warehouse()(&sql)
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert_failure(&out, &["Divide by zero"]);
        let changed = changes(&before, &snapshot(base.path()));
        assert!(changed.is_empty(), "{target} left {changed:?}");
    }
    let url = format!("file://{}/w%20x", base.path().display());
    let out = bin()
        .current_dir(&cwd)
        .args([
            "--warehouse",
            &url,
            "query",
            "-e",
            "CREATE TABLE t AS SELECT 1 AS x",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(base.path().join("w x/tables/t").is_dir());
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0);
    let out = bin()
        .current_dir(&cwd)
        .args(["--warehouse", "wh", "query", "-e"])
        .arg("COPY (SELECT 1 AS x) TO 'a:b.parquet' STORED AS PARQUET")
        .output()
        .unwrap();
    assert_failure(&out, &["scheme 'a:'", "no store for", "'./'"]);
}

#[test]
fn a_file_url_naming_another_machine_or_with_a_query_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    for warehouse in [
        format!("file://otherhost{path}/wh"),
        format!("file://{path}/wh?x=1"),
        format!("file://{path}/wh#frag"),
    ] {
        let before = snapshot(dir.path());
        let out = common::output_within(
            bin().args(["--warehouse", &warehouse, "query", "-e"]).arg(
                "CREATE MODEL m FROM 'data/models/linear.onnx'; CREATE TABLE t AS SELECT 1 AS a",
            ),
            common::DEADLINE,
        );
        assert_failure(&out, &["warehouse"]);
        assert!(!common::stderr(&out).contains("nternal error"));
        let changed = changes(&before, &snapshot(dir.path()));
        assert!(changed.is_empty(), "{warehouse} changed {changed:?}");
    }
    let target = format!("file://otherhost{path}/out.parquet");
    let out = query(
        &dir.path().join("wh"),
        &format!("COPY (SELECT 1 AS a) TO '{target}' STORED AS PARQUET"),
    );
    assert_failure(&out, &["names the machine 'otherhost'"]);
    assert!(!dir.path().join("out.parquet").exists());
}

/// Six processes replace one table at once, three rounds: each commits whole or fails with a
/// conflict naming the table (a replace commits only on the version it began on), and the table
/// always holds one writer's rows.
#[test]
fn concurrent_replaces_of_one_table_commit_whole_or_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE TABLE two AS SELECT 0 AS v"));
    for _round in 0..3 {
        let mut children: Vec<_> = (1..=6)
            .map(|i| {
                bin()
                    .arg("--warehouse")
                    .arg(&wh)
                    .args([
                        "query",
                        "-e",
                        &format!(
                            "CREATE OR REPLACE TABLE two AS SELECT {i} AS v FROM generate_series(1, 100000)"
                        ),
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in &mut children {
            let status = wait_with_deadline(child, Duration::from_secs(120), "a replace");
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(
                status.success() || (err.contains("table 'two'") && err.contains("conflict")),
                "a replace failed otherwise than by a conflict: {err}"
            );
        }
        let out = query(&wh, "SELECT count(*) AS n, count(DISTINCT v) AS k FROM two");
        assert_eq!(assert_ok(&out), "n,k\n100000,1\n");
    }
}

#[test]
fn a_running_process_sees_tables_other_processes_create_replace_and_drop() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(
        &wh,
        "CREATE TABLE t AS SELECT 1 AS gen FROM generate_series(1, 10)",
    ));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let engine = batchinfer::Engine::open(batchinfer::EngineConfig {
                warehouse: Some(wh.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
            let sql = |text: &'static str| {
                let engine = &engine;
                async move {
                    let frame = engine.sql(text).await?;
                    let batches = frame.collect().await?;
                    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                        .unwrap()
                        .to_string();
                    Ok::<_, batchinfer::Error>(text)
                }
            };
            let counts = "SELECT gen, count(*) AS n FROM t GROUP BY gen";
            assert!(sql(counts).await.unwrap().contains("| 1   | 10 |"));
            // Replaced elsewhere: read from its new files.
            assert_ok(&query(
                &wh,
                "CREATE OR REPLACE TABLE t AS SELECT 2 AS gen FROM generate_series(1, 5)",
            ));
            let now = sql(counts).await.unwrap();
            assert!(
                now.contains("| 2   | 5 |") && !now.contains("| 1 "),
                "{now}"
            );
            // Created elsewhere: there.
            assert_ok(&query(&wh, "CREATE TABLE u AS SELECT 7 AS x"));
            assert!(sql("SELECT x FROM u").await.unwrap().contains("| 7 |"));
            // Replaced elsewhere with other columns: read with its new columns.
            assert_ok(&query(
                &wh,
                "CREATE OR REPLACE TABLE t AS SELECT 'x' AS gen, 9 AS w",
            ));
            let now = sql("SELECT gen, w FROM t").await.unwrap();
            assert!(now.contains("| x   | 9 |"), "{now}");
            // Dropped elsewhere: gone, and its name free again.
            assert_ok(&query(&wh, "DROP TABLE t"));
            let gone = sql("SELECT * FROM t").await.unwrap_err().to_string();
            assert!(gone.contains("t"), "{gone}");
            sql("CREATE TABLE t AS SELECT 3 AS gen").await.unwrap();
            assert!(sql(counts).await.unwrap().contains("| 3   | 1 |"));
        });
}

#[test]
fn a_failed_explain_analyze_of_a_write_leaves_what_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let define = table_of_two_rows(dir.path(), &wh);
    let before = snapshot(dir.path());
    for write in [
        format!("{define}; EXPLAIN ANALYZE INSERT INTO t {FAILS_LATE}"),
        format!(
            "EXPLAIN ANALYZE COPY ({FAILS_LATE}) TO '{}' STORED AS PARQUET",
            dir.path().join("out.parquet").display()
        ),
        format!(
            "EXPLAIN ANALYZE COPY ({FAILS_LATE}) TO '{}/' STORED AS PARQUET",
            dir.path().join("out").display()
        ),
    ] {
        assert_failure(&query(&wh, &write), &[]);
        let changed = changes(&before, &snapshot(dir.path()));
        assert!(changed.is_empty(), "{write} changed {changed:?}");
    }
    // One that succeeds writes, and explains itself.
    let out = query(
        &wh,
        &format!(
            "{define}; EXPLAIN ANALYZE INSERT INTO t VALUES (3, 3); SELECT count(*) AS n FROM t"
        ),
    );
    let printed = assert_ok(&out);
    assert!(
        printed.contains("DataSinkExec") && printed.ends_with("n\n3\n"),
        "{printed}"
    );
}

#[test]
fn hidden_files_of_a_killed_insert_are_removed_by_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE TABLE t AS SELECT 1 AS a"));
    // A process that is gone, and this one (running).
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let folder = wh.join("tables/t");
    let dead = folder.join(format!(".x_0.parquet.batchinfer-{gone_pid}-0.partial#1"));
    let live = folder.join(format!(
        ".y_0.parquet.batchinfer-{}-0.partial",
        std::process::id()
    ));
    // Last written two hours ago (a writer's file is left alone for an hour).
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    for (file, text) in [(&dead, "half a file"), (&live, "being written")] {
        std::fs::write(file, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
    }
    let recent = folder.join(format!(".r_0.parquet.batchinfer-{gone_pid}-1.partial"));
    std::fs::write(&recent, "written a moment ago").unwrap();
    // A folder holding only a write in progress is no table (yet).
    std::fs::create_dir_all(wh.join("tables/u")).unwrap();
    std::fs::write(
        wh.join(format!(
            "tables/u/.z_0.parquet.batchinfer-{}-0.partial",
            std::process::id()
        )),
        "being written",
    )
    .unwrap();
    let out = query(&wh, "SELECT count(*) AS n FROM t");
    assert_eq!(assert_ok(&out), "n\n1\n");
    assert!(
        !common::stderr(&out).contains("warning"),
        "{}",
        common::stderr(&out)
    );
    assert!(!dead.exists(), "the killed writer's file is left");
    assert!(live.exists(), "a running writer's file was removed");
    assert!(recent.exists(), "a file written a moment ago was removed");
}

/// What a name is decides what a statement may do with it, even where the table cannot be
/// read or a table of this process hides it: a damaged warehouse table still takes its name
/// and DROP TABLE removes it; DROP TABLE of an external table removes only that table, even
/// over a materialized view's name or the warehouse's own folder; one damaged view leaves
/// SHOW MATERIALIZED VIEWS to the others.
#[test]
fn names_are_kept_and_dropped_by_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::copy("data/sample/features.parquet", input.join("a.parquet")).unwrap();
    let from_input = format!("SELECT id FROM '{}/'", input.display());
    assert_ok(&common::query(
        &wh,
        &format!(
            "CREATE TABLE bad AS SELECT 1 AS one; CREATE TABLE t AS SELECT 2 AS two;
             CREATE MATERIALIZED VIEW m AS {from_input}; CREATE MATERIALIZED VIEW other AS {from_input}"
        ),
    ));
    for file in common::parquet_files(&wh.join("tables/bad")) {
        std::fs::write(file, b"not parquet").unwrap();
    }
    assert_failure(
        &common::query(
            &wh,
            &format!("CREATE MATERIALIZED VIEW bad AS {from_input}"),
        ),
        &["a table named 'bad' exists"],
    );
    assert_failure(
        &common::query(&wh, "CREATE TABLE bad AS SELECT 3 AS three"),
        &["table 'bad' already exists (use CREATE OR REPLACE TABLE)"],
    );
    assert_ok(&common::query(&wh, "DROP TABLE bad"));
    assert!(!wh.join("tables/bad").exists());

    // External tables named as the view and as the warehouse table, over its own folder.
    let tables = wh.join("tables/t");
    assert_ok(&common::query(
        &wh,
        &format!(
            "CREATE OR REPLACE EXTERNAL TABLE m STORED AS PARQUET LOCATION 'data/sample/customers.parquet';
             CREATE OR REPLACE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{}/';
             DROP TABLE m; DROP TABLE t",
            tables.display()
        ),
    ));
    assert_eq!(
        assert_ok(&common::query(&wh, "SELECT count(*) AS n FROM m")),
        "n\n10000\n"
    );
    assert_eq!(
        assert_ok(&common::query(&wh, "SELECT two FROM t")),
        "two\n2\n"
    );

    // One view's newest manifest damaged: SHOW MATERIALIZED VIEWS lists the others.
    let newest = common::newest_manifest_file(&wh.join("views/other"));
    std::fs::write(&newest, "{not json").unwrap();
    let out = common::query(&wh, "SHOW MATERIALIZED VIEWS");
    let shown = assert_ok(&out);
    assert!(
        shown.contains("\nm,") && !shown.contains("other"),
        "{shown}"
    );
    assert!(
        common::stderr(&out).contains("'other' cannot be read"),
        "{}",
        common::stderr(&out)
    );
}

/// No delete follows a symbolic link out of the folder it is for. The warehouse's folders hold
/// links to a folder of old files (a Parquet file and a text file, three days old): one in the
/// LLM cache, two in a table's folder (one named as a write's folder is). `CLEAR LLM CACHE` and
/// `VACUUM t RETAIN 0 HOURS` do their work (the cache's entry and the file the replace removed
/// are gone) and leave that folder whole, saying why.
#[test]
fn deletes_never_follow_a_link_out_of_the_warehouse() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(
        "data/sample/features.parquet",
        elsewhere.join("part-0.parquet"),
    )
    .unwrap();
    std::fs::write(elsewhere.join("notes.txt"), "mine").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
    for file in ["part-0.parquet", "notes.txt"] {
        let f = std::fs::File::options()
            .write(true)
            .open(elsewhere.join(file))
            .unwrap();
        f.set_modified(old).unwrap();
    }
    let before = snapshot(&elsewhere);

    assert_ok(&query(
        &wh,
        "CREATE TABLE t AS SELECT 1 AS x; CREATE OR REPLACE TABLE t AS SELECT 2 AS x",
    ));
    let entry = wh.join("llm-cache/ab/abcd.json");
    std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
    std::fs::write(&entry, "{}").unwrap();
    std::os::unix::fs::symlink(&elsewhere, wh.join("llm-cache/zz")).unwrap();
    let out = query(&wh, "CLEAR LLM CACHE");
    assert_ok(&out);
    assert!(!entry.exists(), "the cache's own entry is removed");
    assert!(
        changes(&before, &snapshot(&elsewhere)).is_empty(),
        "CLEAR LLM CACHE deleted through a link"
    );
    assert!(
        common::stderr(&out).contains("symbolic link"),
        "{}",
        common::stderr(&out)
    );

    let table = wh.join("tables/t");
    std::os::unix::fs::symlink(&elsewhere, table.join("data-x")).unwrap();
    std::os::unix::fs::symlink(
        &elsewhere,
        table.join("data-0123456789abcdef0123456789abcdef"),
    )
    .unwrap();
    let vacuumed = assert_ok(&query(
        &wh,
        "SET batchinfer.vacuum_retention_check = false; VACUUM t RETAIN 0 HOURS",
    ));
    assert!(
        vacuumed.contains('1'),
        "the replaced version's file: {vacuumed}"
    );
    assert!(
        changes(&before, &snapshot(&elsewhere)).is_empty(),
        "VACUUM deleted through a link"
    );
    assert!(assert_ok(&query(&wh, "SELECT x * 21 FROM t")).contains("42"));
}
