//! What the engine does for rejected rows (`SET batchinfer.on_error = 'reject'`, see
//! [`crate::rejects`]): tags each statement with an id (its rejects' folder), makes the rejects
//! location absolute so that every process writes where this one reads, counts a statement's
//! rejects when it ends, and holds back its writes when they are past the budget.

use super::*;

use datafusion::common::config::ConfigExtension;

use crate::config::OnError;
use crate::rejects::statement_id;

/// The most of a statement's text kept with its rejects.
const STATEMENT_TEXT: usize = 4_096;

impl Engine {
    /// Tags the statement about to be planned: a new id, its text (secrets already blanked), and
    /// the rejects location made absolute (the warehouse's `rejects/` unless set).
    pub(super) fn tag_statement(&self, statement: &DFStatement) -> Result<()> {
        self.tag_text(super::options::shown(statement))
    }

    /// [`Engine::tag_statement`] for a statement given as text (a view's refresh).
    pub(super) fn tag_text(&self, mut text: String) -> Result<()> {
        if text.len() > STATEMENT_TEXT {
            let mut end = STATEMENT_TEXT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push('…');
        }
        let options = self.batchinfer_options();
        let rejects = match (&*options.rejects, &self.warehouse) {
            ("", Some(warehouse)) => warehouse.rejects_location()?,
            ("", None) => "rejects/".to_string(),
            (set, _) => set.to_string(),
        };
        let unusable = |e: Error| {
            Error::setting(
                "batchinfer.rejects",
                format!("batchinfer.rejects '{rejects}' cannot be used: {e}"),
            )
        };
        let url = crate::storage::folder_location(&rejects).map_err(unusable)?;
        if options.on_error == OnError::Reject {
            // A place of its own: not a folder of the warehouse's (a DROP would delete the
            // rejects, or a listing would take them for a table), not one a `..` names, and
            // one batchinfer can write to.
            if let Some(folder) = self
                .warehouse
                .as_ref()
                .and_then(|w| w.own_folder_holding(&url))
            {
                return Err(unusable(Error::setting(
                    "batchinfer.rejects",
                    format!(
                        "it is in the warehouse's {folder}/ folder, which holds the warehouse's own \
                     files; leave batchinfer.rejects unset for the warehouse's rejects/"
                    ),
                )));
            }
            if rejects.split(['/', '\\']).any(|part| part == "..") {
                return Err(unusable(Error::setting(
                    "batchinfer.rejects",
                    "it names a folder through '..': name the folder itself",
                )));
            }
            let store = self
                .registry
                .stores()
                .commit_store(&url)
                .map_err(unusable)?;
            if store.read_only().is_some() {
                return Err(unusable(Error::setting(
                    "batchinfer.rejects",
                    "it is on a server batchinfer reads from only",
                )));
            }
            // Its statement folders are read back as tables: named plainly, and a folder.
            crate::storage::check_write_target(&rejects).map_err(unusable)?;
            crate::storage::object_path(&url).map_err(unusable)?;
            self.registry
                .stores()
                .check_folder(&url)
                .map_err(unusable)?;
        }
        self.update_statement(|statement| {
            statement.id = statement_id();
            statement.text = text;
            statement.rejects = crate::storage::display_location(&url);
            statement.keeps_rejects = options.on_error == OnError::Reject;
        });
        Ok(())
    }

    /// The statement at hand, as it was tagged.
    pub(super) fn statement(&self) -> StatementContext {
        self.session_options()
    }

    /// Changes the statement at hand with `change`.
    pub(super) fn update_statement(&self, change: impl FnOnce(&mut StatementContext)) {
        let _ = self.update_session_options(|statement: &mut StatementContext| {
            change(statement);
            Ok(())
        });
    }

    /// Changes the session's `batchinfer.*` options with `change`.
    pub(super) fn update_options(
        &self,
        change: impl FnOnce(&mut BatchInferOptions) -> datafusion::error::Result<()>,
    ) -> Result<()> {
        self.update_session_options(change)
    }

    /// The session's `batchinfer.*` options.
    pub(super) fn batchinfer_options(&self) -> BatchInferOptions {
        self.session_options()
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

    /// The rows the statement that just ran rejected, per model, and the folder they are in
    /// (nothing unless `on_error = 'reject'`): counted from the files, wherever they were written.
    pub async fn statement_rejects(&self) -> Result<(Vec<(String, u64)>, String)> {
        crate::rejects::rejected(self.registry.stores(), &self.statement()).await
    }

    /// Before a statement's writes commit: its rejects are within `batchinfer.max_errors`
    /// ([`crate::rejects::check_budget`]).
    pub(super) async fn check_rejects_budget(&self) -> Result<()> {
        let budget = self.batchinfer_options().max_errors;
        crate::rejects::check_budget(self.registry.stores(), &self.statement(), budget).await
    }
}
