//! The storage emulators the tests run as servers of their own, over HTTP on loopback ports:
//! Azurite (Microsoft's Azure Blob Storage emulator) and fake-gcs-server (Google Cloud Storage),
//! installed by `scripts/emulators.sh` on first use. Each test starts its own and stops it when
//! dropped. Objects are put and listed with the services' own REST APIs, signed as a client of
//! Azure signs them, so that what a test checks does not go through batchinfer.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

/// The folder the emulators are installed in (installed now if they are not).
/// (It needs pip and npm with access to PyPI and npm.)
fn installed() -> PathBuf {
    crate::fixtures::made_by("emulators.sh", &[])
}

/// A free loopback port (bound and let go: the server binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `port` accepts connections, or panics with the server's log.
fn wait_listening(port: u16, child: &mut Child, log: &Path) {
    let started = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the emulator exited ({status}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the emulator is not listening on {port} after 60 s: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn spawn(mut command: Command, dir: &Path, name: &str) -> (Child, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let log = dir.join(format!("{name}.log"));
    let child = command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.err"))).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    (child, log)
}

/// One HTTP/1.1 exchange on a new connection: the status and the body.
fn exchange(port: u16, request: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let text = String::from_utf8_lossy(&response);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text}"));
    let body_at = text.find("\r\n\r\n").map_or(response.len(), |at| at + 4);
    let (head, body) = response.split_at(body_at);
    let chunked = String::from_utf8_lossy(head)
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (
        status,
        if chunked {
            unchunk(body)
        } else {
            body.to_vec()
        },
    )
}

fn unchunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&body[..line_end]).trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        let start = line_end + 2;
        out.extend_from_slice(&body[start..start + size]);
        body = &body[start + size + 2..];
    }
}

/// Azurite's well-known development account, which `AZURE_STORAGE_USE_EMULATOR=true` uses.
pub const AZURE_ACCOUNT: &str = "devstoreaccount1";
pub const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Azurite's blob service, its data in a folder of its own.
pub struct Azurite {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Azurite {
    pub fn start(dir: &Path) -> Azurite {
        let script = installed().join("azurite/node_modules/azurite/dist/src/blob/main.js");
        let port = free_port();
        let mut command = Command::new("node");
        command.arg(script).args([
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            &port.to_string(),
            "--location",
            &dir.join("data").to_string_lossy(),
            "--skipApiVersionCheck",
            "--disableProductStyleUrl",
            "--silent",
        ]);
        let (mut child, log) = spawn(command, dir, "azurite");
        wait_listening(port, &mut child, &log);
        Azurite {
            child,
            port,
            dir: dir.to_path_buf(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment that points a client (batchinfer) at this emulator.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
            ("AZURITE_BLOB_STORAGE_URL", self.url()),
        ]
    }

    /// A request signed with the account's key (Azure's Shared Key scheme): `path` after the
    /// account (`/container/blob`), `query` as `(name, value)` pairs.
    fn request(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        use ring::hmac;
        let date = httpdate();
        let mut ms_headers: Vec<(String, String)> = headers
            .iter()
            .filter(|(k, _)| k.starts_with("x-ms-"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ms_headers.push(("x-ms-date".into(), date));
        ms_headers.push(("x-ms-version".into(), "2021-08-06".into()));
        ms_headers.sort();
        let mut params: Vec<(&str, &str)> = query.to_vec();
        params.sort();
        let length = if body.is_empty() {
            String::new()
        } else {
            body.len().to_string()
        };
        let content_type = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map_or("", |(_, v)| *v);
        let mut to_sign = format!("{method}\n\n\n{length}\n\n{content_type}\n\n\n\n\n\n\n");
        for (k, v) in &ms_headers {
            to_sign.push_str(&format!("{k}:{v}\n"));
        }
        to_sign.push_str(&format!("/{AZURE_ACCOUNT}/{AZURE_ACCOUNT}{path}"));
        for (k, v) in &params {
            to_sign.push_str(&format!("\n{k}:{v}"));
        }
        let key = hmac::Key::new(hmac::HMAC_SHA256, &BASE64.decode(AZURE_KEY).unwrap());
        let signature = BASE64.encode(hmac::sign(&key, to_sign.as_bytes()).as_ref());
        let query_text: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut request = format!(
            "{method} /{AZURE_ACCOUNT}{path}{}{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
             Connection: close\r\nContent-Length: {}\r\nAuthorization: SharedKey {AZURE_ACCOUNT}:{signature}\r\n",
            if params.is_empty() { "" } else { "?" },
            query_text.join("&"),
            self.port,
            body.len()
        );
        for (k, v) in &ms_headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        if !content_type.is_empty() {
            request.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);
        exchange(self.port, &bytes)
    }

    pub fn create_container(&self, name: &str) {
        let (status, body) = self.request(
            "PUT",
            &format!("/{name}"),
            &[("restype", "container")],
            &[],
            &[],
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }

    /// Puts the local `file` as the block blob `container/blob`.
    pub fn put_file(&self, container: &str, blob: &str, file: &Path) {
        let bytes = std::fs::read(file).unwrap();
        let (status, body) = self.request(
            "PUT",
            &format!("/{container}/{blob}"),
            &[],
            &[("x-ms-blob-type", "BlockBlob")],
            &bytes,
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }

    pub fn delete(&self, container: &str, blob: &str) {
        let (status, body) = self.request("DELETE", &format!("/{container}/{blob}"), &[], &[], &[]);
        assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    }

    /// The names of the blobs in `container` (committed ones; with `uncommitted`, blobs that
    /// have only uncommitted blocks too).
    pub fn blobs(&self, container: &str, uncommitted: bool) -> Vec<String> {
        let mut query = vec![("restype", "container"), ("comp", "list")];
        if uncommitted {
            query.push(("include", "uncommittedblobs"));
        }
        let (status, body) = self.request("GET", &format!("/{container}"), &query, &[], &[]);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, 200, "{text}");
        text.split("<Name>")
            .skip(1)
            .filter_map(|part| part.split_once("</Name>").map(|(name, _)| name.to_string()))
            .collect()
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// fake-gcs-server, in memory, its buckets and objects seeded from the folders of `seed`
/// (`seed/BUCKET/KEY`). It also serves objects at `/BUCKET/KEY` as a plain HTTP server does,
/// with HEAD and ranges: the tests' HTTP(S) server too.
pub struct FakeGcs {
    child: Child,
    pub port: u16,
}

impl FakeGcs {
    pub fn start(dir: &Path, seed: &Path) -> FakeGcs {
        let port = free_port();
        let mut command = Command::new(installed().join("fake-gcs-server"));
        command.args([
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            &port.to_string(),
            "-backend",
            "memory",
            "-data",
            &seed.to_string_lossy(),
            "-public-host",
            &format!("127.0.0.1:{port}"),
            "-external-url",
            &format!("http://127.0.0.1:{port}"),
            "-log-level",
            "warn",
        ]);
        let (mut child, log) = spawn(command, dir, "fake-gcs-server");
        wait_listening(port, &mut child, &log);
        FakeGcs { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A service-account key that points object_store's client at this server without OAuth
    /// (what object_store's own tests use): `GOOGLE_SERVICE_ACCOUNT_KEY` or
    /// `'gcp.service_account_key'`.
    pub fn service_account_key(&self) -> String {
        format!(
            r#"{{"private_key": "unused", "private_key_id": "unused", "client_email": "test@example.com", "disable_oauth": true, "gcs_base_url": "{}"}}"#,
            self.url()
        )
    }

    /// The names of the objects in `bucket` (its JSON API).
    pub fn objects(&self, bucket: &str) -> Vec<String> {
        let (status, body) = exchange(
            self.port,
            format!(
                "GET /storage/v1/b/{bucket}/o HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
                self.port
            )
            .as_bytes(),
        );
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, 200, "{text}");
        text.split("\"name\":\"")
            .skip(1)
            .filter_map(|part| part.split_once('"').map(|(name, _)| name.to_string()))
            .collect()
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The date as HTTP writes it (`Tue, 01 Dec 2026 06:47:00 GMT`).
fn httpdate() -> String {
    let out = Command::new("date")
        .env("LC_ALL", "C")
        .args(["-u", "+%a, %d %b %Y %H:%M:%S GMT"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
