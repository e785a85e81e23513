//! Delta Lake tables read as the Python `deltalake` package reads them: the table of
//! `data/sample/customers_delta/` (written by that package, `data/make_delta.py`) at each of its
//! versions against what the package read of each (`data/reference/customers_delta.json`);
//! a query planned over the newest commit, time travel by version and by time, a table in S3,
//! and one clear error for each thing that is not a usable table.

mod common;
mod s3_server;

use std::path::Path;
use std::time::{Duration, SystemTime};

use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;

use common::{assert_failure, assert_ok, query};

const TABLE: &str = "data/sample/customers_delta/";

/// What the Python `deltalake` package read of version `version`.
fn reference(version: usize) -> serde_json::Value {
    let text = std::fs::read_to_string("data/reference/customers_delta.json").unwrap();
    let all: serde_json::Value = serde_json::from_str(&text).unwrap();
    all[version.to_string()].clone()
}

/// The aggregates the reference holds, of table `t`, as batchinfer prints them in CSV.
const AGGREGATES: &str = "SELECT count(*) AS n, sum(id) AS sum_id, \
     sum(CAST(spend AS DOUBLE)) AS sum_spend, string_agg(DISTINCT city, ',' ORDER BY city) AS cities \
     FROM t";

/// `(rows, sum of ids, sum of spend, cities)` from [`AGGREGATES`]' CSV output.
fn aggregates(csv: &str) -> (u64, i64, f64, String) {
    let line = csv
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no row: {csv}"));
    let (n, rest) = line.split_once(',').unwrap();
    let (sum_id, rest) = rest.split_once(',').unwrap();
    let (sum_spend, cities) = rest.split_once(',').unwrap();
    (
        n.parse().unwrap(),
        sum_id.parse().unwrap(),
        sum_spend.parse().unwrap(),
        cities.trim_matches('"').to_string(),
    )
}

/// The aggregates of the reference of `version`, as [`aggregates`] gives them.
fn expected(version: usize) -> (u64, i64, f64, String) {
    let r = reference(version);
    let cities: Vec<&str> = r["cities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    (
        r["rows"].as_u64().unwrap(),
        r["sum_id"].as_i64().unwrap(),
        r["sum_spend"].as_f64().unwrap(),
        cities.join(","),
    )
}

fn assert_same(got: (u64, i64, f64, String), want: (u64, i64, f64, String), what: &str) {
    assert_eq!(got.0, want.0, "{what}: rows");
    assert_eq!(got.1, want.1, "{what}: sum of ids");
    assert!(
        (got.2 - want.2).abs() <= 1e-9 * want.2.abs().max(1.0),
        "{what}: sum of spend {} against {}",
        got.2,
        want.2
    );
    assert_eq!(got.3, want.3, "{what}: cities");
}

#[test]
fn each_version_reads_as_the_python_deltalake_package_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    for version in 0..3 {
        let sql = format!(
            "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{TABLE}' \
             OPTIONS ('version' '{version}'); {AGGREGATES}"
        );
        let out = assert_ok(&query(&wh, &sql));
        assert_same(
            aggregates(&out),
            expected(version),
            &format!("version {version}"),
        );
    }
    // No version named: the newest, 2.
    let sql = format!("CREATE EXTERNAL TABLE t STORED AS DELTA LOCATION '{TABLE}'; {AGGREGATES}");
    assert_same(
        aggregates(&assert_ok(&query(&wh, &sql))),
        expected(2),
        "newest",
    );
    // The columns and their types, as the package read them.
    let sql = format!(
        "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{TABLE}'; \
         SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 't' \
         ORDER BY ordinal_position"
    );
    let columns = assert_ok(&query(&wh, &sql));
    let want: Vec<String> = reference(2)["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    let got: Vec<String> = columns.lines().skip(1).map(str::to_string).collect();
    assert_eq!(got.len(), want.len(), "{columns}");
    for (got, want) in got.iter().zip(&want) {
        let (name, arrow_type) = got.split_once(',').unwrap();
        let (want_name, want_type) = want.split_once(' ').unwrap();
        assert_eq!(name, want_name, "{columns}");
        let same_type = match want_type {
            "int64" => arrow_type == "Int64",
            "float" => arrow_type == "Float32",
            "string" => arrow_type.starts_with("Utf8"),
            other => panic!("a type the test does not know: {other}"),
        };
        assert!(same_type, "{name}: {arrow_type} for {want_type}");
    }
}

/// A model scores a Delta table's rows as it scores the same rows from the Parquet file they
/// were written from.
#[test]
fn predict_over_a_delta_table_scores_as_over_its_parquet_source() {
    let dir = tempfile::tempdir().unwrap();
    let scores = |from: &str| {
        format!(
            "SELECT id, predict('churn', city, age, spend)['label'] AS label, \
             predict('churn', city, age, spend)['probabilities'][2] AS p FROM {from} ORDER BY id"
        )
    };
    let delta = assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{TABLE}' \
             OPTIONS ('version' '1'); {}",
            scores("t")
        ),
    ));
    let parquet = assert_ok(&query(
        &dir.path().join("wh"),
        &scores("'data/sample/customers.parquet'"),
    ));
    assert_eq!(delta.lines().count(), 2001, "{delta}");
    assert_eq!(delta, parquet);
}

/// A copy of the table with its commits up to `last` only.
fn copy_up_to(last: usize, to: &Path) {
    std::fs::create_dir_all(to.join("_delta_log")).unwrap();
    for entry in std::fs::read_dir(TABLE).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
    for version in 0..=last {
        add_commit(version, to);
    }
}

fn add_commit(version: usize, to: &Path) {
    let name = format!("_delta_log/{version:020}.json");
    std::fs::copy(Path::new(TABLE).join(&name), to.join(&name)).unwrap();
}

async fn count(engine: &Engine, table: &str) -> i64 {
    let batches: Vec<RecordBatch> =
        common::run(engine, &format!("SELECT count(*) FROM {table}")).await;
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

/// One process, one definition: each query reads the newest commit as it is planned; a
/// definition with a version pinned keeps reading that version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_query_reads_the_newest_commit_and_a_pinned_version_stays() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("customers_delta");
    copy_up_to(0, &copy);
    let engine = Engine::new(EngineConfig {
        models_dir: Some("data/models".into()),
        ..Default::default()
    })
    .unwrap();
    let location = format!("{}/", copy.display());
    common::run(
        &engine,
        &format!("CREATE EXTERNAL TABLE newest STORED AS DELTATABLE LOCATION '{location}'"),
    )
    .await;
    common::run(
        &engine,
        &format!(
            "CREATE EXTERNAL TABLE first STORED AS DELTATABLE LOCATION '{location}' \
             OPTIONS ('version' '0')"
        ),
    )
    .await;
    assert_eq!(count(&engine, "newest").await, 1000);
    add_commit(1, &copy);
    assert_eq!(count(&engine, "newest").await, 2000);
    add_commit(2, &copy);
    let churned = reference(2)["rows"].as_i64().unwrap();
    assert_eq!(count(&engine, "newest").await, churned);
    assert_eq!(count(&engine, "first").await, 1000);
}

/// `OPTIONS ('timestamp' ...)` reads the version current then: each commit's time is its log
/// file's, as delta-rs and Spark take it.
#[test]
fn time_travel_by_timestamp_reads_the_version_current_then() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("customers_delta");
    copy_up_to(2, &copy);
    let day = Duration::from_secs(86_400);
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
    for version in 0..3u32 {
        let log = copy.join(format!("_delta_log/{version:020}.json"));
        let file = std::fs::File::options().write(true).open(&log).unwrap();
        file.set_modified(start + day * (31 * version)).unwrap();
    }
    let at = |time: &str| {
        let sql = format!(
            "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{}/' \
             OPTIONS ('timestamp' '{time}'); {AGGREGATES}",
            copy.display()
        );
        aggregates(&assert_ok(&query(&dir.path().join("wh"), &sql)))
    };
    assert_same(at("2026-01-15T00:00:00Z"), expected(0), "January");
    assert_same(at("2026-02-15T12:00:00+01:00"), expected(1), "February");
    assert_same(at("2026-12-01T00:00:00Z"), expected(2), "December");
}

#[test]
fn what_is_not_a_usable_delta_table_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let create = |location: &str, options: &str| {
        query(
            &wh,
            &format!(
                "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{location}' {options}; \
                 SELECT count(*) FROM t"
            ),
        )
    };
    assert_failure(
        &create("data/sample/", ""),
        &["Delta table 't'", "data/sample/", "holds no Delta table"],
    );
    assert_failure(
        &create(TABLE, "OPTIONS ('version' '9')"),
        &["Delta table 't'", "has no version 9"],
    );
    assert_failure(
        &create(TABLE, "OPTIONS ('version' 'latest')"),
        &["'version' is \"latest\"", "expected a version number"],
    );
    assert_failure(
        &create(TABLE, "OPTIONS ('versionAsOf' '1')"),
        &[
            "takes the options 'version' and 'timestamp'",
            "not 'versionasof'",
        ],
    );
    assert_failure(
        &query(
            &wh,
            &format!("CREATE EXTERNAL TABLE t (id BIGINT) STORED AS DELTATABLE LOCATION '{TABLE}'"),
        ),
        &["columns and partitions are those of its log"],
    );
}

/// The same table in S3 (the tests' S3 server): read through batchinfer's S3 store, with the
/// environment's credentials, at each version.
#[test]
fn a_delta_table_in_s3_reads_as_the_local_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    for entry in common::files_under(Path::new(TABLE)) {
        let key = entry
            .strip_prefix(TABLE)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        server.put_file("lake", &format!("customers_delta/{key}"), &entry);
    }
    for (version, options) in [(1, "OPTIONS ('version' '1')"), (2, "")] {
        let sql = format!(
            "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION 's3://lake/customers_delta/' \
             {options}; {AGGREGATES}"
        );
        let mut command = common::bin();
        server.client(&mut command);
        command
            .env("BATCHINFER_WAREHOUSE", dir.path().join("wh"))
            .args(["query", "-e", &sql]);
        let out = assert_ok(&common::output_within(&mut command, common::DEADLINE));
        assert_same(
            aggregates(&out),
            expected(version),
            &format!("S3, version {version}"),
        );
    }
}

/// `DESCRIBE HISTORY` lists each commit, newest first, as the `deltalake` package's `history()`
/// does: its version, time and operation; a table that is not a Delta table is refused.
#[test]
fn describe_history_lists_the_commits_as_the_deltalake_package_does() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let out = assert_ok(&query(
        &wh,
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{TABLE}'; DESCRIBE HISTORY t"
        ),
    ));
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        "version,timestamp,operation,operation_parameters,read_version,engine_info,info"
    );
    let history = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string("data/reference/customers_delta.json").unwrap(),
    )
    .unwrap()["history"]
        .clone();
    let history = history.as_array().unwrap();
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), history.len(), "{out}");
    for (row, want) in rows.iter().zip(history) {
        let fields: Vec<&str> = row.splitn(4, ',').collect();
        assert_eq!(fields[0], want["version"].to_string(), "{row}");
        let time = chrono::DateTime::parse_from_rfc3339(fields[1])
            .unwrap_or_else(|e| panic!("{row}: {e}"));
        assert_eq!(
            time.timestamp_millis(),
            want["timestamp"].as_i64().unwrap(),
            "{row}"
        );
        assert_eq!(fields[2], want["operation"].as_str().unwrap(), "{row}");
    }
    assert_failure(
        &query(
            &wh,
            "CREATE EXTERNAL TABLE p STORED AS PARQUET LOCATION 'data/sample/customers.parquet'; \
             DESCRIBE HISTORY p",
        ),
        &["'p' is not a Delta table"],
    );
    assert_failure(&query(&wh, "DESCRIBE HISTORY nowhere"), &["nowhere"]);
}

/// A commit after the table's three that adds `add` (an `add` action's JSON) to it.
fn forge_commit(table: &Path, add: serde_json::Value) {
    let commit = serde_json::json!({ "add": add });
    let info = serde_json::json!({"commitInfo": {"timestamp": 1, "operation": "WRITE"}});
    std::fs::write(
        table.join(format!("_delta_log/{:020}.json", 3)),
        format!("{commit}\n{info}\n"),
    )
    .unwrap();
}

/// An `add` action for the file at `path` (as the log names it), of the size of `real`.
fn add_of(path: &str, real: &Path) -> serde_json::Value {
    serde_json::json!({
        "path": path,
        "partitionValues": {},
        "size": std::fs::metadata(real).unwrap().len(),
        "modificationTime": 1,
        "dataChange": true,
    })
}

/// A log that names files outside the table's folder (a relative path that climbs out, an
/// absolute path, a URL of this machine's files or of another store) is refused before any file
/// is read, naming the table and the file; so is a file with a deletion vector.
#[test]
fn a_log_naming_files_outside_the_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    copy_up_to(2, &table);
    // A real Parquet file beside the table, with rows of its own.
    let outside = dir.path().join("outside.parquet");
    std::fs::copy("data/sample/customers.parquet", &outside).unwrap();
    let inside = std::fs::read_dir(&table)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    let wh = dir.path().join("wh");
    let read = || {
        query(
            &wh,
            &format!(
                "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{}/'; \
                 SELECT count(*) FROM t",
                table.display()
            ),
        )
    };
    let absolute = outside.display().to_string();
    for path in [
        "../outside.parquet".to_string(),
        "./../outside.parquet".to_string(),
        "%2E%2E/outside.parquet".to_string(),
        "..\\outside.parquet".to_string(),
        ".\t./outside.parquet".to_string(),
        format!(" {absolute}"),
        absolute.clone(),
        format!("file://{absolute}"),
        "s3://another-bucket/x.parquet".to_string(),
        "http://127.0.0.1:1/x.parquet".to_string(),
    ] {
        forge_commit(&table, add_of(&path, &outside));
        assert_failure(&read(), &["Delta table 't'", "not in the table's folder"]);
    }
    // The same file named as the table's own reads (the forged commit is otherwise sound).
    let own = inside.file_name().unwrap().to_str().unwrap().to_string();
    std::fs::copy(&outside, table.join("copied.parquet")).unwrap();
    forge_commit(&table, add_of("copied.parquet", &outside));
    let rows = assert_ok(&read());
    let churned = reference(2)["rows"].as_i64().unwrap();
    assert_eq!(rows, format!("count(*)\n{}\n", churned + 2000), "{own}");
    // A deletion vector is refused, not read.
    let mut add = add_of("copied.parquet", &outside);
    add["deletionVector"] = serde_json::json!({
        "storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
        "sizeInBytes": 40, "cardinality": 6
    });
    forge_commit(&table, add);
    assert_failure(&read(), &["Delta table 't'", "deletion vector"]);
}

/// A time before the first commit names no version: refused, not read as the first.
#[test]
fn a_time_before_the_first_commit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = query(
        &dir.path().join("wh"),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS DELTATABLE LOCATION '{TABLE}' \
             OPTIONS ('timestamp' '2000-01-01T00:00:00Z'); SELECT count(*) FROM t"
        ),
    );
    assert_failure(
        &out,
        &["Delta table 't'", "no version existed at 2000-01-01"],
    );
}
