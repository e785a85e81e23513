//! Scoring a PostgreSQL table and writing the scores back to another, beside the same job over
//! Parquet: `INSERT INTO scores SELECT id, predict('churn', city, age, spend) ... FROM customers`
//! against a real PostgreSQL server (the tests' one: Debian's package, `initdb` in a temporary
//! folder, over TCP on loopback), and `COPY (the same SELECT FROM 'customers.parquet') TO
//! 'scores.parquet'`. Each run is a process of its own (wall time and peak RSS); the read alone
//! (`SELECT count(*), sum(spend)` over all rows) is measured too.
//!
//! ```sh
//! cargo bench --bench databases                  # 1,000,000 rows
//! cargo bench --bench databases -- --rows 200000
//! ```

#[path = "../tests/postgres/mod.rs"]
mod postgres;

mod common;

use std::process::Command;

use common::{arg, run_measured};
use postgres::Postgres;

const SCORES: &str = "SELECT id, predict('churn', city, age, spend)['label'] AS label, \
                      predict('churn', city, age, spend)['probabilities'][2] AS p";

fn batchinfer(sql: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
    command.args([
        "--format",
        "csv",
        "--models",
        "data/models",
        "query",
        "-e",
        sql,
    ]);
    command
}

fn main() {
    let rows: u64 = arg("--rows")
        .and_then(|r| r.parse().ok())
        .unwrap_or(1_000_000);
    let Some(pg) = Postgres::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("customers.parquet");
    let status = batchinfer(&format!(
        "COPY ({}) TO '{}' STORED AS PARQUET",
        postgres::customers_query(rows),
        parquet.display()
    ))
    .stdout(std::process::Stdio::null())
    .status()
    .unwrap();
    assert!(status.success());
    // The same rows in PostgreSQL, made by PostgreSQL itself.
    pg.psql(&format!(
        "CREATE TABLE customers (id bigint PRIMARY KEY, city text, age real, spend real);
         INSERT INTO customers SELECT i,
           CASE i % 3 WHEN 0 THEN 'paris' WHEN 1 THEN 'berlin' ELSE 'rome' END,
           18 + i % 60, ((i * 7919) % 5000) / 10.0
         FROM generate_series(0::bigint, {}) i;
         CREATE TABLE scores (id bigint, label bigint, p real);",
        rows - 1
    ));
    pg.psql("VACUUM ANALYZE customers");
    let tables = format!(
        "CREATE EXTERNAL TABLE customers STORED AS POSTGRES LOCATION 'customers' {options};
         CREATE EXTERNAL TABLE scores STORED AS POSTGRES LOCATION 'scores' {options};",
        options = pg.options()
    );
    println!("{rows} rows, 2 cores; each run a process of its own, medians of 3\n");
    println!("| job | s | rows/s | peak MiB |");
    println!("| --- | --- | --- | --- |");
    let out = dir.path().join("scores.parquet");
    let jobs: Vec<(&str, String)> = vec![
        (
            "read: Parquet",
            format!("SELECT count(*), sum(spend) FROM '{}'", parquet.display()),
        ),
        (
            "read: PostgreSQL",
            format!("{tables} SELECT count(*), sum(spend) FROM customers"),
        ),
        (
            "score, Parquet to Parquet",
            format!(
                "COPY ({SCORES} FROM '{}') TO '{}' STORED AS PARQUET",
                parquet.display(),
                out.display()
            ),
        ),
        (
            "score, PostgreSQL to PostgreSQL",
            format!("{tables} INSERT INTO scores {SCORES} FROM customers"),
        ),
    ];
    for (name, sql) in jobs {
        let mut runs = Vec::new();
        for _ in 0..3 {
            pg.psql("TRUNCATE scores");
            runs.push(run_measured(name, batchinfer(&sql)));
        }
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (seconds, peak) = runs[1];
        println!(
            "| {name} | {seconds:.2} | {:.0} | {peak:.0} |",
            rows as f64 / seconds
        );
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM scores").trim(),
        rows.to_string(),
        "the last run wrote every row"
    );
}
