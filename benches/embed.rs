//! Embedding benchmark: real English sentences (data/sample/sentences.parquet) from Parquet to
//! Parquet with all-MiniLM-L6-v2 (int8), each contender in a process of its own.
//!
//! ```sh
//! pip install -r benches/requirements.txt
//! cargo bench --bench embed                      # 2,000, 20,000 and 200,000 sentences
//! cargo bench --bench embed -- --rows 2000       # one size of the comparisons
//! ```
//!
//! - batchinfer: `COPY (SELECT id, embed('minilm', body) ...) TO ...`, sorted token-budget
//!   micro-batches (the default), with `--sessions 1` (one call at a time on 2 threads, the
//!   memory of one model call), with `token_budget = 0` (32 rows per call in input order), and
//!   over the same 2,000 sentences in 8 files of 250 rows;
//! - 200,000 sentences (the corpus repeated), batchinfer alone: its peak against its peak at
//!   20,000 (memory must not grow with the input);
//! - a heavy `predict` model: the breast_cancer tree ensemble over 1,000,302 rows, the default
//!   against `--sessions 1`, time and peak;
//! - (a) `benches/python_embed.py`: tokenizers + onnxruntime, 32 rows per batch;
//! - (b) ONNX Runtime alone on already-tokenized input, in the best configuration found among
//!   rows per call (8, 32), sorted or not, and one 2-thread session or two 1-thread sessions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

mod common;

use batchinfer::{Engine, EngineConfig};
use common::{arg, run_measured};
use ort::session::Session;
use ort::value::TensorRef;
use tokenizers::Tokenizer;

fn measure(name: &str, command: Command) -> (f64, f64) {
    run_measured(name, command)
}

/// Runs statements with a default engine.
fn sql(statements: &[String]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let engine = Engine::new(EngineConfig::default()).unwrap();
        for statement in statements {
            engine
                .sql(statement)
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
        }
    });
}

fn sentences(rows: usize, dir: &Path) -> PathBuf {
    let path = dir.join(format!("sentences_{rows}.parquet"));
    if !path.is_file() {
        // The corpus (ids 0 to 23,999) repeated as often as needed, with ids kept distinct.
        sql(&[format!(
            "COPY (SELECT s.id + r.value * 24000 AS id, body FROM 'data/sample/sentences.parquet' s \
             CROSS JOIN range({}) r WHERE s.id + r.value * 24000 < {rows} ORDER BY 1) TO '{}' STORED AS PARQUET",
            rows.div_ceil(24_000),
            path.display()
        )]);
    }
    path
}

/// The first 2,000 sentences in 8 files of 250 rows.
fn small_files(dir: &Path) -> PathBuf {
    let folder = dir.join("sentences_2000_in_8_files");
    if !folder.is_dir() {
        std::fs::create_dir_all(&folder).unwrap();
        let copies: Vec<String> = (0..8)
            .map(|i| {
                format!(
                    "COPY (SELECT id, body FROM 'data/sample/sentences.parquet' WHERE id >= {} AND id < {} ORDER BY id) TO '{}/part-{i}.parquet' STORED AS PARQUET",
                    i * 250,
                    (i + 1) * 250,
                    folder.display()
                )
            })
            .collect();
        sql(&copies);
    }
    folder
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
    // ONNX Runtime alone in a process of its own, so that its peak is its own: one session
    // (2 threads) holding the model, 8 sorted rows per call.
    if let Some(rows) = arg("--ort-alone") {
        let texts = read_texts(&sentences(rows.parse().unwrap(), &dir));
        println!("{}", onnxruntime_alone(&model_dir, &texts, 8, true, 1));
        return;
    }
    println!(
        "machine: {} cores; one run each; peak = max RSS of the process",
        EngineConfig::cores()
    );
    let mut peaks = Vec::new();
    for rows in sizes {
        let input = sentences(rows, &dir);
        let texts = read_texts(&input);
        let out = |name: &str| dir.join(format!("embed_{name}_{rows}.parquet"));
        let batchinfer = || {
            measure(
                "batchinfer",
                embed_command(&models, &input, &out("sorted"), 256, &[]),
            )
        };
        let mut bi_runs = Vec::new();
        let (one_s, one_mib) = measure(
            "batchinfer --sessions 1",
            embed_command(&models, &input, &out("one"), 256, &["--sessions", "1"]),
        );
        // The same sentences in 8 files of 250 rows (at 2,000), run as often as the one file.
        let small = (rows == 2_000).then(|| small_files(&dir));
        let small_run = || {
            small.as_ref().map_or(f64::NAN, |files| {
                measure(
                    "batchinfer 8 files",
                    embed_command(&models, files, &out("files"), 256, &[]),
                )
                .0
            })
        };
        let mut small_runs = Vec::new();
        // The unsorted comparison is made on the smaller corpus only (it takes as long again).
        let naive_s = if rows <= 2_000 {
            measure(
                "batchinfer naive",
                embed_command(&models, &input, &out("naive"), 0, &[]),
            )
            .0
        } else {
            f64::NAN
        };
        let mut alone = Command::new(std::env::current_exe().unwrap());
        alone.args(["--ort-alone", &rows.to_string()]);
        let (alone_s, alone_mib) = measure("onnxruntime alone, one session", alone);
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
        let mut best = (f64::MAX, String::new(), (0, false, 0));
        for (per_call, sorted, sessions) in configs {
            let s = onnxruntime_alone(&model_dir, &texts, per_call, sorted, sessions);
            let label = format!(
                "{per_call} rows/call, {}, {sessions} session(s) x {} thread(s)",
                if sorted { "sorted" } else { "unsorted" },
                (EngineConfig::cores() / sessions).max(1)
            );
            println!("  (b) candidate {label}: {:.1} rows/s", rows as f64 / s);
            if s < best.0 {
                best = (s, label, (per_call, sorted, sessions));
            }
        }
        // batchinfer, the 8 files and (b)'s best, one after the other, `rounds` times: the ratio
        // is of the medians (this machine's noise between runs is several percent). All are run
        // once (b)'s configuration is chosen: the run that chose it, the fastest of six noisy
        // runs, would favour (b).
        let rounds = if rows <= 2_000 { 5 } else { 3 };
        let mut b_runs = Vec::new();
        for _ in 0..rounds {
            bi_runs.push(batchinfer());
            small_runs.push(small_run());
            let (per_call, sorted, sessions) = best.2;
            b_runs.push(onnxruntime_alone(
                &model_dir, &texts, per_call, sorted, sessions,
            ));
        }
        println!(
            "  runs, batchinfer / (b) / 8 files s: {}",
            bi_runs
                .iter()
                .zip(&b_runs)
                .zip(&small_runs)
                .map(|(((bi, _), b), small)| format!("{bi:.2} / {b:.2} / {small:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let bi_s = median(bi_runs.iter().map(|r| r.0).collect());
        let small_s = median(small_runs);
        let bi_mib = median(bi_runs.iter().map(|r| r.1).collect());
        best.0 = median(b_runs);
        let rate = |s: f64| rows as f64 / s;
        println!("\n{rows} sentences");
        println!("| contender | wall s | rows/s | peak MiB |");
        println!("|---|---|---|---|");
        println!(
            "| batchinfer embed (sorted, token budget 256), median of {rounds} | {bi_s:.1} | {:.1} | {bi_mib:.0} |",
            rate(bi_s)
        );
        println!(
            "| batchinfer embed, `--sessions 1` | {one_s:.1} | {:.1} | {one_mib:.0} |",
            rate(one_s)
        );
        println!(
            "| batchinfer embed, the same rows in 8 files of 250, median of {rounds} | {small_s:.1} | {:.1} | - |",
            rate(small_s)
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
            "| (b) ONNX Runtime alone, best: {}, median of {rounds} | {:.1} | {:.1} | - |",
            best.1,
            best.0,
            rate(best.0)
        );
        println!(
            "| (b) ONNX Runtime alone, one session of 2 threads, 8 rows/call sorted, a process of its own (wall: with start-up and tokenizing) | {alone_s:.1} | {:.1} | {alone_mib:.0} |",
            rate(alone_s)
        );
        println!(
            "ratios: batchinfer/(b) {:.3}x [>= {}], batchinfer/(a) {:.2}x, peak batchinfer/(a) {:.2}x, \
             peak default/--sessions 1 {:.2}x [<= 1.15], peak batchinfer/ONNX Runtime alone {:.2}x, rows/s default/--sessions 1 {:.2}x, \
             8 files/one file {:.3}x [>= 0.95], sorted/naive {:.2}x\n",
            rate(bi_s) / rate(best.0),
            if rows <= 2_000 { "0.97" } else { "0.99" },
            rate(bi_s) / rate(py_s),
            bi_mib / py_mib,
            bi_mib / one_mib,
            bi_mib / alone_mib,
            rate(bi_s) / rate(one_s),
            rate(small_s) / rate(bi_s),
            rate(bi_s) / rate(naive_s)
        );
        peaks.push((rows, bi_s, bi_mib));
    }
    if arg("--rows").is_none() {
        let rows = 200_000;
        let input = sentences(rows, &dir);
        let out = dir.join("embed_sorted_200000.parquet");
        let (s, mib) = measure(
            "batchinfer 200k",
            embed_command(&models, &input, &out, 256, &[]),
        );
        println!(
            "\n{rows} sentences, batchinfer alone: {s:.1} s, {:.1} rows/s, peak {mib:.0} MiB",
            rows as f64 / s
        );
        if let Some((_, _, at_20k)) = peaks.iter().find(|(r, _, _)| *r == 20_000) {
            println!(
                "peak at 200,000 / peak at 20,000: {:.2}x [<= 1.2]",
                mib / at_20k
            );
        }
    }
    heavy_predict(&dir);
}

/// The sentences of `input`, in id order.
fn read_texts(input: &Path) -> Vec<String> {
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
}

/// `COPY (SELECT id, embed('minilm', body) ...)` from `input` (a file or a folder) to `out`.
fn embed_command(
    models: &Path,
    input: &Path,
    out: &Path,
    budget: usize,
    flags: &[&str],
) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
    c.args(["query", "--models"]).arg(models).args(flags).args([
        "-e",
        &format!(
            "SET batchinfer.token_budget = {budget}; COPY (SELECT id, embed('minilm', body) AS v FROM '{}') TO '{}' STORED AS PARQUET",
            input.display(),
            out.display()
        ),
    ]);
    c
}

/// The breast_cancer tree ensemble over 1,000,302 rows: the default against `--sessions 1`.
fn heavy_predict(dir: &Path) {
    let input = dir.join("breast_cancer_1m.parquet");
    // The model's 30 inputs: every column of its table but the id.
    let columns = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let engine = Engine::new(EngineConfig::default()).unwrap();
        let table = engine
            .sql("SELECT * FROM 'data/sample/breast_cancer.parquet'")
            .await
            .unwrap();
        let names: Vec<String> = table
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|name| name != "id")
            .collect();
        names.join(", ")
    });
    if !input.is_file() {
        sql(&[format!(
            "COPY (SELECT b.id + r.value * 1000 AS id, {columns} FROM 'data/sample/breast_cancer.parquet' b \
             CROSS JOIN range(1758) r) TO '{}' STORED AS PARQUET",
            input.display()
        )]);
    }
    let command = |flags: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        c.args(["query", "--models", "data/models"]).args(flags).args([
            "-e",
            &format!(
                "COPY (SELECT id, predict('breast_cancer', {columns}) AS p FROM '{}') TO '{}' STORED AS PARQUET",
                input.display(),
                dir.join("breast_cancer_scores.parquet").display()
            ),
        ]);
        c
    };
    let (s, mib) = measure("predict breast_cancer", command(&[]));
    let (one_s, one_mib) = measure(
        "predict breast_cancer --sessions 1",
        command(&["--sessions", "1"]),
    );
    println!("\nbreast_cancer tree ensemble, 1,000,302 rows");
    println!("| contender | wall s | peak MiB |");
    println!("|---|---|---|");
    println!("| batchinfer `predict` (default: 2 calls at a time) | {s:.2} | {mib:.0} |");
    println!("| batchinfer `predict`, `--sessions 1` | {one_s:.2} | {one_mib:.0} |");
    println!(
        "peak default/--sessions 1 {:.2}x [<= 1.15], speed {:.2}x",
        mib / one_mib,
        one_s / s
    );
}
