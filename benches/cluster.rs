//! One process against a Ballista cluster of one and of two executors, on this machine.
//!
//! ```text
//! cargo bench --bench cluster
//! ```
//! Two workloads, each read from 8 Parquet files and written back as Parquet with COPY:
//! - embed: all-MiniLM-L6-v2 (int8) over 2,000 real sentences (the model is nearly all the cost);
//! - score: `Linear(10 -> 1)` over 8 x 10,000 rows (the model is nearly free: the cluster's own
//!   overhead shows).
//!
//! The cluster runs on the same machine as the single process: on 2 cores, two executors of one
//! task each share the cores that one executor of two tasks has, so the comparison shows what
//! the cluster layer costs here, not what more machines would give.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::run_measured;

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_batchinfer"))
}

fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

/// A scheduler with `executors` executors of `tasks` tasks each; killed on drop.
struct Cluster {
    processes: Vec<Child>,
    remote: String,
}

impl Cluster {
    fn start(executors: usize, tasks: usize, models: &Path, work: &Path) -> Cluster {
        let port = free_port();
        let mut processes = vec![
            bin()
                .env("BATCHINFER_WAREHOUSE", work.join("wh"))
                .args(["scheduler", "--bind", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        ];
        for i in 0..executors {
            processes.push(
                bin()
                    .env("BATCHINFER_WAREHOUSE", work.join("wh"))
                    .args(["executor", "--scheduler", &format!("127.0.0.1:{port}")])
                    .args(["--port", &free_port().to_string()])
                    .args(["--concurrent-tasks", &tasks.to_string(), "--models"])
                    .arg(models)
                    .arg("--work-dir")
                    .arg(work.join(format!("executor-{executors}-{i}")))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        let cluster = Cluster {
            processes,
            remote: format!("df://127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while !bin()
            .args(["--remote", &cluster.remote, "query", "-e", "SELECT 1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
        {
            assert!(started.elapsed() < Duration::from_secs(60), "no cluster");
            std::thread::sleep(Duration::from_millis(300));
        }
        std::thread::sleep(Duration::from_secs(2));
        cluster
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in &mut self.processes {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

fn split(source: &str, filter: &str, dir: &Path) {
    let script: String = (0..8)
        .map(|k| {
            format!(
                "COPY (SELECT * FROM '{source}' WHERE {filter} AND id % 8 = {k}) TO '{}' STORED AS PARQUET;",
                dir.join(format!("part-{k}.parquet")).display()
            )
        })
        .collect();
    assert!(
        bin()
            .args(["query", "-e", &script])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    );
}

fn main() {
    let fetched = Command::new("bash")
        .arg("scripts/fetch_minilm.sh")
        .output()
        .unwrap();
    assert!(fetched.status.success());
    let work = tempfile::tempdir().unwrap();
    let models = work.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model_dir = PathBuf::from(String::from_utf8(fetched.stdout).unwrap().trim());
    std::os::unix::fs::symlink(model_dir, models.join("minilm")).unwrap();
    std::fs::copy("data/models/linear.onnx", models.join("linear.onnx")).unwrap();
    let text = work.path().join("text");
    let features = work.path().join("features");
    std::fs::create_dir_all(&text).unwrap();
    std::fs::create_dir_all(&features).unwrap();
    split("data/sample/sentences.parquet", "id < 2000", &text);
    for k in 0..8 {
        std::fs::copy(
            "data/sample/features.parquet",
            features.join(format!("part-{k}.parquet")),
        )
        .unwrap();
    }
    let workloads = [
        (
            "embed 2,000 sentences",
            format!(
                "SELECT id, embed('minilm', body) AS v FROM '{}/'",
                text.display()
            ),
            2_000.0,
        ),
        (
            "score 80,000 rows",
            format!(
                "SELECT id, predict('linear', {FEATURES}) AS p FROM '{}/'",
                features.display()
            ),
            80_000.0,
        ),
    ];
    let setups: [(&str, Option<(usize, usize)>); 3] = [
        ("one process (2 partitions)", None),
        ("cluster: 1 executor x 2 tasks", Some((1, 2))),
        ("cluster: 2 executors x 1 task", Some((2, 1))),
    ];
    println!("| workload | setup | wall (s) | rows/s | vs one process |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for (name, query, rows) in &workloads {
        let mut baseline = None;
        for (setup, cluster) in &setups {
            let cluster = cluster.map(|(e, t)| Cluster::start(e, t, &models, work.path()));
            let out = work.path().join(format!("out-{}", rand_suffix()));
            let mut command = bin();
            command.env("BATCHINFER_WAREHOUSE", work.path().join("wh"));
            if let Some(c) = &cluster {
                command.args(["--remote", &c.remote]);
            }
            command.arg("--models").arg(&models).args([
                "query",
                "-e",
                &format!("COPY ({query}) TO '{}/' STORED AS PARQUET", out.display()),
            ]);
            let (seconds, _) = run_measured(setup, command);
            let base = *baseline.get_or_insert(seconds);
            println!(
                "| {name} | {setup} | {seconds:.2} | {:.0} | {:.2}x |",
                rows / seconds,
                base / seconds
            );
        }
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
