//! llama.cpp's OpenAI-compatible server (SmolLM2-135M-Instruct) and a fault-injecting proxy in
//! front of it, started for the tests from scripts/llm_server.py (scripts/llm_server.sh
//! installs them, checked against their sha256).
// Shared by several test crates, each of which uses part of it.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// The python of scripts/llm_server.sh's environment.
pub fn python() -> PathBuf {
    crate::fixtures::made_by("llm_server.sh", &[])
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process of scripts/llm_server.py, stopped when dropped (and when the test process ends:
/// it stops when its standard input closes).
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        Server::start_at(args, free_port())
    }

    /// [`Server::start`] on `port` (a server started again where it was).
    pub fn start_at(args: &[&str], port: u16) -> Server {
        let mut child = Command::new(python())
            .arg("scripts/llm_server.py")
            .args(args)
            .args(["--port", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{args:?} did not start");
        Server { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// A proxy's counts: received, forwarded, failed, reset, delayed.
    pub fn counts(&self) -> serde_json::Value {
        let out = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{}/_counts", self.port)])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn count(&self, what: &str) -> u64 {
        self.counts()[what].as_u64().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The llama.cpp server every test shares (4 slots).
pub fn llama() -> &'static Server {
    static LLAMA: OnceLock<Server> = OnceLock::new();
    LLAMA.get_or_init(|| Server::start(&["serve", "--parallel", "4", "--threads", "2"]))
}

/// A llama.cpp server that computes each request whole and alone (one slot, no prompt cache), so
/// that the same request gets the same log-probabilities whatever came before it: with
/// several slots or a prompt's start reused, they vary by up to a few hundredths.
pub fn llama_exact() -> &'static Server {
    static EXACT: OnceLock<Server> = OnceLock::new();
    EXACT.get_or_init(|| {
        Server::start(&[
            "serve",
            "--parallel",
            "1",
            "--threads",
            "2",
            "--no-prompt-cache",
        ])
    })
}

/// A fault-injecting proxy in front of the llama.cpp server.
pub fn proxy(faults: &[&str]) -> Server {
    proxy_to(llama(), faults)
}

/// A fault-injecting proxy in front of `upstream`.
pub fn proxy_to(upstream: &Server, faults: &[&str]) -> Server {
    let upstream = format!("http://127.0.0.1:{}", upstream.port);
    let mut args = vec!["proxy", "--upstream", upstream.as_str()];
    args.extend_from_slice(faults);
    Server::start(&args)
}

/// An emulator of OpenAI's Batch API (scripts/batch_api.py) in front of the llama.cpp server,
/// keeping its state in `state` (started again on the same folder and port, it goes on), with
/// `faults` (`--fail-every N`, `--expire-first`, `--hold`).
pub fn batch_api(state: &std::path::Path, faults: &[&str]) -> Server {
    batch_api_at(state, faults, free_port())
}

/// [`batch_api`] on `port`.
pub fn batch_api_at(state: &std::path::Path, faults: &[&str], port: u16) -> Server {
    let upstream = format!("http://127.0.0.1:{}", llama().port);
    let state = state.display().to_string();
    let mut args = vec![
        "batches",
        "--upstream",
        upstream.as_str(),
        "--state",
        state.as_str(),
    ];
    args.extend_from_slice(faults);
    Server::start_at(&args, port)
}

/// The Batch API emulator every test of the documents' examples shares.
pub fn shared_batch_api() -> &'static Server {
    static BATCHES: OnceLock<(tempfile::TempDir, Server)> = OnceLock::new();
    &BATCHES
        .get_or_init(|| {
            let state = tempfile::tempdir().unwrap();
            let server = batch_api(state.path(), &[]);
            (state, server)
        })
        .1
}

/// A llama.cpp server of embeddings (`--embedding`), shared by every test.
pub fn llama_embeddings() -> &'static Server {
    static EMBEDDINGS: OnceLock<Server> = OnceLock::new();
    EMBEDDINGS.get_or_init(|| {
        Server::start(&["serve", "--parallel", "2", "--threads", "1", "--embedding"])
    })
}
