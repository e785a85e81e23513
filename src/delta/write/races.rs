//! An append that another writer's commit raced: made again on the newer version where
//! Delta's conflict rules allow it, and never into a table dropped and made again.

use super::*;

impl TableWrite {
    /// The table's newest version, where the append that began on `began` may be committed on
    /// it as Delta's conflict rules allow: none of the commits since changed the columns or the
    /// protocol, and none removed rows (`dataChange` removes: a replace, a delete) unless the
    /// statement read nothing of the table (a blind append). OPTIMIZE's removes change no row.
    /// Where it may not, why not: the statement's conflict.
    pub(super) async fn newer_to_append_on(
        &self,
        began: Option<Version>,
    ) -> Result<std::result::Result<DeltaTable, &'static str>> {
        let (Some(read), Some(began)) = (self.read.as_ref(), began) else {
            return Ok(Err("it did not exist when this one began"));
        };
        let read = read.snapshot().map_err(|e| self.error(e))?;
        let Some(newest) = load_newest(&self.name, &self.log_store).await? else {
            return Ok(Err("it was dropped"));
        };
        let Some(now) = newest.version().filter(|now| *now > began) else {
            return Ok(Err("it was dropped and made again"));
        };
        let columns = |metadata: &deltalake_core::kernel::Metadata| {
            metadata_text(metadata, "schemaString")
                .and_then(|text| serde_json::from_str::<StructType>(&text).ok())
        };
        let read_columns = columns(read.metadata());
        for version in began + 1..=now {
            let Some(entry) = self
                .log_store
                .read_commit_entry(version)
                .await
                .map_err(|e| self.error(e))?
            else {
                return Ok(Err("its log no longer holds the versions between"));
            };
            let winner = deltalake_core::logstore::get_actions(version, &entry)
                .map_err(|e| self.error(e))?;
            for action in winner {
                let refused = match &action {
                    Action::Metadata(metadata)
                        if read_columns.is_none() || columns(metadata) != read_columns =>
                    {
                        Some("its columns were changed")
                    }
                    Action::Protocol(protocol) if protocol != read.protocol() => {
                        Some("its protocol was changed")
                    }
                    Action::Remove(remove) if remove.data_change && !self.blind => {
                        Some("rows this statement reads were removed or replaced")
                    }
                    _ => None,
                };
                if let Some(why) = refused {
                    return Ok(Err(why));
                }
            }
        }
        Ok(Ok(newest))
    }

    /// Fails with a conflict where the table is no longer the one the statement read: dropped,
    /// or dropped and made again (another table id).
    pub(super) async fn still_the_table_read(&self) -> Result<()> {
        let Some(read) = self.read.as_ref() else {
            return Ok(());
        };
        let read_id = read.snapshot().ok().and_then(|s| table_id(s.metadata()));
        match load_newest(&self.name, &self.log_store).await? {
            None => Err(self.conflict_because("it was dropped")),
            Some(now) => {
                let now_id = now.snapshot().ok().and_then(|s| table_id(s.metadata()));
                if now_id != read_id {
                    return Err(self.conflict_because("it was dropped and made again"));
                }
                Ok(())
            }
        }
    }

    /// Commits the removal of the files an append added (among `actions`) from the table as it
    /// is now: what an append committed onto a table made again meanwhile is taken back.
    pub(super) async fn take_back(&self, actions: &[Action]) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let removes: Vec<Action> = actions
            .iter()
            .filter_map(|action| match action {
                Action::Add(add) => Some(Action::Remove(deltalake_core::kernel::Remove {
                    path: add.path.clone(),
                    data_change: true,
                    deletion_timestamp: Some(now),
                    extended_file_metadata: Some(false),
                    partition_values: Some(add.partition_values.clone()),
                    size: Some(add.size),
                    tags: None,
                    deletion_vector: None,
                    base_row_id: None,
                    default_row_commit_version: None,
                })),
                _ => None,
            })
            .collect();
        let taken = async {
            let newest = load_newest(&self.name, &self.log_store)
                .await?
                .ok_or_else(|| self.conflict_because("it was dropped"))?;
            let state = newest.snapshot().map_err(|e| self.error(e))?;
            CommitBuilder::default()
                .with_actions(removes)
                .with_max_retries(15)
                .build(
                    Some(state as _),
                    self.log_store.clone(),
                    DeltaOperation::Delete { predicate: None },
                )
                .await
                .map_err(|e| self.error(e))?;
            Ok::<_, Error>(())
        };
        if let Err(e) = taken.await {
            crate::say!(
                "warning: table '{}' was made again while an INSERT committed into it; its rows \
                 could not be taken out of the new table: {}",
                self.name,
                crate::message::display_error(&e)
            );
        }
    }
}
