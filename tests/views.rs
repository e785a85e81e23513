//! Materialized views through the real binary: input files written here with Arrow, refreshed
//! as they are added, changed and removed, and the view compared with the same query computed
//! over all the files at once (a full recompute). Refreshes are killed with SIGKILL, run two at a
//! time, run on a schedule and stopped with SIGTERM, and kept in the tests' S3 server.

mod common;
mod s3_server;
use common::{lines_of, parquet_files};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Float32Array, Int64Array, RecordBatch};
use datafusion::parquet::arrow::ArrowWriter;

use common::{assert_failure, assert_ok, bin, query, stdout};

const PREDICT: &str = "predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)";
const PREDICT_M: &str = "predict('m', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)";

/// A file of the features `linear` takes, for ids `from..to` (values that differ with `seed`).
fn write_features(path: &Path, from: i64, to: i64, seed: f32) {
    let ids: Vec<i64> = (from..to).collect();
    let mut columns: Vec<(String, ArrayRef)> =
        vec![("id".into(), Arc::new(Int64Array::from(ids.clone())))];
    for f in 0..10 {
        let values: Vec<f32> = ids
            .iter()
            .map(|id| ((*id as f32 * 0.37 + f as f32 * 1.3 + seed) % 7.0) - 3.0)
            .collect();
        columns.push((format!("f{f}"), Arc::new(Float32Array::from(values))));
    }
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

/// `id,value` rows of a CSV result, sorted by id.
fn id_values(csv: &str) -> Vec<(i64, f64)> {
    common::rows(csv)
        .into_iter()
        .map(|(id, values)| (id, values[0]))
        .collect()
}

/// The view's rows, and the same query over every input file now (a full recompute): equal.
fn assert_view_is_recompute(wh: &Path, view: &str, input: &str) -> Vec<(i64, f64)> {
    let got = id_values(&assert_ok(&query(
        wh,
        &format!("SELECT id, p FROM {view} ORDER BY id"),
    )));
    let want = id_values(&assert_ok(&query(
        wh,
        &format!("SELECT id, {PREDICT} AS p FROM '{input}' ORDER BY id"),
    )));
    assert_eq!(got.len(), want.len(), "rows in the view and in a recompute");
    for ((id, p), (want_id, want_p)) in got.iter().zip(&want) {
        assert_eq!(id, want_id);
        assert!((p - want_p).abs() <= 1e-5, "id {id}: {p} vs {want_p}");
    }
    got
}

fn refresh(wh: &Path, view: &str) -> String {
    assert_ok(&refresh_output(wh, view))
}

/// `batchinfer refresh VIEW` once, its output whatever its status.
fn refresh_output(wh: &Path, view: &str) -> std::process::Output {
    common::output_within(
        bin()
            .arg("--warehouse")
            .arg(wh)
            .args(["--models", "data/models", "refresh", view]),
        common::DEADLINE,
    )
}

/// A view `scores` over `first` files of `rows` rows (`f000.parquet`, ...; ids from 0), then
/// `more` such files added: the folder, the warehouse, the input folder and its text.
fn view_then_files(
    first: i64,
    more: i64,
    rows: i64,
) -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    let input_text = format!("{}/", input.display());
    let add = |files: std::ops::Range<i64>| {
        for i in files {
            let file = input.join(format!("f{i:03}.parquet"));
            write_features(&file, i * rows, i * rows + rows, 0.0);
        }
    };
    add(0..first);
    create_view(&wh, &input_text);
    add(first..first + more);
    (dir, wh, input, input_text)
}

fn create_view(wh: &Path, input: &str) {
    assert_ok(&query(
        wh,
        &format!("CREATE MATERIALIZED VIEW scores AS SELECT id, {PREDICT} AS p FROM '{input}'"),
    ));
}

#[test]
fn a_refresh_scores_new_files_rescores_changed_ones_and_forgets_removed_ones() {
    let (_dir, wh, input, input_text) = view_then_files(3, 0, 100);
    assert_eq!(
        assert_view_is_recompute(&wh, "scores", &input_text).len(),
        300
    );

    // Nothing new: nothing scored.
    assert_eq!(common::refresh_counts(&refresh(&wh, "scores")), (0, 0, 0));
    // Two new files.
    write_features(&input.join("f003.parquet"), 300, 400, 0.0);
    write_features(&input.join("f004.parquet"), 400, 450, 0.0);
    let line = refresh(&wh, "scores");
    assert_eq!(common::refresh_counts(&line), (2, 0, 0));
    assert!(line.contains("150 row(s) scored"), "{line}");
    assert_eq!(
        assert_view_is_recompute(&wh, "scores", &input_text).len(),
        450
    );
    // One file rewritten with other values and fewer rows, one removed.
    let before = id_values(&assert_ok(&query(
        &wh,
        "SELECT id, p FROM scores WHERE id = 100",
    )));
    write_features(&input.join("f001.parquet"), 100, 150, 2.5);
    std::fs::remove_file(input.join("f002.parquet")).unwrap();
    assert_eq!(common::refresh_counts(&refresh(&wh, "scores")), (0, 1, 1));
    let rows = assert_view_is_recompute(&wh, "scores", &input_text);
    assert_eq!(rows.len(), 100 + 50 + 100 + 50);
    let after = id_values(&assert_ok(&query(
        &wh,
        "SELECT id, p FROM scores WHERE id = 100",
    )));
    assert_ne!(before, after, "the changed file's rows are scored again");

    // Each output file records its input files and the model's sha256.
    let files = parquet_files(&wh.join("views/scores/data"));
    assert!(!files.is_empty());
    for file in files {
        let value = |key: &str| {
            common::parquet_footer_value(&file, key)
                .unwrap_or_else(|| panic!("no {key} in {}", file.display()))
        };
        assert!(value("batchinfer.inputs").contains("\"size\""));
        assert!(value("batchinfer.models").contains("\"sha256\""));
    }

    // The view lists its state, survives the process, and is dropped whole.
    let shown = assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS"));
    assert!(shown.contains(&format!("scores,{input_text}")), "{shown}");
    assert!(shown.contains(",4,300,current,"), "{shown}");
    // A file landed, one changed, one removed since: the view says it is behind its source.
    write_features(&input.join("f005.parquet"), 500, 510, 0.0);
    write_features(&input.join("f001.parquet"), 100, 150, 3.5);
    std::fs::remove_file(input.join("f000.parquet")).unwrap();
    let shown = assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS"));
    assert!(
        shown.contains(
            ",4,300,\"behind its source (1 new, 1 changed, 1 removed input files): REFRESH to \
             bring it up to date\","
        ),
        "{shown}"
    );
    assert_failure(
        &query(&wh, "DROP TABLE scores"),
        &["DROP MATERIALIZED VIEW scores"],
    );
    assert_ok(&query(&wh, "DROP MATERIALIZED VIEW scores"));
    // What is left is the version that says it was dropped.
    assert!(!wh.join("views/scores/data").exists());
    assert_eq!(manifests(&wh, "scores"), 1);
    assert!(!assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS")).contains("scores"));
    assert_failure(&query(&wh, "SELECT * FROM scores"), &["scores"]);
    assert_ok(&query(&wh, "DROP MATERIALIZED VIEW IF EXISTS scores"));
}

/// A model replaced with other bytes: the next refresh scores everything again, as a new
/// generation; one that fails leaves the old rows readable.
#[test]
fn a_replaced_model_rescores_everything_and_a_failed_rebuild_keeps_the_old_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    let model = dir.path().join("m.onnx");
    std::fs::copy("data/models/linear.onnx", &model).unwrap();
    for i in 0..4 {
        write_features(
            &input.join(format!("f{i}.parquet")),
            i * 50,
            i * 50 + 50,
            0.0,
        );
    }
    let sql = |sql: &str| {
        common::output_within(
            bin().arg("--warehouse").arg(&wh).args(["query", "-e", sql]),
            common::DEADLINE,
        )
    };
    assert_ok(&sql(&format!("CREATE MODEL m FROM '{}'", model.display())));
    assert_ok(&sql(&format!(
        "CREATE MATERIALIZED VIEW v AS SELECT id, {PREDICT_M} AS p FROM '{}/'",
        input.display()
    )));
    let old = id_values(&assert_ok(&sql("SELECT id, p FROM v")));
    assert_eq!(old.len(), 200);

    // Replaced, while a file the view serves gets damaged pages (its footer is whole): the
    // rebuild cannot read it, so it would take that file's rows out of the view; it stays
    // pending, and the view still holds the old model's rows.
    std::fs::copy("data/fixtures/linear_doubled.onnx", &model).unwrap();
    assert_ok(&sql(&format!(
        "CREATE OR REPLACE MODEL m FROM '{}'",
        model.display()
    )));
    let bad = input.join("f3.parquet");
    let good = std::fs::read(&bad).unwrap();
    let mut bytes = good.clone();
    bytes[4..64].fill(0xff);
    std::fs::write(&bad, bytes).unwrap();
    // A commit per file: the good files are committed to the new generation before the bad one
    // is found, and readers still read the old one.
    let out = sql("SET batchinfer.files_per_commit = 1; REFRESH MATERIALIZED VIEW v");
    assert_failure(
        &out,
        &["its rebuild cannot read 1 input file(s)", "f3.parquet"],
    );
    assert_eq!(id_values(&assert_ok(&sql("SELECT id, p FROM v"))), old);
    let shown = assert_ok(&sql("SHOW MATERIALIZED VIEWS"));
    assert!(
        shown.contains("rebuilding (4 input files so far)"),
        "{shown}"
    );

    // Fixed: everything is scored again by the new model (twice the old scores).
    std::fs::write(&bad, good).unwrap();
    let out = sql("REFRESH MATERIALIZED VIEW v");
    assert_ok(&out);
    let new = id_values(&assert_ok(&sql("SELECT id, p FROM v")));
    assert_eq!(new.len(), old.len());
    for ((id, p), (_, was)) in new.iter().zip(&old) {
        assert!(
            (p - 2.0 * was).abs() <= 1e-4 * was.abs().max(1.0),
            "id {id}: {p} vs 2 x {was}"
        );
    }
    assert!(assert_ok(&sql("SHOW MATERIALIZED VIEWS")).contains(",current,"));
}

#[test]
fn a_view_must_be_row_wise_over_one_set_of_files() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = "data/sample/features.parquet";
    for (query_text, what) in [
        (format!("SELECT count(*) FROM '{input}'"), "an aggregation"),
        (format!("SELECT id FROM '{input}' ORDER BY id"), "ORDER BY"),
        (format!("SELECT id FROM '{input}' LIMIT 3"), "LIMIT"),
        (
            format!("SELECT id, row_number() OVER (ORDER BY id) FROM '{input}'"),
            "a window function",
        ),
        (
            format!("SELECT a.id FROM '{input}' a JOIN '{input}' b ON a.id = b.id"),
            "a join",
        ),
        (format!("SELECT DISTINCT f0 FROM '{input}'"), "DISTINCT"),
        ("SELECT 1 AS x".to_string(), "no files to read"),
    ] {
        let out = query(&wh, &format!("CREATE MATERIALIZED VIEW v AS {query_text}"));
        assert_failure(&out, &[what, "CREATE TABLE v AS"]);
    }
    assert!(!wh.join("views/v").exists());
}

fn manifests(wh: &Path, view: &str) -> usize {
    std::fs::read_dir(wh.join("views").join(view))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("manifest-"))
                .count()
        })
        .unwrap_or(0)
}

/// A refresh killed with SIGKILL halfway keeps what it committed; the next one scores only the
/// rest, and the view then holds every input row exactly once.
#[test]
fn a_refresh_killed_halfway_is_finished_by_the_next_exactly_once() {
    let (_dir, wh, _input, input_text) = view_then_files(1, 99, 100);
    let before = manifests(&wh, "scores");
    let mut child = spawn_refresh(&wh, 2, Stdio::null);
    // Killed once a few commits are made.
    let started = Instant::now();
    while manifests(&wh, "scores") < before + 4 {
        assert!(started.elapsed() < common::DEADLINE, "no commit came");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the refresh ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let (new, _, _) = common::refresh_counts(&refresh(&wh, "scores"));
    assert!(
        new > 0 && new < 99,
        "the second refresh scored {new} of the 99 files"
    );
    let rows = assert_view_is_recompute(&wh, "scores", &input_text);
    assert_eq!(rows.len(), 10_000);
    assert_eq!(
        assert_ok(&query(&wh, "SELECT count(DISTINCT id) AS n FROM scores")),
        "n\n10000\n"
    );
}

/// Two refreshes of one view at once: each ends (in success, or an error saying to refresh
/// again), and no row is in the view twice.
#[test]
fn two_refreshes_at_once_never_duplicate_rows() {
    let (_dir, wh, _input, input_text) = view_then_files(1, 39, 100);
    let (a, b) = (
        spawn_refresh(&wh, 3, Stdio::piped),
        spawn_refresh(&wh, 3, Stdio::piped),
    );
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            assert_failure(&out, &["REFRESH again"]);
        }
    }
    refresh(&wh, "scores");
    assert_eq!(
        assert_view_is_recompute(&wh, "scores", &input_text).len(),
        4_000
    );
    assert_eq!(
        assert_ok(&query(&wh, "SELECT count(DISTINCT id) AS n FROM scores")),
        "n\n4000\n"
    );
}

/// A refresh of `scores` committing every `files` input files, started in the background.
fn spawn_refresh(wh: &Path, files: usize, output: fn() -> Stdio) -> std::process::Child {
    bin()
        .arg("--warehouse")
        .arg(wh)
        .args(["--models", "data/models", "query", "-e"])
        .arg(format!(
            "SET batchinfer.files_per_commit = {files}; REFRESH MATERIALIZED VIEW scores"
        ))
        .stdout(output())
        .stderr(output())
        .spawn()
        .unwrap()
}

/// Lines of a child's standard output, as they come.
fn lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    lines_of(child.stdout.take().unwrap())
}

fn scheduled(wh: &Path, args: &[&str]) -> std::process::Child {
    let mut command: Command = bin();
    command
        .arg("--warehouse")
        .arg(wh)
        .args(["--models", "data/models", "refresh", "scores"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().unwrap()
}

fn stop(child: std::process::Child) -> std::process::Output {
    common::send(child.id(), libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("stopped"),
        "{}",
        common::stderr(&out)
    );
    out
}

/// `refresh --every` and `refresh --watch`, driven for a few ticks and stopped with SIGTERM.
#[test]
fn scheduled_and_watching_refreshes_pick_up_new_files_and_stop_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    let input_text = format!("{}/", input.display());
    write_features(&input.join("a.parquet"), 0, 10, 0.0);
    create_view(&wh, &input_text);
    let wait = Duration::from_secs(30);

    let mut every = scheduled(&wh, &["--every", "1s"]);
    let out = lines(&mut every);
    let first = out.recv_timeout(wait).unwrap();
    assert_eq!(common::refresh_counts(&first), (0, 0, 0), "{first}");
    assert!(first.contains("next at"), "{first}");
    write_features(&input.join("b.parquet"), 10, 20, 0.0);
    loop {
        let line = out.recv_timeout(wait).unwrap();
        if common::refresh_counts(&line) == (1, 0, 0) {
            break;
        }
    }
    stop(every);

    let mut watch = scheduled(&wh, &["--watch", "--poll", "200ms"]);
    let out = lines(&mut watch);
    assert_eq!(
        common::refresh_counts(&out.recv_timeout(wait).unwrap()),
        (0, 0, 0)
    );
    write_features(&input.join("c.parquet"), 20, 30, 0.0);
    let line = out.recv_timeout(wait).unwrap();
    assert_eq!(common::refresh_counts(&line), (1, 0, 0), "{line}");
    std::fs::remove_file(input.join("a.parquet")).unwrap();
    let line = out.recv_timeout(wait).unwrap();
    assert_eq!(common::refresh_counts(&line), (0, 0, 1), "{line}");
    stop(watch);
    assert_eq!(
        assert_view_is_recompute(&wh, "scores", &input_text).len(),
        20
    );

    // A view that is not there is an error at once, not a loop.
    let out = common::output_within(
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .args(["refresh", "nothing", "--every", "1s"]),
        common::DEADLINE,
    );
    assert_failure(&out, &["no materialized view 'nothing'"]);
}

/// A view whose input files and warehouse are in S3 (the tests' server).
#[test]
fn a_view_over_s3_in_an_s3_warehouse() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    let local = dir.path().join("local");
    for i in 0..3 {
        write_features(
            &local.join(format!("f{i}.parquet")),
            i * 100,
            i * 100 + 100,
            0.0,
        );
        server.put_file(
            "bkt",
            &format!("in/f{i}.parquet"),
            &local.join(format!("f{i}.parquet")),
        );
    }
    let run = |sql: &str| {
        let mut command = bin();
        command
            .env("AWS_ACCESS_KEY_ID", s3_server::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", s3_server::SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .args([
                "--warehouse",
                "s3://bkt/wh/",
                "--models",
                "data/models",
                "query",
                "-e",
                sql,
            ]);
        common::output_within(&mut command, common::DEADLINE)
    };
    assert_ok(&run(&format!(
        "CREATE MATERIALIZED VIEW scores AS SELECT id, {PREDICT} AS p FROM 's3://bkt/in/'"
    )));
    write_features(&local.join("f3.parquet"), 300, 350, 0.0);
    server.put_file("bkt", "in/f3.parquet", &local.join("f3.parquet"));
    server.put_file("bkt", "in/f0.parquet", &local.join("f1.parquet"));
    let out = stdout(&run("REFRESH MATERIALIZED VIEW scores"));
    // f0 was committed with f1 and f2: the three are scored again, with f3.
    assert!(out.contains("scores,1,1,0,350,4,350"), "{out}");
    let got = id_values(&assert_ok(&run("SELECT id, p FROM scores")));
    let want = id_values(&assert_ok(&run(&format!(
        "SELECT id, {PREDICT} AS p FROM 's3://bkt/in/'"
    ))));
    assert_eq!(got.len(), 350);
    assert_eq!(got.len(), want.len());
    for ((id, p), (_, w)) in got.iter().zip(&want) {
        assert!((p - w).abs() <= 1e-5, "id {id}");
    }
    assert!(
        server
            .keys("bkt", "wh/views/scores/")
            .iter()
            .any(|k| k.contains("manifest-"))
    );
    assert_ok(&run("DROP MATERIALIZED VIEW scores"));
    let left = server.keys("bkt", "wh/views/scores/");
    assert!(left.len() == 1 && left[0].contains("manifest-"), "{left:?}");
    // Created again: it counts on from the drop.
    assert_ok(&run(&format!(
        "CREATE MATERIALIZED VIEW scores AS SELECT id, {PREDICT} AS p FROM 's3://bkt/in/'"
    )));
    assert_eq!(stdout(&run("SELECT count(*) AS n FROM scores")), "n\n350\n");
}

/// `refresh --every` over S3 while the server goes away and comes back: the failed refreshes
/// are reported and tried again, and the loop goes on to score what arrived meanwhile.
#[test]
fn a_scheduled_refresh_survives_the_storage_going_away() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = s3_server::S3Server::start(&dir.path().join("s3"));
    let local = dir.path().join("local");
    write_features(&local.join("a.parquet"), 0, 10, 0.0);
    write_features(&local.join("b.parquet"), 10, 30, 0.0);
    server.put_file("bkt", "in/a.parquet", &local.join("a.parquet"));
    let command = |args: &[&str]| {
        let mut command = bin();
        command
            .env("AWS_ACCESS_KEY_ID", s3_server::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", s3_server::SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .args(["--warehouse", "s3://bkt/wh/", "--models", "data/models"])
            .args(args);
        command
    };
    assert_ok(&common::output_within(
        &mut command(&[
            "query",
            "-e",
            &format!(
                "CREATE MATERIALIZED VIEW scores AS SELECT id, {PREDICT} AS p FROM 's3://bkt/in/'"
            ),
        ]),
        common::DEADLINE,
    ));
    let mut child = command(&["refresh", "scores", "--every", "1s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(&mut child);
    let err = lines_of(child.stderr.take().unwrap());
    let wait = Duration::from_secs(60);
    assert_eq!(
        common::refresh_counts(&out.recv_timeout(wait).unwrap()),
        (0, 0, 0)
    );
    server.stop();
    // (A tick skipped while the machine is busy is said on stderr too.)
    let failed = loop {
        let line = err.recv_timeout(wait).unwrap();
        if line.contains("failed") {
            break line;
        }
    };
    assert!(
        failed.contains("refresh of 'scores' failed (1 in a row)"),
        "{failed}"
    );
    assert!(failed.contains("trying again in"), "{failed}");
    server.restart();
    server.put_file("bkt", "in/b.parquet", &local.join("b.parquet"));
    loop {
        let line = out.recv_timeout(wait).unwrap();
        if common::refresh_counts(&line).0 == 1 {
            assert!(line.contains("the view has 30 row(s)"), "{line}");
            break;
        }
    }
    common::send(child.id(), libc::SIGTERM);
    let status = child.wait().unwrap();
    let rest: Vec<String> = err.iter().collect();
    assert!(status.success(), "{status}: {rest:?}");
    assert!(rest.iter().any(|l| l.starts_with("stopped")), "{rest:?}");
}

/// Views through damage around them: a view's folder emptied, a damaged manifest, a view's data
/// file deleted, a rewrite that keeps size and modification time, a table named like a view.
#[test]
fn views_hold_through_emptied_inputs_damaged_manifests_and_deleted_data() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    let input_text = format!("{}/", input.display());
    write_features(&input.join("a.parquet"), 0, 100, 0.0);
    write_features(&input.join("b.parquet"), 100, 200, 0.0);
    assert_ok(&query(
        &wh,
        &format!(
            "SET batchinfer.files_per_commit = 1; CREATE MATERIALIZED VIEW scores AS \
             SELECT id, {PREDICT} AS p FROM '{input_text}'"
        ),
    ));
    assert_ok(&query(
        &wh,
        &format!("CREATE MATERIALIZED VIEW other AS SELECT id FROM '{input_text}'"),
    ));

    // Rewritten in place with other values, same size, its modification time put back.
    let a = input.join("a.parquet");
    let modified = std::fs::metadata(&a).unwrap().modified().unwrap();
    write_features(&a, 0, 100, 1.5);
    std::fs::File::options()
        .write(true)
        .open(&a)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    assert_eq!(common::refresh_counts(&refresh(&wh, "scores")), (0, 1, 0));
    assert_view_is_recompute(&wh, "scores", &input_text);

    // A data file of the view deleted: the next refresh scores its unit again.
    let files = parquet_files(&wh.join("views/scores/data"));
    std::fs::remove_file(&files[0]).unwrap();
    let line = refresh(&wh, "scores");
    assert!(line.contains("200 row(s) from 2 file(s)"), "{line}");
    assert_view_is_recompute(&wh, "scores", &input_text);

    // A name taken by a view is not a table's, replaced or not.
    assert_failure(
        &query(&wh, "CREATE OR REPLACE TABLE scores AS SELECT 1 AS one"),
        &["'scores' is a materialized view"],
    );
    assert!(!wh.join("tables/scores").exists());
    // IF NOT EXISTS over a name another kind of object holds creates nothing, and says so.
    let out = query(&wh, "CREATE TABLE IF NOT EXISTS scores AS SELECT 1 AS one");
    assert_ok(&out);
    assert!(
        common::stderr(&out).contains("CREATE TABLE IF NOT EXISTS scores created nothing"),
        "{}",
        common::stderr(&out)
    );
    assert!(!wh.join("tables/scores").exists());
    assert_ok(&query(&wh, "CREATE TABLE taken AS SELECT 1 AS one"));
    let out = query(
        &wh,
        &format!("CREATE MATERIALIZED VIEW IF NOT EXISTS taken AS SELECT id FROM '{input_text}'"),
    );
    assert_ok(&out);
    assert!(
        common::stderr(&out).contains("MATERIALIZED VIEW IF NOT EXISTS taken created nothing"),
        "{}",
        common::stderr(&out)
    );
    assert!(!wh.join("views/taken").exists());
    assert_eq!(assert_ok(&query(&wh, "SELECT one FROM taken")), "one\n1\n");

    // Every input file removed: the view is empty.
    std::fs::remove_file(input.join("a.parquet")).unwrap();
    std::fs::remove_file(input.join("b.parquet")).unwrap();
    assert_eq!(common::refresh_counts(&refresh(&wh, "scores")), (0, 0, 2));
    assert_eq!(
        assert_ok(&query(&wh, "SELECT count(*) AS n FROM scores")),
        "n\n0\n"
    );

    // One view's newest manifest damaged: a statement that does not name that view does not
    // read it, and works; one that names it is told it cannot be read; DROP removes it.
    let folder = wh.join("views/other");
    let newest = common::newest_manifest_file(&folder);
    std::fs::write(&newest, "{\"format\":1").unwrap();
    let out = query(&wh, "SELECT count(*) AS n FROM scores");
    assert_eq!(assert_ok(&out), "n\n0\n");
    assert!(
        !common::stderr(&out).contains("other"),
        "{}",
        common::stderr(&out)
    );
    let out = query(&wh, "SELECT * FROM other");
    assert_eq!(out.status.code(), Some(1));
    let said = common::stderr(&out);
    assert!(said.contains("'other' cannot be read"), "{said}");
    assert!(
        said.contains("Error: materialized view 'other' has no complete"),
        "{said}"
    );
    // CREATE OR REPLACE over it makes it whole again; DROP removes it.
    write_features(&input.join("c.parquet"), 0, 10, 0.0);
    assert_ok(&query(
        &wh,
        &format!("CREATE OR REPLACE MATERIALIZED VIEW other AS SELECT id FROM '{input_text}'"),
    ));
    assert_ok(&query(&wh, "SELECT count(*) FROM other"));
    assert_ok(&query(&wh, "DROP MATERIALIZED VIEW other"));
    assert!(!folder.join("data").exists());
}

/// The input folder moved away (or a mount gone) is not an emptied folder: the refresh fails
/// and the view keeps its rows. A view file rewritten by hand with other rows is scored again.
#[test]
fn a_missing_input_folder_fails_the_refresh_and_a_tampered_view_file_is_repaired() {
    let (dir, wh, input, input_text) = view_then_files(1, 0, 100);
    let moved = dir.path().join("moved");
    std::fs::rename(&input, &moved).unwrap();
    let out = query(&wh, "REFRESH MATERIALIZED VIEW scores");
    assert_failure(&out, &["is not there", "left as it was"]);
    assert_eq!(
        assert_ok(&query(&wh, "SELECT count(*) AS n FROM scores")),
        "n\n100\n"
    );
    std::fs::rename(&moved, &input).unwrap();

    let file = &parquet_files(&wh.join("views/scores/data"))[0];
    write_features(file, 0, 10, 0.0);
    let line = refresh(&wh, "scores");
    assert!(line.contains("100 row(s) scored"), "{line}");
    assert_view_is_recompute(&wh, "scores", &input_text);
}

/// `refresh --watch` with `--models`: a model file replaced in that folder is seen by the next
/// poll, which rebuilds the view with it.
#[test]
fn a_watching_refresh_rebuilds_when_a_models_folder_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy("data/models/linear.onnx", models.join("linear.onnx")).unwrap();
    let input_text = format!("{}/", input.display());
    write_features(&input.join("a.parquet"), 0, 100, 0.0);
    let run = |sql: &str| {
        let out = common::output_within(
            bin()
                .arg("--warehouse")
                .arg(&wh)
                .arg("--models")
                .arg(&models)
                .args(["query", "-e", sql]),
            common::DEADLINE,
        );
        assert_ok(&out)
    };
    run(&format!(
        "CREATE MATERIALIZED VIEW scores AS SELECT id, {PREDICT} AS p FROM '{input_text}'"
    ));
    let old = id_values(&run("SELECT id, p FROM scores"));
    let mut watch = bin()
        .arg("--warehouse")
        .arg(&wh)
        .arg("--models")
        .arg(&models)
        .args(["refresh", "scores", "--watch", "--poll", "200ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(&mut watch);
    let wait = Duration::from_secs(30);
    assert_eq!(
        common::refresh_counts(&out.recv_timeout(wait).unwrap()),
        (0, 0, 0)
    );
    let staged = dir.path().join("new.onnx");
    std::fs::copy("data/fixtures/linear_doubled.onnx", &staged).unwrap();
    std::fs::rename(&staged, models.join("linear.onnx")).unwrap();
    let line = out.recv_timeout(wait).unwrap();
    assert!(line.contains("rebuilt"), "{line}");
    stop(watch);
    let new = id_values(&run("SELECT id, p FROM scores"));
    assert_eq!(new.len(), old.len());
    for ((id, p), (_, was)) in new.iter().zip(&old) {
        assert!(
            (p - 2.0 * was).abs() <= 1e-4 * was.abs().max(1.0),
            "id {id}"
        );
    }
}

/// CREATE OR REPLACE MATERIALIZED VIEW while a refresh commits file after file: the new
/// definition is what the view has after both (never the old one written back, never no rows).
#[test]
fn a_view_redefined_while_a_refresh_commits_keeps_the_new_definition() {
    let (dir, wh, _input, input_text) = view_then_files(40, 0, 50);
    // Replaced by the doubled model: the next refresh rebuilds, committing a file at a time.
    let model = dir.path().join("m.onnx");
    std::fs::copy("data/fixtures/linear_doubled.onnx", &model).unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy(&model, models.join("linear.onnx")).unwrap();
    let with = |sql: &str| {
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .arg("--models")
            .arg(&models)
            .args(["query", "-e", sql])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let before = manifests(&wh, "scores");
    let refresh = with("SET batchinfer.files_per_commit = 1; REFRESH MATERIALIZED VIEW scores");
    let started = Instant::now();
    while manifests(&wh, "scores") == before && started.elapsed() < common::DEADLINE {
        std::thread::sleep(Duration::from_millis(2));
    }
    let redefine = with(&format!(
        "CREATE OR REPLACE MATERIALIZED VIEW scores AS SELECT id, {PREDICT} * 10 AS p \
         FROM '{input_text}'"
    ));
    assert_ok(&redefine.wait_with_output().unwrap());
    let refreshed = refresh.wait_with_output().unwrap();
    if !refreshed.status.success() {
        assert_failure(&refreshed, &["redefined", "REFRESH again"]);
    }
    let out = common::output_within(
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .arg("--models")
            .arg(&models)
            .args([
                "query",
                "-e",
                &format!(
                    "REFRESH MATERIALIZED VIEW scores; SELECT count(*) AS n FROM scores; \
                 SELECT (SELECT sum(p) FROM scores) - (SELECT sum({PREDICT} * 10) \
                 FROM '{input_text}') AS d"
                ),
            ]),
        common::DEADLINE,
    );
    let text = assert_ok(&out);
    assert!(text.contains("n\n2000\n"), "{text}");
    let d: f64 = text.lines().last().unwrap().parse().unwrap();
    assert!(d.abs() < 1e-3, "{text}");
    let shown = assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS"));
    assert!(shown.contains("* 10 AS p"), "{shown}");
}

/// View names are names, never paths: every statement and `batchinfer refresh` refuse names
/// that would reach outside `views/NAME/`, and nothing anywhere around changes.
#[test]
fn hostile_view_names_are_refused_and_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let victim = dir.path().join("victim");
    write_features(&victim.join("keep.parquet"), 0, 10, 0.0);
    write_features(&wh.join("views/keep.parquet"), 0, 10, 0.0);
    let before = common::snapshot(dir.path());
    let long = "v".repeat(201);
    for name in [
        "\"../victim\"",
        "\"..\"",
        "\"a/b\"",
        "\".hidden\"",
        "\"%2e%2e\"",
        &long,
    ] {
        for sql in [
            format!(
                "CREATE MATERIALIZED VIEW {name} AS SELECT id FROM 'data/sample/features.parquet'"
            ),
            format!(
                "CREATE OR REPLACE MATERIALIZED VIEW {name} AS SELECT id FROM 'data/sample/features.parquet'"
            ),
            format!("REFRESH MATERIALIZED VIEW {name}"),
            format!("DROP MATERIALIZED VIEW IF EXISTS {name}"),
        ] {
            assert_failure(&query(&wh, &sql), &["view name"]);
        }
        let out = common::output_within(
            bin().arg("--warehouse").arg(&wh).args([
                "refresh",
                name.trim_matches('"'),
                "--every",
                "1s",
            ]),
            common::DEADLINE,
        );
        assert_failure(&out, &["view name"]);
    }
    let changed = common::changes(&before, &common::snapshot(dir.path()));
    assert!(changed.is_empty(), "changed: {changed:?}");
}

/// The newest manifest version of `view`: its path and its JSON.
fn newest_manifest(wh: &Path, view: &str) -> (PathBuf, serde_json::Value) {
    let newest = common::newest_manifest_file(&wh.join("views").join(view));
    let json = serde_json::from_slice(&std::fs::read(&newest).unwrap()).unwrap();
    (newest, json)
}

/// Writes `json` as the next manifest version of `view`, as a hand (or a hostile writer) would.
fn write_next_manifest(wh: &Path, view: &str, json: &serde_json::Value) {
    let (newest, _) = newest_manifest(wh, view);
    let name = newest.file_name().unwrap().to_string_lossy().into_owned();
    let version: u64 = name["manifest-".len()..name.len() - ".json".len()]
        .parse()
        .unwrap();
    std::fs::write(
        newest.with_file_name(format!("manifest-{:020}.json", version + 1)),
        serde_json::to_vec(json).unwrap(),
    )
    .unwrap();
}

/// A view answers with all of its rows or not at all: with one of its data files deleted, or
/// cut short, a query of it fails naming the view, the file and the repair; REFRESH repairs it.
#[test]
fn a_view_missing_a_data_file_fails_until_refreshed() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    let input_text = format!("{}/", input.display());
    for i in 0..3 {
        write_features(
            &input.join(format!("f{i}.parquet")),
            i * 1000,
            i * 1000 + 1000,
            0.0,
        );
    }
    assert_ok(&query(
        &wh,
        &format!(
            "SET batchinfer.files_per_commit = 1; CREATE MATERIALIZED VIEW scores AS \
             SELECT id, {PREDICT} AS p FROM '{input_text}'"
        ),
    ));
    let files = parquet_files(&wh.join("views/scores/data"));
    assert!(files.len() >= 3, "{files:?}");
    std::fs::remove_file(&files[0]).unwrap();
    for sql in [
        "SELECT count(*) FROM scores",
        "SELECT id, p FROM scores WHERE id < 10",
        "SELECT count(*) FROM datafusion.public.scores",
        "COPY (SELECT * FROM scores) TO 'OUT' STORED AS PARQUET",
    ] {
        let target = dir.path().join("out.parquet");
        let out = query(&wh, &sql.replace("OUT", &target.display().to_string()));
        assert!(!target.exists());
        assert_failure(
            &out,
            &[
                "materialized view 'scores'",
                "is missing",
                "REFRESH MATERIALIZED VIEW scores",
            ],
        );
    }
    // Cut short: its size is not the one recorded.
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() - 100]).unwrap();
    assert_failure(
        &query(&wh, "SELECT count(*) FROM scores"),
        &["materialized view 'scores'", "2 of its files"],
    );
    refresh(&wh, "scores");
    assert_view_is_recompute(&wh, "scores", &input_text);
}

/// A manifest written by hand naming a file outside the view's own data folder (absolute, `..`,
/// a `file://` or `http://` URL, another generation's folder) is refused naming the view; the
/// other file's rows are never served as the view's.
#[test]
fn a_forged_manifest_never_makes_a_view_read_another_file() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    write_features(&input.join("a.parquet"), 0, 100, 0.0);
    let private = dir.path().join("private/x.parquet");
    write_features(&private, 777_000, 777_010, 0.0);
    let size = std::fs::metadata(&private).unwrap().len();
    create_view(&wh, &format!("{}/", input.display()));
    let (_, original) = newest_manifest(&wh, "scores");
    let generation = original["current"]["id"].as_str().unwrap().to_string();
    for forged in [
        private.display().to_string(),
        "../../../private/x.parquet".to_string(),
        format!("data/{generation}/../../../../private/x.parquet"),
        format!("data/{generation}/%2e%2e/%2e%2e/%2e%2e/%2e%2e/private/x.parquet"),
        format!("file://{}", private.display()),
        "http://127.0.0.1:9/x.parquet".to_string(),
        "data/other-generation/u/x.parquet".to_string(),
    ] {
        let mut json = original.clone();
        json["current"]["units"][0]["files"][0] = serde_json::json!({"path": forged, "size": size});
        write_next_manifest(&wh, "scores", &json);
        // (A warning first: every statement of the process says the view is left out.)
        let out = query(&wh, "SELECT id FROM scores ORDER BY id DESC LIMIT 1");
        let stderr = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{forged}: {stderr}");
        assert!(
            stderr.contains("Error: materialized view 'scores'") && stderr.contains("not one of"),
            "{forged}: {stderr}"
        );
        assert!(!stdout(&out).contains("777"), "{forged}: {}", stdout(&out));
        assert!(!stderr.contains("777"), "{forged}: {stderr}");
        let out = query(&wh, "REFRESH MATERIALIZED VIEW scores");
        let stderr = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{forged}: {stderr}");
        assert!(
            stderr.contains("Error: materialized view 'scores'") && stderr.contains("not one of"),
            "{forged}: {stderr}"
        );
    }
    // The manifest put back: the view answers again.
    write_next_manifest(&wh, "scores", &original);
    assert_eq!(
        assert_ok(&query(&wh, "SELECT count(*) AS n FROM scores")),
        "n\n100\n"
    );
}

/// A credential in a view's URL is refused before anything is kept: no manifest, no data file,
/// no message holds it. A view kept with one (written before this was refused) shows none and
/// is not refreshed with it.
#[test]
fn credentials_in_a_view_url_are_refused_and_never_kept() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    for url in [
        "s3://AKIDUSER:SeCrEtPaSs@bkt/in/",
        "http://user:SeCrEtPaSs@127.0.0.1:9/in/",
        "https://127.0.0.1:9/in/f.parquet?sig=SeCrEtPaSs",
    ] {
        let out = query(
            &wh,
            &format!("CREATE MATERIALIZED VIEW pv AS SELECT id, {PREDICT} AS p FROM '{url}'"),
        );
        let stderr = assert_failure(&out, &["materialized view 'pv'", "password or a token"]);
        assert!(!stderr.contains("SeCrEtPaSs"), "{stderr}");
        assert!(!wh.join("views/pv").exists(), "{url}: the view was kept");
    }
    // A view whose manifest holds a password (as one kept before could).
    let input = dir.path().join("in");
    write_features(&input.join("a.parquet"), 0, 10, 0.0);
    create_view(&wh, &format!("{}/", input.display()));
    let (_, mut json) = newest_manifest(&wh, "scores");
    let with_password = "http://user:SeCrEtPaSs@127.0.0.1:9/in/";
    for key in ["query", "source"] {
        let text = json[key].as_str().unwrap().to_string();
        json[key] = serde_json::Value::String(format!("{text} UNION ALL '{with_password}'"));
    }
    write_next_manifest(&wh, "scores", &json);
    let out = query(&wh, "SHOW MATERIALIZED VIEWS");
    let shown = assert_ok(&out);
    assert!(shown.contains("user:REDACTED@"), "{shown}");
    assert!(!shown.contains("SeCrEtPaSs"), "{shown}");
    let out = query(&wh, "REFRESH MATERIALIZED VIEW scores");
    let stderr = assert_failure(&out, &["materialized view 'scores'", "password or a token"]);
    assert!(!stderr.contains("SeCrEtPaSs"), "{stderr}");
}

/// One file that cannot be read (not Parquet) among good ones: the refresh scores the good
/// ones, leaves that one out with its error (SHOW MATERIALIZED VIEWS lists it, the summary says
/// so), does not try it again until it changes, and scores it once it is a good file.
#[test]
fn an_unreadable_input_file_is_left_out_and_the_rest_are_scored() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    write_features(&input.join("a.parquet"), 0, 100, 0.0);
    create_view(&wh, &format!("{}/", input.display()));
    let junk = input.join("b-junk.parquet");
    std::fs::write(&junk, b"PAR1garbagePAR1").unwrap();
    write_features(&input.join("c.parquet"), 100, 200, 0.0);
    write_features(&input.join("d.parquet"), 200, 300, 0.0);
    let out = refresh_output(&wh, "scores");
    let line = assert_ok(&out);
    assert!(
        line.contains("1 input file(s) left out for errors"),
        "{line}"
    );
    assert!(
        line.contains("the view has 300 row(s) from 3 file(s)"),
        "{line}"
    );
    let warned = common::stderr(&out);
    assert!(
        warned.contains("b-junk.parquet is left out until it changes"),
        "{warned}"
    );
    let ids: Vec<i64> = id_values(&assert_ok(&query(&wh, "SELECT id, p FROM scores")))
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(ids, (0..300).collect::<Vec<i64>>());
    let shown = assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS"));
    assert!(shown.contains("b-junk.parquet: "), "{shown}");
    assert!(shown.contains("not a Parquet file"), "{shown}");
    // Not tried again while it is as it was.
    let out = refresh_output(&wh, "scores");
    assert_eq!(common::refresh_counts(&assert_ok(&out)), (0, 0, 0));
    assert!(
        !common::stderr(&out).contains("left out"),
        "{}",
        common::stderr(&out)
    );
    // Replaced by a good file: scored, and no longer listed.
    write_features(&junk, 300, 350, 0.0);
    assert_eq!(common::refresh_counts(&refresh(&wh, "scores")), (0, 1, 0));
    assert_view_is_recompute(&wh, "scores", &format!("{}/", input.display()));
    let shown = assert_ok(&query(&wh, "SHOW MATERIALIZED VIEWS"));
    assert!(!shown.contains("b-junk"), "{shown}");
}

/// A refresh that keeps failing (its input folder gone) is tried again after 1, 2, 4 seconds,
/// whatever the poll period.
#[test]
fn a_failing_watch_backs_off_1_2_4_seconds() {
    let (dir, wh, input, _) = view_then_files(1, 0, 10);
    std::fs::rename(&input, dir.path().join("gone")).unwrap();
    let mut child = scheduled(&wh, &["--watch", "--poll", "200ms"]);
    let err = lines_of(child.stderr.take().unwrap());
    let mut waits = Vec::new();
    while waits.len() < 3 {
        let line = err.recv_timeout(Duration::from_secs(60)).unwrap();
        if let Some((_, wait)) = line.split_once("trying again in ") {
            waits.push(wait.to_string());
        }
    }
    assert_eq!(waits, ["1s", "2s", "4s"]);
    common::send(child.id(), libc::SIGTERM);
    assert!(child.wait().unwrap().success());
}

/// A new file whose columns are not the view's (a feature as text, a column missing, one named
/// in another case) is that file's error, left out as an unreadable one is: never cast silently
/// (`'1e39'` as infinity) or scored with NULL for what it lacks.
#[test]
fn a_file_with_other_columns_is_left_out_not_cast() {
    let (_dir, wh, input, _) = view_then_files(1, 0, 10);
    let features = (0..10)
        .map(|f| format!("CAST(value AS REAL) AS f{f}"))
        .collect::<Vec<_>>();
    let as_text = features
        .iter()
        .enumerate()
        .map(|(f, c)| {
            if f == 0 {
                "'1e39' AS f0".to_string()
            } else {
                c.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ");
    let missing = features[..9].join(", ");
    let renamed = features.join(", ").replace("AS f0", "AS \"F0\"");
    for (name, columns) in [
        ("text", as_text),
        ("missing", missing),
        ("renamed", renamed),
    ] {
        assert_ok(&query(
            &wh,
            &format!(
                "COPY (SELECT value + 1000 AS id, {columns} FROM range(5)) TO '{}' STORED AS PARQUET",
                input.join(format!("{name}.parquet")).display()
            ),
        ));
    }
    let out = refresh_output(&wh, "scores");
    let line = assert_ok(&out);
    assert!(
        line.contains("3 input file(s) left out for errors"),
        "{line}"
    );
    let warned = common::stderr(&out);
    assert!(
        warned.contains("text.parquet") && warned.contains("'f0' is Utf8"),
        "{warned}"
    );
    assert!(
        warned.contains("missing.parquet") && warned.contains("no column 'f9'"),
        "{warned}"
    );
    assert!(
        warned.contains("renamed.parquet") && warned.contains("no column 'f0'"),
        "{warned}"
    );
    assert_eq!(
        assert_ok(&query(
            &wh,
            "SELECT count(*) AS n, count(p) AS scored FROM scores"
        )),
        "n,scored\n10,10\n"
    );
    // Only the columns the query reads count: a view over files of which some have a column
    // more takes a new file without it.
    let wide = input.parent().unwrap().join("wide");
    let all = features.join(", ");
    for (name, extra) in [("a", ""), ("b", ", 'x' AS note"), ("c", "")] {
        if name == "c" {
            assert_ok(&query(
                &wh,
                &format!(
                    "CREATE MATERIALIZED VIEW wide AS SELECT id, {PREDICT} AS p FROM '{}/'",
                    wide.display()
                ),
            ));
        }
        assert_ok(&query(
            &wh,
            &format!(
                "COPY (SELECT value AS id, {all}{extra} FROM range(5)) TO '{}' STORED AS PARQUET",
                wide.join(format!("{name}.parquet")).display()
            ),
        ));
    }
    let line = refresh(&wh, "wide");
    assert!(!line.contains("left out"), "{line}");
    assert!(
        line.contains("the view has 15 row(s) from 3 file(s)"),
        "{line}"
    );
}

/// A manifest version written by hand that drops a unit without retiring it leaves that unit's
/// files unlisted: the next refresh removes them an hour after they were written, as retired
/// files are, not a day later.
#[test]
fn files_a_forged_manifest_dropped_are_removed_after_an_hour() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, input) = (dir.path().join("wh"), dir.path().join("in"));
    write_features(&input.join("a.parquet"), 0, 10, 0.0);
    write_features(&input.join("b.parquet"), 10, 20, 0.0);
    assert_ok(&query(
        &wh,
        &format!(
            "SET batchinfer.files_per_commit = 1; CREATE MATERIALIZED VIEW scores AS \
             SELECT id, {PREDICT} AS p FROM '{}/'",
            input.display()
        ),
    ));
    let (_, mut json) = newest_manifest(&wh, "scores");
    let units = json["current"]["units"].as_array_mut().unwrap();
    let dropped = units.remove(0);
    write_next_manifest(&wh, "scores", &json);
    let views = wh.join("views/scores");
    let files: Vec<PathBuf> = dropped["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| views.join(f["path"].as_str().unwrap()))
        .collect();
    assert!(!files.is_empty() && files.iter().all(|f| f.exists()));
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7_200);
    for file in &files {
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
    }
    write_features(&input.join("c.parquet"), 20, 30, 0.0);
    refresh(&wh, "scores");
    for file in &files {
        assert!(!file.exists(), "{} is still there", file.display());
    }
    assert_view_is_recompute(&wh, "scores", &format!("{}/", input.display()));
}
