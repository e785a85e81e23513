//! `generate` against a Python asyncio client: the same chat requests (`Say a word about the
//! number i`, `max_tokens` 8, temperature 0) to the same llama.cpp server (SmolLM2-135M-Instruct,
//! `n_parallel` 4, started here from scripts/llm_server.py), at the same concurrency (4), each
//! contender a process of its own, in turn (A B A B), wall time and peak RSS; then batchinfer
//! again with its cache on, after a run that filled it (the re-run of a job).
//!
//! ```sh
//! cargo bench --bench llm                       # 2,000 prompts, 2 pairs
//! cargo bench --bench llm -- --prompts 500 --repeat 3
//! ```

mod common;

#[path = "../tests/fixtures/mod.rs"]
mod fixtures;
#[path = "../tests/llm_server/mod.rs"]
mod llm_server;

use std::process::Command;

use common::{arg, run_measured};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    let prompts: usize = arg("--prompts")
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let repeat: usize = arg("--repeat").and_then(|v| v.parse().ok()).unwrap_or(2);
    let python = llm_server::python();
    let pip = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("httpx==0.28.1")
        .status()
        .unwrap();
    assert!(pip.success(), "pip install httpx");
    let server = llm_server::Server::start(&["serve", "--parallel", "4", "--threads", "2"]);
    let port = server.port;
    let url = format!("http://127.0.0.1:{port}/v1");
    let dir = std::path::PathBuf::from("target/bench-data/llmbench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let batchinfer = |cache: &str, out: &str| {
        let sql = format!(
            "CREATE OR REPLACE MODEL m OPTIONS ('endpoint' '{url}', 'model' 'smollm2', \
             'max_tokens' '8', 'temperature' '0', 'seed' '7', 'max_concurrency' '4'); \
             SET batchinfer.cache = '{cache}'; SET batchinfer.on_error = 'null'; \
             COPY (SELECT value AS id, generate('m', 'Say a word about the number ' || \
             CAST(value AS VARCHAR)) AS g FROM range({prompts})) TO '{out}'"
        );
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        c.arg("--warehouse")
            .arg(dir.join("wh"))
            .args(["query", "-e", &sql]);
        c
    };
    let client = || {
        let mut c = Command::new(&python);
        c.arg("benches/python_llm.py")
            .args([url.as_str(), &prompts.to_string(), "4", "8"]);
        c
    };
    println!(
        "{prompts} prompts, max_tokens 8, concurrency 4, llama.cpp n_parallel 4, {repeat} pairs"
    );
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..repeat {
        let out = dir.join(format!("out{i}.parquet")).display().to_string();
        let a = run_measured("batchinfer", batchinfer("off", &out));
        let b = run_measured("python", client());
        // Throughput ratio: theirs over ours in time.
        ratios.push(b.0 / a.0);
        println!(
            "pair {i}: batchinfer {:.2} s ({:.0} MiB), python asyncio + httpx {:.2} s ({:.0} MiB)",
            a.0, a.1, b.0, b.1
        );
        ours.push(a);
        theirs.push(b);
    }
    let secs = |v: &[(f64, f64)]| median(v.iter().map(|x| x.0).collect());
    let peak = |v: &[(f64, f64)]| median(v.iter().map(|x| x.1).collect());
    println!(
        "batchinfer generate (cache off): {:>7.2} s {:>5.0} MiB, {:.1} prompts/s | python asyncio \
         + httpx: {:>7.2} s {:>5.0} MiB, {:.1} prompts/s | batchinfer's throughput over python's, \
         median of pairs: {:.2}x",
        secs(&ours),
        peak(&ours),
        prompts as f64 / secs(&ours),
        secs(&theirs),
        peak(&theirs),
        prompts as f64 / secs(&theirs),
        median(ratios)
    );
    // The cache: one run fills it, the next is answered from it.
    let out = dir.join("filled.parquet").display().to_string();
    let fill = run_measured("batchinfer, cache on (filling)", batchinfer("on", &out));
    let out = dir.join("cached.parquet").display().to_string();
    let cached = run_measured("batchinfer, cache on (re-run)", batchinfer("on", &out));
    println!(
        "batchinfer, cache on: first run {:.2} s, re-run from the cache {:.2} s ({:.0} MiB)",
        fill.0, cached.0, cached.1
    );
    drop(server);
}
