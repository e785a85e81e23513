//! The command-line contract, tested on the real binary: `query -e/-f`, `--models`, `--format`,
//! engine options before or after the subcommand, exit status and readable errors.

mod common;

use std::path::Path;
use std::process::Output;

use common::{DEADLINE, assert_ok, output_within, stderr, stdout};

/// The binary, with a warehouse outside the repository unless a test names its own.
fn batchinfer(args: &[&str]) -> Output {
    output_within(
        common::binary()
            .args(args)
            .env("BATCHINFER_WAREHOUSE", scratch_warehouse()),
        DEADLINE,
    )
}

fn scratch_warehouse() -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "batchinfer-cli-test-warehouse-{}",
        std::process::id()
    ))
}

/// A failure: exit status 1 and one readable message mentioning `expected` (no panic, no
/// backtrace).
fn assert_clean_failure(out: &Output, expected: &str) {
    common::assert_failure(out, &[expected]);
}

const LINEAR: &str = "predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)";

#[test]
fn sample_job_writes_parquet_that_rereads_to_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("scores.parquet");
    let job = format!(
        "COPY (SELECT id, {LINEAR} AS score FROM 'data/sample/features.parquet') TO '{}' STORED AS PARQUET",
        out_file.display()
    );
    let out = batchinfer(&["query", "--models", "data/models", "-e", &job]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("10000"),
        "COPY reports the rows written:\n{}",
        stdout(&out)
    );
    assert!(out_file.is_file());

    // Re-read the written file and compare with Python onnxruntime's reference.
    let check = format!(
        "SELECT count(*) AS n, sum(CASE WHEN abs(s.score - r.score) <= 1e-6 * greatest(abs(r.score), 1) THEN 1 ELSE 0 END) AS same \
         FROM '{}' s JOIN 'data/reference/linear.parquet' r ON s.id = r.id",
        out_file.display()
    );
    let out = batchinfer(&["query", "--format", "csv", "-e", &check]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "n,same\n10000,10000\n");
}

#[test]
fn file_with_several_statements_runs_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.sql");
    std::fs::write(
        &job,
        format!(
            "-- a job file\n\
             CREATE EXTERNAL TABLE customers STORED AS PARQUET LOCATION 'data/sample/customers.parquet';\n\
             CREATE TABLE scored AS SELECT id, predict('churn', city, age, spend)['label'] AS label FROM customers;\n\
             COPY scored TO '{}/scored.parquet' STORED AS PARQUET;\n\
             SELECT count(*) AS n FROM '{}/scored.parquet';\n",
            dir.path().display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let warehouse = dir.path().join("warehouse");
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "--warehouse",
        warehouse.to_str().unwrap(),
        "--format",
        "csv",
        "-f",
        job.to_str().unwrap(),
    ]);
    assert_ok(&out);
    assert!(
        warehouse.join("tables/scored").is_dir(),
        "CREATE TABLE AS writes into the warehouse"
    );
    // COPY prints its count, then the SELECT prints its row.
    assert_eq!(stdout(&out), "count\n2000\nn\n2000\n");
}

#[test]
fn engine_options_go_before_or_after_the_subcommand() {
    let sql = format!("SELECT {LINEAR} AS s FROM 'data/sample/features.parquet' WHERE id = 0");
    let before = batchinfer(&[
        "--models",
        "data/models",
        "--format",
        "csv",
        "query",
        "-e",
        &sql,
    ]);
    let after = batchinfer(&[
        "query",
        "-e",
        &sql,
        "--format",
        "csv",
        "--models",
        "data/models",
    ]);
    assert_ok(&before);
    assert_ok(&after);
    assert_eq!(stdout(&before), stdout(&after));
    assert!(stdout(&before).starts_with("s\n"));
}

#[test]
fn formats_print_the_same_rows() {
    let sql = "SELECT id, predict('iris', sepal_length, sepal_width, petal_length, petal_width)['label'] AS label \
               FROM 'data/sample/iris.parquet' WHERE id IN (0, 149) ORDER BY id";
    let run = |format: &str| {
        let out = batchinfer(&[
            "query",
            "--models",
            "data/models",
            "--format",
            format,
            "-e",
            sql,
        ]);
        assert_ok(&out);
        stdout(&out)
    };
    assert_eq!(run("csv"), "id,label\n0,0\n149,2\n");
    assert_eq!(
        run("json"),
        "[{\"id\":0,\"label\":0},{\"id\":149,\"label\":2}]\n"
    );
    assert_eq!(
        run("ndjson"),
        "{\"id\":0,\"label\":0}\n{\"id\":149,\"label\":2}\n"
    );
    // NULL is written as `null`, never a key left out.
    let nulls = |format: &str| {
        let out = batchinfer(&[
            "query",
            "--format",
            format,
            "-e",
            "SELECT 1 AS a, CAST(NULL AS INT) AS b",
        ]);
        assert_ok(&out);
        stdout(&out)
    };
    assert_eq!(nulls("json"), "[{\"a\":1,\"b\":null}]\n");
    assert_eq!(nulls("ndjson"), "{\"a\":1,\"b\":null}\n");
    let table = run("table");
    assert!(table.contains("| id  | label |"), "{table}");
    assert!(table.contains("| 149 | 2     |"), "{table}");
}

#[test]
fn list_and_struct_results_print_as_csv() {
    let sql = "SELECT predict('iris', sepal_length, sepal_width, petal_length, petal_width) AS p \
               FROM 'data/sample/iris.parquet' WHERE id = 0";
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "--format",
        "csv",
        "-e",
        sql,
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.starts_with("p\n\"{label: 0, probabilities: ["),
        "{text}"
    );
}

#[test]
fn directories_are_queried_by_path() {
    let dir = tempfile::tempdir().unwrap();
    for part in 0..3 {
        let sql = format!(
            "COPY (SELECT * FROM 'data/sample/features.parquet' WHERE id % 3 = {part}) TO '{}/part{part}.parquet' STORED AS PARQUET",
            dir.path().display()
        );
        assert_ok(&batchinfer(&["query", "-e", &sql]));
    }
    let sql = format!(
        "SELECT count(*) AS n, count({LINEAR}) AS scored FROM '{}/'",
        dir.path().display()
    );
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "--format",
        "csv",
        "-e",
        &sql,
    ]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "n,scored\n10000,10000\n");
}

/// Runs batchinfer (no subcommand) with `input` piped to its standard input.
fn piped(args: &[&str], input: &[u8]) -> std::process::Output {
    common::output_with_input(
        common::binary()
            .args(args)
            .env("BATCHINFER_WAREHOUSE", scratch_warehouse()),
        input,
        "batchinfer reading standard input",
    )
}

#[test]
fn statements_from_standard_input_without_a_subcommand() {
    let out = piped(
        &["--models", "data/models", "--format", "csv"],
        // A ';' ending a line inside a string literal does not end the statement.
        b"SELECT count(*) AS n\nFROM 'data/sample/iris.parquet';\nSELECT 1 + 1 AS two;\nSELECT 'a;\nb' AS s;\n",
    );
    assert_ok(&out);
    assert_eq!(stdout(&out), "n\n150\ntwo\n2\ns\n\"a;\nb\"\n");
}

#[test]
fn a_semicolon_alone_on_a_line_of_a_literal_does_not_end_piped_statements() {
    let out = piped(
        &["--format", "csv"],
        b"SELECT 'x\n;\ny' AS t;\nSELECT 2 AS two;\n",
    );
    assert_ok(&out);
    assert_eq!(stdout(&out), "t\n\"x\n;\ny\"\ntwo\n2\n");
}

#[test]
fn unknown_model_fails_cleanly_and_lists_the_models() {
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "-e",
        "SELECT predict('nope', 1.0)",
    ]);
    assert_clean_failure(
        &out,
        "unknown model 'nope'; the models are: attention, breast_cancer, churn, churn_mlp, dense, half, iris",
    );
}

#[test]
fn wrong_columns_fail_cleanly_naming_the_inputs() {
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "-e",
        "SELECT predict('churn', age, spend) FROM 'data/sample/customers.parquet'",
    ]);
    assert_clean_failure(
        &out,
        "model 'churn': the model takes 3 inputs, 2 columns were given",
    );
    assert!(
        stderr(&out).contains("city: string [N, 1]"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_input_file_fails_cleanly() {
    let out = batchinfer(&[
        "query",
        "-e",
        "SELECT * FROM 'data/sample/no_such_file.parquet'",
    ]);
    assert_clean_failure(&out, "no_such_file.parquet");
}

#[test]
fn missing_models_folder_fails_cleanly() {
    let out = batchinfer(&["query", "--models", "no/such/folder", "-e", "SELECT 1"]);
    assert_clean_failure(&out, "reading the models folder no/such/folder");
}

#[test]
fn corrupt_model_file_fails_cleanly_naming_the_model() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("broken.onnx"), b"this is not an ONNX model").unwrap();
    let out = batchinfer(&[
        "query",
        "--models",
        dir.path().to_str().unwrap(),
        "-e",
        "SELECT predict('broken', 1.0)",
    ]);
    assert_clean_failure(&out, "model 'broken' could not be loaded from");
}

#[test]
fn models_in_subfolders_are_found_by_folder_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("scorer")).unwrap();
    std::fs::copy(
        "data/models/linear.onnx",
        dir.path().join("scorer/model.onnx"),
    )
    .unwrap();
    let sql = "SELECT count(predict('scorer', features)) AS n FROM 'data/sample/vectors.parquet'";
    let out = batchinfer(&[
        "query",
        "--models",
        dir.path().to_str().unwrap(),
        "--format",
        "csv",
        "-e",
        sql,
    ]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "n\n10000\n");
}

#[test]
fn failed_statement_stops_the_script_with_a_nonzero_status() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("never.parquet");
    let sql = format!(
        "SELECT predict('nope', 1); COPY (SELECT 1 AS a) TO '{}' STORED AS PARQUET",
        target.display()
    );
    let out = batchinfer(&["query", "--models", "data/models", "-e", &sql]);
    assert_clean_failure(&out, "unknown model 'nope'");
    assert!(
        !Path::new(&target).exists(),
        "statements after a failure must not run"
    );
}

#[test]
fn unusable_onnx_runtime_library_says_how_to_provide_one() {
    let out = output_within(
        common::binary()
            .args([
                "query",
                "--models",
                "data/models",
                "-e",
                "SELECT predict('linear', features) FROM 'data/sample/vectors.parquet'",
            ])
            .env("ORT_DYLIB_PATH", "/no/such/libonnxruntime.so"),
        DEADLINE,
    );
    assert_clean_failure(
        &out,
        "ORT_DYLIB_PATH is /no/such/libonnxruntime.so, which is not a file",
    );
    assert!(
        stderr(&out).contains("pip install onnxruntime==1.31.1"),
        "{}",
        stderr(&out)
    );
}

fn in_warehouse(warehouse: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--warehouse", warehouse.to_str().unwrap()];
    all.extend_from_slice(args);
    batchinfer(&all)
}

#[test]
fn models_and_tables_persist_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let out = in_warehouse(
        &wh,
        &[
            "query",
            "-e",
            "CREATE MODEL churn2 FROM 'data/models/churn.onnx'; \
             CREATE TABLE scored AS SELECT id, predict('churn2', city, age, spend)['label'] AS label FROM 'data/sample/customers.parquet'",
        ],
    );
    assert_ok(&out);
    // A new process, without --models: the model and the table are still there.
    let out = in_warehouse(
        &wh,
        &[
            "query",
            "--format",
            "csv",
            "-e",
            "SELECT count(*) AS n FROM scored; SELECT name FROM models(); SHOW TABLES",
        ],
    );
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.starts_with("n\n2000\nname\nchurn2\n"), "{text}");
    assert!(text.contains("scored"), "{text}");

    // The table's files name the model and its file's hash.
    let file = common::parquet_files(&wh.join("tables/scored"))[0].clone();
    let models = common::parquet_footer_value(&file, "batchinfer.models").unwrap();
    let sha = common::sha256_of("data/models/churn.onnx");
    assert!(
        models.contains("\"name\":\"churn2\"") && models.contains(&sha),
        "{models}"
    );

    // DROP removes the files and the definition.
    assert_ok(&in_warehouse(
        &wh,
        &["query", "-e", "DROP TABLE scored; DROP MODEL churn2"],
    ));
    assert!(!wh.join("tables/scored").exists());
    let out = in_warehouse(
        &wh,
        &[
            "query",
            "--format",
            "csv",
            "-e",
            "SELECT count(*) AS n FROM models()",
        ],
    );
    assert_eq!(stdout(&out), "n\n0\n");
}

#[test]
fn a_failing_create_table_leaves_no_table_and_no_files() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    // Rows 10..99 are out of the lookup table's range: the model fails part-way.
    let out = in_warehouse(
        &wh,
        &[
            "query",
            "--models",
            "data/models",
            "-e",
            "CREATE TABLE bad AS SELECT value, predict('lookup', value) AS v FROM range(100)",
        ],
    );
    assert_clean_failure(&out, "model 'lookup' failed");
    let leftovers: Vec<_> = std::fs::read_dir(wh.join("tables"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "a failed CREATE TABLE left {leftovers:?}"
    );
    let out = in_warehouse(&wh, &["query", "-e", "SELECT * FROM bad"]);
    assert_clean_failure(&out, "table 'datafusion.public.bad' not found");
}

/// Types one line at the shell's prompt, waits for each expected text, then for the next prompt.
fn type_and_expect(session: &mut rexpect::session::PtySession, line: &str, expected: &[&str]) {
    session.send_line(line).unwrap();
    for text in expected {
        session.exp_string(text).unwrap();
    }
    session.exp_string("batchinfer> ").unwrap();
}

#[test]
fn the_shell_runs_statements_typed_at_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let command = format!(
        "{} shell --models data/models --warehouse {}",
        env!("CARGO_BIN_EXE_batchinfer"),
        wh.display()
    );
    let mut session =
        rexpect::spawn(&command, Some(30_000)).expect("the shell starts in a pseudo-terminal");
    session.exp_string("batchinfer> ").unwrap();
    // A statement over two lines, ended by ';'.
    session.send_line("SELECT predict('iris', sepal_length, sepal_width, petal_length, petal_width)['label'] AS label").unwrap();
    session
        .send_line("FROM 'data/sample/iris.parquet' WHERE id = 149;")
        .unwrap();
    session.exp_string("| 2     |").unwrap();
    // One summary line, batchinfer's.
    session.exp_string("1 row in ").unwrap();
    session.exp_string("s in the model").unwrap();
    // batchinfer's own statements, and DataFusion's backslash commands. Each line is typed once
    // the shell prompts again (what is typed while a statement runs is not read).
    session.exp_string("batchinfer> ").unwrap();
    type_and_expect(
        &mut session,
        "CREATE MODEL flowers FROM 'data/models/iris.onnx';",
        &["0 rows in"],
    );
    type_and_expect(
        &mut session,
        "DESCRIBE MODEL flowers;",
        &["float_input", "rows in"],
    );
    type_and_expect(
        &mut session,
        "SELECT predict('nope', 1);",
        &["Error: unknown model 'nope'"],
    );
    // A statement running for more than a second shows a progress line; Ctrl-C cancels it and
    // the shell goes on.
    let long = "SELECT count(predict('linear', value, value, value, value, value, value, value, value, value, value)) \
                FROM range(1000000000);";
    session.send_line(long).unwrap();
    session.exp_string("rows scored, ").unwrap();
    session.send_control('c').unwrap();
    session.exp_string("^C (cancelled)").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    session.send_line("\\pset format csv").unwrap();
    session.exp_string("Output format is Csv.").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    session.send_line("SELECT 40 + 2 AS answer;").unwrap();
    session.exp_string("answer\r\n42").unwrap();
    // Lists print as `--format csv` prints them: one printer.
    session.exp_string("batchinfer> ").unwrap();
    session.send_line("SELECT make_array(1, 2) AS l;").unwrap();
    session.exp_string("l\r\n\"[1, 2]\"").unwrap();
    type_and_expect(
        &mut session,
        "CREATE TABLE shell_t AS SELECT value FROM range(10000);",
        &["shell_t: 10,000 rows written in"],
    );
    session.send_line("\\q").unwrap();
    session.exp_eof().unwrap();
    // What was created in the shell persists.
    let model =
        std::fs::read_to_string(common::newest_manifest_file(&wh.join("models/flowers"))).unwrap();
    assert!(model.contains("iris.onnx"), "{model}");
}

#[test]
fn explain_analyze_shows_the_rows_and_time_inside_each_model() {
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "--format",
        "csv",
        "-e",
        "EXPLAIN ANALYZE SELECT predict('linear', features) FROM 'data/sample/vectors.parquet'",
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("batchinfer_model,\"model 'linear': 10000 rows scored in 2 calls, "),
        "{text}"
    );
    assert!(text.contains("ms inside ONNX Runtime"), "{text}");
}

/// `rows scored` in an EXPLAIN ANALYZE of `sql` over data/models.
fn rows_scored(sql: &str) -> String {
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "--format",
        "csv",
        "-e",
        &format!("EXPLAIN ANALYZE {sql}"),
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    let at = text.find("model 'linear': ").expect(&text) + "model 'linear': ".len();
    text[at..].split(" rows scored").next().unwrap().to_string()
}

#[test]
fn a_top_n_or_a_filter_scores_only_the_rows_it_keeps() {
    let from = "FROM 'data/sample/vectors.parquet'";
    // Keys that read no model call: the sort and its limit come first, the model after.
    for (sql, rows) in [
        (
            format!("SELECT id, predict('linear', features) AS s {from} ORDER BY id LIMIT 7"),
            "7",
        ),
        (
            format!(
                "SELECT predict('linear', features) AS s {from} ORDER BY id DESC LIMIT 5 OFFSET 3"
            ),
            "5",
        ),
        (
            format!(
                "SELECT id, predict('linear', features) AS s {from} ORDER BY features[1] * 2, id LIMIT 4"
            ),
            "4",
        ),
        // Keys that read the scores: every row is scored.
        (
            format!("SELECT id, predict('linear', features) AS s {from} ORDER BY s DESC LIMIT 7"),
            "10000",
        ),
        (
            format!("SELECT id, predict('linear', features) AS s {from} ORDER BY id"),
            "10000",
        ),
    ] {
        assert_eq!(rows_scored(&sql), rows, "{sql}");
    }
    // The same rows and scores as the whole table scored and sorted.
    let query = |sql: &str| {
        let out = batchinfer(&[
            "query",
            "--models",
            "data/models",
            "--format",
            "csv",
            "-e",
            sql,
        ]);
        assert_ok(&out);
        stdout(&out)
    };
    let all = query(&format!(
        "SELECT id, predict('linear', features) AS s {from} ORDER BY id DESC"
    ));
    let top = query(&format!(
        "SELECT id, predict('linear', features) AS s {from} ORDER BY id DESC LIMIT 5 OFFSET 3"
    ));
    let expected: Vec<&str> = all
        .lines()
        .take(1)
        .chain(all.lines().skip(4).take(5))
        .collect();
    assert_eq!(top.lines().collect::<Vec<_>>(), expected);
    // In order, however many batches the rows kept fill (each run again: the order of
    // partitions is a race).
    let sorted = query(&format!(
        "SELECT id, predict('linear', features) AS s {from} ORDER BY id % 7, id DESC"
    ));
    for _ in 0..3 {
        let top = query(&format!(
            "SELECT id, predict('linear', features) AS s {from} ORDER BY id % 7, id DESC LIMIT 9000"
        ));
        assert!(top.lines().eq(sorted.lines().take(9001)), "out of order");
        let small = query(&format!(
            "SET datafusion.execution.batch_size = 2; SELECT id, predict('linear', features) AS s \
             {from} ORDER BY id % 7, id DESC LIMIT 10"
        ));
        assert!(small.lines().eq(sorted.lines().take(11)), "{small}");
    }
}

#[test]
fn timing_prints_a_summary_per_statement_on_stderr() {
    let out = batchinfer(&[
        "query",
        "--models",
        "data/models",
        "--timing",
        "--format",
        "csv",
        "-e",
        "SELECT count(predict('linear', features)) AS n FROM 'data/sample/vectors.parquet'",
    ]);
    assert_ok(&out);
    assert_eq!(stdout(&out), "n\n10000\n");
    let err = stderr(&out);
    assert!(err.starts_with("1 row in "), "{err}");
    assert!(err.contains("; 10,000 scored in 2 calls, "), "{err}");
    // The two calls may overlap (then the line ends with how many ran at a time).
    let model = err.trim_end().rsplit("; ").next().unwrap();
    assert!(
        model.ends_with(" s in the model") || model.ends_with(" calls at a time"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one summary line: {err}");
    // No progress line when stderr is not a terminal.
    assert!(!err.contains("rows/s"), "{err}");
}

/// With `on_error = 'null'`, the rows that got NULL are counted and the count is said on stderr:
/// graph failures (an index out of the model's table) and conversion failures (a value out of
/// the input's type) alike.
#[test]
fn on_error_null_reports_how_many_rows_got_null() {
    let cases = [
        // Every 97th of 1000 rows (0, 97, ..., 970) out of lookup's table.
        (
            "SELECT count(*) AS n, count(p) AS scored FROM (SELECT predict('lookup', CASE WHEN value % 97 = 0 THEN 100 ELSE value % 10 END) AS p FROM range(1000))",
            "n,scored\n1000,989\n",
            "model 'lookup' failed on 11 row(s)",
        ),
        // Two values that do not fit types' int32 input.
        (
            "SELECT count(*) AS n, count(p) AS scored FROM (SELECT predict('types', CASE WHEN value IN (3, 7) THEN 10000000000 ELSE value END, 1, 1.0, true) AS p FROM range(10))",
            "n,scored\n10,8\n",
            "model 'types' failed on 2 row(s)",
        ),
    ];
    for (sql, rows, warning) in cases {
        let out = batchinfer(&[
            "--models",
            "data/models",
            "--format",
            "csv",
            "query",
            "-e",
            "SET batchinfer.on_error = 'null'",
            "-e",
            sql,
        ]);
        assert_ok(&out);
        assert_eq!(stdout(&out), rows, "{sql}");
        let err = stderr(&out);
        let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
        assert_eq!(warnings.len(), 1, "{err}");
        assert!(warnings[0].contains(warning), "{}", warnings[0]);
    }
}

/// A stop signal ends the process where no statement can answer it: between statements, and
/// while a statement is being planned (work that checks for nothing), at a second signal.
#[test]
fn stop_signals_end_the_process_where_no_statement_can_answer() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let spawn = |args: &[&str]| {
        common::binary()
            .arg("--warehouse")
            .arg(dir.path().join("wh"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Statements read from a pipe: after the first, batchinfer waits for more.
    let mut shell = spawn(&["shell"]);
    let mut stdin = shell.stdin.take().unwrap();
    writeln!(stdin, "SELECT 41 + 1 AS x;").unwrap();
    let mut lines = BufReader::new(shell.stdout.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().contains("42") {}
    common::send(shell.id(), libc::SIGTERM);
    let status = common::wait_with_deadline(&mut shell, Duration::from_secs(5), "the shell");
    assert_eq!(status.code(), Some(1));
    drop(stdin);
    // A statement planned for long (many thousands of plan nodes): two Ctrl-C end it at once.
    let unions = vec!["SELECT a + b + c AS x FROM (VALUES (1, 2, 3)) t(a, b, c) WHERE a > 0"; 990];
    let script = dir.path().join("slow.sql");
    let sql = format!("SELECT count(*) FROM ({})", unions.join(" UNION ALL "));
    std::fs::write(&script, sql).unwrap();
    let mut slow = spawn(&["query", "-f", script.to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs(1));
    common::send(slow.id(), libc::SIGINT);
    std::thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    common::send(slow.id(), libc::SIGINT);
    let status = common::wait_with_deadline(&mut slow, Duration::from_secs(5), "the statement");
    let out = slow.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cancelled by SIGINT"),
        "{}",
        stderr(&out)
    );
    assert!(signalled.elapsed() < Duration::from_secs(5));
}

/// SIGTERM to the shell while a statement runs cancels the statement and ends the shell, status 1:
/// a service manager stopping it needs one signal. (Ctrl-C cancels only the statement.)
#[test]
fn sigterm_cancels_the_running_statement_and_ends_the_shell() {
    let command = format!(
        "{} shell --models data/models",
        env!("CARGO_BIN_EXE_batchinfer")
    );
    let mut session =
        rexpect::spawn(&command, Some(30_000)).expect("the shell starts in a pseudo-terminal");
    session.exp_string("batchinfer> ").unwrap();
    session
        .send_line(
            "SELECT count(predict('linear', value, value, value, value, value, value, value, value, value, value)) \
             FROM range(1000000000);",
        )
        .unwrap();
    session.exp_string("rows scored, ").unwrap();
    common::send(session.process.child_pid.as_raw() as u32, libc::SIGTERM);
    session.exp_string("cancelled by SIGTERM").unwrap();
    session.exp_eof().unwrap();
    let status = format!("{:?}", session.process.wait().unwrap());
    assert!(
        status.starts_with("Exited(") && status.ends_with(", 1)"),
        "{status}"
    );
}

/// The shell over piped input, with `input` written to it and closed: its output.
fn piped_shell(home: &std::path::Path, input: &str) -> std::process::Output {
    common::output_with_input(
        common::binary()
            .args(["--models", "data/models", "shell"])
            .env("HOME", home),
        input.as_bytes(),
        "the piped shell",
    )
}

/// A statement of 20,000 lines piped to the shell is read once, not once per line: it runs
/// within a bound that reading it 20,000 times (minutes) would break.
#[test]
fn a_long_piped_statement_is_read_in_linear_time() {
    let home = tempfile::tempdir().unwrap();
    let mut sql = String::from("SELECT count(*) AS n FROM (VALUES\n");
    for i in 0..20_000 {
        sql.push_str(&format!("  ({i}),\n"));
    }
    sql.push_str("  (20000)) t(x);\n");
    let started = std::time::Instant::now();
    let out = piped_shell(home.path(), &sql);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("20001"), "{}", stdout(&out));
    assert!(took < std::time::Duration::from_secs(60), "took {took:?}");
}

/// Backslash commands piped to the shell are carried out as typed ones are, and swallow nothing:
/// the statement after each one runs.
#[test]
fn piped_backslash_commands_run_and_the_next_statement_too() {
    let home = tempfile::tempdir().unwrap();
    let out = piped_shell(
        home.path(),
        "\\?\nSELECT 1 AS first;\n\\d\nSELECT 2 AS second; -- a note\n\\pset format csv\nSELECT 3 AS third;\n",
    );
    let (out_text, err_text) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{err_text}");
    assert!(out_text.contains("first"), "{out_text}");
    assert!(out_text.contains("second"), "{out_text}");
    assert!(out_text.ends_with("third\n3\n"), "{out_text}");
    assert!(!err_text.contains("rror"), "{err_text}");
}

/// The shell's history keeps statements with their secrets blanked, as plans show them: a
/// secret option's value and a URL's password never reach the file.
#[test]
fn the_shell_history_keeps_no_secret() {
    let home = tempfile::tempdir().unwrap();
    let history = home.path().join(".batchinfer_history");
    std::fs::write(
        &history,
        "#V2\nSELECT 1 FROM 's3://u:OldSeCrEt@b/x' OPTIONS ('aws.secret_access_key' 'OldSeCrEt');\n",
    )
    .unwrap();
    let command = format!(
        "env HOME={} {} --models data/models shell",
        home.path().display(),
        env!("CARGO_BIN_EXE_batchinfer")
    );
    let mut session =
        rexpect::spawn(&command, Some(30_000)).expect("the shell starts in a pseudo-terminal");
    session.exp_string("batchinfer> ").unwrap();
    session
        .send_line(
            "COPY (SELECT 1) TO 'x' OPTIONS ('aws.secret_access_key' 'SeCrEt1', 'aws.session_token' 'SeCrEt2') nonsense;",
        )
        .unwrap();
    session.exp_string("Error:").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    session
        .send_line(
            "SELECT * FROM 'https://user:SeCrEt3@127.0.0.1:9/f.parquet?sig=SeCrEt4' nonsense;",
        )
        .unwrap();
    session.exp_string("Error:").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    session.send_line("\\q").unwrap();
    session.exp_eof().unwrap();
    let kept = std::fs::read_to_string(&history).unwrap();
    assert!(kept.contains("aws.secret_access_key"), "{kept}");
    assert!(kept.contains("<redacted>"), "{kept}");
    assert!(!kept.contains("SeCrEt"), "{kept}");
}
