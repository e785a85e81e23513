//! The scheduler: plans each client's queries with that client's model definitions, hands the
//! tasks to the executors, and fails a query that comes when no executor is registered.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ballista_core::serde::protobuf::executor_status;
use ballista_scheduler::cluster::{BallistaCluster, ClusterState};
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::context::SessionState;
use datafusion::prelude::SessionConfig;

use super::node::Node;
use super::{EXECUTOR_TIMEOUT_SECONDS, cluster_error, warn_if_exposed};
use crate::config::EngineConfig;
use crate::context::{cluster_session_config, cluster_state};
use crate::error::Result;
use crate::statement_context::StatementContext;

/// A scheduler's node, and its cluster's executors once it runs.
struct Scheduler {
    node: Node,
    executors: OnceLock<Executors>,
}

impl Scheduler {
    /// The state for a client's session: planning reads each model's signature, through the
    /// model definitions of that client ([`crate::model::shared`]).
    fn session_state(&self, mut config: SessionConfig) -> datafusion::error::Result<SessionState> {
        if let Some(executors) = self.executors.get() {
            executors.wait_for_one()?;
            // Each executor takes its share of an endpoint model's limits: the statement
            // travels to them with the count.
            if let Some(statement) = config
                .options_mut()
                .extensions
                .get_mut::<StatementContext>()
            {
                statement.executors = executors.alive();
            }
        }
        let registry = match config.options().extensions.get::<StatementContext>() {
            Some(statement) => self.node.registry.for_session(&statement.models)?,
            None => self.node.registry.clone(),
        };
        cluster_state(config, &self.node.stores, &registry)
    }
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

/// Runs a scheduler on `bind` until the process is stopped. A query that comes when no executor
/// is registered waits for one at most `wait_for_executors`, then fails saying so.
pub async fn run_scheduler(
    bind: SocketAddr,
    wait_for_executors: Duration,
    config: &EngineConfig,
) -> Result<()> {
    let node = Arc::new(Scheduler {
        node: Node::new(config).await?,
        executors: OnceLock::new(),
    });
    let mut scheduler = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        bind_port: bind.port(),
        external_host: bind.ip().to_string(),
        executor_timeout_seconds: EXECUTOR_TIMEOUT_SECONDS,
        expire_dead_executor_interval_seconds: 2,
        no_executors_grace_period_seconds: EXECUTOR_TIMEOUT_SECONDS,
        override_logical_codec: Some(super::codec::logical()),
        override_physical_codec: Some(super::codec::physical()),
        ..Default::default()
    };
    let sessions = node.clone();
    scheduler = scheduler
        .with_override_config_producer(Arc::new(cluster_session_config))
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
async fn report_executors(node: Arc<Scheduler>) {
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
