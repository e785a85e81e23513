//! `batchinfer serve`: the engine as an Arrow Flight SQL server, for BI tools, notebooks and
//! services (any Flight SQL client: ADBC, JDBC, ODBC drivers). The feature whole: how clients are
//! let in (`auth.rs`: a bearer token, a username and password, session tokens; failed attempts
//! slowed per address: `throttle.rs`), their sessions
//! (`sessions.rs`: each with its own engine session and `SET` options, over the models loaded
//! once), the protocol (`service.rs`: statements, updates, prepared statements, results
//! streamed), statements with their parameters bound (`params.rs`), what a client's catalog
//! browser asks (`metadata.rs`), and the server itself here (address, TLS, the limit on
//! statements at once, shutting down).

mod auth;
mod connections;
mod metadata;
mod params;
mod replies;
mod running;
mod service;
mod sessions;
mod statement;
mod throttle;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use tonic::transport::{Identity, Server, ServerTlsConfig};

pub use auth::Credentials;

use crate::engine::Engine;
use crate::error::{Error, Result};

/// How `batchinfer serve` serves (its flags).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The address to listen on.
    pub bind: SocketAddr,
    /// Who is let in.
    pub credentials: Credentials,
    /// Serve a non-loopback address with no authentication (refused without it).
    pub insecure_no_auth: bool,
    /// TLS: the certificate chain and its private key, PEM files.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Statements that run at once, all sessions together; the others wait for one to end.
    pub max_statements: usize,
    /// How long a statement may run (its result streamed included) before it is cancelled.
    pub statement_timeout: Option<Duration>,
    /// How long a session is kept with no call before it is ended.
    pub idle_timeout: Duration,
    /// What clients may read and write.
    pub confinement: Confinement,
}

/// What a server's clients may read and write (`--allow-dir`, `--no-local-files`,
/// `--allow-url`, `--read-only`): their sessions start so confined, and a `SET` only narrows it.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    pub allow_dirs: Vec<PathBuf>,
    pub no_local_files: bool,
    pub allow_urls: Vec<String>,
    pub read_only: bool,
}

impl Confinement {
    /// The `batchinfer.*` settings it comes to, for a server listening on `bind`: beyond
    /// loopback, no local file unless `--allow-dir` says which.
    fn settings(&self, bind: &SocketAddr) -> Result<Vec<(&'static str, String)>> {
        let mut settings = Vec::new();
        if self.read_only {
            settings.push(("read_only", "true".to_string()));
        }
        if !self.allow_dirs.is_empty() {
            let mut folders = Vec::new();
            for dir in &self.allow_dirs {
                let dir = dir.to_str().filter(|d| !d.contains(',')).ok_or_else(|| {
                    Error::Usage(format!(
                        "--allow-dir {}: a folder's name must be UTF-8 without a comma",
                        dir.display()
                    ))
                })?;
                folders.push(dir);
            }
            settings.push(("allowed_directories", folders.join(",")));
        } else if self.no_local_files || !bind.ip().is_loopback() {
            settings.push(("allowed_directories", String::new()));
        }
        if !self.allow_urls.is_empty() {
            settings.push(("allowed_urls", self.allow_urls.join(",")));
        }
        Ok(settings)
    }

    /// What the server says of it when it starts.
    fn describe(&self, bind: &SocketAddr) -> String {
        let local = if !self.allow_dirs.is_empty() {
            let dirs: Vec<String> = self
                .allow_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            format!("local files under {}", dirs.join(", "))
        } else if self.no_local_files {
            "no local file".to_string()
        } else if !bind.ip().is_loopback() {
            "no local file (beyond loopback; --allow-dir DIR to allow some)".to_string()
        } else {
            "any local file".to_string()
        };
        let stores = if self.allow_urls.is_empty() {
            "any object store".to_string()
        } else {
            format!("object stores under {}", self.allow_urls.join(", "))
        };
        let writes = if self.read_only { "; read-only" } else { "" };
        format!("clients reach {local} and {stores}{writes}")
    }
}

/// Sessions kept at once; past it, the one idle longest is ended for a new one.
pub const MAX_SESSIONS: usize = 1000;

/// Serves `engine`'s models and warehouse until SIGINT or SIGTERM; then the statements running
/// are cancelled (what they wrote discarded) and the process ends.
pub async fn serve(engine: Engine, options: ServeOptions) -> Result<()> {
    check_exposure(&options)?;
    engine
        .confine(&options.confinement.settings(&options.bind)?)
        .map_err(|e| Error::Usage(format!("confining the server's clients: {e}")))?;
    let tls = match &options.tls {
        Some((cert, key)) => Some(tls_config(cert, key)?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|e| Error::io(format!("listening on {}", options.bind), e))?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::io("reading the address listened on", e))?;
    let scheme = if tls.is_some() { "grpc+tls" } else { "grpc" };
    let mut server = Server::builder()
        // A client that vanished without closing is found out, and its statements dropped.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some(tls) = tls {
        server = server.tls_config(tls).map_err(|e| {
            Error::Usage(format!(
                "TLS cannot be set up with --tls-cert and --tls-key ({e}): the certificate \
                 chain and its private key must be PEM files that go together"
            ))
        })?;
    }
    running::start_statements_runtime(options.max_statements)
        .map_err(|e| Error::io("starting the statements' threads", e))?;
    let service = service::FlightSql::new(Arc::new(engine), &options);
    let gate = service.gate();
    crate::say!(
        "batchinfer serve: Arrow Flight SQL on {scheme}://{address} ({}; at most {} statement(s) at once; {})",
        options.credentials.describe(),
        options.max_statements,
        options.confinement.describe(&options.bind)
    );
    let incoming = connections::accepted(listener, connections::max_connections());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = server
        .add_service(tonic::service::interceptor::InterceptedService::new(
            FlightServiceServer::new(service)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            gate,
        ))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
    tokio::pin!(served);
    let result = tokio::select! {
        result = &mut served => result,
        signal = crate::runner::stop_signal() => {
            crate::say!("batchinfer serve: stopping ({signal}): running statements are cancelled");
            // Model calls in flight end, and scoring loops stop between micro-batches; no new
            // call is taken.
            crate::stop::request(signal);
            let _ = stop.send(());
            // What is still running then is dropped, and its writes discarded.
            tokio::time::timeout(STOPPING_WITHIN, &mut served)
                .await
                .unwrap_or(Ok(()))
        }
    };
    crate::storage::discards_done().await;
    result.map_err(|e| Error::Usage(format!("the server stopped: {e}")))
}

/// How long statements have to end once the server is told to stop.
const STOPPING_WITHIN: Duration = Duration::from_secs(10);

/// The largest gRPC message taken or sent (a batch of parameters, a record batch of results).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Refuses to let anyone on the network in unasked: a non-loopback address needs a token, a
/// password, or `--insecure-no-auth`.
fn check_exposure(options: &ServeOptions) -> Result<()> {
    if options.credentials.required() || options.bind.ip().is_loopback() {
        return Ok(());
    }
    if options.insecure_no_auth {
        crate::say!(
            "warning: serving {} with no authentication (--insecure-no-auth): anyone who can \
             reach it can read and write what this process can",
            options.bind
        );
        return Ok(());
    }
    Err(Error::Usage(format!(
        "refusing to serve {} with no authentication: set BATCHINFER_TOKEN (or --token-file), \
         or --user with BATCHINFER_PASSWORD (or --password-file); or bind 127.0.0.1; or say \
         --insecure-no-auth",
        options.bind
    )))
}

/// The server's TLS: `cert` (its chain) and `key`, PEM files.
fn tls_config(cert: &PathBuf, key: &PathBuf) -> Result<ServerTlsConfig> {
    // rustls is built with two crypto providers; the server uses ring's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |path: &PathBuf, what: &str| {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(format!("reading the TLS {what} {}", path.display()), e))?;
        if !String::from_utf8_lossy(&bytes).contains("-----BEGIN") {
            return Err(Error::Usage(format!(
                "the TLS {what} {} is not a PEM file (-----BEGIN ...)",
                path.display()
            )));
        }
        Ok(bytes)
    };
    let identity = Identity::from_pem(read(cert, "certificate")?, read(key, "key")?);
    Ok(ServerTlsConfig::new().identity(identity))
}
