//! Rows a model fails on, kept (`SET batchinfer.on_error = 'reject'`) and bounded
//! (`SET batchinfer.max_errors`), through the real binary. Inputs are written here with Arrow
//! (not by batchinfer), outputs and rejects are read back with the Parquet reader, and what each
//! row should give is computed here from the models' definitions (`data/make_data.py`):
//! `lookup` is `1.5 * idx` for an index in 0..9 and fails otherwise; `two_inputs` is
//! `sum(x) * w` for three values of `x` per row and fails on any other count.

mod common;
mod fixtures;
use common::{parquet_files, sha256_of};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float32Array, Int64Array, ListArray, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Int64Type};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use common::{assert_failure, assert_ok, query, stderr};

const ROWS: i64 = 20_000;
/// The rows whose index is out of the lookup table's range.
const FAILING: [i64; 3] = [17, 5_000, 19_999];

fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
}

fn read(paths: &[PathBuf]) -> Vec<RecordBatch> {
    paths
        .iter()
        .flat_map(|path| {
            ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
                .unwrap()
                .build()
                .unwrap()
                .map(Result::unwrap)
        })
        .collect()
}

/// 20,000 rows of `id` and `idx = id % 10`, but 99 at the [`FAILING`] ids.
fn lookup_input(dir: &Path) -> PathBuf {
    let path = dir.join("in.parquet");
    let ids: Vec<i64> = (0..ROWS).collect();
    let idx: Vec<i64> = ids
        .iter()
        .map(|id| if FAILING.contains(id) { 99 } else { id % 10 })
        .collect();
    write(
        &path,
        vec![
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("idx", Arc::new(Int64Array::from(idx))),
        ],
    );
    path
}

/// The folder a statement's rejects went to, as the warning at its end names it.
fn rejects_folder(out: &std::process::Output) -> PathBuf {
    let err = stderr(out);
    let at = err
        .find("they are kept in ")
        .unwrap_or_else(|| panic!("no rejects named: {err}"));
    PathBuf::from(
        err[at + "they are kept in ".len()..]
            .lines()
            .next()
            .unwrap(),
    )
}

fn strings(batches: &[RecordBatch], column: &str) -> Vec<String> {
    batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name(column).unwrap();
            let c = datafusion::arrow::compute::cast(c, &DataType::Utf8).unwrap();
            c.as_string::<i32>()
                .iter()
                .map(|s| s.unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn rejected_rows_get_null_and_are_kept_with_their_inputs_and_the_models_message() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = lookup_input(dir.path());
    // The same rows through a model that fixes its batch at 4 (calls padded, then bisected).
    for model in ["lookup", "lookup_fixed4"] {
        let output = dir.path().join(format!("{model}.parquet"));
        let sql = format!(
            "SET batchinfer.on_error = 'reject';
             COPY (SELECT id, predict('{model}', idx) AS p FROM '{}') TO '{}' STORED AS PARQUET",
            input.display(),
            output.display()
        );
        let out = query(&wh, &sql);
        assert_ok(&out);
        assert!(
            stderr(&out).contains(&format!("model '{model}' failed on 3 row(s)")),
            "{}",
            stderr(&out)
        );
        // NULL exactly at the failing rows, 1.5 * idx elsewhere.
        let mut seen = 0;
        for batch in read(&[output]) {
            let ids = batch.column(0).as_primitive::<Int64Type>();
            let p = batch.column(1).as_primitive::<Float32Type>();
            for row in 0..batch.num_rows() {
                let id = ids.value(row);
                if FAILING.contains(&id) {
                    assert!(p.is_null(row), "{model}: id {id} should be NULL");
                } else {
                    assert_eq!(p.value(row), (id % 10) as f32 * 1.5, "{model}: id {id}");
                }
                seen += 1;
            }
        }
        assert_eq!(seen, ROWS);
        // The rejects: exactly those rows, their input, the model and its message.
        let folder = rejects_folder(&out);
        assert!(
            folder.starts_with(wh.join("rejects")),
            "{}",
            folder.display()
        );
        let rejects = read(&parquet_files(&folder));
        let rows: usize = rejects.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 3, "{model}: three rows rejected");
        for batch in &rejects {
            let idx = batch
                .column_by_name("idx")
                .unwrap()
                .as_primitive::<Int64Type>();
            assert!(idx.iter().all(|v| v == Some(99)));
        }
        let id = folder.file_name().unwrap().to_string_lossy().into_owned();
        assert!(strings(&rejects, "statement_id").iter().all(|s| *s == id));
        assert!(strings(&rejects, "model").iter().all(|m| m == model));
        let sha = sha256_of(format!("data/models/{model}.onnx"));
        assert!(strings(&rejects, "model_sha256").iter().all(|s| *s == sha));
        assert!(
            strings(&rejects, "error")
                .iter()
                .all(|e| e.contains("idx=99"))
        );
        assert!(
            strings(&rejects, "statement")
                .iter()
                .all(|s| s.contains("COPY"))
        );
    }
    // batchinfer_rejects() reads them all back; a retry reads one statement's folder.
    let out = query(
        &wh,
        "SELECT model, count(*) AS n FROM batchinfer_rejects() GROUP BY model ORDER BY model",
    );
    assert_eq!(assert_ok(&out), "model,n\nlookup,3\nlookup_fixed4,3\n");
    let folders: Vec<PathBuf> = std::fs::read_dir(wh.join("rejects"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let retry = format!(
        "SELECT predict('lookup', idx - 90) AS p FROM '{}/'",
        folders[0].display()
    );
    assert_eq!(assert_ok(&query(&wh, &retry)), "p\n13.5\n13.5\n13.5\n");
}

#[test]
fn rows_whose_input_does_not_fit_are_rejected_too() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    // x has 3 values per row, but 2 at every 1,000th row.
    let n = 5_000i64;
    let mut offsets = vec![0i32];
    let mut values = Vec::new();
    for id in 0..n {
        let len = if id % 1_000 == 7 { 2 } else { 3 };
        values.extend((0..len).map(|k| (id % 5 + k) as f32));
        offsets.push(values.len() as i32);
    }
    let x = ListArray::new(
        Arc::new(Field::new_list_field(DataType::Float32, true)),
        datafusion::arrow::buffer::OffsetBuffer::new(offsets.into()),
        Arc::new(Float32Array::from(values)),
        None,
    );
    let w: Vec<f32> = (0..n).map(|id| 0.5 + (id % 3) as f32).collect();
    let input = dir.path().join("pairs.parquet");
    write(
        &input,
        vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
            ),
            ("x", Arc::new(x)),
            ("w", Arc::new(Float32Array::from(w.clone()))),
        ],
    );
    let output = dir.path().join("out.parquet");
    let out = query(
        &wh,
        &format!(
            "SET batchinfer.on_error = 'reject';
             COPY (SELECT id, predict('two_inputs', x, w) AS y FROM '{}') TO '{}' STORED AS PARQUET",
            input.display(),
            output.display()
        ),
    );
    assert_ok(&out);
    for batch in read(&[output]) {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let y = batch.column(1).as_primitive::<Float32Type>();
        for row in 0..batch.num_rows() {
            let id = ids.value(row);
            if id % 1_000 == 7 {
                assert!(y.is_null(row), "id {id}");
            } else {
                let sum = (3 * (id % 5) + 3) as f32;
                let want = sum * w[id as usize];
                assert!((y.value(row) - want).abs() <= 1e-5 * want.abs(), "id {id}");
            }
        }
    }
    let rejects = read(&parquet_files(&rejects_folder(&out)));
    let rows: usize = rejects.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 5);
    for batch in &rejects {
        let x = batch.column_by_name("x").unwrap().as_list::<i32>();
        assert!(
            (0..x.len()).all(|r| x.value(r).len() == 2),
            "the short rows kept"
        );
        assert!(batch.column_by_name("w").is_some());
    }
    assert!(
        strings(&rejects, "error")
            .iter()
            .all(|e| e.contains("holds 2 value(s)")),
        "{:?}",
        strings(&rejects, "error")
    );
}

#[test]
fn a_statement_past_its_error_budget_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = lookup_input(dir.path());
    let output = dir.path().join("out.parquet");
    let copy = |budget: &str, on_error: &str| {
        let _ = std::fs::remove_file(&output);
        query(
            &wh,
            &format!(
                "SET batchinfer.on_error = '{on_error}'; SET batchinfer.max_errors = '{budget}';
                 COPY (SELECT id, predict('lookup', idx) AS p FROM '{}') TO '{}' STORED AS PARQUET",
                input.display(),
                output.display()
            ),
        )
    };
    // 3 failures: past a budget of 2 rows, and of 0.01% of 20,000 (2 rows).
    for (budget, on_error) in [("2", "reject"), ("0.01%", "reject"), ("2", "null")] {
        let out = copy(budget, on_error);
        assert_failure(
            &out,
            &["rows failed", &format!("max_errors = '{budget}'"), "idx=99"],
        );
        assert!(!output.exists(), "a COPY past its budget ({budget}) wrote");
    }
    // Within a budget of 3 rows, or of 0.1% of the rows scored so far (whatever order the
    // partitions' batches are counted in, the share never passes 0.06%).
    for budget in ["3", "0.1%"] {
        assert_ok(&copy(budget, "reject"));
        assert!(output.exists());
    }
    // A CREATE TABLE past its budget leaves no table.
    let out = query(
        &wh,
        &format!(
            "SET batchinfer.on_error = 'reject'; SET batchinfer.max_errors = '2';
             CREATE TABLE scored AS SELECT id, predict('lookup', idx) AS p FROM '{}'",
            input.display()
        ),
    );
    assert_failure(&out, &["max_errors"]);
    assert_eq!(
        assert_ok(&query(&wh, "SHOW TABLES"))
            .matches("scored")
            .count(),
        0
    );
    assert!(!wh.join("tables/scored").exists());
    // The rejects of the statements stopped are kept.
    let out = query(&wh, "SELECT count(*) AS n FROM batchinfer_rejects()");
    let n: usize = assert_ok(&out).lines().nth(1).unwrap().parse().unwrap();
    assert!(n >= 3, "{n}");
}

/// A share of the rows holds at every size: a job of 300 rows of which 38 fail (12.7%) is past
/// `max_errors = '10%'` and commits nothing, though it never reaches the 1,000 rows after which
/// the share is checked as rows go; within 15% it commits.
#[test]
fn a_share_of_errors_holds_for_a_small_job() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = dir.path().join("small.parquet");
    let ids: Vec<i64> = (0..300).collect();
    let idx: Vec<i64> = ids
        .iter()
        .map(|id| if id % 8 == 0 { 99 } else { id % 10 })
        .collect();
    write(
        &input,
        vec![
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("idx", Arc::new(Int64Array::from(idx))),
        ],
    );
    let create = |budget: &str| {
        query(
            &wh,
            &format!(
                "SET batchinfer.on_error = 'reject'; SET batchinfer.max_errors = '{budget}';
                 CREATE OR REPLACE TABLE small AS SELECT id, predict('lookup', idx) AS p FROM '{}'",
                input.display()
            ),
        )
    };
    let out = create("10%");
    assert_failure(&out, &["38 rows failed of 300", "max_errors = '10%'"]);
    assert!(
        !wh.join("tables/small").exists(),
        "a table past its budget was kept"
    );
    assert_ok(&create("15%"));
    let out = assert_ok(&query(
        &wh,
        "SELECT count(*) AS n, count(p) AS scored FROM small",
    ));
    assert!(out.contains("300") && out.contains("262"), "{out}");
}

#[test]
fn budgets_and_on_error_values_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = query(&dir.path().join("wh"), "SET batchinfer.max_errors = 'lots'");
    assert_failure(&out, &["max_errors 'lots'", "'100'", "'0.5%'"]);
    let out = query(&dir.path().join("wh"), "SET batchinfer.max_errors = '150%'");
    assert_failure(&out, &["max_errors '150%'"]);
    let out = query(&dir.path().join("wh"), "SET batchinfer.on_error = 'keep'");
    assert_failure(&out, &["'fail', 'null' or 'reject'"]);
}

#[test]
fn texts_a_text_model_fails_on_are_rejected_with_their_text() {
    // A model that knows only the first 1,100 token ids (data/text/small_vocabulary, made by
    // data/make_data.py), with MiniLM's tokenizer: a text with any other word fails its call.
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(models.join("small")).unwrap();
    std::fs::copy(
        "data/text/small_vocabulary/model.onnx",
        models.join("small/model.onnx"),
    )
    .unwrap();
    let tokenizer = fixtures::models_with_minilm().join("minilm/tokenizer.json");
    std::fs::copy(&tokenizer, models.join("small/tokenizer.json")).unwrap();
    let known = ["1", "2", "a", "b", "!", "?", "7", "z"];
    let unknown = ["hello", "world", "the", "cat"];
    // Known tokens, and a word every so often.
    let texts: Vec<String> = (0..2_000usize)
        .map(|i| {
            let mut text: Vec<&str> = (0..1 + i % 4)
                .map(|k| known[(i * 7 + k * 3) % known.len()])
                .collect();
            if i % 97 == 5 {
                text.insert(i % text.len(), unknown[i % unknown.len()]);
            }
            text.join(" ")
        })
        .collect();
    // Which fail, from the tokenizer itself: any id past the model's 1,100.
    let tokens = tokenizers::Tokenizer::from_file(&tokenizer).unwrap();
    let fails: Vec<bool> = texts
        .iter()
        .map(|t| {
            let encoding = tokens.encode(t.as_str(), true).unwrap();
            encoding.get_ids().iter().any(|&id| id >= 1_100)
        })
        .collect();
    let failing = fails.iter().filter(|f| **f).count();
    assert!(
        failing > 10 && failing < 1_000,
        "{failing} of the texts fail"
    );
    let input = dir.path().join("texts.parquet");
    write(
        &input,
        vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..2_000)) as ArrayRef,
            ),
            (
                "body",
                Arc::new(datafusion::arrow::array::StringArray::from(texts.clone())),
            ),
        ],
    );
    let output = dir.path().join("vectors.parquet");
    let out = common::output_within(
        common::bin()
            .arg("--warehouse")
            .arg(dir.path().join("wh"))
            .arg("--models")
            .arg(&models)
            .args(["query", "-e"])
            .arg(format!(
                "SET batchinfer.on_error = 'reject';
                 COPY (SELECT id, embed('small', body) AS v FROM '{}') TO '{}' STORED AS PARQUET",
                input.display(),
                output.display()
            )),
        common::DEADLINE,
    );
    assert_ok(&out);
    for batch in read(&[output]) {
        let ids = batch.column(0).as_primitive::<Int64Type>();
        let v = batch.column(1);
        for row in 0..batch.num_rows() {
            let id = ids.value(row) as usize;
            assert_eq!(v.is_null(row), fails[id], "text {id}: {:?}", texts[id]);
        }
    }
    let rejects = read(&parquet_files(&rejects_folder(&out)));
    let mut kept = strings(&rejects, "body");
    kept.sort();
    let mut want: Vec<String> = texts
        .iter()
        .zip(&fails)
        .filter(|(_, f)| **f)
        .map(|(t, _)| t.clone())
        .collect();
    want.sort();
    assert_eq!(kept, want);
    assert!(
        strings(&rejects, "error")
            .iter()
            .all(|e| e.contains("out of data bounds"))
    );
}

#[test]
fn predict_table_rejects_too() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = lookup_input(dir.path());
    let out = query(
        &wh,
        &format!(
            "SET batchinfer.on_error = 'reject';
             SELECT count(*) AS n, count(value) AS scored FROM predict_table('lookup', '{}')",
            input.display()
        ),
    );
    assert_eq!(assert_ok(&out), "n,scored\n20000,19997\n");
    let rejects = read(&parquet_files(&rejects_folder(&out)));
    let idx: Vec<String> = strings(&rejects, "idx");
    assert_eq!(idx, ["99", "99", "99"]);
}

#[test]
fn rejects_keep_no_secret_and_go_only_to_a_usable_folder() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = lookup_input(dir.path());
    let copy = |setting: &str, target: &str, options: &str| {
        query(
            &wh,
            &format!(
                "SET batchinfer.on_error = 'reject'; {setting}
                 COPY (SELECT id, predict('lookup', idx) AS p FROM '{}') TO '{}' STORED AS PARQUET {options}",
                input.display(),
                dir.path().join(target).display()
            ),
        )
    };
    // A password in a URL of any option is blanked in the statement the rejects keep.
    let out = copy(
        "",
        "a.parquet",
        "OPTIONS ('aws.endpoint' 'http://alice:SECRET2@minio:9000', 'aws.secret_access_key' 'SECRET3')",
    );
    assert_ok(&out);
    let rejects = read(&parquet_files(&rejects_folder(&out)));
    for statement in strings(&rejects, "statement") {
        assert!(!statement.contains("SECRET"), "{statement}");
    }
    // A rejects location that is a file, or is a pattern: one error naming the setting, before
    // anything is written.
    std::fs::write(dir.path().join("afile"), "x").unwrap();
    for location in ["afile", "r?x/"] {
        let setting = format!(
            "SET batchinfer.rejects = '{}';",
            dir.path().join(location).display()
        );
        let out = copy(&setting, "b.parquet", "");
        assert_failure(&out, &["batchinfer.rejects"]);
        assert!(!dir.path().join("b.parquet").exists());
    }
    // Inside the warehouse's own folders (a DROP TABLE would delete them, a listing take them
    // for a table), through `..`, or on a server batchinfer only reads: refused the same way.
    let before = common::snapshot(&wh);
    for (location, why) in [
        (wh.join("tables/r").display().to_string(), "tables/"),
        (wh.join("views").display().to_string(), "views/"),
        (wh.join("models/x/").display().to_string(), "models/"),
        (format!("{}/../elsewhere/", wh.display()), "'..'"),
        ("..".to_string(), "'..'"),
        ("http://127.0.0.1:9/rejects/".to_string(), "reads from only"),
    ] {
        let out = copy(
            &format!("SET batchinfer.rejects = '{location}';"),
            "c.parquet",
            "",
        );
        assert_failure(&out, &["batchinfer.rejects", why]);
        assert!(!dir.path().join("c.parquet").exists());
    }
    assert!(common::changes(&before, &common::snapshot(&wh)).is_empty());
}

/// A view keeps the settings it was created with: one created with `on_error = 'reject'` is
/// refreshed by `batchinfer refresh` (which has no SET) with them, and both say where the
/// rejects are kept.
#[test]
fn a_view_keeps_its_own_on_error_and_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let file = |name: &str, ids: std::ops::Range<i64>, failing: i64| {
        let idx: Vec<i64> = ids
            .clone()
            .map(|id| if id == failing { 99 } else { id % 10 })
            .collect();
        write(
            &input.join(name),
            vec![
                (
                    "id",
                    Arc::new(Int64Array::from(ids.collect::<Vec<_>>())) as ArrayRef,
                ),
                ("idx", Arc::new(Int64Array::from(idx))),
            ],
        );
    };
    file("a.parquet", 0..100, 7);
    let out = query(
        &wh,
        &format!(
            "SET batchinfer.on_error = 'reject';
             CREATE MATERIALIZED VIEW v AS SELECT id, predict('lookup', idx) AS p FROM '{}/'",
            input.display()
        ),
    );
    assert_ok(&out);
    let created = rejects_folder(&out);
    assert_eq!(
        read(&parquet_files(&created))
            .iter()
            .map(|b| b.num_rows())
            .sum::<usize>(),
        1
    );
    file("b.parquet", 100..200, 150);
    let out = common::output_within(
        common::bin()
            .arg("--warehouse")
            .arg(&wh)
            .args(["--models", "data/models", "refresh", "v"]),
        common::DEADLINE,
    );
    assert_ok(&out);
    let refreshed = rejects_folder(&out);
    assert_ne!(refreshed, created);
    let rejects = read(&parquet_files(&refreshed));
    assert_eq!(strings(&rejects, "idx"), ["99"]);
    assert_eq!(
        assert_ok(&query(
            &wh,
            "SELECT count(*) AS n, count(p) AS scored FROM v"
        )),
        "n,scored\n200,198\n"
    );
    // The session that refreshes keeps its own settings for what it runs next.
    let out = query(
        &wh,
        "REFRESH MATERIALIZED VIEW v; SELECT predict('lookup', 99) AS p",
    );
    assert_failure(&out, &["model 'lookup' failed"]);
}
