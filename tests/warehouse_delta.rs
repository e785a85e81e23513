//! The warehouse's tables are Delta Lake tables: what CREATE TABLE ... AS, INSERT INTO and
//! CREATE OR REPLACE TABLE commit is read back by the Python `deltalake` package and by Polars
//! (scripts/python_readers.sh installs them), and a table they write is read by batchinfer;
//! concurrent replaces leave exactly one writer's rows, locally and in S3; a statement that fails
//! or is killed leaves the version before it; time travel, history with lineage, VACUUM and
//! OPTIMIZE; a table written before tables were Delta tables is read as before and converted by
//! CREATE OR REPLACE.

mod common;
mod fixtures;
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{assert_failure, assert_ok, bin, query, stderr};

/// The python of the environment that holds `deltalake` and Polars.
fn python_readers() -> PathBuf {
    fixtures::python_readers()
}

/// Runs `script` in the readers' python with the arguments `args`; its standard output. The
/// script ends by `os._exit` once it has run (and printed) to its end: the `deltalake` package's
/// threads can abort the interpreter's own shutdown ("terminate called without an active
/// exception"), after every check has passed.
fn python(script: &str, args: &[&str]) -> String {
    let script = format!("{script}\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n");
    let out = Command::new(python_readers())
        .arg("-c")
        .arg(&script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one row of a CSV result, its fields.
fn one_row(out: &Output) -> Vec<String> {
    let text = assert_ok(out);
    let mut lines = text.lines().skip(1);
    let row = lines.next().unwrap_or_else(|| panic!("no row: {text}"));
    row.split(',').map(str::to_string).collect()
}

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
        "{what}: {got} against {want}"
    );
}

const PYTHON_SUMS: &str = r#"
import sys, json
import deltalake, polars as pl, pyarrow.compute as pc
path = sys.argv[1]
t = deltalake.DeltaTable(path)
a = t.to_pyarrow_table()
p = pl.read_delta(path)
first = pc.list_element(a.column("probabilities"), 0)
print(json.dumps({
    "version": t.version(),
    "rows": a.num_rows,
    "polars_rows": p.height,
    "sum_id": pc.sum(a.column("id")).as_py(),
    "sum_p0": pc.sum(first).as_py(),
    "polars_sum_id": int(p["id"].sum()),
    "label": str(a.schema.field("label").type),
    "probabilities": str(a.schema.field("probabilities").type),
    "models": [c.get("batchinfer.models") for c in t.history()],
}))
"#;

/// CREATE TABLE ... AS and INSERT INTO write a Delta table that the Python `deltalake` package
/// and Polars read with the same rows, values and types as batchinfer; a vector column
/// (FixedSizeList) and a struct holding one come back as vectors; each commit names the models
/// with their sha256.
#[test]
fn tables_written_read_alike_in_deltalake_and_polars() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(
        wh,
        "CREATE TABLE scores AS SELECT id, label, probabilities \
         FROM predict_table('churn', 'data/sample/customers.parquet') WHERE id < 1500; \
         INSERT INTO scores SELECT id, label, probabilities \
         FROM predict_table('churn', 'data/sample/customers.parquet') WHERE id >= 1500",
    ));
    let ours = one_row(&query(
        wh,
        "SELECT count(*), sum(id), sum(CAST(probabilities[1] AS DOUBLE)), \
         arrow_typeof(first_value(probabilities)) FROM scores",
    ));
    assert_eq!(ours[3], "FixedSizeList(2 x Float32)", "{ours:?}");
    let table = wh.join("tables/scores");
    let theirs: serde_json::Value =
        serde_json::from_str(&python(PYTHON_SUMS, &[table.to_str().unwrap()])).unwrap();
    assert_eq!(theirs["version"], 1, "{theirs}");
    assert_eq!(
        theirs["rows"].as_u64().unwrap(),
        ours[0].parse::<u64>().unwrap()
    );
    assert_eq!(theirs["polars_rows"], theirs["rows"]);
    assert_eq!(
        theirs["sum_id"].as_i64().unwrap(),
        ours[1].parse::<i64>().unwrap()
    );
    assert_eq!(theirs["polars_sum_id"], theirs["sum_id"]);
    close(
        theirs["sum_p0"].as_f64().unwrap(),
        ours[2].parse().unwrap(),
        "sum of the first probability",
    );
    assert_eq!(theirs["label"], "int64");
    assert!(
        theirs["probabilities"].as_str().unwrap().contains("float"),
        "{theirs}"
    );
    let models = theirs["models"].to_string();
    let sha = common::sha256_of("data/models/churn.onnx");
    assert_eq!(models.matches(&sha).count(), 2, "{models}");

    // A struct holding a vector (predict over a classifier) round-trips too.
    assert_ok(&query(
        wh,
        "CREATE TABLE flowers AS SELECT predict('iris', sepal_length, sepal_width, \
         petal_length, petal_width) AS p FROM 'data/sample/iris.parquet'",
    ));
    let typed = one_row(&query(
        wh,
        "SELECT arrow_typeof(first_value(p)) FROM flowers",
    ));
    assert!(
        typed.join(",").contains("FixedSizeList(3 x Float32)"),
        "{typed:?}"
    );
}

/// A table the Python `deltalake` package writes into the warehouse is a table of batchinfer's.
#[test]
fn a_table_deltalake_writes_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("tables/written");
    python(
        "import sys, pyarrow as pa, deltalake\n\
         t = pa.table({'x': pa.array(range(1000), pa.int64()), 'y': [str(i) for i in range(1000)]})\n\
         deltalake.write_deltalake(sys.argv[1], t)\n\
         deltalake.write_deltalake(sys.argv[1], t.slice(0, 10), mode='append')\n",
        &[table.to_str().unwrap()],
    );
    let row = one_row(&query(
        dir.path(),
        "SELECT count(*), sum(x), max(y) FROM written",
    ));
    assert_eq!(row, ["1010", "499545", "999"]);
}

/// The rows and rounds of the concurrency tests: `default`, or `BATCHINFER_CONCURRENT_ROWS` and
/// `BATCHINFER_CONCURRENT_ROUNDS` (the full case: 3000000 and 8).
fn size(default: (u64, usize)) -> (u64, usize) {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    (
        var("BATCHINFER_CONCURRENT_ROWS").unwrap_or(default.0),
        var("BATCHINFER_CONCURRENT_ROUNDS")
            .map(|r: u64| r as usize)
            .unwrap_or(default.1),
    )
}

/// Concurrent `CREATE OR REPLACE TABLE` of one table, each writer its own rows, `rounds` times
/// through `command` (the binary over one warehouse): after each round the table holds exactly
/// one writer's rows, all of them; each writer succeeded or failed with a conflict that names
/// the table.
fn replaces_leave_one_writer(command: &dyn Fn(&str) -> Command, rows: u64, rounds: usize) {
    for round in 0..rounds {
        let writers: Vec<_> = (1..=3)
            .map(|w| {
                let sql = format!(
                    "CREATE OR REPLACE TABLE t AS SELECT {w} AS writer, value AS i \
                     FROM generate_series(1, {rows})"
                );
                command(&sql).spawn().unwrap()
            })
            .collect();
        let mut won = 0;
        for writer in writers {
            let out = writer.wait_with_output().unwrap();
            if out.status.success() {
                won += 1;
            } else {
                let err = stderr(&out);
                assert!(
                    err.contains("'t'") && (err.contains("conflict") || err.contains("already")),
                    "round {round}: {err}"
                );
                assert!(!err.contains("panicked"), "{err}");
            }
        }
        assert!(won >= 1, "round {round}: no writer committed");
        let out =
            command("SELECT writer, count(*) AS n, count(DISTINCT i) AS d FROM t GROUP BY writer")
                .output()
                .unwrap();
        let text = assert_ok(&out);
        let rows_of: Vec<_> = text.lines().skip(1).collect();
        assert_eq!(rows_of.len(), 1, "round {round}: {text}");
        let fields: Vec<&str> = rows_of[0].split(',').collect();
        assert_eq!(fields[1], rows.to_string(), "round {round}: {text}");
        assert_eq!(fields[2], rows.to_string(), "round {round}: {text}");
    }
}

#[test]
fn concurrent_replaces_leave_one_writers_rows_locally() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().to_path_buf();
    let command = move |sql: &str| {
        let mut command = bin();
        command
            .arg("--warehouse")
            .arg(&wh)
            .args(["query", "-e", sql])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    };
    let (rows, rounds) = size((300_000, 4));
    replaces_leave_one_writer(&command, rows, rounds);
}

#[test]
fn concurrent_replaces_leave_one_writers_rows_in_s3() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(dir.path());
    server.bucket("lake");
    let lake = server.lake_warehouse();
    let command = move |sql: &str| {
        let mut command = lake(sql);
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        command
    };
    let (rows, rounds) = size((200_000, 3));
    replaces_leave_one_writer(&command, rows, rounds);
}

/// What `DESCRIBE HISTORY t` and `count(*)` say: the newest version and the rows.
fn version_and_rows(wh: &Path) -> (u64, u64) {
    let history = assert_ok(&query(wh, "DESCRIBE HISTORY t"));
    let newest = history.lines().nth(1).unwrap().split(',').next().unwrap();
    let rows = one_row(&query(wh, "SELECT count(*) FROM t"));
    (newest.parse().unwrap(), rows[0].parse().unwrap())
}

/// A CREATE OR REPLACE that fails after 1.5M of its 2M rows, and one killed with SIGKILL while
/// it writes, leave the version before them, whole and readable; the failed one's files are
/// gone.
#[test]
fn a_failed_or_killed_replace_leaves_the_version_before() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(
        wh,
        "CREATE TABLE t AS SELECT value AS i FROM generate_series(1, 2000)",
    ));
    let out = query(
        wh,
        "CREATE OR REPLACE TABLE t AS SELECT CAST(CASE WHEN value > 1500000 THEN 'x' \
         ELSE CAST(value AS VARCHAR) END AS BIGINT) AS i FROM generate_series(1, 2000000)",
    );
    assert_failure(&out, &["x"]);
    assert_eq!(version_and_rows(wh), (0, 2000));
    let folders: Vec<_> = std::fs::read_dir(wh.join("tables/t"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("data-"))
        .collect();
    assert_eq!(folders.len(), 1, "the failed statement's files stay");

    let mut killed = bin()
        .arg("--warehouse")
        .arg(wh)
        .args([
            "query",
            "-e",
            "CREATE OR REPLACE TABLE t AS SELECT value AS i, value * 2 AS j \
             FROM generate_series(1, 200000000)",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let table = wh.join("tables/t");
    common::poll_until(
        Duration::from_secs(120),
        "the killed statement's files",
        || {
            common::files_under(&table)
                .iter()
                .filter(|f| !f.to_string_lossy().contains("_delta_log"))
                .count()
                > 1
        },
    );
    common::send(killed.id(), libc::SIGKILL);
    let _ = killed.wait();
    assert_eq!(version_and_rows(wh), (0, 2000));
}

/// INSERT INTO a table with columns that do not fit is refused, naming both lists of columns;
/// nothing is committed.
#[test]
fn an_insert_whose_columns_do_not_fit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(
        wh,
        "CREATE TABLE t AS SELECT 1 AS id, CAST(0.5 AS FLOAT) AS p",
    ));
    let out = query(wh, "INSERT INTO t SELECT 2");
    assert_failure(&out, &["INSERT INTO t", "1 columns", "id Int64, p Float32"]);
    let out = query(wh, "INSERT INTO t SELECT 2, 'high'");
    assert_failure(&out, &["column 'p'", "Utf8", "Float32"]);
    let out = query(wh, "INSERT INTO t (id, q) SELECT 2, 0.5");
    assert_failure(&out, &["no column 'q'"]);
    assert_ok(&query(wh, "INSERT INTO t SELECT 2, CAST(0.25 AS FLOAT)"));
    assert_eq!(version_and_rows(wh), (1, 2));
}

/// `VERSION AS OF` and `TIMESTAMP AS OF` read older versions; `DESCRIBE HISTORY` shows each
/// commit's statement; VACUUM deletes only files no current reader needs, and OPTIMIZE compacts
/// without changing the rows.
#[test]
fn time_travel_history_vacuum_and_optimize() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(
        wh,
        "CREATE TABLE t AS SELECT value AS i FROM generate_series(1, 10)",
    ));
    std::thread::sleep(Duration::from_millis(1100));
    let between = chrono_now();
    std::thread::sleep(Duration::from_millis(1100));
    assert_ok(&query(
        wh,
        "INSERT INTO t SELECT value FROM generate_series(11, 15); \
         INSERT INTO t SELECT value FROM generate_series(16, 20)",
    ));
    assert_ok(&query(wh, "CREATE OR REPLACE TABLE t AS SELECT 7 AS i"));
    let count = |sql: &str| one_row(&query(wh, sql))[0].clone();
    assert_eq!(count("SELECT count(*) FROM t VERSION AS OF 0"), "10");
    assert_eq!(count("SELECT count(*) FROM t VERSION AS OF 2"), "20");
    assert_eq!(count("SELECT count(*) FROM t"), "1");
    assert_eq!(
        count(&format!(
            "SELECT count(*) FROM t TIMESTAMP AS OF '{between}'"
        )),
        "10"
    );
    assert_failure(
        &query(wh, "SELECT * FROM t VERSION AS OF 9"),
        &["no version 9"],
    );
    let history = assert_ok(&query(wh, "DESCRIBE HISTORY t"));
    assert_eq!(history.lines().count(), 5, "{history}");
    assert!(
        history.contains("CREATE OR REPLACE TABLE t AS SELECT 7 AS i"),
        "{history}"
    );

    // Under the table's retention, as Delta does, unless told.
    assert_failure(
        &query(wh, "VACUUM t RETAIN 0 HOURS"),
        &["retention of 168 hours", "vacuum_retention_check"],
    );
    let vacuumed = one_row(&query(
        wh,
        "SET batchinfer.vacuum_retention_check = false; VACUUM t RETAIN 0 HOURS",
    ));
    assert_eq!(vacuumed, ["3"], "the three files the replace removed");
    assert_eq!(count("SELECT sum(i) FROM t"), "7");
    // A vacuumed version is one error naming the table, even where its log alone would answer.
    for sql in [
        "SELECT sum(i) FROM t VERSION AS OF 0",
        "SELECT count(*) FROM t VERSION AS OF 0",
    ] {
        assert_failure(
            &query(wh, sql),
            &[
                "Delta table 't",
                "version 0 can no longer be read",
                "VACUUM",
            ],
        );
    }

    assert_ok(&query(
        wh,
        "INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); INSERT INTO t VALUES (3)",
    ));
    let optimized = one_row(&query(wh, "OPTIMIZE t"));
    assert_eq!(optimized, ["1", "4"]);
    assert_eq!(count("SELECT sum(i) FROM t"), "13");
}

fn chrono_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A table written before tables were Delta tables (its Parquet files directly in its folder)
/// is read as before, and CREATE OR REPLACE makes it a Delta table, its old files gone.
#[test]
fn a_folder_of_parquet_files_is_read_then_converted() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let old = wh.join("tables/old");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::copy("data/sample/customers.parquet", old.join("part-0.parquet")).unwrap();
    let before = one_row(&query(wh, "SELECT count(*), sum(id) FROM old"));
    assert_eq!(before[0], "2000");
    assert_ok(&query(
        wh,
        "CREATE OR REPLACE TABLE old AS SELECT * FROM old WHERE id < 1000",
    ));
    assert!(!old.join("part-0.parquet").exists());
    assert!(old.join("_delta_log").is_dir());
    let after = one_row(&query(wh, "SELECT count(*) FROM old"));
    assert_eq!(after[0], "1000");
}

/// Columns Delta holds otherwise: a time without a time zone (the `timestampNtz` feature, which
/// the `deltalake` package reads), an unsigned integer (widened), a column of no type (refused,
/// named), a vector of no values (refused); a replace that adds such a time keeps the table
/// readable.
#[test]
fn times_unsigned_and_untyped_columns() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(wh, "CREATE TABLE t AS SELECT 1 AS id"));
    assert_ok(&query(
        wh,
        "CREATE OR REPLACE TABLE t AS SELECT 2 AS id, \
         CAST('2024-01-01 10:00:00' AS TIMESTAMP) AS ts, arrow_cast(200, 'UInt8') AS u",
    ));
    let row = one_row(&query(wh, "SELECT id, ts, u, arrow_typeof(u) FROM t"));
    assert_eq!(row, ["2", "2024-01-01T10:00:00", "200", "Int16"]);
    let theirs = python(
        "import sys, deltalake\nt = deltalake.DeltaTable(sys.argv[1]).to_pyarrow_table()\n\
         print(t.column('ts')[0].as_py().isoformat(), t.column('u')[0].as_py())",
        &[wh.join("tables/t").to_str().unwrap()],
    );
    assert_eq!(theirs.trim(), "2024-01-01T10:00:00 200");
    assert_failure(
        &query(wh, "CREATE TABLE n AS SELECT NULL AS c, 1 AS k"),
        &["column 'c' has no type"],
    );
    assert_failure(
        &query(
            wh,
            "CREATE TABLE z AS SELECT arrow_cast(make_array(), 'FixedSizeList(0, Int64)') AS c",
        ),
        &["column 'c' is a vector of no values"],
    );
    assert!(!wh.join("tables/n").exists() && !wh.join("tables/z").exists());
}

/// What a commit keeps of its statement has its secrets blanked; a path with `@` in it is a path,
/// not a version; a version far past the newest is refused at once.
#[test]
fn history_keeps_no_secret_and_names_with_at_are_paths() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(
        wh,
        "CREATE TABLE s AS SELECT 'https://user:SEKRET1@example.com/x?sig=SEKRET2' AS u \
         WHERE 'password' = 'SEKRET3' OR 1 = 1",
    ));
    let history = assert_ok(&query(wh, "DESCRIBE HISTORY s"));
    assert!(history.contains("CREATE TABLE s"), "{history}");
    assert!(!history.contains("SEKRET"), "{history}");
    let file = dir.path().join("in@2026.parquet");
    std::fs::copy("data/sample/customers.parquet", &file).unwrap();
    let row = one_row(&query(
        wh,
        &format!("SELECT count(*) FROM '{}'", file.display()),
    ));
    assert_eq!(row, ["2000"]);
    let started = std::time::Instant::now();
    assert_failure(
        &query(wh, "SELECT * FROM s VERSION AS OF 100000000000"),
        &["has no version 100000000000"],
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// A CREATE TABLE killed before it commits leaves the name free: a later CREATE TABLE makes the
/// table.
#[test]
fn a_killed_create_leaves_the_name_free() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let mut killed = bin()
        .arg("--warehouse")
        .arg(wh)
        .args([
            "query",
            "-e",
            "CREATE TABLE k AS SELECT value AS i, value * 2 AS j FROM generate_series(1, 200000000)",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let table = wh.join("tables/k");
    common::poll_until(
        Duration::from_secs(120),
        "the killed statement's files",
        || table.exists() && !common::files_under(&table).is_empty(),
    );
    common::send(killed.id(), libc::SIGKILL);
    let _ = killed.wait();
    assert_failure(&query(wh, "SELECT * FROM k"), &["k"]);
    assert_ok(&query(wh, "CREATE TABLE k AS SELECT 1 AS i"));
    assert_eq!(one_row(&query(wh, "SELECT count(*) FROM k")), ["1"]);
}

/// A CREATE OR REPLACE that converts a folder of Parquet files, while an INSERT adds a file to
/// that folder: the replace fails with a conflict, and the inserted row stays.
#[test]
fn converting_a_folder_an_insert_changed_meanwhile_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let old = wh.join("tables/oi");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::copy("data/sample/features.parquet", old.join("part-0.parquet")).unwrap();
    let replace = bin()
        .arg("--warehouse")
        .arg(wh)
        .args([
            "query",
            "-e",
            "CREATE OR REPLACE TABLE oi AS SELECT id FROM oi UNION ALL \
             SELECT value + 100000 AS id FROM range(10000000) \
             WHERE md5(CAST(value AS VARCHAR)) <> 'x'",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The replace has listed the folder's files and computes its 10M rows (over ten seconds in
    // a debug build): the INSERT lands before its commit.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !old.join("_delta_log").exists(),
        "the replace is still running"
    );
    let features: Vec<String> = (0..10).map(|j| format!("f{j}")).collect();
    assert_ok(&query(
        wh,
        &format!(
            "INSERT INTO oi SELECT 424242 AS id, {} FROM oi LIMIT 1",
            features.join(", ")
        ),
    ));
    let out = replace.wait_with_output().unwrap();
    assert_failure(&out, &["table 'oi'", "conflict"]);
    let row = one_row(&query(wh, "SELECT count(*) FROM oi WHERE id = 424242"));
    assert_eq!(row, ["1"]);
}

/// An INSERT that commits after another statement committed meanwhile: beside OPTIMIZE and a
/// CREATE OR REPLACE that keeps the columns, the append read nothing the winner removed, so it is
/// made again on the newer version (Delta's conflict rules) and no row is lost; beside a replace
/// that changes the columns, it fails with a conflict naming the table and commits nothing.
#[test]
fn an_insert_commits_beside_optimize_and_a_replace_that_keeps_the_columns() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let spawn = |sql: &str| {
        bin()
            .arg("--warehouse")
            .arg(wh)
            .args(["query", "-e", sql])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let count = || one_row(&query(wh, "SELECT count(*) AS n FROM t"))[0].clone();
    // A slow INSERT (ten million rows, seconds), and `other` run and committed meanwhile.
    let beside_insert = |insert: &str, other: &str| {
        let mut insert = spawn(insert);
        std::thread::sleep(Duration::from_millis(1200));
        assert_ok(&query(wh, other));
        assert!(
            insert.try_wait().unwrap().is_none(),
            "the INSERT ended before {other} did: the test needs it slower"
        );
        insert.wait_with_output().unwrap()
    };
    let beside = |other: &str| {
        beside_insert(
            "INSERT INTO t SELECT value AS i, repeat('x', 20) AS s FROM \
             generate_series(1, 10000000)",
            other,
        )
    };
    let setup = "CREATE OR REPLACE TABLE t AS SELECT value AS i, 'first' AS s FROM \
                 generate_series(1, 10)";
    assert_ok(&query(wh, setup));
    assert_ok(&query(wh, "INSERT INTO t SELECT 11 AS i, 'second' AS s"));
    let optimized = beside("OPTIMIZE t");
    assert_ok(&optimized);
    assert_eq!(count(), "10000011");

    assert_ok(&query(wh, setup));
    let replaced = beside("CREATE OR REPLACE TABLE t AS SELECT i + 100 AS i, s FROM t");
    assert_ok(&replaced);
    assert_eq!(count(), "10000010");
    let row = one_row(&query(
        wh,
        "SELECT min(i) AS lo, max(i) AS hi FROM t WHERE s = 'first'",
    ));
    assert_eq!(row, ["101", "110"], "the replace's rows, and the INSERT's");

    // Other columns: the INSERT never saw them, and must not land in them.
    assert_ok(&query(wh, setup));
    let changed = beside("CREATE OR REPLACE TABLE t AS SELECT CAST(i AS VARCHAR) AS i FROM t");
    assert_failure(&changed, &["'t'", "its columns were changed", "conflict"]);
    assert_eq!(count(), "10");

    // An INSERT that reads the table: the rows it read were replaced meanwhile.
    assert_ok(&query(wh, setup));
    let reading = beside_insert(
        "INSERT INTO t SELECT a.i, a.s FROM t AS a, generate_series(1, 1000000)",
        "CREATE OR REPLACE TABLE t AS SELECT i + 100 AS i, s FROM t",
    );
    assert_failure(
        &reading,
        &["'t'", "rows this statement reads were removed", "conflict"],
    );
    assert_eq!(
        one_row(&query(wh, "SELECT count(*) AS n, min(i) AS lo FROM t")),
        ["10", "101"]
    );
}

/// A table dropped and made again while an INSERT into it runs starts its versions anew: the
/// INSERT fails with a conflict and the new table is left readable, without its rows.
#[test]
fn an_insert_never_lands_in_a_table_dropped_and_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    for columns in ["7 AS other_id, 'zz' AS other_text", "8 AS i, 'same' AS s"] {
        assert_ok(&query(
            wh,
            "DROP TABLE IF EXISTS t; CREATE TABLE t AS SELECT 1 AS i, 'a' AS s",
        ));
        let mut insert = bin()
            .arg("--warehouse")
            .arg(wh)
            .args([
                "query",
                "-e",
                "INSERT INTO t SELECT value AS i, repeat('x', 20) AS s FROM \
                 generate_series(1, 10000000)",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        assert_ok(&query(
            wh,
            &format!("DROP TABLE t; CREATE TABLE t AS SELECT {columns}"),
        ));
        assert!(
            insert.try_wait().unwrap().is_none(),
            "the INSERT ended first"
        );
        let out = insert.wait_with_output().unwrap();
        // Other columns or the same: another table all the same.
        assert_failure(&out, &["'t'", "dropped and made again", "conflict"]);
        assert_eq!(one_row(&query(wh, "SELECT count(*) AS n FROM t")), ["1"]);
    }
}
