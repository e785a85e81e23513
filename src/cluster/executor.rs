//! An executor: runs the tasks its scheduler gives it, with batchinfer's functions over its own
//! model registry (the client's definitions come with each task's session).

use std::sync::Arc;

use ballista_core::registry::BallistaFunctionRegistry;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use datafusion::prelude::SessionConfig;

use super::client::Remote;
use super::node::Node;
use super::{HEARTBEAT_SECONDS, cluster_error, warn_if_exposed};
use crate::config::{BatchInferOptions, EngineConfig};
use crate::context::{cluster_session_config, runtime_env, scalar_functions};
use crate::error::Result;

/// Where an executor listens and whom it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler.
    pub scheduler: Remote,
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
    let node = Node::new(config).await?;
    let scheduler = &options.scheduler;
    // Ballista's default registry lacks DataFusion's list functions (`array_element`, which
    // `predict(...)[i]` plans into, `make_array`, ...): added here, then batchinfer's own.
    let mut functions = BallistaFunctionRegistry::default();
    let nested = datafusion::functions_nested::all_default_nested_functions();
    for f in nested.into_iter().chain(scalar_functions(&node.registry)) {
        functions.scalar_functions.insert(f.name().to_string(), f);
    }
    let stores = node.stores.clone();
    // Its own --memory-limit: the memory of this machine's tasks.
    let memory_limit = config.memory_limit;
    let process = ExecutorProcessConfig {
        bind_host: options.bind_host.clone(),
        external_host: Some(options.bind_host.clone()),
        port: options.port,
        grpc_port: options.port + 1,
        scheduler_host: scheduler.host().to_string(),
        scheduler_port: scheduler.port(),
        scheduler_connect_timeout_seconds: 30,
        vcores: options.concurrent_tasks.max(1),
        work_dir: options.work_dir.clone(),
        executor_heartbeat_interval_seconds: HEARTBEAT_SECONDS,
        print_thread_info: false,
        override_function_registry: Some(Arc::new(functions)),
        override_logical_codec: Some(super::codec::logical()),
        override_physical_codec: Some(super::codec::physical()),
        override_config_producer: Some(Arc::new(cluster_session_config)),
        override_runtime_producer: Some(Arc::new(move |config: &SessionConfig| {
            // The footer cap and confinement of the client's session, as its query says.
            let limits = crate::storage::SessionLimits::of(
                config.options().extensions.get::<BatchInferOptions>(),
            );
            runtime_env(&stores, memory_limit, Arc::new(limits))
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
