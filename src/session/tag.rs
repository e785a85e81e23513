//! The statement at hand tagged for its rejected rows (`SET batchinfer.on_error = 'reject'`, see
//! [`crate::rejects`]): an id (its rejects' folder), its text, and the rejects location made
//! absolute so that every process writes where this one reads; its rejects counted when it ends,
//! and its writes held back when they are past the budget.

use datafusion::sql::parser::Statement as DFStatement;

use super::Session;
use crate::config::OnError;
use crate::error::Result;
use crate::rejects::statement_id;
use crate::warehouse::Warehouse;

/// The most of a statement's text kept with its rejects.
const STATEMENT_TEXT: usize = 4_096;

impl Session {
    /// Tags the statement about to be planned: a new id, its text (secrets already blanked), and
    /// the rejects location made absolute (the warehouse's `rejects/` unless set).
    pub fn tag_statement(
        &self,
        statement: &DFStatement,
        warehouse: Option<&Warehouse>,
    ) -> Result<()> {
        self.tag_text(super::shown(statement), warehouse)
    }

    /// [`Session::tag_statement`] for a statement given as text (a view's refresh).
    pub fn tag_text(&self, mut text: String, warehouse: Option<&Warehouse>) -> Result<()> {
        if text.len() > STATEMENT_TEXT {
            let mut end = STATEMENT_TEXT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push('…');
        }
        let options = self.batchinfer_options();
        let url = crate::rejects::location(&options, warehouse, self.registry.stores())?;
        self.update_statement(|statement| {
            statement.id = statement_id();
            statement.text = text;
            statement.rejects = crate::storage::display_location(&url);
            statement.keeps_rejects = options.on_error == OnError::Reject;
        });
        Ok(())
    }

    /// The rows the statement that just ran rejected, per model, and the folder they are in
    /// (nothing unless `on_error = 'reject'`): counted from the files, wherever they were written.
    pub async fn statement_rejects(&self) -> Result<(Vec<(String, u64)>, String)> {
        crate::rejects::rejected(self.registry.stores(), &self.statement()).await
    }

    /// Before a statement's writes commit: its rejects are within `batchinfer.max_errors`
    /// ([`crate::rejects::check_budget`]).
    pub async fn check_rejects_budget(&self) -> Result<()> {
        let budget = self.batchinfer_options().max_errors;
        crate::rejects::check_budget(self.registry.stores(), &self.statement(), budget).await
    }
}
