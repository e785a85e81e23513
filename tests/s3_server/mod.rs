//! A real S3-compatible server for the tests: `s3s` with its file-system backend (`s3s-fs`),
//! in-process, over HTTP on a loopback port, checking SigV4 signatures against one key pair.
//! Buckets are the folders of its root.
//!
//! It can be stopped and started again on the same port and root, and it can hold back the n-th
//! write to a bucket (the request never gets an answer), so that a test can stop the server in the
//! middle of a write.
// Shared by several test crates, each of which uses part of it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, mpsc};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

pub const ACCESS_KEY: &str = "batchinfer-test";
pub const SECRET_KEY: &str = "batchinfer-test-secret";

/// Writes (PUT or POST) into a bucket are counted down; the one that reaches zero is held, and
/// reported on the channel.
type Hold = Arc<Mutex<Option<(String, usize, mpsc::Sender<()>)>>>;

pub struct S3Server {
    pub root: PathBuf,
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    hold: Hold,
}

impl S3Server {
    /// A server over `root` (created) on a free loopback port.
    pub fn start(root: &Path) -> S3Server {
        std::fs::create_dir_all(root).unwrap();
        let mut server = S3Server {
            root: root.to_path_buf(),
            addr: "127.0.0.1:0".parse().unwrap(),
            runtime: None,
            hold: Arc::new(Mutex::new(None)),
        };
        server.run();
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `command` set to reach this server (its key pair, endpoint and region), with no other
    /// AWS setting the test's environment may have.
    pub fn client<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        for (key, _) in std::env::vars() {
            if key.starts_with("AWS") {
                command.env_remove(key);
            }
        }
        command
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", self.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
    }

    /// The batchinfer binary (`--format csv`) over the warehouse `s3://lake/wh/` of this server,
    /// running `query -e SQL` for each `sql` it is given.
    pub fn lake_warehouse(&self) -> impl Fn(&str) -> Command + '_ {
        move |sql: &str| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
            self.client(&mut command).args([
                "--format",
                "csv",
                "--warehouse",
                "s3://lake/wh/",
                "query",
                "-e",
                sql,
            ]);
            command
        }
    }

    /// A bucket (a folder of the root).
    pub fn bucket(&self, name: &str) -> PathBuf {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Puts a local file at `bucket/key`.
    pub fn put_file(&self, bucket: &str, key: &str, file: &Path) {
        let path = self.bucket(bucket).join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::copy(file, path).unwrap();
    }

    /// The keys under `bucket/prefix` whose names do not start with '.' (the server's own files).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let dir = self.root.join(bucket).join(prefix);
        let mut stack = vec![dir];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    continue;
                }
                if entry.path().is_dir() {
                    stack.push(entry.path());
                } else {
                    let key = entry.path();
                    let key = key.strip_prefix(self.root.join(bucket)).unwrap();
                    keys.push(key.display().to_string());
                }
            }
        }
        keys.sort();
        keys
    }

    /// Holds the `nth` write request (1-based) into `bucket` and says so on the returned channel.
    pub fn hold_write_to(&self, bucket: &str, nth: usize) -> mpsc::Receiver<()> {
        self.hold_write_under(&format!("{bucket}/"), nth)
    }

    /// Holds the `nth` write request (1-based) to a key starting with `bucket/prefix`.
    pub fn hold_write_under(&self, prefix: &str, nth: usize) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        *self.hold.lock().unwrap() = Some((format!("/{prefix}"), nth, tx));
        rx
    }

    /// Stops the server at once: open connections are dropped mid-request.
    pub fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// Starts the server again on the same port and root.
    pub fn restart(&mut self) {
        self.stop();
        *self.hold.lock().unwrap() = None;
        self.run();
    }

    fn run(&mut self) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fs = s3s_fs::FileSystem::new(&self.root).unwrap();
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
        let s3 = builder.build();
        let hold = self.hold.clone();
        // s3s-fs checks a conditional PUT's condition, then writes: two at once could both
        // pass. S3 decides them one at a time, and so does this server.
        let conditional = Arc::new(tokio::sync::Mutex::new(()));
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let s3 = s3.clone();
                let held = held_by(&hold, &req);
                let conditional = conditional.clone();
                async move {
                    if let Some(report) = held {
                        // The writes before this one finish first.
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                        let _ = report.send(());
                        std::future::pending::<()>().await;
                    }
                    let headers = req.headers();
                    let _one_at_a_time = if headers.contains_key("if-none-match")
                        || headers.contains_key("if-match")
                    {
                        Some(conditional.lock().await)
                    } else {
                        None
                    };
                    hyper::service::Service::call(&s3, req).await
                }
            });
        let addr = self.addr;
        let listener = runtime.block_on(async {
            // Binding again right after a stop needs a few tries while the old socket closes.
            for _ in 0..50 {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(listener) => return listener,
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                }
            }
            panic!("cannot bind {addr}");
        });
        self.addr = listener.local_addr().unwrap();
        runtime.spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            while let Ok((socket, _)) = listener.accept().await {
                let connection = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                tokio::spawn(connection);
            }
        });
        self.runtime = Some(runtime);
    }
}

/// Whether the request is the one to hold: then, where to report it.
fn held_by(hold: &Hold, req: &hyper::Request<hyper::body::Incoming>) -> Option<mpsc::Sender<()>> {
    let mut hold = hold.lock().unwrap();
    let writes = matches!(*req.method(), hyper::Method::PUT | hyper::Method::POST);
    match hold.as_mut() {
        Some((prefix, left, tx)) if writes && req.uri().path().starts_with(prefix.as_str()) => {
            *left -= 1;
            if *left > 0 {
                return None;
            }
            let report = tx.clone();
            *hold = None;
            Some(report)
        }
        _ => None,
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
