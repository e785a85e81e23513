//! Beyond one machine: the same statements on an Apache DataFusion Ballista cluster. This binary
//! is the client (`--remote df://host:port`), the scheduler (`batchinfer scheduler`) and the
//! executors (`batchinfer executor`); Ballista does the distribution, we add our functions and
//! our models to each process.
//!
//! Every process registers batchinfer's functions over a model registry of its own, filled from
//! its `--models` and `--warehouse` and from the definitions the client sends with each query (the
//! session option `batchinfer.models`, JSON of name -> source): models come from S3 or from paths
//! that are the same on every machine. Each process loads a model once and shares it across its
//! tasks.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ballista_core::serde::protobuf::executor_status;
use ballista_scheduler::cluster::ClusterState;

use ballista_core::extension::{
    SessionConfigExt, ballista_aggregate_functions, ballista_scalar_functions,
    ballista_window_functions,
};
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::SessionState;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::SessionConfig;

use crate::config::{BatchInferOptions, EngineConfig};
use crate::context::scalar_functions;
use crate::error::{Error, Result};
use crate::model::ModelRegistry;
use crate::storage::StoreRegistry;

/// An executor is declared dead this long after its last heartbeat, and its tasks rescheduled.
pub const EXECUTOR_TIMEOUT_SECONDS: u64 = 20;
/// How often an executor tells the scheduler it is alive.
pub const HEARTBEAT_SECONDS: u64 = 5;

/// The scheduler address of `df://host:port` (or `host:port`), as Ballista's client wants it.
pub fn scheduler_url(remote: &str) -> Result<String> {
    let address = remote
        .strip_prefix("df://")
        .unwrap_or(remote)
        .trim_end_matches('/');
    let (host, port) = match address.rsplit_once(':') {
        Some((host, port)) => (host, port),
        None => (address, "50050"),
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(Error::Usage(format!(
            "'{remote}' is not a scheduler address: expected df://HOST:PORT"
        )));
    }
    Ok(format!("http://{host}:{port}"))
}

/// The session configuration every process of a cluster starts from.
fn cluster_config() -> SessionConfig {
    SessionConfig::new_with_ballista()
        .with_information_schema(true)
        .with_option_extension(BatchInferOptions::default())
}

/// What a scheduler or an executor holds: its object stores and its models; a scheduler also
/// its cluster's executors, once it runs.
struct Node {
    stores: Arc<StoreRegistry>,
    registry: Arc<ModelRegistry>,
    executors: OnceLock<Executors>,
}

/// The executors a scheduler knows, and how long a query waits for one.
struct Executors {
    state: Arc<dyn ClusterState>,
    wait: Duration,
    address: SocketAddr,
}

impl Executors {
    /// Executors that sent a heartbeat within the timeout and did not say they are going.
    fn alive(&self) -> usize {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.state
            .executor_heartbeats()
            .values()
            .filter(|h| h.timestamp + EXECUTOR_TIMEOUT_SECONDS > now)
            .filter(|h| {
                matches!(
                    h.status.as_ref().and_then(|s| s.status.as_ref()),
                    None | Some(executor_status::Status::Active(_))
                )
            })
            .count()
    }

    /// Waits (up to the configured time) for an executor to be registered; an error naming the
    /// scheduler when none is, instead of a query queued until one comes.
    fn wait_for_one(&self) -> datafusion::error::Result<()> {
        let started = Instant::now();
        while self.alive() == 0 {
            if started.elapsed() >= self.wait {
                return Err(datafusion::error::DataFusionError::Execution(format!(
                    "the scheduler at {} has no executor registered (waited {} s): start one \
                     with `batchinfer executor --scheduler {}`",
                    self.address,
                    self.wait.as_secs(),
                    self.address
                )));
            }
            // The planning call this runs in is async: let the runtime go on meanwhile.
            tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(200)));
        }
        Ok(())
    }
}

impl Node {
    fn new(config: &EngineConfig) -> Result<Self> {
        let stores = Arc::new(StoreRegistry::new());
        let registry = Arc::new(ModelRegistry::new(config, stores.clone()));
        if let Some(root) = &config.warehouse {
            let warehouse = crate::warehouse::Warehouse::new(root, stores.clone())?;
            registry.register_sources(&warehouse.models()?)?;
        }
        if let Some(dir) = &config.models_dir {
            registry.register_dir(dir)?;
        }
        Ok(Node {
            stores,
            registry,
            executors: OnceLock::new(),
        })
    }

    fn functions(&self) -> Vec<Arc<ScalarUDF>> {
        scalar_functions(&self.registry)
    }

    /// The scheduler's state for a session: planning reads each model's signature, through the
    /// model definitions of the session's client ([`crate::model::shared`]).
    fn session_state(&self, config: SessionConfig) -> datafusion::error::Result<SessionState> {
        if let Some(executors) = self.executors.get() {
            executors.wait_for_one()?;
        }
        let registry = match config.options().extensions.get::<BatchInferOptions>() {
            Some(options) => self.registry.for_session(&options.models)?,
            None => self.registry.clone(),
        };
        let mut scalar = ballista_scalar_functions();
        scalar.extend(scalar_functions(&registry));
        Ok(SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_runtime_env(
                RuntimeEnvBuilder::new()
                    .with_object_store_registry(self.stores.clone())
                    .build_arc()?,
            )
            .with_scalar_functions(scalar)
            .with_aggregate_functions(ballista_aggregate_functions())
            .with_window_functions(ballista_window_functions())
            .build())
    }
}

/// Runs a scheduler on `bind` until the process is stopped. A query that comes when no executor
/// is registered waits for one at most `wait_for_executors`, then fails saying so.
pub async fn run_scheduler(
    bind: SocketAddr,
    wait_for_executors: Duration,
    config: &EngineConfig,
) -> Result<()> {
    let node = Arc::new(Node::new(config)?);
    let mut scheduler = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        bind_port: bind.port(),
        external_host: bind.ip().to_string(),
        executor_timeout_seconds: EXECUTOR_TIMEOUT_SECONDS,
        expire_dead_executor_interval_seconds: 2,
        no_executors_grace_period_seconds: EXECUTOR_TIMEOUT_SECONDS,
        ..Default::default()
    };
    let sessions = node.clone();
    scheduler = scheduler
        .with_override_config_producer(Arc::new(cluster_config))
        .with_override_session_builder(Arc::new(move |c| sessions.session_state(c)));
    let cluster = BallistaCluster::new_from_config(&scheduler)
        .await
        .map_err(cluster_error)?;
    let executors = Executors {
        state: cluster.cluster_state(),
        wait: wait_for_executors,
        address: bind,
    };
    let _ = node.executors.set(executors);
    eprintln!("batchinfer scheduler listening on {bind}");
    warn_if_exposed("scheduler", bind.ip());
    tokio::spawn(report_executors(node));
    start_server(cluster, bind, Arc::new(scheduler))
        .await
        .map_err(cluster_error)
}

/// Says on stderr how many executors are registered, whenever that changes.
async fn report_executors(node: Arc<Node>) {
    let Some(executors) = node.executors.get() else {
        return;
    };
    let mut known = 0;
    loop {
        let alive = executors.alive();
        if alive != known {
            eprintln!("batchinfer scheduler: {alive} executor(s) registered");
            known = alive;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Where an executor listens and whom it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler, `host:port`.
    pub scheduler: String,
    /// The address this executor listens on (and tells the scheduler).
    pub bind_host: String,
    /// Arrow Flight port (shuffle data); its gRPC port is the next one.
    pub port: u16,
    /// Tasks run at once (default: the cores).
    pub concurrent_tasks: usize,
    /// Where shuffle files go.
    pub work_dir: Option<String>,
}

/// Runs an executor until the process is stopped.
pub async fn run_executor(options: ExecutorOptions, config: &EngineConfig) -> Result<()> {
    let node = Arc::new(Node::new(config)?);
    let (scheduler_host, scheduler_port) = scheduler_url(&options.scheduler)?
        .trim_start_matches("http://")
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.parse::<u16>().unwrap_or(50050)))
        .ok_or_else(|| Error::Usage(format!("bad scheduler address {}", options.scheduler)))?;
    let mut functions = BallistaFunctionRegistry::default();
    for f in node.functions() {
        functions.scalar_functions.insert(f.name().to_string(), f);
    }
    let stores = node.stores.clone();
    let process = ExecutorProcessConfig {
        bind_host: options.bind_host.clone(),
        external_host: Some(options.bind_host.clone()),
        port: options.port,
        grpc_port: options.port + 1,
        scheduler_host,
        scheduler_port,
        scheduler_connect_timeout_seconds: 30,
        vcores: options.concurrent_tasks.max(1),
        work_dir: options.work_dir.clone(),
        executor_heartbeat_interval_seconds: HEARTBEAT_SECONDS,
        print_thread_info: false,
        override_function_registry: Some(Arc::new(functions)),
        override_config_producer: Some(Arc::new(cluster_config)),
        override_runtime_producer: Some(Arc::new(move |_config: &SessionConfig| {
            RuntimeEnvBuilder::new()
                .with_object_store_registry(stores.clone())
                .build_arc()
        })),
        ..Default::default()
    };
    eprintln!(
        "batchinfer executor on {}:{} serving scheduler {}",
        options.bind_host, options.port, options.scheduler
    );
    if let Ok(ip) = options.bind_host.parse::<std::net::IpAddr>() {
        warn_if_exposed("executor", ip);
    } else if options.bind_host != "localhost" {
        warn_if_exposed("executor", std::net::Ipv4Addr::UNSPECIFIED.into());
    }
    start_executor_process(Arc::new(process))
        .await
        .map_err(cluster_error)
}

/// A cluster process answers whoever reaches its port: it has no authentication. Said at start
/// whenever it listens beyond this machine.
fn warn_if_exposed(role: &str, ip: std::net::IpAddr) {
    if !ip.is_loopback() {
        eprintln!(
            "warning: this {role} listens on {ip}, beyond this machine, and has no \
             authentication: anyone who reaches its ports can run queries with this cluster's \
             models, files and credentials. Keep the cluster on a private network (a VPC subnet, \
             a firewall that admits only the cluster's machines), as the README says."
        );
    }
}

fn cluster_error(e: ballista_core::error::BallistaError) -> Error {
    Error::Usage(format!("cluster: {e}"))
}

#[cfg(test)]
mod tests {
    use super::scheduler_url;

    #[test]
    fn scheduler_addresses_parse_with_or_without_scheme() {
        assert_eq!(
            scheduler_url("df://host:50050").unwrap(),
            "http://host:50050"
        );
        assert_eq!(
            scheduler_url("10.0.0.1:6000").unwrap(),
            "http://10.0.0.1:6000"
        );
        assert_eq!(scheduler_url("df://host").unwrap(), "http://host:50050");
        assert!(scheduler_url("df://host:port").is_err());
    }
}
