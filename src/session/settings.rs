//! The session's settings: its `batchinfer.*` options, which a user can `SET`, and the statement
//! at hand ([`StatementContext`]), which no user can.

use datafusion::common::config::ConfigExtension;

use super::Session;
use crate::config::BatchInferOptions;
use crate::error::Result;
use crate::statement_context::StatementContext;

impl Session {
    /// The statement at hand, as it was tagged.
    pub fn statement(&self) -> StatementContext {
        self.session_options()
    }

    /// A statement of its own, begun: a new [`StatementContext`] (which keeps no rejects until
    /// it is tagged, owns what the statement counts, and whose scoring stops at a signal that
    /// comes from now on, not at one that came before), and the session's reads held to its
    /// options as they are now.
    pub fn begin_statement(&self) {
        self.update_statement(|statement| {
            *statement = StatementContext {
                stop_signals_before: crate::stop::signals(),
                ..StatementContext::default()
            }
        });
        self.limits.follow(&self.batchinfer_options());
    }

    /// What the session may read and write, as its options said when its statement began.
    pub fn access(&self) -> std::sync::Arc<crate::storage::access::Access> {
        self.limits.access()
    }

    /// The warehouse whose files the session's catalog reads and writes, whatever confines it.
    pub fn set_warehouse(&self, root: &url::Url) {
        self.limits.set_warehouse(root);
        self.limits.follow(&self.batchinfer_options());
    }

    /// Changes the statement at hand with `change`.
    pub fn update_statement(&self, change: impl FnOnce(&mut StatementContext)) {
        let _ = self.update_session_options(|statement: &mut StatementContext| {
            change(statement);
            Ok(())
        });
    }

    /// Changes the session's `batchinfer.*` options with `change`.
    pub fn update_options(
        &self,
        change: impl FnOnce(&mut BatchInferOptions) -> datafusion::error::Result<()>,
    ) -> Result<()> {
        self.update_session_options(change)
    }

    /// The session's `batchinfer.*` options.
    pub fn batchinfer_options(&self) -> BatchInferOptions {
        self.session_options()
    }

    /// After `SET batchinfer.device = '...'`, models of later statements (their planning too)
    /// load on that device.
    pub fn follow_device_option(&self) {
        let device = self
            .batchinfer_options()
            .device
            .map(crate::device::Device::resolve);
        if let Some(device) = device
            && device != self.registry.device()
        {
            self.registry.set_device(device);
        }
    }

    /// The session's options of one extension (its default where the session has none).
    fn session_options<T: ConfigExtension + Clone + Default>(&self) -> T {
        let state = self.ctx.state_ref();
        let state = state.read();
        state
            .config()
            .options()
            .extensions
            .get::<T>()
            .cloned()
            .unwrap_or_default()
    }

    /// Changes the session's options of one extension with `change` (nothing where the session
    /// has none).
    fn update_session_options<T: ConfigExtension>(
        &self,
        change: impl FnOnce(&mut T) -> datafusion::error::Result<()>,
    ) -> Result<()> {
        let state = self.ctx.state_ref();
        let mut state = state.write();
        match state.config_mut().options_mut().extensions.get_mut::<T>() {
            Some(options) => Ok(change(options)?),
            None => Ok(()),
        }
    }
}
