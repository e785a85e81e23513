//! What is particular to S3, through the real binary, against a real S3-compatible server (s3s +
//! s3s-fs, in this process, over HTTP on loopback, with SigV4 checked): its settings and
//! credentials, its errors, uploads cut off or cancelled half-way. The scenarios every store
//! shares are in `storage.rs`.

mod common;
mod s3_server;
use common::random_rows;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_failure, assert_ok, stdout};
use s3_server::{ACCESS_KEY, S3Server, SECRET_KEY};

const FEATURES: &str = "f0, f1, f2, f3, f4, f5, f6, f7, f8, f9";

/// The binary with the environment of a user of this server: keys, region, endpoint.
fn batchinfer(server: &S3Server, warehouse: &Path) -> Command {
    let mut command = common::bin();
    server
        .client(&mut command)
        .env("BATCHINFER_WAREHOUSE", warehouse);
    command
}

/// A server holding the sample features (as 4 files) and the test models.
fn server_with_data(dir: &Path) -> S3Server {
    let server = S3Server::start(&dir.join("s3"));
    for part in 0..4 {
        server.put_file(
            "data",
            &format!("features/part-{part}.parquet"),
            Path::new("data/sample/features.parquet"),
        );
    }
    server.put_file(
        "models",
        "linear.onnx",
        Path::new("data/models/linear.onnx"),
    );
    server.put_file(
        "models",
        "scorer/model.onnx",
        Path::new("data/models/linear.onnx"),
    );
    server.bucket("out");
    server
}

/// The rows of `s3://out/scores/`, re-read, equal those of the same scoring run locally.
fn assert_scores_in_s3_match_a_local_run(server: &S3Server, wh: &Path) {
    let reread = common::run_with(
        batchinfer(server, wh),
        &["query", "-e", "SELECT id, p FROM 's3://out/scores/'"],
    );
    common::assert_same_rows(
        &common::rows(&assert_ok(&reread)),
        &common::local_scores(4),
        1e-6,
    );
}

#[test]
fn models_folder_in_s3_registers_files_and_model_folders() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    let wh = dir.path().join("wh");
    let query = format!(
        "SELECT id, predict('scorer', {FEATURES}) - predict('linear', {FEATURES}) AS d \
         FROM 's3://data/features/part-0.parquet'"
    );
    let out = common::run_with(
        batchinfer(&server, &wh),
        &["--models", "s3://models/", "query", "-e", &query],
    );
    let rows = common::rows(&assert_ok(&out));
    assert_eq!(rows.len(), 10_000);
    assert!(
        rows.iter().all(|r| r.1 == [0.0]),
        "the same model gives the same scores"
    );
    let out = common::run_with(
        batchinfer(&server, &wh),
        &[
            "--models",
            "s3://models/",
            "query",
            "-e",
            "SELECT name, source FROM models()",
        ],
    );
    let listing = assert_ok(&out);
    assert!(
        listing.contains("linear,s3://models/linear.onnx")
            && listing.contains("scorer,s3://models/scorer/model.onnx"),
        "{listing}"
    );
}

#[test]
fn external_table_options_name_the_endpoint_and_region() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    let mut command = batchinfer(&server, &dir.path().join("wh"));
    command
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_ALLOW_HTTP")
        .env_remove("AWS_REGION");
    let out = common::run_with(
        command,
        &[
            "query",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE features STORED AS PARQUET LOCATION 's3://data/features/'
                 OPTIONS ('aws.endpoint' '{}', 'aws.allow_http' 'true', 'aws.region' 'eu-west-1');
                 SELECT count(*) AS n FROM features",
                server.endpoint()
            ),
        ],
    );
    assert_eq!(assert_ok(&out), "n\n40000\n");
}

/// docs/storage.md's S3 example, run as written against the tests' S3 server (its endpoint in
/// place of the example's).
#[test]
fn the_storage_guides_s3_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    server.put_file(
        "data",
        "customers/part-0.parquet",
        Path::new("data/sample/customers.parquet"),
    );
    let examples = common::examples_with("docs/storage.md", "s3://");
    assert_eq!(examples.len(), 1, "{examples:?}");
    let example = examples[0].replace("http://minio:9000", &server.endpoint());
    assert_ne!(example, examples[0], "the example names an endpoint");
    let mut command = batchinfer(&server, &dir.path().join("wh"));
    command
        .env_remove("AWS_ENDPOINT_URL")
        .env_remove("AWS_REGION");
    let sql = format!("{example}\nSELECT count(*) AS n FROM customers;");
    let out = common::run_with(command, &["query", "-e", &sql]);
    let local = common::output_within(
        common::bin().args([
            "query",
            "-e",
            "SELECT count(*) AS n FROM 'data/sample/customers.parquet'",
        ]),
        common::DEADLINE,
    );
    assert_eq!(assert_ok(&out), assert_ok(&local));
}

#[test]
fn a_model_rewritten_in_s3_after_create_model_scores_as_registered_until_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    server.bucket("lake");
    let local = dir.path().join("unused");
    let in_wh = |sql: &str| {
        common::run_with(
            batchinfer(&server, &local),
            &["--warehouse", "s3://lake/wh/", "query", "-e", sql],
        )
    };
    let scores = |name: &str| {
        common::rows(&assert_ok(&in_wh(&format!(
            "SELECT id, predict('{name}', {FEATURES}) AS p FROM \
             's3://data/features/part-1.parquet' WHERE id < 20"
        ))))
    };
    assert_ok(&in_wh("CREATE MODEL lin FROM 's3://models/linear.onnx'"));
    let first = scores("lin");
    assert_eq!(first.len(), 20);
    // Retrained in place: other bytes at the same key. The warehouse keeps the registered ones.
    server.put_file(
        "models",
        "linear.onnx",
        Path::new("data/fixtures/linear_doubled.onnx"),
    );
    assert_eq!(scores("lin"), first);
    assert_ok(&in_wh(
        "CREATE OR REPLACE MODEL lin FROM 's3://models/linear.onnx'",
    ));
    let second = scores("lin");
    for (a, b) in second.iter().zip(&first) {
        assert!(
            (a.1[0] - 2.0 * b.1[0]).abs() <= 1e-5 * b.1[0].abs().max(1.0),
            "{a:?} {b:?}"
        );
    }
    assert_eq!(scores("lin@1"), first);
}

#[test]
fn missing_objects_buckets_and_models_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    let wh = dir.path().join("wh");
    let out = common::run_with(
        batchinfer(&server, &wh),
        &[
            "query",
            "-e",
            "SELECT * FROM 's3://data/nothing-here.parquet'",
        ],
    );
    assert_failure(&out, &["no object at s3://data/nothing-here.parquet"]);
    let out = common::run_with(
        batchinfer(&server, &wh),
        &[
            "query",
            "-e",
            "SELECT * FROM 's3://no-such-bucket/x.parquet'",
        ],
    );
    assert_failure(
        &out,
        &["bucket 'no-such-bucket' does not exist", &server.endpoint()],
    );
    let out = common::run_with(
        batchinfer(&server, &wh),
        &[
            "query",
            "-e",
            "CREATE MODEL m FROM 's3://models/missing.onnx'",
        ],
    );
    assert_failure(
        &out,
        &["model 'm'", "s3://models/missing.onnx", "does not exist"],
    );
}

#[test]
fn wrong_credentials_are_rejected_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    let mut command = batchinfer(&server, &dir.path().join("wh"));
    command.env("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    let out = common::run_with(
        command,
        &["query", "-e", "SELECT count(*) FROM 's3://data/features/'"],
    );
    assert_failure(
        &out,
        &[
            "s3://data/features/",
            "refused access",
            "AWS_SECRET_ACCESS_KEY",
        ],
    );
}

#[test]
fn an_unreachable_endpoint_fails_after_bounded_retries() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = server_with_data(dir.path());
    let command = batchinfer(&server, &dir.path().join("wh"));
    server.stop();
    let started = Instant::now();
    let out = common::run_with(
        command,
        &["query", "-e", "SELECT count(*) FROM 's3://data/features/'"],
    );
    assert_failure(
        &out,
        &[
            "cannot read s3://data/features/",
            "could not reach the S3 endpoint",
            &server.endpoint(),
        ],
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// The server goes away in the middle of a COPY that writes several files (its third write
/// request is never answered, then the server stops): the command fails clearly, no file of the
/// output exists, not even those whose data was all sent, and the same COPY succeeds once the
/// server is back.
#[test]
fn a_copy_interrupted_by_the_server_leaves_no_table_and_reruns() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = server_with_data(dir.path());
    let wh = dir.path().join("wh");
    let copy = format!(
        "COPY (SELECT id, predict('linear', {FEATURES}) AS p FROM 's3://data/features/')
         TO 's3://out/scores/' STORED AS PARQUET"
    );
    let held = server.hold_write_to("out", 3);
    let mut child = batchinfer(&server, &wh)
        .args([
            "--models",
            "data/models",
            "--partitions",
            "4",
            "query",
            "-e",
            &copy,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    held.recv_timeout(Duration::from_secs(60))
        .expect("the COPY starts writing");
    server.stop();
    common::wait_with_deadline(&mut child, common::DEADLINE, "the interrupted COPY");
    let out = child.wait_with_output().unwrap();
    assert_failure(&out, &["could not reach"]);

    server.restart();
    assert_eq!(
        server.keys("out", ""),
        Vec::<String>::new(),
        "no output file exists"
    );
    let out = common::run_with(
        batchinfer(&server, &wh),
        &[
            "query",
            "-e",
            "SELECT count(*) AS n FROM 's3://out/scores/'",
        ],
    );
    assert!(
        !out.status.success() || stdout(&out) == "n\n0\n",
        "{}",
        stdout(&out)
    );

    assert_ok(&common::run_with(
        batchinfer(&server, &wh),
        &["--models", "data/models", "query", "-e", &copy],
    ));
    assert_scores_in_s3_match_a_local_run(&server, &wh);
}

/// No key in the environment: the AWS SDK's chain finds them in a credentials file, and the region
/// in the config file, of the profile AWS_PROFILE names.
#[test]
fn credentials_and_region_come_from_the_aws_profile_files() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    let credentials = dir.path().join("credentials");
    std::fs::write(
        &credentials,
        format!("[other]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n[batch]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"),
    )
    .unwrap();
    let config = dir.path().join("config");
    std::fs::write(&config, "[profile batch]\nregion = eu-central-1\n").unwrap();
    let mut command = batchinfer(&server, &dir.path().join("wh"));
    command
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_REGION")
        .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
        .env("AWS_CONFIG_FILE", &config)
        .env("AWS_PROFILE", "batch")
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let out = common::run_with(
        command,
        &[
            "query",
            "-e",
            "SELECT count(*) AS n FROM 's3://data/features/'",
        ],
    );
    assert_eq!(assert_ok(&out), "n\n40000\n");
}

/// The server's own files of the multipart uploads in progress (s3s-fs keeps `.upload-ID.json`
/// and `.upload_id-ID.part-N` at its root): what an upload neither completed nor aborted leaves.
fn open_uploads(server: &S3Server) -> Vec<String> {
    std::fs::read_dir(&server.root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".upload"))
        .collect()
}

/// Runs `args` while watching the server: whether parts of an upload were seen on it before the
/// command ended (so that what is checked after is an abort, not uploads never begun).
fn run_watching_uploads(server: &S3Server, mut command: Command, args: &[&str]) -> (Output, bool) {
    let mut child = command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut seen = false;
    while child.try_wait().unwrap().is_none() {
        seen |= open_uploads(server).iter().any(|n| n.contains(".part-"));
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the command hangs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    (child.wait_with_output().unwrap(), seen)
}

/// COPY and CREATE TABLE into S3 that fail on a model error after their files were partly
/// uploaded: no object appears, and every upload begun is aborted on the server.
#[test]
fn s3_writes_failed_by_a_model_error_leave_no_object_and_no_upload() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    server.bucket("lake");
    let wh = dir.path().join("wh");
    let failing = random_rows(600_000, 599_990);
    let statements = [
        (
            "out",
            format!("COPY ({failing}) TO 's3://out/scores/' STORED AS PARQUET"),
        ),
        ("lake", format!("CREATE TABLE scored AS {failing}")),
    ];
    for (bucket, sql) in statements {
        let mut command = batchinfer(&server, &wh);
        command.args(["--warehouse", "s3://lake/wh/", "--models", "data/models"]);
        let (out, uploaded) = run_watching_uploads(&server, command, &["query", "-e", &sql]);
        assert_failure(&out, &["model 'lookup' failed"]);
        assert!(uploaded, "{sql}: no part was uploaded before the failure");
        assert_eq!(server.keys(bucket, ""), Vec::<String>::new(), "{sql}");
        assert_eq!(open_uploads(&server), Vec::<String>::new(), "{sql}");
    }
}

/// The same cancelled by SIGINT (Ctrl-C) and SIGTERM while parts are being uploaded.
#[test]
fn s3_writes_cancelled_mid_way_leave_no_object_and_no_upload() {
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_data(dir.path());
    server.bucket("lake");
    let wh = dir.path().join("wh");
    let endless = random_rows(1_000_000_000, u64::MAX);
    for (signal, bucket, sql) in [
        (
            libc::SIGINT,
            "out",
            format!("COPY ({endless}) TO 's3://out/scores/' STORED AS PARQUET"),
        ),
        (
            libc::SIGTERM,
            "lake",
            format!("CREATE TABLE scored AS {endless}"),
        ),
    ] {
        let mut child = batchinfer(&server, &wh)
            .args(["--warehouse", "s3://lake/wh/", "--models", "data/models"])
            .args(["query", "-e", &sql])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !open_uploads(&server).iter().any(|n| n.contains(".part-")) {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the statement ended by itself"
            );
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no part uploaded"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        common::send(child.id(), signal);
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the statement did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert_failure(&out, &["cancelled by", "nothing it wrote was kept"]);
        assert_eq!(server.keys(bucket, ""), Vec::<String>::new(), "{sql}");
        assert_eq!(open_uploads(&server), Vec::<String>::new(), "{sql}");
    }
}

/// A loopback listener that accepts every connection and never answers, until dropped.
struct Silent {
    endpoint: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Silent {
    fn start() -> Silent {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) && held.len() < 100 {
                    if let Ok((socket, _)) = listener.accept() {
                        held.push(socket);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        });
        Silent {
            endpoint,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one object (CREATE MODEL reads the model file) from `endpoint`; how long it took.
fn read_one_object_from(endpoint: &str) -> (Output, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = common::output_within(
        common::binary()
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("BATCHINFER_WAREHOUSE", dir.path().join("wh"))
            .args(["query", "-e", "CREATE MODEL m FROM 's3://models/m.onnx'"]),
        Duration::from_secs(120),
    );
    (out, started.elapsed())
}

/// A server that accepts connections and never answers: the request gives up after its 30 s
/// timeout, and no retry starts after 15 s, so the statement fails after about 30 s.
#[test]
fn a_server_that_never_answers_fails_after_the_request_timeout() {
    let silent = Silent::start();
    let (out, took) = read_one_object_from(&silent.endpoint);
    assert_failure(&out, &["could not reach the S3 endpoint", &silent.endpoint]);
    assert!(
        took >= Duration::from_secs(29) && took <= Duration::from_secs(50),
        "took {took:?}"
    );
}

/// An endpoint where connections never open (a listener whose queue is full): each attempt
/// gives up after the 5 s connect timeout, and retries stop 15 s after the first.
#[test]
fn a_connection_that_never_opens_fails_after_the_connect_timeout_and_retries() {
    // A listener with a backlog of 0, whose one queued connection is taken by this test: the
    // kernel then leaves every new connection unanswered.
    // SAFETY: plain socket calls on a descriptor this test owns and closes.
    let (fd, port) = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let mut address: libc::sockaddr_in = std::mem::zeroed();
        address.sin_family = libc::AF_INET as libc::sa_family_t;
        address.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let size = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, &address as *const _ as *const libc::sockaddr, size),
            0
        );
        assert_eq!(libc::listen(fd, 0), 0);
        let mut bound: libc::sockaddr_in = std::mem::zeroed();
        let mut len = size;
        libc::getsockname(fd, &mut bound as *mut _ as *mut libc::sockaddr, &mut len);
        (fd, u16::from_be(bound.sin_port))
    };
    let _queued = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let (out, took) = read_one_object_from(&endpoint);
    // SAFETY: the descriptor opened above.
    unsafe { libc::close(fd) };
    assert_failure(&out, &["could not reach the S3 endpoint", &endpoint]);
    assert!(
        took >= Duration::from_secs(5) && took <= Duration::from_secs(25),
        "took {took:?}"
    );
}
