//! Materialized views: what a refresh costs, over 1,000 input files of 10,000 rows each.
//!
//! ```sh
//! cargo bench --bench views                      # 1,000 files of 10,000 rows
//! cargo bench --bench views -- --files 200 --rows 50000
//! ```
//!
//! In one run, each in a batchinfer process of its own (`--timing`: the statement's own time):
//! - the first refresh (CREATE MATERIALIZED VIEW) beside the same `CREATE TABLE ... AS`;
//! - a refresh that finds nothing new, and one that finds one new file, each as the second
//!   statement of a process (as in `batchinfer refresh --every`/`--watch`, where the process
//!   and its models are already loaded); the first statement is the same refresh.

use std::path::Path;
use std::process::Command;

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seconds of each statement of `sql`, from the `--timing` lines.
fn timed(warehouse: &Path, sql: &str) -> Vec<f64> {
    let out = Command::new(env!("CARGO_BIN_EXE_batchinfer"))
        .arg("--warehouse")
        .arg(warehouse)
        .args(["--models", "data/models", "--timing", "query", "-e", sql])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{sql}: {stderr}");
    stderr
        .lines()
        .filter_map(|line| {
            let at = line.find(" s")?;
            let number = line[..at].rsplit(' ').next()?;
            line.contains(" in ").then(|| number.parse().ok())?
        })
        .collect()
}

fn main() {
    let files = arg("--files", 1_000);
    let rows = arg("--rows", 10_000);
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let one = work.path().join("one.parquet");
    let cols: Vec<String> = (0..10)
        .map(|j| format!("CAST(random() AS FLOAT) AS f{j}"))
        .collect();
    timed(
        &work.path().join("wh-gen"),
        &format!(
            "COPY (SELECT value AS id, {} FROM range({rows})) TO '{}' STORED AS PARQUET",
            cols.join(", "),
            one.display()
        ),
    );
    for k in 0..files {
        std::fs::copy(&one, input.join(format!("part-{k:05}.parquet"))).unwrap();
    }
    let query = format!(
        "SELECT id, predict('linear', {FEATURES}) AS p FROM '{}/'",
        input.display()
    );
    let total = files * rows;
    println!("views: {files} input files of {rows} rows ({total} rows)");
    let ctas = timed(
        &work.path().join("wh-table"),
        &format!("CREATE TABLE t AS {query}"),
    )[0];
    let wh = work.path().join("wh-view");
    let first = timed(&wh, &format!("CREATE MATERIALIZED VIEW v AS {query}"))[0];
    let noop = timed(
        &wh,
        "REFRESH MATERIALIZED VIEW v; REFRESH MATERIALIZED VIEW v",
    );
    std::fs::copy(&one, input.join("part-new.parquet")).unwrap();
    let one_new = timed(&wh, "SELECT count(*) FROM v; REFRESH MATERIALIZED VIEW v");
    println!("| step | seconds |");
    println!("| --- | --- |");
    println!("| CREATE TABLE ... AS (all files) | {ctas:.3} |");
    println!(
        "| CREATE MATERIALIZED VIEW (first refresh) | {first:.3} ({:.2}x the table) |",
        first / ctas
    );
    println!(
        "| REFRESH, nothing new (first statement of a process / second) | {:.3} / {:.3} |",
        noop[0], noop[1]
    );
    println!(
        "| REFRESH, one new file of {rows} rows | {:.3} |",
        one_new[1]
    );
}
