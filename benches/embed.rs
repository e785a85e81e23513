//! Embedding benchmark: real English sentences (data/sample/sentences.parquet) from Parquet to
//! Parquet with all-MiniLM-L6-v2 (int8), each contender in a process of its own.
//!
//! ```sh
//! pip install -r benches/requirements.txt
//! cargo bench --bench embed                      # 2,000 and 20,000 sentences
//! cargo bench --bench embed -- --rows 2000       # one size
//! ```
//!
//! - batchinfer: `COPY (SELECT id, embed('minilm', body) ...) TO ...`, sorted token-budget
//!   micro-batches (the default), and with `token_budget = 0` (32 rows per call in input order);
//! - (a) `benches/python_embed.py`: tokenizers + onnxruntime, 32 rows per batch;
//! - (b) ONNX Runtime alone on already-tokenized input, in the best configuration found among
//!   rows per call (8, 32), sorted or not, and one 2-thread session or two 1-thread sessions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod common;

use batchinfer::{Engine, EngineConfig};
use common::run_measured;
use ort::session::Session;
use ort::value::TensorRef;
use tokenizers::Tokenizer;

fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn measure(name: &str, command: Command) -> (f64, f64) {
    run_measured(name, command)
}

fn sentences(rows: usize, dir: &Path) -> PathBuf {
    let path = dir.join(format!("sentences_{rows}.parquet"));
    if !path.is_file() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let engine = Engine::new(EngineConfig::default()).unwrap();
            let sql = format!(
                "COPY (SELECT id, body FROM 'data/sample/sentences.parquet' WHERE id < {rows} ORDER BY id) TO '{}' STORED AS PARQUET",
                path.display()
            );
            engine.sql(&sql).await.unwrap().collect().await.unwrap();
        });
    }
    path
}

/// One pre-built call: rows, padded length, and the three input tensors' data.
type Call = (usize, usize, Vec<i64>, Vec<i64>, Vec<i64>);

/// (b): ONNX Runtime alone on pre-tokenized input; returns seconds for one configuration.
fn onnxruntime_alone(
    model_dir: &Path,
    texts: &[String],
    rows_per_call: usize,
    sorted: bool,
    sessions: usize,
) -> f64 {
    let env = batchinfer::device::Target::Cpu.environment().unwrap();
    let mut tokenizer = Tokenizer::from_file(model_dir.join("tokenizer.json")).unwrap();
    tokenizer
        .with_truncation(Some(tokenizers::TruncationParams {
            max_length: 256,
            ..Default::default()
        }))
        .unwrap();
    // tokenizer.json asks for padding to the longest text of each encode_batch call: off, so that
    // each call below is padded to its own longest row only.
    tokenizer.with_padding(None);
    let encodings = tokenizer.encode_batch(texts.to_vec(), true).unwrap();
    let mut order: Vec<usize> = (0..texts.len()).collect();
    if sorted {
        order.sort_by_key(|&i| encodings[i].len());
    }
    // Padded tensors for every call, built before the clock starts.
    let calls: Vec<Call> = order
        .chunks(rows_per_call)
        .map(|rows| {
            let len = rows.iter().map(|&r| encodings[r].len()).max().unwrap();
            let (mut ids, mut mask, types) = (
                vec![0i64; rows.len() * len],
                vec![0i64; rows.len() * len],
                vec![0i64; rows.len() * len],
            );
            for (i, &r) in rows.iter().enumerate() {
                for (t, (&id, &m)) in encodings[r]
                    .get_ids()
                    .iter()
                    .zip(encodings[r].get_attention_mask())
                    .enumerate()
                {
                    ids[i * len + t] = id as i64;
                    mask[i * len + t] = m as i64;
                }
            }
            (rows.len(), len, ids, mask, types)
        })
        .collect();
    let threads = (EngineConfig::cores() / sessions).max(1);
    let mut pool: Vec<Session> = (0..sessions)
        .map(|_| {
            Session::builder(env)
                .unwrap()
                .with_intra_threads(threads)
                .unwrap()
                .commit_from_file(model_dir.join("model.onnx"))
                .unwrap()
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for session in pool.iter_mut() {
            let (calls, next) = (&calls, &next);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((n, len, ids, mask, types)) = calls.get(i) else { break };
                    let shape = [*n, *len];
                    let out = session
                        .run(ort::inputs![
                            "input_ids" => TensorRef::from_array_view((shape, ids.as_slice())).unwrap(),
                            "attention_mask" => TensorRef::from_array_view((shape, mask.as_slice())).unwrap(),
                            "token_type_ids" => TensorRef::from_array_view((shape, types.as_slice())).unwrap()
                        ])
                        .unwrap();
                    std::hint::black_box(out[0].try_extract_tensor::<f32>().unwrap().1[0]);
                }
            });
        }
    });
    start.elapsed().as_secs_f64()
}

fn main() {
    let sizes: Vec<usize> = match arg("--rows") {
        Some(r) => vec![r.parse().unwrap()],
        None => vec![2_000, 20_000],
    };
    let python = arg("--python").unwrap_or_else(|| "python3".into());
    let fetched = Command::new("bash")
        .arg("scripts/fetch_minilm.sh")
        .output()
        .unwrap();
    assert!(fetched.status.success());
    let model_dir = PathBuf::from(String::from_utf8(fetched.stdout).unwrap().trim());
    let dir = PathBuf::from("target/bench-data");
    let models = dir.join("text-models");
    std::fs::create_dir_all(&models).unwrap();
    let link = models.join("minilm");
    if !link.exists() {
        std::os::unix::fs::symlink(&model_dir, &link).unwrap();
    }
    println!(
        "machine: {} cores; one run each; peak = max RSS of the process",
        EngineConfig::cores()
    );
    for rows in sizes {
        let input = sentences(rows, &dir);
        let texts: Vec<String> = {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let engine = Engine::new(EngineConfig::default()).unwrap();
                let sql = format!("SELECT body FROM '{}' ORDER BY id", input.display());
                let batches = engine.sql(&sql).await.unwrap().collect().await.unwrap();
                batches
                    .iter()
                    .flat_map(|b| {
                        let col = datafusion::arrow::compute::cast(
                            b.column(0),
                            &datafusion::arrow::datatypes::DataType::Utf8,
                        )
                        .unwrap();
                        datafusion::arrow::array::AsArray::as_string::<i32>(&col)
                            .iter()
                            .map(|s| s.unwrap().to_string())
                            .collect::<Vec<_>>()
                    })
                    .collect()
            })
        };
        let out = |name: &str| dir.join(format!("embed_{name}_{rows}.parquet"));
        let batchinfer = |budget: usize, name: &str| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
            c.args(["query", "--models"]).arg(&models).args([
                "-e",
                &format!(
                    "SET batchinfer.token_budget = {budget}; COPY (SELECT id, embed('minilm', body) AS v FROM '{}') TO '{}' STORED AS PARQUET",
                    input.display(),
                    out(name).display()
                ),
            ]);
            c
        };
        let (bi_s, bi_mib) = measure("batchinfer", batchinfer(256, "sorted"));
        // The unsorted comparison is made on the smaller corpus only (it takes as long again).
        let naive_s = if rows <= 2_000 {
            measure("batchinfer naive", batchinfer(0, "naive")).0
        } else {
            f64::NAN
        };
        let mut py = Command::new(&python);
        py.arg("benches/python_embed.py")
            .arg(&model_dir)
            .arg(&input)
            .arg(out("python"));
        let (py_s, py_mib) = measure("python", py);
        let configs: Vec<(usize, bool, usize)> = if rows <= 2_000 {
            vec![
                (4, true, 2),
                (8, true, 2),
                (16, true, 2),
                (8, true, 1),
                (32, true, 2),
                (32, false, 1),
            ]
        } else {
            vec![(8, true, 2)]
        };
        let mut best = (f64::MAX, String::new());
        for (per_call, sorted, sessions) in configs {
            let s = onnxruntime_alone(&model_dir, &texts, per_call, sorted, sessions);
            let label = format!(
                "{per_call} rows/call, {}, {sessions} session(s) x {} thread(s)",
                if sorted { "sorted" } else { "unsorted" },
                (EngineConfig::cores() / sessions).max(1)
            );
            println!("  (b) candidate {label}: {:.1} rows/s", rows as f64 / s);
            if s < best.0 {
                best = (s, label);
            }
        }
        let rate = |s: f64| rows as f64 / s;
        println!("\n{rows} sentences");
        println!("| contender | wall s | rows/s | peak MiB |");
        println!("|---|---|---|---|");
        println!(
            "| batchinfer embed (sorted, token budget 256) | {bi_s:.1} | {:.1} | {bi_mib:.0} |",
            rate(bi_s)
        );
        println!(
            "| batchinfer embed, 32 rows/call unsorted | {naive_s:.1} | {:.1} | - |",
            rate(naive_s)
        );
        println!(
            "| (a) Python: tokenizers + onnxruntime, 32 rows/batch | {py_s:.1} | {:.1} | {py_mib:.0} |",
            rate(py_s)
        );
        println!(
            "| (b) ONNX Runtime alone, best: {} | {:.1} | {:.1} | - |",
            best.1,
            best.0,
            rate(best.0)
        );
        println!(
            "ratios: batchinfer/(b) {:.2}x [>= 0.95], batchinfer/(a) {:.2}x [>= 1.05], peak batchinfer/(a) {:.2}x [< 0.5], sorted/naive {:.2}x\n",
            rate(bi_s) / rate(best.0),
            rate(bi_s) / rate(py_s),
            bi_mib / py_mib,
            rate(bi_s) / rate(naive_s)
        );
    }
}
