//! A cascade against the LLM alone: `ai_filter` over up to 1,000 distinct pages of real manuals
//! (scripts/documents.sh's PDFs, each page's first 400 characters, in an order that says nothing
//! of their manual), through one llama.cpp server (SmolLM2-135M-Instruct, 4 slots, started here),
//! once with all-MiniLM-L6-v2 as the proxy (target 0.75, a sample of 200) and once with every
//! row sent (`SET batchinfer.llm_proxy = 'none'`), the cache off, each a process of its own, in
//! turn (A B A B): requests, wall time and peak RSS side by side, and how often the cascade's
//! answers are the LLM's.
//!
//! ```sh
//! cargo bench --bench cascade                   # 1,000 pages, 2 pairs
//! cargo bench --bench cascade -- --rows 600 --repeat 3
//! ```

mod common;

#[path = "../tests/fixtures/mod.rs"]
mod fixtures;
#[path = "../tests/llm_server/mod.rs"]
mod llm_server;

use std::process::Command;

use common::{arg, run_measured_saying};

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// The requests a run's summary line says it sent.
fn requests(said: &str) -> u64 {
    let at = said
        .find(" requests")
        .unwrap_or_else(|| panic!("no requests in {said}"));
    let start = said[..at].rfind(' ').map_or(0, |i| i + 1);
    said[start..at].replace(',', "").parse().unwrap()
}

fn main() {
    let rows: usize = arg("--rows").and_then(|v| v.parse().ok()).unwrap_or(1000);
    let repeat: usize = arg("--repeat").and_then(|v| v.parse().ok()).unwrap_or(2);
    let corpus = fixtures::made_by("documents.sh", &[]).join("pdf");
    let models = fixtures::models_with_minilm();
    let server = llm_server::Server::start(&["serve", "--parallel", "4", "--threads", "2"]);
    let url = format!("http://127.0.0.1:{}/v1", server.port);
    let dir = std::path::PathBuf::from("target/bench-data/cascade");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pages = dir.join("pages.parquet");
    let batchinfer = |sql: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        c.arg("--warehouse")
            .arg(dir.join("wh"))
            .arg("--models")
            .arg(&models)
            .args(["--timing", "query", "-e", sql]);
        c
    };
    let made = batchinfer(&format!(
        "COPY (SELECT row_number() OVER (ORDER BY md5(t)) AS id, t FROM (SELECT DISTINCT \
         substr(regexp_replace(text, '\\s+', ' ', 'g'), 1, 400) AS t FROM read_document('{}/') \
         WHERE length(text) > 200) ORDER BY id LIMIT {rows}) TO '{}' STORED AS PARQUET",
        corpus.display(),
        pages.display()
    ))
    .status()
    .unwrap();
    assert!(made.success());
    let question = "Is this text about the bash shell?";
    let job = |proxy: &str, out: &str| {
        batchinfer(&format!(
            "CREATE OR REPLACE MODEL judge OPTIONS ('endpoint' '{url}', 'model' 'smollm2', \
             'temperature' '0', 'seed' '7', 'max_concurrency' '4', 'proxy' 'minilm', \
             'target' '0.75', 'proxy_sample' '200'); SET batchinfer.cache = 'off'; \
             SET batchinfer.llm_proxy = '{proxy}'; \
             COPY (SELECT id, ai_filter('judge', '{question}', t) AS f FROM '{}') TO '{out}' \
             STORED AS PARQUET",
            pages.display()
        ))
    };
    println!(
        "up to {rows} distinct pages, ai_filter, SmolLM2-135M (llama.cpp, 4 slots), proxy all-MiniLM-L6-v2 \
         (target 0.75, sample 200), cache off, {repeat} pairs"
    );
    let (mut cascade, mut alone) = (Vec::new(), Vec::new());
    let mut agreement = Vec::new();
    for i in 0..repeat {
        let a_out = dir.join(format!("cascade{i}.parquet"));
        let b_out = dir.join(format!("alone{i}.parquet"));
        let a = run_measured_saying("cascade", job("minilm", &a_out.display().to_string()));
        let b = run_measured_saying("LLM alone", job("none", &b_out.display().to_string()));
        let (ra, rb) = (requests(&a.2), requests(&b.2));
        println!(
            "pair {i}: cascade {:.2} s, {ra} requests, {:.0} MiB | LLM alone {:.2} s, {rb} \
             requests, {:.0} MiB | requests {:.2}x fewer, {:.2}x faster",
            a.0,
            a.1,
            b.0,
            b.1,
            rb as f64 / ra as f64,
            b.0 / a.0
        );
        let same = Command::new(fixtures::python_readers())
            .args([
                "-c",
                "import sys, pyarrow.parquet as pq\n\
                 a = {r['id']: r['f'] for r in pq.read_table(sys.argv[1]).to_pylist()}\n\
                 b = pq.read_table(sys.argv[2]).to_pylist()\n\
                 print(sum(a[r['id']] == r['f'] for r in b) / len(b))",
            ])
            .arg(&a_out)
            .arg(&b_out)
            .output()
            .unwrap();
        let rate: f64 = String::from_utf8_lossy(&same.stdout)
            .trim()
            .parse()
            .unwrap();
        println!("pair {i}: the cascade's answers are the LLM's on {rate:.3} of the rows");
        agreement.push(rate);
        cascade.push((a.0, a.1, ra as f64));
        alone.push((b.0, b.1, rb as f64));
    }
    let m = |v: &[(f64, f64, f64)], k: usize| {
        median(v.iter().map(|x| [x.0, x.1, x.2][k]).collect::<Vec<_>>())
    };
    println!(
        "cascade: {:.2} s, {:.0} requests, {:.0} MiB | LLM alone: {:.2} s, {:.0} requests, {:.0} \
         MiB | medians; agreement with the LLM alone {:.3}",
        m(&cascade, 0),
        m(&cascade, 2),
        m(&cascade, 1),
        m(&alone, 0),
        m(&alone, 2),
        m(&alone, 1),
        median(agreement)
    );
    drop(server);
}
