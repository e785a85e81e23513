//! A commit's conflicts as a person reads them: the version taken, the table changed since it
//! was read, delta-rs's errors.

use super::*;

impl TableWrite {
    pub(super) fn taken(&self) -> Error {
        let name = &self.name;
        Error::table(
            name,
            format!(
                "table '{name}' already exists (another statement created it meanwhile); \
                 nothing was written"
            ),
        )
    }

    /// The error of a statement that lost to another that changed the table after it read it.
    pub fn conflict(&self) -> Error {
        self.conflict_message("a conflict;")
    }

    /// [`TableWrite::conflict`], saying what the other statement did.
    pub(super) fn conflict_because(&self, why: &str) -> Error {
        self.conflict_message(&format!("{why}; a conflict,"))
    }

    /// A conflict's error, `what` said between what happened and what was committed.
    pub(super) fn conflict_message(&self, what: &str) -> Error {
        let name = &self.name;
        let read = self
            .read_version()
            .map(|v| format!(" (version {v})"))
            .unwrap_or_default();
        Error::table(
            name,
            format!(
                "table '{name}' was changed by another statement after this one read it{read}: \
                 {what} nothing of this statement was committed (run it again)"
            ),
        )
    }

    pub(super) fn error(&self, e: DeltaTableError) -> Error {
        let name = &self.name;
        Error::table(
            name,
            format!(
                "Delta table '{name}': {}",
                crate::delta::readable(&e.to_string())
            ),
        )
    }
}

/// The table id a Delta table's `metaData` carries.
pub(super) fn table_id(metadata: &deltalake_core::kernel::Metadata) -> Option<String> {
    metadata_text(metadata, "id")
}

/// The text field `key` of a `metaData` action, as the log writes it (the kernel keeps its
/// accessors to itself).
pub(super) fn metadata_text(
    metadata: &deltalake_core::kernel::Metadata,
    key: &str,
) -> Option<String> {
    serde_json::to_value(metadata)
        .ok()?
        .get(key)?
        .as_str()
        .map(str::to_string)
}

/// Whether a commit failed because another commit took its version.
pub(super) fn lost_race(e: &TransactionError) -> bool {
    matches!(
        e,
        TransactionError::VersionAlreadyExists(_)
            | TransactionError::MaxCommitAttempts(_)
            | TransactionError::CommitConflict(_)
    )
}
