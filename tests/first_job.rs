//! A first real job, as a new user runs it: the `late` model (a scikit-learn pipeline with
//! string inputs, trained with missing values; `data/make_late.py`) over three monthly files of
//! flights. Each model call is computed once per row whatever reads it; columns named after the
//! model's inputs bind by name; NULL features can be NaN; a registered model stays the bytes
//! that were registered; every write names its models.

mod common;

use std::path::Path;
use std::process::Output;

use common::{DEADLINE, assert_failure, assert_ok, bin, output_within, stderr, stdout};

const LATE: &str =
    "predict('late', carrier, origin, dest, month, hour, distance, temp, wind_speed)";
/// The same call, its columns qualified by the alias `x`.
const LATE_X: &str = "predict('late', x.carrier, x.origin, x.dest, x.month, x.hour, x.distance, x.temp, x.wind_speed)";
const FLIGHTS: &str = "'data/sample/flights/'";
const ROWS: u64 = 3_000;

/// Runs `statements` (each its own `-e`) with the test models and `--timing`.
fn timed(warehouse: &Path, statements: &[&str]) -> Output {
    let mut command = bin();
    command.arg("--warehouse").arg(warehouse).args([
        "--models",
        "data/models",
        "--timing",
        "query",
    ]);
    for statement in statements {
        command.args(["-e", statement]);
    }
    output_within(&mut command, DEADLINE)
}

/// The rows returned and scored that the last statement's summary line reports.
fn rows_and_scored(out: &Output) -> (u64, u64) {
    let err = stderr(out);
    let line = err.lines().rev().find(|l| l.contains(" in ")).unwrap_or("");
    let number = |text: &str| text.replace(',', "").parse::<u64>().unwrap_or(0);
    let returned = line.split(" row").next().map_or(0, number);
    let scored = line
        .split("; ")
        .nth(1)
        .and_then(|s| s.split(" scored").next())
        .map_or(0, number);
    (returned, scored)
}

#[test]
fn a_model_call_is_computed_once_per_row_however_many_of_its_fields_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let shapes = [
        // Two fields in one select list.
        (
            format!("SELECT {LATE}['label'] AS l, {LATE}['probabilities'][2] AS p FROM {FLIGHTS}"),
            ROWS,
        ),
        // Through a CTE.
        (
            format!(
                "WITH s AS (SELECT {LATE} AS p FROM {FLIGHTS}) SELECT p['label'], p['probabilities'][2] FROM s"
            ),
            ROWS,
        ),
        // A subquery with ORDER BY.
        (
            format!(
                "SELECT p['label'], p['probabilities'][2] FROM (SELECT id, {LATE} AS p FROM {FLIGHTS} ORDER BY id)"
            ),
            ROWS,
        ),
        // A filter on one field and another field selected: the filter is not moved below the
        // call and computed again.
        (
            format!(
                "SELECT p['label'] FROM (SELECT {LATE} AS p FROM {FLIGHTS}) WHERE p['probabilities'][2] > 0.3"
            ),
            0,
        ),
        // Two filters and the whole struct.
        (
            format!(
                "SELECT * FROM (SELECT {LATE} AS p FROM {FLIGHTS}) WHERE p['label'] = 1 AND p['probabilities'][2] > 0.6"
            ),
            0,
        ),
        // ORDER BY a field the select list does not show.
        (
            format!(
                "SELECT {LATE}['label'] AS l FROM {FLIGHTS} ORDER BY {LATE}['probabilities'][2]"
            ),
            ROWS,
        ),
        // An aggregate over two fields.
        (
            format!(
                "SELECT p['label'], avg(p['probabilities'][2]) FROM (SELECT {LATE} AS p FROM {FLIGHTS}) GROUP BY p['label']"
            ),
            2,
        ),
        // A sort key only: sorts evaluate their keys again when they merge partitions.
        (
            format!("SELECT id FROM {FLIGHTS} ORDER BY {LATE}['probabilities'][2] DESC LIMIT 3"),
            3,
        ),
        (
            format!(
                "SELECT id, row_number() OVER (ORDER BY {LATE}['probabilities'][2]) AS r FROM {FLIGHTS}"
            ),
            ROWS,
        ),
        (
            format!(
                "SELECT array_agg(id ORDER BY {LATE}['probabilities'][2] DESC)[1] AS first FROM {FLIGHTS}"
            ),
            1,
        ),
        // A window's ordering and the same field selected.
        (
            format!(
                "SELECT id, row_number() OVER (ORDER BY {LATE}['probabilities'][2] DESC) AS r, {LATE}['probabilities'][2] AS p FROM {FLIGHTS}"
            ),
            ROWS,
        ),
        // Grouping sets over a field.
        (
            format!(
                "SELECT {LATE}['label'] AS l, count(*) AS n FROM {FLIGHTS} GROUP BY ROLLUP ({LATE}['label'])"
            ),
            3,
        ),
        // Two fields over columns a subquery renamed.
        (
            format!(
                "SELECT {LATE}['label'] AS l, {LATE}['probabilities'][2] AS p FROM (SELECT carrier, origin, dest, month, hour, distance, wind_speed AS temp, temp AS wind_speed FROM {FLIGHTS}) v"
            ),
            ROWS,
        ),
        // A table alias, with a filter pushed below it that reads the columns by their own names.
        (
            format!(
                "SELECT id, {LATE}['label'] AS l FROM {FLIGHTS} x WHERE {LATE}['probabilities'][2] > 0"
            ),
            ROWS,
        ),
        // The same call twice.
        (
            format!("SELECT {LATE}, {LATE} AS again FROM {FLIGHTS}"),
            ROWS,
        ),
        // The README's predict_table shape.
        (
            format!("SELECT label, probabilities[2] FROM predict_table('late', {FLIGHTS})"),
            ROWS,
        ),
    ];
    for (sql, rows) in &shapes {
        let out = timed(wh, &["SET batchinfer.nulls = 'nan'", sql]);
        assert_ok(&out);
        let (returned, scored) = rows_and_scored(&out);
        assert_eq!(scored, ROWS, "{sql}\n{}", stderr(&out));
        if *rows > 0 {
            assert_eq!(returned, *rows, "{sql}\n{}", stderr(&out));
        }
    }

    // And the values are the model's: the aliased, filtered shape against scikit-learn.
    let out = timed(
        wh,
        &[
            "SET batchinfer.nulls = 'nan'",
            &format!(
                "SELECT x.id, {LATE_X}['probabilities'][2] AS p FROM {FLIGHTS} x WHERE {LATE}['label'] >= 0"
            ),
        ],
    );
    common::assert_same_rows(&common::rows(&assert_ok(&out)), &reference(), 1e-5);

    // EXPLAIN ANALYZE counts the rows scored too.
    let out = timed(
        wh,
        &[
            "SET batchinfer.nulls = 'nan'",
            &format!(
                "EXPLAIN ANALYZE SELECT {LATE}['label'] AS l, {LATE}['probabilities'][2] AS p FROM {FLIGHTS}"
            ),
        ],
    );
    let text = assert_ok(&out);
    assert!(
        text.contains(&format!("model 'late': {ROWS} rows scored in ")),
        "{text}"
    );

    // A materialized view reading two fields scores each row once.
    let out = timed(
        wh,
        &[
            "SET batchinfer.nulls = 'nan'",
            &format!(
                "CREATE MATERIALIZED VIEW lateness AS SELECT id, {LATE}['label'] AS l, {LATE}['probabilities'][2] AS p FROM {FLIGHTS}"
            ),
        ],
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("3,000 rows written in")
            && stderr(&out).contains("; 3,000 scored in"),
        "{}",
        stderr(&out)
    );
}

/// The reference: scikit-learn's own `predict_proba` on the flights (NaN where weather is
/// missing), by id.
fn reference() -> Vec<(i64, Vec<f64>)> {
    let out = common::query(
        Path::new("unused"),
        "SELECT id, p_late FROM 'data/reference/late.parquet' ORDER BY id",
    );
    common::rows(&assert_ok(&out))
}

#[test]
fn nulls_as_nan_score_every_flight_as_scikit_learn_does() {
    let dir = tempfile::tempdir().unwrap();
    let scores = |statements: &[&str]| assert_ok(&timed(dir.path(), statements));
    let select = format!("SELECT id, {LATE}['probabilities'][2] AS p FROM {FLIGHTS} ORDER BY id");

    // By default a flight with missing weather is not scored: NULL.
    let default = scores(&[&select]);
    let nulls = default.lines().filter(|l| l.ends_with(',')).count();
    let missing = scores(&[&format!(
        "SELECT count(*) AS n FROM {FLIGHTS} WHERE temp IS NULL OR wind_speed IS NULL"
    )]);
    assert_eq!(format!("n\n{nulls}\n"), missing);
    assert!(nulls > 100, "{nulls} flights with missing weather");

    // With 'nan', every flight, within 1e-5 of scikit-learn (float32 trees against float64).
    let nan = scores(&["SET batchinfer.nulls = 'nan'", &select]);
    common::assert_same_rows(&common::rows(&nan), &reference(), 1e-5);

    // Other settings are refused, naming the setting and its values.
    let out = timed(dir.path(), &["SET batchinfer.nulls = 'zero'"]);
    assert_failure(
        &out,
        &["batchinfer.nulls must be 'null'", "'nan'", "not 'zero'"],
    );
}

#[test]
fn columns_named_after_the_inputs_bind_by_name_in_any_order() {
    let dir = tempfile::tempdir().unwrap();
    let run = |sql: &str| timed(dir.path(), &["SET batchinfer.nulls = 'nan'", sql]);
    // The model's inputs in another order: each column still feeds the input of its name.
    let swapped = format!(
        "SELECT id, predict('late', wind_speed, dest, hour, carrier, temp, month, origin, distance)['probabilities'][2] AS p FROM {FLIGHTS}"
    );
    let out = run(&swapped);
    common::assert_same_rows(&common::rows(&assert_ok(&out)), &reference(), 1e-5);
    // EXPLAIN shows the columns in the model's order: where each binds.
    let out = run(&format!("EXPLAIN {swapped}"));
    let plan = assert_ok(&out);
    let call = plan.split("predict(").nth(1).unwrap_or_default();
    let at = |name: &str| call.find(&format!(".{name}")).unwrap_or(usize::MAX);
    let inputs = [
        "carrier",
        "origin",
        "dest",
        "month",
        "hour",
        "distance",
        "temp",
        "wind_speed",
    ];
    assert!(
        inputs.windows(2).all(|w| at(w[0]) < at(w[1])) && at("wind_speed") < usize::MAX,
        "{plan}"
    );
    // Names are the query's own: a column renamed in a subquery binds under its new name, as
    // the same columns computed there do (temp and wind_speed trade places both ways).
    let swapped = |temp: &str, wind_speed: &str| {
        let out = run(&format!(
            "SELECT id, {LATE}['probabilities'][2] AS p FROM (SELECT id, carrier, origin, dest, month, hour, distance, {temp} AS temp, {wind_speed} AS wind_speed FROM {FLIGHTS})"
        ));
        common::rows(&assert_ok(&out))
    };
    let renamed = swapped("wind_speed", "temp");
    assert_eq!(renamed.len(), reference().len());
    assert_ne!(
        renamed,
        reference(),
        "temp and wind_speed bound by their new names"
    );
    common::assert_same_rows(&renamed, &swapped("wind_speed + 0", "temp + 0"), 0.0);
    // A column under another input's name in the model's order is no mistake.
    let out = run(&format!(
        "SELECT count({LATE}) AS n FROM (SELECT carrier, origin, dest, month, hour, distance, temp, temp AS wind_speed FROM {FLIGHTS})"
    ));
    assert_eq!(assert_ok(&out), format!("n\n{ROWS}\n"));

    // A named column that would feed another input by position: an error naming both.
    let out = common::query(
        dir.path(),
        &format!(
            "SELECT predict('late', origin, carrier, dest, month, hour, distance, temp, wind_speed * 1.0) FROM {FLIGHTS}"
        ),
    );
    assert_failure(
        &out,
        &[
            "model 'late'",
            "column 1 'origin' is named after input 'origin' but would feed input 'carrier' by position",
        ],
    );
}

/// A warehouse with the model `late` created from a copy of its file, which the caller may
/// rewrite; the folder of that copy.
fn warehouse_with_late(dir: &Path) -> std::path::PathBuf {
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::copy("data/models/late.onnx", models.join("late.onnx")).unwrap();
    let wh = dir.join("wh");
    let out = timed(
        &wh,
        &[&format!(
            "CREATE MODEL flights FROM '{}'",
            models.join("late.onnx").display()
        )],
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("model 'flights' created as version 1 from ")
            && stderr(&out).contains("(sha256 "),
        "a confirmation: {}",
        stderr(&out)
    );
    models
}

/// The model is the bytes that were registered: its file rewritten (or removed) afterwards
/// changes nothing until a statement registers it again, as a new version.
#[test]
fn a_model_file_rewritten_after_create_model_changes_nothing_until_registered_again() {
    let dir = tempfile::tempdir().unwrap();
    let models = warehouse_with_late(dir.path());
    let wh = dir.path().join("wh");
    let old = common::sha256_of(models.join("late.onnx"));
    let late = |name: &str| {
        format!(
            "SELECT id, predict('{name}', carrier, origin, dest, month, hour, distance, temp, \
             wind_speed)['probabilities'][2] AS p FROM {FLIGHTS} ORDER BY id LIMIT 5"
        )
    };
    let first = assert_ok(&timed(&wh, &[&late("flights")]));
    let query = late("flights");
    let query = query.as_str();
    std::fs::copy("data/models/churn.onnx", models.join("late.onnx")).unwrap();
    let new = common::sha256_of(models.join("late.onnx"));
    assert_ne!(old, new);
    assert_eq!(assert_ok(&timed(&wh, &[query])), first);
    let out = timed(
        &wh,
        &["SELECT name, sha256 FROM models() WHERE name = 'flights'"],
    );
    assert!(assert_ok(&out).contains(&old), "{}", stdout(&out));

    let replace = format!(
        "CREATE OR REPLACE MODEL flights FROM '{}'",
        models.join("late.onnx").display()
    );
    let out = timed(
        &wh,
        &[
            &replace,
            "SELECT predict('flights', 'lima', 30.0, 2.0) AS p",
        ],
    );
    assert!(
        stderr(&out).contains("model 'flights' defined as version 2 from"),
        "{}",
        stderr(&out)
    );
    assert!(assert_ok(&out).contains("label: "), "{}", stdout(&out));
    std::fs::remove_file(models.join("late.onnx")).unwrap();
    let out = timed(&wh, &[&late("flights@1")]);
    assert_eq!(assert_ok(&out), first);
    let out = timed(&wh, &["DROP MODEL flights"]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("model 'flights' dropped"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn copy_names_its_models_and_views_say_when_a_model_changed() {
    let dir = tempfile::tempdir().unwrap();
    let models = warehouse_with_late(dir.path());
    let wh = dir.path().join("wh");
    let target = dir.path().join("scores.parquet");
    let out = timed(
        &wh,
        &[&format!(
            "COPY (SELECT id, predict('flights', carrier, origin, dest, month, hour, distance, temp, wind_speed)['label'] AS l FROM {FLIGHTS}) TO '{}' STORED AS PARQUET",
            target.display()
        )],
    );
    assert_ok(&out);
    let models_used = common::parquet_footer_value(&target, "batchinfer.models")
        .expect("batchinfer.models in the footer");
    let sha = common::sha256_of("data/models/late.onnx");
    assert!(
        models_used.contains("\"name\":\"flights\"")
            && models_used.contains(&sha)
            && models_used.contains("late.onnx"),
        "{models_used}"
    );

    // A view of the model, then the model redefined with other bytes.
    let view = format!(
        "CREATE MATERIALIZED VIEW v AS SELECT id, predict('flights', carrier, origin, dest, month, hour, distance, temp, wind_speed)['label'] AS l FROM {FLIGHTS}"
    );
    assert_ok(&timed(&wh, &[&view]));
    let state = || assert_ok(&timed(&wh, &["SHOW MATERIALIZED VIEWS"]));
    assert!(state().contains(",current,"), "{}", state());
    let retrained = dir.path().join("retrained.onnx");
    let mut bytes = std::fs::read(models.join("late.onnx")).unwrap();
    // The same graph with another doc string: other bytes, the same scores.
    bytes.extend_from_slice(&[0x32, 0x01, b'x']);
    std::fs::write(&retrained, bytes).unwrap();
    assert_ok(&timed(
        &wh,
        &[&format!(
            "CREATE OR REPLACE MODEL flights FROM '{}'",
            retrained.display()
        )],
    ));
    assert!(
        state().contains("model changed (flights): REFRESH to rebuild"),
        "{}",
        state()
    );
    assert_ok(&timed(&wh, &["REFRESH MATERIALIZED VIEW v"]));
    assert!(!state().contains("model changed"), "{}", state());
}

#[test]
fn the_small_things_a_first_user_meets() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");

    // Short default names for model columns.
    let out = common::query(
        &wh,
        &format!("SELECT {LATE}, {LATE}['label'] FROM {FLIGHTS} LIMIT 1"),
    );
    let text = assert_ok(&out);
    assert!(
        text.starts_with("predict_late,predict_late_label\n"),
        "{text}"
    );

    // A struct column into CSV: an error naming the column and how to select its fields.
    let target = dir.path().join("out.csv");
    let out = common::query(
        &wh,
        &format!(
            "COPY (SELECT id, predict('churn', city, age, spend) AS p FROM 'data/sample/customers.parquet') TO '{}' STORED AS CSV",
            target.display()
        ),
    );
    assert_failure(
        &out,
        &[
            "column 'p' is a struct (label: Int64",
            "p['label'] AS label",
            "Parquet or JSON",
        ],
    );
    assert!(!target.exists());

    // CSV and JSON inputs, scored as Parquet is.
    let csv = dir.path().join("customers.csv");
    let json = dir.path().join("customers.json");
    for (path, format) in [(&csv, "CSV"), (&json, "JSON")] {
        assert_ok(&common::query(
            &wh,
            &format!(
                "COPY (SELECT id, city, age, spend FROM 'data/sample/customers.parquet') TO '{}' STORED AS {format}",
                path.display()
            ),
        ));
    }
    let scores = |from: &str| {
        let out = common::query(
            &wh,
            &format!(
                "SELECT id, predict('churn', city, CAST(age AS float), CAST(spend AS float))['probabilities'][2] AS p FROM {from} ORDER BY id"
            ),
        );
        common::rows(&assert_ok(&out))
    };
    let parquet = scores("'data/sample/customers.parquet'");
    assert_eq!(parquet.len(), 2000);
    common::assert_same_rows(&scores(&format!("'{}'", csv.display())), &parquet, 1e-6);
    common::assert_same_rows(&scores(&format!("'{}'", json.display())), &parquet, 1e-6);

    // Wide rows, one line per column.
    let out = output_within(
        common::binary().args([
            "--models",
            "data/models",
            "--format",
            "vertical",
            "query",
            "-e",
            "SELECT 1 AS a, 'two' AS bb",
        ]),
        DEADLINE,
    );
    assert_eq!(assert_ok(&out), "-[ RECORD 1 ]\na  | 1\nbb | two\n");

    // The shell's own help: its commands, and batchinfer's functions and statements.
    let typed = dir.path().join("typed.txt");
    std::fs::write(
        &typed,
        "\\?\n\\h predict\n\\h create model\n\\h abs\n\\x\nSELECT 1 AS a;\n",
    )
    .unwrap();
    // Piped: output_within gives the command no standard input of its own.
    let mut shell = std::process::Command::new("sh");
    shell.arg("-c").arg(format!(
        "'{}' --warehouse '{}' --models data/models shell < '{}'",
        env!("CARGO_BIN_EXE_batchinfer"),
        wh.display(),
        typed.display()
    ));
    let out = output_within(&mut shell, DEADLINE);
    let (text, err) = (stdout(&out), stderr(&out));
    assert!(text.contains("\\timing") && text.contains("\\x "), "{text}");
    assert!(!text.contains("datafusion-cli"), "{text}");
    assert!(text.contains("predict('model', column, ...)"), "{text}");
    assert!(
        text.contains("CREATE [OR REPLACE] MODEL name FROM"),
        "{text}"
    );
    assert!(err.contains("SHOW FUNCTIONS LIKE 'abs'"), "{err}");
    assert!(text.contains("-[ RECORD 1 ]\na | 1\n"), "{text}");
}

#[test]
fn a_models_file_hides_a_warehouse_definition_with_a_warning_only_when_they_differ() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let folder = dir.path().join("models");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy("data/models/churn.onnx", folder.join("churn.onnx")).unwrap();
    // The warehouse defines churn from the same bytes elsewhere.
    assert_ok(&output_within(
        bin().arg("--warehouse").arg(&wh).args([
            "query",
            "-e",
            "CREATE MODEL churn FROM 'data/models/churn.onnx'",
        ]),
        DEADLINE,
    ));
    let with_folder = |sql: &str| {
        output_within(
            bin()
                .arg("--warehouse")
                .arg(&wh)
                .arg("--models")
                .arg(&folder)
                .args(["query", "-e", sql]),
            DEADLINE,
        )
    };
    let out = with_folder("SELECT 1 AS one");
    assert_ok(&out);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    // Other bytes: the warning says which one is used.
    std::fs::copy("data/models/iris.onnx", folder.join("churn.onnx")).unwrap();
    let out = with_folder("SELECT 1 AS one");
    assert_ok(&out);
    assert!(
        stderr(&out).contains("warning: model 'churn' of --models"),
        "{}",
        stderr(&out)
    );
}

/// The SQL of the README's section `heading`, its ```sql blocks in order.
fn readme_sql(heading: &str) -> String {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .unwrap_or_else(|| panic!("README has a section '{heading}'"));
    section
        .split("```sql\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap_or_default())
        .collect()
}

#[test]
fn the_readme_walk_through_of_a_scikit_learn_model_runs_and_matches_scikit_learn() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let job = dir.path().join("job.sql");
    std::fs::write(&job, readme_sql("You have a scikit-learn model")).unwrap();
    // As the README has it: no --models, the model created in the warehouse.
    let mut command = bin();
    command
        .arg("--warehouse")
        .arg(&wh)
        .arg("query")
        .arg("-f")
        .arg(&job);
    let out = output_within(&mut command, DEADLINE);
    let text = assert_ok(&out);
    assert!(
        text.contains("model,labels,\"0, 1\""),
        "DESCRIBE MODEL:\n{text}"
    );
    assert!(
        stderr(&out).contains("model 'late' created as version 1 from"),
        "{}",
        stderr(&out)
    );
    // The table and the view hold scikit-learn's scores, for every flight.
    let read = |sql: &str| {
        let out = output_within(
            bin().arg("--warehouse").arg(&wh).args(["query", "-e", sql]),
            DEADLINE,
        );
        common::rows(&assert_ok(&out))
    };
    let want = reference();
    common::assert_same_rows(
        &read("SELECT id, p['probabilities'][2] AS p FROM late_scores"),
        &want,
        1e-5,
    );
    common::assert_same_rows(&read("SELECT id, p_late FROM late_flights"), &want, 1e-5);
}
