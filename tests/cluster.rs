//! The same SQL on a DataFusion Ballista cluster: a scheduler and two executors started as real
//! processes of this binary on loopback ports, checked against the single-process run.

mod common;
mod fixtures;
mod llm_server;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";

fn bin() -> Command {
    common::binary()
}

/// A port that was free a moment ago, with the next one free too (an executor uses both).
fn free_port_pair() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

/// A scheduler and executors; all are killed when it is dropped.
struct Cluster {
    scheduler: Child,
    executors: Vec<Child>,
    port: u16,
    _work: tempfile::TempDir,
}

impl Cluster {
    /// Executors get `--models models` when given (else they know only what the client sends).
    fn start(executors: usize, models: Option<&Path>) -> Cluster {
        Self::start_with(executors, models, &[])
    }

    /// [`Cluster::start`], with more arguments for the scheduler.
    fn start_with(executors: usize, models: Option<&Path>, scheduler_args: &[&str]) -> Cluster {
        let work = tempfile::tempdir().unwrap();
        let port = free_port_pair();
        let quiet = |c: &mut Command| {
            c.stdout(Stdio::null()).stderr(Stdio::null());
        };
        let mut scheduler = bin();
        scheduler
            .env("BATCHINFER_WAREHOUSE", work.path().join("wh"))
            .args(["scheduler", "--bind", &format!("127.0.0.1:{port}")])
            .args(scheduler_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.path().join("scheduler.log")).unwrap());
        let scheduler = scheduler.spawn().unwrap();
        let mut cluster = Cluster {
            scheduler,
            executors: Vec::new(),
            port,
            _work: work,
        };
        for i in 0..executors {
            let mut executor = bin();
            executor
                .env("BATCHINFER_WAREHOUSE", cluster._work.path().join("wh"))
                .args(["executor", "--scheduler", &format!("127.0.0.1:{port}")])
                .args([
                    "--port",
                    &free_port_pair().to_string(),
                    "--concurrent-tasks",
                    "2",
                ])
                .arg("--work-dir")
                .arg(cluster._work.path().join(format!("executor-{i}")));
            if let Some(models) = models {
                executor.arg("--models").arg(models);
            }
            quiet(&mut executor);
            cluster.executors.push(executor.spawn().unwrap());
        }
        cluster.wait_ready(executors);
        cluster
    }

    /// What the scheduler said on stderr so far.
    fn scheduler_log(&self) -> String {
        std::fs::read_to_string(self._work.path().join("scheduler.log")).unwrap_or_default()
    }

    /// The work folder of executor `i` (shuffle files, by job and stage).
    fn work_dir(&self, i: usize) -> std::path::PathBuf {
        self._work.path().join(format!("executor-{i}"))
    }

    fn remote(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// Runs `sql` on the cluster with the client's `--models`.
    fn query(&self, models: Option<&Path>, sql: &str) -> Output {
        self.query_as("client", models, sql)
    }

    /// [`Cluster::query`] from the client `client`, with a warehouse of its own.
    fn query_as(&self, client: &str, models: Option<&Path>, sql: &str) -> Output {
        let mut command = bin();
        command
            .env(
                "BATCHINFER_WAREHOUSE",
                self._work.path().join(format!("{client}-wh")),
            )
            .args(["--format", "csv", "--remote", &self.remote()]);
        if let Some(models) = models {
            command.arg("--models").arg(models);
        }
        common::output_within(command.args(["query", "-e", sql]), common::DEADLINE)
    }

    /// Waits until the scheduler says that all `executors` registered (it says so on stderr
    /// whenever the number changes).
    fn wait_ready(&self, executors: usize) {
        let ready = format!("batchinfer scheduler: {executors} executor(s) registered");
        let listening = "batchinfer scheduler listening";
        common::poll_until(Duration::from_secs(90), "the cluster coming up", || {
            let log = self.scheduler_log();
            if executors == 0 {
                log.contains(listening)
            } else {
                log.contains(&ready)
            }
        });
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.executors.iter_mut().chain([&mut self.scheduler]) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "batchinfer failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The single-process run of `sql`.
fn local(models: &Path, sql: &str) -> String {
    let out = common::output_within(
        bin()
            .env(
                "BATCHINFER_WAREHOUSE",
                std::env::temp_dir().join("batchinfer-cluster-test-wh"),
            )
            .args(["--format", "csv", "--models"])
            .arg(models)
            .args(["query", "-e", sql]),
        common::DEADLINE,
    );
    ok(&out)
}

/// `n` Parquet files splitting `source` (its rows with `filter`) by `id % n`.
fn split_into_files(source: &str, filter: &str, n: usize, dir: &Path) {
    let script: String = (0..n)
        .map(|k| {
            format!(
                "COPY (SELECT * FROM '{source}' WHERE {filter} AND id % {n} = {k}) TO '{}' STORED AS PARQUET;",
                dir.join(format!("part-{k}.parquet")).display()
            )
        })
        .collect();
    local(Path::new("data/models"), &script);
}

#[test]
fn scoring_and_embedding_on_two_executors_give_the_rows_of_one_process() {
    let data = tempfile::tempdir().unwrap();
    split_into_files("data/sample/features.parquet", "true", 8, data.path());
    let text = tempfile::tempdir().unwrap();
    split_into_files("data/sample/sentences.parquet", "id < 240", 8, text.path());
    let models = fixtures::models_with_minilm();
    let cluster = Cluster::start(2, Some(&models));

    // The same files in one process: the same record batches reach the model, so the same bits.
    let sql = format!(
        "SELECT id, predict('linear', {FEATURES}) AS p FROM '{}/'",
        data.path().display()
    );
    let remote = common::rows(&ok(&cluster.query(Some(&models), &sql)));
    assert_eq!(remote.len(), 10_000);
    common::assert_same_rows(&remote, &common::rows(&local(&models, &sql)), 0.0);

    let sql = format!(
        "SELECT id, embed('minilm', body) AS v FROM '{}/'",
        text.path().display()
    );
    let remote = common::rows(&ok(&cluster.query(Some(&models), &sql)));
    assert_eq!(remote.len(), 240);
    assert_eq!(remote[0].1.len(), 384);
    common::assert_same_rows(&remote, &common::rows(&local(&models, &sql)), 1e-5);
}

/// Executors started without models: the client's CREATE MODEL reaches them with the query, and
/// the files the executors write (COPY, and CREATE TABLE into the client's warehouse) re-read to
/// the single-process rows.
#[test]
fn copy_from_the_cluster_with_a_model_the_client_created_rereads_correctly() {
    let data = tempfile::tempdir().unwrap();
    split_into_files("data/sample/features.parquet", "true", 8, data.path());
    let cluster = Cluster::start(2, None);
    let out_dir = data.path().join("out/scores/");
    let copy = format!(
        "CREATE MODEL scorer FROM 'data/models/linear.onnx';
         COPY (SELECT id, predict('scorer', {FEATURES}) AS p FROM '{}/part-*.parquet')
         TO '{}/' STORED AS PARQUET",
        data.path().display(),
        out_dir.display()
    );
    ok(&cluster.query(None, &copy));
    let files: Vec<_> = std::fs::read_dir(&out_dir).unwrap().flatten().collect();
    assert!(!files.is_empty());
    assert!(
        files
            .iter()
            .all(|f| f.file_name().to_string_lossy().ends_with(".parquet")),
        "only complete Parquet files in the output"
    );
    assert!(
        std::fs::read_dir(data.path().join("out"))
            .unwrap()
            .flatten()
            .all(|e| e.file_name() == "scores"),
        "no staging folder is left"
    );
    let reread = local(
        Path::new("data/models"),
        &format!("SELECT id, p FROM '{}/'", out_dir.display()),
    );
    let want = local(
        Path::new("data/models"),
        &format!(
            "SELECT id, predict('linear', {FEATURES}) AS p FROM 'data/sample/features.parquet'"
        ),
    );
    common::assert_same_rows(&common::rows(&reread), &common::rows(&want), 1e-6);

    let table = cluster.query(
        None,
        &format!(
            "CREATE OR REPLACE MODEL scorer FROM 'data/models/linear.onnx';
             CREATE TABLE scored AS SELECT id, predict('scorer', {FEATURES}) AS p
             FROM '{}/part-*.parquet';
             SELECT id, p FROM scored",
            data.path().display()
        ),
    );
    common::assert_same_rows(&common::rows(&ok(&table)), &common::rows(&want), 1e-6);
}

/// One executor is killed while a COPY runs, at a moment when it holds tasks of the COPY (its
/// work folder has shuffle files of the job) and the COPY is still running. Ballista declares it
/// dead after 20 s without a heartbeat and runs its tasks again, those whose output it had
/// written too, on the other executor: the COPY completes with every row exactly once, and no
/// staging folder is left.
#[test]
fn an_executor_killed_mid_query_leaves_every_row_exactly_once() {
    let text = tempfile::tempdir().unwrap();
    split_into_files("data/sample/sentences.parquet", "id < 1600", 8, text.path());
    let models = fixtures::models_with_minilm();
    let mut cluster = Cluster::start(2, Some(&models));
    let out_dir = text.path().join("out/vectors");
    let copy = format!(
        "COPY (SELECT id, embed('minilm', body) AS v FROM '{}/part-*.parquet') TO '{}/' STORED AS PARQUET",
        text.path().display(),
        out_dir.display()
    );
    let log = text.path().join("client.log");
    let mut client = bin()
        .env("BATCHINFER_WAREHOUSE", text.path().join("wh"))
        // Four partitions, so that both executors (two tasks each) get tasks.
        .args([
            "--format",
            "csv",
            "--partitions",
            "4",
            "--remote",
            &cluster.remote(),
        ])
        .arg("--models")
        .arg(&models)
        .args(["query", "-e", &copy])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The executor to kill: one that has begun tasks of this job.
    let has_tasks = |dir: &Path| {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|job| {
                std::fs::read_dir(job.path()).is_ok_and(|mut stages| stages.next().is_some())
            })
    };
    let mut victim = None;
    common::poll_until(Duration::from_secs(120), "an executor taking tasks", || {
        victim = (0..2).find(|&i| has_tasks(&cluster.work_dir(i)));
        victim.is_some()
    });
    let victim = victim.unwrap();
    assert!(
        client.try_wait().unwrap().is_none(),
        "the COPY is still running when the executor is killed"
    );
    let killed = &mut cluster.executors[victim];
    killed.kill().unwrap();
    killed.wait().unwrap();
    let status = common::wait_with_deadline(&mut client, common::DEADLINE, "the COPY");
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.success(),
        "the COPY failed after executor {victim} was killed: {stderr}"
    );
    let reread = local(
        Path::new("data/models"),
        &format!(
            "SELECT id, count(*) AS n FROM '{}/' GROUP BY id",
            out_dir.display()
        ),
    );
    let counts = common::rows(&reread);
    assert_eq!(counts.len(), 1600, "every row is there");
    assert!(counts.iter().all(|r| r.1 == vec![1.0]), "no row twice");
    let leftovers: Vec<_> = std::fs::read_dir(text.path().join("out"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        leftovers.iter().all(|n| n == "vectors"),
        "no staging folder is left: {leftovers:?}"
    );
}

/// A scheduler with no executor: a query fails within the scheduler's `--executor-wait`,
/// naming the scheduler and saying that no executor is registered, instead of waiting forever.
#[test]
fn a_scheduler_without_executors_fails_a_query_within_its_wait() {
    let cluster = Cluster::start_with(0, None, &["--executor-wait", "3"]);
    let started = Instant::now();
    let out = cluster.query(None, "SELECT count(*) AS n FROM (VALUES (1), (2)) AS t(x)");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.starts_with("Error: "), "{stderr}");
    assert!(
        stderr.contains("no executor registered")
            && stderr.contains(&format!("127.0.0.1:{}", cluster.port)),
        "{stderr}"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(30),
        "took {took:?}"
    );
}

/// A scheduler whose port is taken stops with one error naming the cluster and the cause.
#[test]
fn a_scheduler_on_a_port_in_use_is_one_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = common::output_within(
        bin().args(["scheduler", "--bind", &format!("127.0.0.1:{port}")]),
        common::DEADLINE,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Error: cluster: ") && stderr.contains("Address already in use"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The same with the scheduler's default `--executor-wait` (30 s): the client waits for its
/// answer, rather than give up first with a raw timeout.
#[test]
fn with_default_settings_a_query_hears_that_no_executor_is_registered() {
    let cluster = Cluster::start_with(0, None, &[]);
    let started = Instant::now();
    let out = cluster.query(None, "SELECT 1 AS x");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no executor registered (waited 30 s)"),
        "{stderr}"
    );
    assert!(!stderr.contains("Timeout expired"), "{stderr}");
    assert!(took >= Duration::from_secs(30), "took {took:?}");
}

/// A database table on a cluster is refused with the flag that runs it in one process.
#[test]
fn a_database_table_on_a_cluster_names_the_flag_to_leave_out() {
    // Refused by the client, before any executor could be needed.
    let cluster = Cluster::start(0, None);
    let out = cluster.query(
        None,
        "CREATE EXTERNAL TABLE events STORED AS SQLITE LOCATION 'events.db' \
         OPTIONS ('table' 'events')",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("is read in one process") && stderr.contains("without --remote"),
        "{stderr}"
    );
}

/// Two clients define the model `m` differently on one cluster, one after the other and back:
/// each gets its own model's scores, whatever the executors loaded first. Then one client
/// replaces its model's file and runs CREATE OR REPLACE MODEL: the new file's scores.
#[test]
fn a_model_name_means_one_model_everywhere() {
    let data = tempfile::tempdir().unwrap();
    split_into_files("data/sample/features.parquet", "id < 2000", 4, data.path());
    let cluster = Cluster::start(2, None);
    let scores = format!(
        "SELECT id, predict('m', {FEATURES}) AS p FROM '{}/'",
        data.path().display()
    );
    let define = |model: &Path, replace: bool| {
        format!(
            "CREATE {}MODEL m FROM '{}'",
            if replace { "OR REPLACE " } else { "" },
            model.display()
        )
    };
    let linear = std::fs::canonicalize("data/models/linear.onnx").unwrap();
    let doubled = std::fs::canonicalize("data/fixtures/linear_doubled.onnx").unwrap();
    // The single-process scores of each file.
    let want = |model: &Path| {
        common::rows(&local(
            Path::new("data/models"),
            &format!("{}; {scores}", define(model, true)),
        ))
    };
    let (want_linear, want_doubled) = (want(&linear), want(&doubled));
    assert_eq!(want_linear.len(), 2000);
    assert_ne!(want_linear, want_doubled);
    let on_cluster = |client: &str, model: &Path, replace: bool| {
        common::rows(&ok(&cluster.query_as(
            client,
            None,
            &format!("{}; {scores}", define(model, replace)),
        )))
    };
    common::assert_same_rows(&on_cluster("a", &linear, false), &want_linear, 0.0);
    common::assert_same_rows(&on_cluster("b", &doubled, false), &want_doubled, 0.0);
    common::assert_same_rows(&on_cluster("a", &linear, true), &want_linear, 0.0);
    common::assert_same_rows(&on_cluster("b", &doubled, true), &want_doubled, 0.0);

    // The same path, new bytes: CREATE OR REPLACE MODEL reads the file again, and the executors
    // serve the new model, not the one they loaded from that path before.
    let file = data.path().join("m.onnx");
    std::fs::copy(&linear, &file).unwrap();
    common::assert_same_rows(&on_cluster("c", &file, false), &want_linear, 0.0);
    std::fs::copy(&doubled, &file).unwrap();
    common::assert_same_rows(&on_cluster("c", &file, true), &want_doubled, 0.0);

    // Rewritten without CREATE OR REPLACE MODEL: the registered bytes still score (the
    // warehouse's copy, which the executors load and check), until a statement takes the new
    // file as a new version; the version before stays reachable by its number.
    std::fs::copy(&linear, &file).unwrap();
    common::assert_same_rows(
        &common::rows(&ok(&cluster.query_as("c", None, &scores))),
        &want_doubled,
        0.0,
    );
    common::assert_same_rows(&on_cluster("c", &file, true), &want_linear, 0.0);
    let version_2 = scores.replace("predict('m',", "predict('m@2',");
    common::assert_same_rows(
        &common::rows(&ok(&cluster.query_as("c", None, &version_2))),
        &want_doubled,
        0.0,
    );
}

/// Names of a model's versions on a cluster: the executors score `m@1`, `m@champion` and `m`
/// with the version the client picked, as one process does; an alias moved between two queries
/// moves what the next one scores with.
#[test]
fn versions_and_aliases_on_a_cluster_are_the_clients() {
    let data = tempfile::tempdir().unwrap();
    split_into_files("data/sample/features.parquet", "id < 2000", 4, data.path());
    let cluster = Cluster::start(2, None);
    let linear = std::fs::canonicalize("data/models/linear.onnx").unwrap();
    let doubled = std::fs::canonicalize("data/fixtures/linear_doubled.onnx").unwrap();
    let scores = |name: &str| {
        format!(
            "SELECT id, predict('{name}', {FEATURES}) AS p FROM '{}/'",
            data.path().display()
        )
    };
    let want = |model: &Path| {
        common::rows(&local(
            Path::new("data/models"),
            &format!(
                "CREATE OR REPLACE MODEL m FROM '{}'; {}",
                model.display(),
                scores("m")
            ),
        ))
    };
    let (want_linear, want_doubled) = (want(&linear), want(&doubled));
    let run = |sql: &str| common::rows(&ok(&cluster.query_as("v", None, sql)));
    ok(&cluster.query_as(
        "v",
        None,
        &format!(
            "CREATE MODEL m FROM '{}'; ALTER MODEL m ADD VERSION FROM '{}'; \
             ALTER MODEL m SET ALIAS champion TO VERSION 1",
            linear.display(),
            doubled.display()
        ),
    ));
    common::assert_same_rows(&run(&scores("m@1")), &want_linear, 0.0);
    common::assert_same_rows(&run(&scores("m@champion")), &want_linear, 0.0);
    common::assert_same_rows(&run(&scores("m")), &want_doubled, 0.0);
    ok(&cluster.query_as("v", None, "ALTER MODEL m SET ALIAS champion TO VERSION 2"));
    common::assert_same_rows(&run(&scores("m@champion")), &want_doubled, 0.0);
}

/// An INSERT the executors carry out adds all of its rows when it succeeds, and none when it
/// fails partway (1,500,000 rows into 2,000,000): what the executors wrote is held back until the
/// whole job has succeeded, as in one process.
#[test]
fn a_failed_insert_on_the_cluster_adds_none_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    local(
        Path::new("data/models"),
        &format!(
            "COPY (SELECT value AS id FROM range(2000000)) TO '{}/' STORED AS PARQUET",
            source.display()
        ),
    );
    let table = dir.path().join("t");
    let define = format!(
        "CREATE EXTERNAL TABLE t (id BIGINT, q BIGINT) STORED AS PARQUET LOCATION '{}/'",
        table.display()
    );
    local(
        Path::new("data/models"),
        &format!("{define}; INSERT INTO t VALUES (1, 1), (2, 2)"),
    );
    let before = common::snapshot(&table);
    let cluster = Cluster::start(2, None);
    let failed = cluster.query(
        None,
        &format!(
            "{define}; INSERT INTO t SELECT id, 10 / (id - 1500000) AS q FROM '{}/'",
            source.display()
        ),
    );
    assert!(!failed.status.success(), "the INSERT was to fail");
    let changed = common::changes(&before, &common::snapshot(&table));
    assert!(changed.is_empty(), "the failed INSERT changed {changed:?}");
    ok(&cluster.query(
        None,
        &format!(
            "{define}; INSERT INTO t SELECT id, id AS q FROM '{}/'",
            source.display()
        ),
    ));
    let count = local(
        Path::new("data/models"),
        &format!("{define}; SELECT count(*) AS n FROM t"),
    );
    assert!(count.ends_with("n\n2000002\n"), "{count}");
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["source", "t"], "no staging folder is left");
}

/// Rows a model fails on, rejected on the executors: NULL in the output, kept (by the executors)
/// in the client's rejects, counted in the client's summary; a budget passed by the executors'
/// rows together fails the statement, which then writes nothing.
#[test]
fn rejected_rows_on_the_cluster_are_kept_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    local(
        Path::new("data/models"),
        &format!(
            "COPY (SELECT value AS id, CASE WHEN value IN (17, 5000, 19999) THEN 99 ELSE value % 10 END AS idx
                   FROM range(20000)) TO '{}/' STORED AS PARQUET",
            input.display()
        ),
    );
    let cluster = Cluster::start(2, None);
    let models = Path::new("data/models");
    let output = dir.path().join("out");
    let copy = |budget: &str, to: &Path| {
        cluster.query(
            Some(models),
            &format!(
                "SET batchinfer.on_error = 'reject'; {budget}
                 COPY (SELECT id, predict('lookup', idx) AS p FROM '{}/') TO '{}/' STORED AS PARQUET",
                input.display(),
                to.display()
            ),
        )
    };
    let out = copy("", &output);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("model 'lookup' failed on 3 row(s)"), "{err}");
    let nulls = local(
        models,
        &format!(
            "SELECT id FROM '{}/' WHERE p IS NULL ORDER BY id",
            output.display()
        ),
    );
    assert_eq!(nulls, "id\n17\n5000\n19999\n");
    let folder = err
        .split("they are kept in ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap()
        .to_string();
    let kept = local(
        models,
        &format!("SELECT idx, model FROM '{folder}' ORDER BY idx"),
    );
    assert_eq!(kept, "idx,model\n99,lookup\n99,lookup\n99,lookup\n");
    let past = dir.path().join("past");
    let out = copy("SET batchinfer.max_errors = '2';", &past);
    assert!(!out.status.success(), "a COPY past its budget succeeded");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max_errors"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!past.exists(), "a COPY past its budget wrote");
}

/// A materialized view created and refreshed through the cluster (executors without models:
/// the client's definition reaches them): the executors score, the client keeps the manifest,
/// and the view holds the rows of one process.
#[test]
fn a_materialized_view_refreshed_on_the_cluster_holds_the_rows_of_one_process() {
    let data = tempfile::tempdir().unwrap();
    let all = data.path().join("all");
    split_into_files("data/sample/features.parquet", "true", 8, &all);
    let input = data.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let move_in = |k: usize| {
        let name = format!("part-{k}.parquet");
        std::fs::copy(all.join(&name), input.join(&name)).unwrap();
    };
    (0..5).for_each(move_in);
    let cluster = Cluster::start(2, None);
    ok(&cluster.query(
        None,
        &format!(
            "CREATE MODEL scorer FROM 'data/models/linear.onnx';
             CREATE MATERIALIZED VIEW v AS SELECT id, predict('scorer', {FEATURES}) AS p
             FROM '{}/'",
            input.display()
        ),
    ));
    (5..8).for_each(move_in);
    let refreshed = ok(&cluster.query(None, "REFRESH MATERIALIZED VIEW v"));
    assert!(refreshed.contains("v,3,0,0,"), "{refreshed}");
    let view = ok(&cluster.query(None, "SELECT id, p FROM v"));
    let want = local(
        Path::new("data/models"),
        &format!(
            "SELECT id, predict('linear', {FEATURES}) AS p FROM 'data/sample/features.parquet'"
        ),
    );
    assert_eq!(common::rows(&view).len(), 10_000);
    common::assert_same_rows(&common::rows(&view), &common::rows(&want), 1e-6);
}

/// `generate` through the cluster, the endpoint model defined by the client only: the
/// executors send the requests (one per distinct prompt, through a proxy that counts them),
/// keep the answers in the client's warehouse's cache, and the rows are those of one process.
#[test]
fn generate_on_the_cluster_asks_once_per_row_and_fills_the_clients_cache() {
    let data = tempfile::tempdir().unwrap();
    let input = data.path().join("in");
    local(
        Path::new("data/models"),
        &format!(
            "COPY (SELECT value AS id, 'Say ' || CAST(value % 6 AS VARCHAR) AS prompt FROM \
             range(12)) TO '{}/' STORED AS PARQUET",
            input.display()
        ),
    );
    let front = llm_server::proxy(&[]);
    let cluster = Cluster::start(2, None);
    let define = format!(
        "CREATE OR REPLACE MODEL m OPTIONS ('endpoint' '{}', 'model' 'smollm2', 'max_tokens' \
         '8', 'temperature' '0', 'seed' '7');",
        front.url()
    );
    let select = format!(
        "SET batchinfer.on_error = 'null'; SELECT id, generate('m', prompt) AS g FROM '{}/' \
         ORDER BY id",
        input.display()
    );
    ok(&cluster.query(None, &define));
    let first = ok(&cluster.query(None, &select));
    assert_eq!(first.lines().count(), 13, "{first}");
    // Six distinct prompts; each executor sends those of its rows once.
    let sent = front.count("received");
    assert!((6..=12).contains(&sent), "{}", front.counts());
    let cache = cluster._work.path().join("client-wh").join("llm-cache");
    assert_eq!(
        common::files_under(&cache).len(),
        6,
        "the client's warehouse keeps them"
    );
    // Again: every answer from the cache, the same rows.
    let again = ok(&cluster.query(None, &select));
    assert_eq!(again, first);
    assert_eq!(front.count("received"), sent);
}

/// `embed` of an embedding endpoint through the cluster, the model defined by the client only:
/// the vectors of one process.
#[test]
fn embed_of_an_endpoint_on_the_cluster_gives_the_vectors_of_one_process() {
    let data = tempfile::tempdir().unwrap();
    let input = data.path().join("in");
    local(
        Path::new("data/models"),
        &format!(
            "COPY (SELECT value AS id, 'text ' || CAST(value % 5 AS VARCHAR) AS body FROM \
             range(40)) TO '{}/' STORED AS PARQUET",
            input.display()
        ),
    );
    let server = llm_server::llama_embeddings();
    let cluster = Cluster::start(2, None);
    let define = format!(
        "CREATE OR REPLACE MODEL vec OPTIONS ('endpoint' '{}', 'model' 'smollm2', 'kind' \
         'embedding', 'dimensions' '576');",
        server.url()
    );
    // The whole vectors (a field of one, `embed(...)[1]`, is pushed into the scan by the
    // optimizer, which Ballista cannot send to an executor).
    let select = format!(
        "SELECT id, embed('vec', body) AS v FROM '{}/' ORDER BY id",
        input.display()
    );
    ok(&cluster.query(None, &define));
    let remote = ok(&cluster.query(None, &select));
    let one = local(
        Path::new("data/models"),
        &format!("{define} SET batchinfer.cache = 'off'; {select}"),
    );
    // The server embeds texts in batches of another make-up in each run: the same vectors
    // within 1e-4 each.
    let values = |csv: &str| -> Vec<Vec<f64>> {
        csv.lines()
            .skip(1)
            .map(|line| {
                line.split(['[', ']', ',', '"'])
                    .filter_map(|v| v.trim().parse::<f64>().ok())
                    .collect()
            })
            .collect()
    };
    let (remote, one) = (values(&remote), values(&one));
    assert_eq!(remote.len(), 40);
    assert_eq!(remote.len(), one.len());
    for (a, b) in remote.iter().zip(&one) {
        assert_eq!(a.len(), 577, "the id and 576 values");
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "{worst}");
    }
}

/// Each executor takes its share of an endpoint model's limits: with `max_concurrency` 2 over
/// two executors, at most two requests are ever in flight at the server (four without the
/// share: eight tasks keep both executors busy, each with rows to ask for at once).
#[test]
fn executors_share_an_endpoint_models_limits() {
    let data = tempfile::tempdir().unwrap();
    let input = data.path().join("in");
    for part in 0..8 {
        local(
            Path::new("data/models"),
            &format!(
                "COPY (SELECT value AS id, 'Say ' || CAST(value AS VARCHAR) AS prompt FROM \
                 range({}, {})) TO '{}/part{part}.parquet' STORED AS PARQUET",
                part * 4,
                part * 4 + 4,
                input.display()
            ),
        );
    }
    // Every request held half a second at the proxy, so that those sent together overlap.
    let front = llm_server::proxy(&["--delay", "0.5", "--delay-first", "1000"]);
    let cluster = Cluster::start(2, None);
    let define = format!(
        "CREATE OR REPLACE MODEL m OPTIONS ('endpoint' '{}', 'model' 'smollm2', 'max_tokens' \
         '2', 'max_concurrency' '2');",
        front.url()
    );
    ok(&cluster.query(None, &define));
    let select = format!(
        "SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; SET \
         datafusion.execution.target_partitions = '8'; SELECT count(g) FROM (SELECT \
         generate('m', prompt) AS g FROM '{}/')",
        input.display()
    );
    ok(&cluster.query(None, &select));
    assert_eq!(front.count("received"), 32, "{}", front.counts());
    let most = front.count("most_in_flight");
    assert!((1..=2).contains(&most), "{}", front.counts());
}

/// The photos and image model of scripts/image_models.sh, as a folder of models (`nsfw`, its
/// classes named `sfw` and `nsfw`) and the photos' folder.
fn image_assets(models: &Path) -> std::path::PathBuf {
    let assets = fixtures::image_assets();
    let nsfw = models.join("nsfw");
    std::fs::create_dir_all(&nsfw).unwrap();
    std::fs::copy(assets.join("nsfw/model.onnx"), nsfw.join("model.onnx")).unwrap();
    let declared: serde_json::Value =
        serde_json::from_slice(&std::fs::read(assets.join("nsfw/batchinfer.json")).unwrap())
            .unwrap();
    let labelled = serde_json::json!({"image": declared["image"], "labels": ["sfw", "nsfw"]});
    std::fs::write(nsfw.join("batchinfer.json"), labelled.to_string()).unwrap();
    // The model as shipped: its output a list of the two classes' probabilities.
    let raw = models.join("nsfw_raw");
    std::fs::create_dir_all(&raw).unwrap();
    for file in ["model.onnx", "batchinfer.json"] {
        std::fs::copy(assets.join("nsfw").join(file), raw.join(file)).unwrap();
    }
    assets.join("photos")
}

/// Rows of (filename, size, score) in CSV, compared: the same files and sizes, the scores
/// within `tolerance`.
fn assert_same_files(got: &str, want: &str, tolerance: f64) {
    let parse = |csv: &str| -> Vec<(String, String, f64)> {
        csv.lines()
            .skip(1)
            .map(|l| {
                let fields: Vec<&str> = l.split(',').collect();
                (
                    fields[0].to_string(),
                    fields[1].to_string(),
                    fields[2].parse().unwrap(),
                )
            })
            .collect()
    };
    let (got, want) = (parse(got), parse(want));
    assert_eq!(got.len(), want.len(), "{got:?}\n{want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.0, &g.1), (&w.0, &w.1));
        assert!((g.2 - w.2).abs() <= tolerance, "{g:?} against {w:?}");
    }
}

/// `read_blob` on the cluster: the scheduler plans over the folder's listing, the executors read
/// the files and run the image model; the rows are those of one process. A view over the folder,
/// refreshed on the cluster as photos arrive, holds them too.
#[test]
fn photos_on_the_cluster_are_scored_as_in_one_process_and_kept_by_a_view() {
    let work = tempfile::tempdir().unwrap();
    let models = work.path().join("models");
    let photos = image_assets(&models);
    let folder = work.path().join("photos");
    std::fs::create_dir_all(&folder).unwrap();
    let add = |name: &str| std::fs::copy(photos.join(name), folder.join(name)).unwrap();
    for name in ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg"] {
        add(name);
    }
    let select = format!(
        "SELECT filename, size, predict('nsfw', content)['score'] AS p FROM read_blob('{}/')",
        folder.display()
    );
    let ordered = format!("{select} ORDER BY filename");
    let cluster = Cluster::start(2, None);
    let there = ok(&cluster.query(Some(&models), &ordered));
    assert_same_files(&there, &local(&models, &ordered), 1e-5);
    assert_eq!(there.lines().count(), 5, "{there}");
    // A list output indexed (`array_element`, a function of DataFusion's the executors add).
    let indexed = ordered.replace("'nsfw', content)['score']", "'nsfw_raw', content)[2]");
    let there = ok(&cluster.query(Some(&models), &indexed));
    assert_same_files(&there, &local(&models, &indexed), 1e-5);
    assert_eq!(there.lines().count(), 5, "{there}");

    ok(&cluster.query(
        Some(&models),
        &format!("CREATE MATERIALIZED VIEW tags AS {select}"),
    ));
    add("horse.png");
    let refreshed = ok(&cluster.query(Some(&models), "REFRESH MATERIALIZED VIEW tags"));
    assert!(refreshed.contains("tags,1,0,0,"), "{refreshed}");
    let view = ok(&cluster.query(
        Some(&models),
        "SELECT filename, size, p FROM tags ORDER BY filename",
    ));
    assert_same_files(&view, &local(&models, &ordered), 1e-5);
    assert_eq!(view.lines().count(), 6, "{view}");
}

/// The LLM operators through the cluster, against a server that gives the same request the same
/// log-probabilities: `ai_filter_score` and `ai_classify` equal to one process's, `ai_agg`
/// answering each group, and a top-N sending only the rows it keeps.
#[test]
fn the_llm_operators_on_the_cluster_answer_as_one_process() {
    let data = tempfile::tempdir().unwrap();
    let input = data.path().join("in");
    local(
        Path::new("data/models"),
        &format!(
            "COPY (SELECT value AS id, 'The ' || CASE value % 3 WHEN 0 THEN 'cat' WHEN 1 THEN \
             'truck' ELSE 'apple' END || ' number ' || CAST(value AS VARCHAR) AS body FROM \
             range(12)) TO '{}/' STORED AS PARQUET",
            input.display()
        ),
    );
    let front = llm_server::proxy_to(llm_server::llama_exact(), &[]);
    let define = format!(
        "CREATE OR REPLACE MODEL judge OPTIONS ('endpoint' '{}', 'model' 'smollm2', \
         'max_tokens' '16', 'temperature' '0', 'seed' '7');",
        front.url()
    );
    let select = format!(
        "SET batchinfer.cache = 'off'; SELECT id, ai_filter_score('judge', 'Is it an animal?', \
         body) AS p, ai_classify('judge', body, ['animal', 'vehicle', 'food'])['label'] AS l \
         FROM '{}/' ORDER BY id",
        input.display()
    );
    let one = local(Path::new("data/models"), &format!("{define} {select}"));
    let cluster = Cluster::start(2, None);
    ok(&cluster.query(None, &define));
    let before = front.count("received");
    let many = ok(&cluster.query(None, &select));
    let rows = |csv: &str| -> Vec<String> {
        csv.lines()
            .filter(|l| !l.starts_with("id,"))
            .map(String::from)
            .collect()
    };
    assert_eq!(rows(&many), rows(&one));
    assert_eq!(rows(&many).len(), 12, "{many}");
    assert_eq!(front.count("received") - before, 24, "{}", front.counts());
    // A top-N: three rows asked about.
    let before = front.count("received");
    let top = ok(&cluster.query(
        None,
        &format!(
            "SET batchinfer.cache = 'off'; SELECT id, ai_filter_score('judge', 'Is it an \
             animal?', body) AS p FROM '{}/' ORDER BY id DESC LIMIT 3",
            input.display()
        ),
    ));
    assert_eq!(top.lines().count(), 4, "{top}");
    assert_eq!(front.count("received") - before, 3, "{}", front.counts());
    // ai_agg: an answer for each group.
    let groups = ok(&cluster.query(
        None,
        &format!(
            "SET batchinfer.cache = 'off'; SELECT id % 3 AS g, ai_agg('judge', 'Summarize.', \
             body) IS NOT NULL AS answered FROM '{}/' GROUP BY id % 3 ORDER BY g",
            input.display()
        ),
    ));
    assert_eq!(
        groups.lines().collect::<Vec<_>>(),
        ["g,answered", "0,true", "1,true", "2,true"],
        "{groups}"
    );

    // A cascade: each executor sets its own thresholds on its own sample of 20 (MiniLM, from
    // the client's models, is the proxy), and the rows it is sure of are not sent.
    let pages = data.path().join("pages");
    local(
        Path::new("data/models"),
        &format!(
            "COPY (SELECT value AS id, 'The ' || CASE value % 3 WHEN 0 THEN 'cat' WHEN 1 THEN \
             'truck' ELSE 'apple' END || ' seen on day ' || CAST(value AS VARCHAR) AS body FROM \
             range(120)) TO '{}/' STORED AS PARQUET",
            pages.display()
        ),
    );
    let models = fixtures::models_with_minilm();
    let cascade = format!(
        "CREATE OR REPLACE MODEL screener OPTIONS ('endpoint' '{}', 'model' 'smollm2', \
         'temperature' '0', 'seed' '7', 'proxy' 'minilm', 'target' '0.6', 'proxy_sample' '20');",
        front.url()
    );
    ok(&cluster.query(Some(&models), &cascade));
    let before = front.count("received");
    let kept = ok(&cluster.query(
        Some(&models),
        &format!(
            "SET batchinfer.cache = 'off'; SELECT count(*) AS n, count(f) AS answered FROM \
             (SELECT ai_filter('screener', 'Is it an animal?', body) AS f FROM '{}/')",
            pages.display()
        ),
    ));
    let sent = front.count("received") - before;
    eprintln!("a cascade on 2 executors: {sent} requests for 120 rows: {kept}");
    assert_eq!(kept.lines().nth(1), Some("120,120"), "{kept}");
    assert!((20..=120).contains(&sent), "{sent}");
}
