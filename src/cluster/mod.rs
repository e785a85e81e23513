//! One process or a Ballista cluster: the one place that answers where statements run. The
//! engine holds a [`Placement`]; this binary is also the cluster's scheduler
//! (`batchinfer scheduler`, [`scheduler`]) and executors (`batchinfer executor`, [`executor`]).
//! Ballista does the distribution; batchinfer adds its functions and its models to each process,
//! and its own plan nodes to the codecs they send plans with ([`codec`]).
//!
//! Every process registers batchinfer's functions over a model registry of its own, filled from
//! its `--models` and `--warehouse` and from the definitions the client sends with each query (the
//! session option `batchinfer_statement.models`: each model's source and sha256, see
//! [`crate::model::shared`]): models come from S3 or from paths that are the same on every
//! machine. Each process loads a model once and shares it across its tasks.

pub mod client;
pub mod codec;
pub mod executor;
mod node;
pub mod scheduler;

pub use client::{Placement, Remote};
pub use executor::{ExecutorOptions, run_executor};
pub use scheduler::run_scheduler;

use crate::error::Error;

/// An executor is declared dead this long after its last heartbeat, and its tasks rescheduled.
pub const EXECUTOR_TIMEOUT_SECONDS: u64 = 20;
/// How often an executor tells the scheduler it is alive.
pub const HEARTBEAT_SECONDS: u64 = 5;
/// The longest a scheduler's `--executor-wait` may be: less than [`CLIENT_TIMEOUT_SECONDS`], so
/// that a client hears why no executor runs its query.
pub const MAX_EXECUTOR_WAIT_SECONDS: u64 = 100;
/// How long a client waits for the scheduler to answer one request (Ballista: 20 s), a query's
/// planning on the scheduler among them: it loads the query's models, and waits for an executor.
pub const CLIENT_TIMEOUT_SECONDS: u64 = 120;

/// A cluster process answers whoever reaches its port: it has no authentication. Said at start
/// whenever it listens beyond this machine.
fn warn_if_exposed(role: &str, ip: std::net::IpAddr) {
    if !ip.is_loopback() {
        eprintln!(
            "warning: this {role} listens on {ip}, beyond this machine, and has no \
             authentication: anyone who reaches its ports can run queries with this cluster's \
             models, files and credentials. Keep the cluster on a private network (a VPC subnet, \
             a firewall that admits only the cluster's machines), as docs/cluster.md says."
        );
    }
}

fn cluster_error(e: ballista_core::error::BallistaError) -> Error {
    Error::Cluster(Box::new(e))
}
