//! The client's side: where an engine's statements run ([`Placement`]), and the address of a
//! cluster's scheduler ([`Remote`], what `--remote df://host:port` parses into).

use std::sync::Arc;

use ballista_core::config::BALLISTA_CLIENT_GRPC_TIMEOUT_SECONDS;
use ballista_core::extension::{SessionConfigExt, SessionStateExt};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::context::{SessionContext, SessionState};

pub use crate::config::Remote;
use crate::error::Result;
use crate::model::ModelRegistry;
use crate::rules::{
    EmbedBufferRule, FrameBatchesRule, ModelFiltersLast, StreamingParquetRule, TopNOrderKept,
};
use crate::statement_context::StatementContext;
use crate::storage::{CommittedWrite, StagedOutput, StoreRegistry};

/// Where an engine's statements run: in this process, or on a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    InProcess,
    Cluster(Remote),
}

impl Placement {
    pub fn new(remote: Option<&Remote>) -> Self {
        match remote {
            Some(remote) => Placement::Cluster(remote.clone()),
            None => Placement::InProcess,
        }
    }

    /// Finishes an engine's session state: local Parquet read by batchinfer's streaming reader
    /// in this process; planned here and run by the cluster's scheduler and executors
    /// otherwise (plans travel between processes with DataFusion's own scan).
    pub fn finish(&self, state: SessionStateBuilder) -> Result<SessionState> {
        Ok(match self {
            Placement::InProcess => state
                .with_physical_optimizer_rules(EmbedBufferRule::among_default_rules())
                .with_physical_optimizer_rule(Arc::new(StreamingParquetRule))
                .with_physical_optimizer_rule(Arc::new(FrameBatchesRule))
                .with_physical_optimizer_rule(Arc::new(ModelFiltersLast))
                .with_physical_optimizer_rule(Arc::new(TopNOrderKept))
                .build(),
            Placement::Cluster(remote) => {
                // Long enough for the scheduler to wait its `--executor-wait` for an executor
                // and say that none came, rather than the client give up first.
                let state = state.build();
                let config = state
                    .config()
                    .clone()
                    .upgrade_for_ballista()
                    .with_ballista_logical_extension_codec(super::codec::logical())
                    .with_ballista_physical_extension_codec(super::codec::physical())
                    .set_u64(
                        BALLISTA_CLIENT_GRPC_TIMEOUT_SECONDS,
                        super::CLIENT_TIMEOUT_SECONDS,
                    );
                SessionStateBuilder::new_from_existing(state)
                    .with_config(config)
                    .build()
                    .upgrade_for_ballista(remote.grpc_url())?
            }
        })
    }

    /// Before a statement is planned, and again once its planning loaded the models it uses: a
    /// cluster's processes learn the client's model definitions (with each loaded model's
    /// sha256) from a session option sent with every query.
    pub fn share_models(&self, ctx: &SessionContext, registry: &ModelRegistry) -> Result<()> {
        if let Placement::Cluster(_) = self {
            let models = registry.shared_models();
            let state = ctx.state_ref();
            let mut state = state.write();
            if let Some(options) = state
                .config_mut()
                .options_mut()
                .extensions
                .get_mut::<StatementContext>()
            {
                options.models = models;
            }
        }
        Ok(())
    }

    /// Where a write to `target` goes, and how it commits: in this process, to the target with
    /// its files held back until the statement succeeds ([`crate::storage::commit`]); from a
    /// cluster's executors, to a staging folder beside it moved into place at the end.
    pub fn write_to(
        &self,
        stores: &StoreRegistry,
        target: &str,
    ) -> Result<(String, CommittedWrite)> {
        match self {
            Placement::InProcess => Ok((
                target.to_string(),
                CommittedWrite::Deferred(stores.begin_write(target)?),
            )),
            Placement::Cluster(_) => {
                crate::storage::check_write_target(target)?;
                let staged = StagedOutput::new(stores, target)?;
                Ok((
                    staged.location().to_string(),
                    CommittedWrite::Staged(staged),
                ))
            }
        }
    }

    /// Refuses a table read only in this process where statements run on a cluster: a database
    /// table (PostgreSQL, SQLite), whose connection lives in this process, or a Delta table,
    /// whose scan Ballista cannot send to an executor.
    pub fn reads_in_process(&self, what: &str) -> Result<()> {
        match self {
            Placement::InProcess => Ok(()),
            Placement::Cluster(remote) => Err(crate::error::Error::Statement(format!(
                "{what} is read in one process, not by the cluster at {remote}: run batchinfer \
                 without --remote for it, or COPY it to Parquet first"
            ))),
        }
    }

    /// What the progress line says of where a statement runs (None: here).
    pub fn running_on(&self) -> Option<String> {
        match self {
            Placement::InProcess => None,
            Placement::Cluster(remote) => Some(format!("the cluster at {remote}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Remote;

    #[test]
    fn scheduler_addresses_parse_with_or_without_scheme() {
        let grpc = |text: &str| text.parse::<Remote>().map(|r| r.grpc_url());
        assert_eq!(grpc("df://host:50050").unwrap(), "http://host:50050");
        assert_eq!(grpc("10.0.0.1:6000").unwrap(), "http://10.0.0.1:6000");
        assert_eq!(grpc("df://host").unwrap(), "http://host:50050");
        assert!(grpc("df://host:port").is_err());
        assert!(grpc("df://:50050").is_err());
        assert_eq!(
            "host:7".parse::<Remote>().unwrap().to_string(),
            "df://host:7"
        );
    }
}
