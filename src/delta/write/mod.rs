//! A statement's files made one commit of a Delta table: the files are written first, into a
//! folder of the statement's own under the table's (`data-<uuid>/`), where no reader looks (a
//! Delta table is the files its log names); then one entry of the `_delta_log` names them, written
//! only where no entry of that version exists (a conditional PUT in S3 and Azure, a link made
//! where no file is locally). Of two statements that commit the same version, one does; the
//! other's files are deleted and it fails, naming the table.
//!
//! - A table created (`CREATE TABLE`) is version 0: its protocol, its columns and its files.
//! - A table replaced (`CREATE OR REPLACE TABLE`) is a commit that removes every file of the
//!   version the statement began on and adds its own, with the new columns: it commits only on
//!   the version after that one, so that a replace never lands on a change it did not see.
//! - Rows appended (`INSERT INTO`) are a commit that adds files: appends that race each other
//!   all commit (delta-rs checks that none of the versions between changed the columns or the
//!   protocol). An append that lost to an OPTIMIZE, or to a replace that kept the columns, is made
//!   again on the newer version where Delta's conflict rules allow it
//!   ([`TableWrite::newer_to_append_on`]).
//!
//! Each commit carries its lineage in Delta's commit info (`batchinfer.statement`,
//! `batchinfer.models`: each model's name, source and sha256), where `DESCRIBE HISTORY` and other
//! tools read it.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake_core::kernel::{Action, Add, StructType, Version, new_metadata};
use deltalake_core::logstore::LogStoreRef;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableError};
use futures::TryStreamExt;
use object_store::ObjectStore;
use object_store::path::Path;
use url::Url;

use crate::error::{Error, Result};

mod columns;
mod conflicts;
mod races;

pub use columns::{check_insert, delta_schema, restored, written_schema};
use columns::{holds_time_ntz, protocol};
use conflicts::{lost_race, metadata_text, table_id};

/// The field metadata that keeps a vector's length in a Delta schema (Delta has arrays of any
/// length only): a column written as `FixedSizeList(n)` reads back as one.
pub const FIXED_SIZE_KEY: &str = "batchinfer.fixedSize";

/// The table settings (Delta's `configuration`) of a table batchinfer creates: none.
const NO_SETTINGS: [(&str, &str); 0] = [];

/// How often an append that lost its version is made again on a newer one (each time after
/// delta-rs's own retries).
const MAX_APPEND_ROUNDS: usize = 8;

/// What a statement does to a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Makes a table that does not exist (version 0).
    Create,
    /// Replaces every row and the columns (a table that does not exist yet is created).
    Replace,
    /// Adds rows.
    Append,
}

/// What a commit says of where its rows came from.
#[derive(Debug, Clone, Default)]
pub struct Lineage {
    /// The statement, secrets blanked.
    pub statement: String,
    /// The models it called (JSON: name, sha256, source), as [`crate::lineage::models_used`].
    pub models: String,
    /// What its endpoint models did (JSON), as [`crate::lineage::UsageRecord::json`], if it
    /// called any.
    pub llm_usage: Option<String>,
}

/// A statement writing table `name`: where its files go, and the version it began on.
pub struct TableWrite {
    name: String,
    url: Url,
    store: Arc<dyn ObjectStore>,
    log_store: LogStoreRef,
    /// The table as the statement began (None: no Delta table there).
    read: Option<DeltaTable>,
    /// `data-<uuid>/` under the table's folder.
    folder: Url,
    /// Whether the statement read nothing of the table (an append whose rows come from
    /// elsewhere): a concurrent commit that removed rows does not change them.
    blind: bool,
}

impl TableWrite {
    /// Begins a write of the table `name` at `url` (a folder URL) in `store` (its bucket's):
    /// reads the version it begins on, if there is a table.
    pub async fn begin(name: &str, url: &Url, store: Arc<dyn ObjectStore>) -> Result<Self> {
        let log_store = super::log_store(url, store.clone())
            .map_err(|e| Error::table(name, format!("Delta table '{name}': {e}")))?;
        let read = load_newest(name, &log_store).await?;
        Self::at(name, url, store, log_store, read)
    }

    /// Begins a write of table `name` that reads `read` (the version its statement planned on).
    pub fn at(
        name: &str,
        url: &Url,
        store: Arc<dyn ObjectStore>,
        log_store: LogStoreRef,
        read: Option<DeltaTable>,
    ) -> Result<Self> {
        let folder = url
            .join(&format!("data-{}/", uuid::Uuid::new_v4().simple()))
            .map_err(|e| Error::table(name, format!("{url}: {e}")))?;
        Ok(TableWrite {
            name: name.to_string(),
            url: url.clone(),
            store,
            log_store,
            read,
            folder,
            blind: false,
        })
    }

    /// Says that the statement reads nothing of the table ([`TableWrite::newer_to_append_on`]).
    pub fn reads_nothing_of_the_table(&mut self) {
        self.blind = true;
    }

    /// Where the statement writes its files (a folder location, ending in `/`).
    pub fn folder(&self) -> String {
        crate::storage::display_location(&self.folder)
    }

    /// The version the statement began on, if the table existed.
    pub fn read_version(&self) -> Option<Version> {
        self.read.as_ref().and_then(|t| t.version())
    }

    /// Commits the files of the statement's folder as `mode`, with the columns `schema` (the
    /// Arrow schema the files were written with) and `lineage`; returns the version committed.
    /// Where nothing was committed the files are deleted; where it is not known (the log entry's
    /// write failed midway) they are left, for VACUUM once no version names them; after the
    /// commit, what delta-rs does (a checkpoint) is not the statement's to fail.
    pub async fn commit(self, mode: Mode, schema: &Schema, lineage: &Lineage) -> Result<Version> {
        let prepared = async {
            let (mut actions, operation, retries) = self.operation(mode, schema).await?;
            actions.extend(self.adds().await?);
            Ok::<_, Error>((actions, operation, self.properties(lineage, retries)))
        };
        let (actions, operation, properties) = match prepared.await {
            Ok(prepared) => prepared,
            Err(e) => {
                self.discard().await;
                return Err(e);
            }
        };
        // A table dropped and made again meanwhile starts its versions anew: the version after
        // the one this statement read may be free in another table's log.
        if mode != Mode::Create
            && let Err(e) = self.still_the_table_read().await
        {
            self.discard().await;
            return Err(e);
        }
        // An append that lost its version to another commit is made again on the newest
        // version where nothing it depends on changed ([`TableWrite::newer_to_append_on`]).
        let mut newer: Option<DeltaTable> = None;
        let mut rounds = 0;
        let post = loop {
            let on = newer.as_ref().or(self.read.as_ref());
            let read_state = on.and_then(|t| t.snapshot().ok());
            let commit = CommitBuilder::from(properties.clone())
                .with_actions(actions.clone())
                .build(
                    read_state.map(|s| s as _),
                    self.log_store.clone(),
                    operation.clone(),
                )
                .into_prepared_commit_future()
                .await;
            let written = match commit {
                Ok(commit) => commit.await,
                Err(e) => {
                    self.discard().await;
                    return Err(self.error(e));
                }
            };
            match written {
                Ok(post) => break post,
                Err(DeltaTableError::Transaction { source }) if lost_race(&source) => {
                    if mode == Mode::Append && rounds < MAX_APPEND_ROUNDS {
                        rounds += 1;
                        let began = on.and_then(|t| t.version());
                        match self.newer_to_append_on(began).await {
                            Ok(Ok(table)) => {
                                newer = Some(table);
                                continue;
                            }
                            Ok(Err(why)) => {
                                self.discard().await;
                                return Err(self.conflict_because(why));
                            }
                            Err(e) => {
                                self.discard().await;
                                return Err(e);
                            }
                        }
                    }
                    self.discard().await;
                    return Err(match mode {
                        Mode::Create => self.taken(),
                        Mode::Replace | Mode::Append => self.conflict(),
                    });
                }
                Err(e) => return Err(self.error(e)),
            }
        };
        let version = post.version;
        // Made again between the check above and the commit: the append's files are taken
        // out of that table again, and the statement fails.
        if mode == Mode::Append
            && let Err(e) = self.still_the_table_read().await
        {
            self.take_back(&actions).await;
            return Err(e);
        }
        if let Err(e) = post.await {
            crate::say!(
                "table '{}': version {version} is committed; what follows a commit failed: {}",
                self.name,
                super::readable(&e.to_string())
            );
        }
        Ok(version)
    }

    /// What a commit records beside its actions: its lineage, and how often it is retried on a
    /// version another statement took.
    fn properties(&self, lineage: &Lineage, retries: usize) -> CommitProperties {
        let mut metadata = vec![
            (
                "batchinfer.statement".to_string(),
                serde_json::Value::from(lineage.statement.clone()),
            ),
            (
                crate::lineage::MODELS_KEY.to_string(),
                serde_json::from_str(&lineage.models).unwrap_or_default(),
            ),
        ];
        if let Some(usage) = &lineage.llm_usage {
            metadata.push((
                crate::lineage::LLM_USAGE_KEY.to_string(),
                serde_json::from_str(usage).unwrap_or_default(),
            ));
        }
        CommitProperties::default()
            .with_metadata(metadata)
            .with_max_retries(retries)
    }

    /// The actions `mode` begins a commit with (a new table's protocol and columns; a replace's
    /// columns and the removal of every file it began on), its operation, and how often it may
    /// be retried on a version another statement took (a replace or create: never).
    async fn operation(
        &self,
        mode: Mode,
        schema: &Schema,
    ) -> Result<(Vec<Action>, DeltaOperation, usize)> {
        let name = &self.name;
        let mut actions = Vec::new();
        let read = self.read.as_ref().map(|t| t.snapshot()).transpose();
        let read = read.map_err(|e| self.error(e))?;
        let (operation, retries) = match (mode, read) {
            (Mode::Append, None) => {
                return Err(Error::table(
                    name,
                    format!("table '{name}' has no Delta log to append to"),
                ));
            }
            (Mode::Append, Some(_)) => {
                let operation = DeltaOperation::Write {
                    mode: SaveMode::Append,
                    partition_by: None,
                    predicate: None,
                };
                (operation, 15)
            }
            (Mode::Create, Some(_)) => return Err(self.taken()),
            (Mode::Create | Mode::Replace, read) => {
                let columns = delta_schema(name, schema)?;
                let mut metadata = new_metadata(&columns, Vec::<String>::new(), NO_SETTINGS)
                    .map_err(|e| Error::table(name, format!("Delta table '{name}': {e}")))?;
                // A replace is the same table (its log goes on): it keeps the table's id, which
                // a table dropped and made again does not have.
                if let Some(id) = read.and_then(|r| table_id(r.metadata())) {
                    metadata = deltalake_core::kernel::MetadataExt::with_table_id(metadata, id)
                        .map_err(|e| Error::table(name, format!("Delta table '{name}': {e}")))?;
                }
                let protocol = protocol(read.map(|r| r.protocol()), holds_time_ntz(schema))?;
                actions.extend(protocol.map(Action::Protocol));
                actions.push(Action::Metadata(metadata.clone()));
                if let Some(read) = read {
                    let mut files = read.snapshot().file_views(self.log_store.as_ref(), None);
                    while let Some(file) = files.try_next().await.map_err(|e| self.error(e))? {
                        actions.push(Action::Remove(file.remove_action(true)));
                    }
                }
                let operation = DeltaOperation::Write {
                    mode: if read.is_none() {
                        SaveMode::ErrorIfExists
                    } else {
                        SaveMode::Overwrite
                    },
                    partition_by: None,
                    predicate: None,
                };
                (operation, 0)
            }
        };
        Ok((actions, operation, retries))
    }

    /// An `add` for each file the statement wrote, with its row count.
    async fn adds(&self) -> Result<Vec<Action>> {
        let prefix = crate::storage::object_path(&self.folder)?;
        let table = crate::storage::object_path(&self.url)?;
        let files: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
        let mut adds = Vec::with_capacity(files.len());
        for file in files {
            let Some(relative) = relative(&table, &file.location) else {
                continue;
            };
            let rows = row_count(self.store.clone(), &file).await?;
            adds.push(Action::Add(Add {
                path: relative,
                partition_values: HashMap::new(),
                size: file.size as i64,
                modification_time: file.last_modified.timestamp_millis(),
                data_change: true,
                stats: Some(serde_json::json!({ "numRecords": rows }).to_string()),
                tags: None,
                deletion_vector: None,
                base_row_id: None,
                default_row_commit_version: None,
                clustering_provider: None,
            }));
        }
        Ok(adds)
    }

    /// Deletes the statement's files.
    pub async fn discard(&self) {
        if let Ok(prefix) = crate::storage::object_path(&self.folder) {
            let _ = crate::storage::delete_prefix(self.store.as_ref(), &prefix).await;
        }
    }
}

/// The newest version of the table of `log_store`, None where it has no commit.
pub async fn load_newest(name: &str, log_store: &LogStoreRef) -> Result<Option<DeltaTable>> {
    let error = |e: DeltaTableError| {
        Error::table(
            name,
            format!("Delta table '{name}': {}", super::readable(&e.to_string())),
        )
    };
    if !log_store.is_delta_table_location().await.map_err(error)? {
        return Ok(None);
    }
    let mut table = DeltaTable::new(log_store.clone());
    match table.load().await {
        Ok(()) => Ok(Some(table)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(e) => Err(error(e)),
    }
}

/// A table's files as its log names them: relative to its folder.
fn relative(table: &Path, file: &Path) -> Option<String> {
    let parts: Vec<_> = file
        .prefix_match(table)?
        .map(|p| p.as_ref().to_string())
        .collect();
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The rows of a Parquet file the statement wrote, from its footer (checked before it is read:
/// [`crate::storage::footer`]).
async fn row_count(store: Arc<dyn ObjectStore>, file: &object_store::ObjectMeta) -> Result<i64> {
    use datafusion::parquet::file::metadata::ParquetMetaDataReader;
    use object_store::ObjectStoreExt;
    let size = file.size;
    let what = file.location.to_string();
    let tail = store
        .get_range(&file.location, size.saturating_sub(8)..size)
        .await?;
    let tail: [u8; 8] = tail
        .as_ref()
        .try_into()
        .map_err(|_| Error::Internal(format!("{what}: {size} bytes is not a Parquet file")))?;
    let length = crate::storage::footer::metadata_len(
        &what,
        size,
        tail,
        crate::storage::footer::DEFAULT_MAX_FOOTER_BYTES,
    )
    .map_err(|e| Error::Internal(e.to_string()))?;
    let footer = store
        .get_range(&file.location, size - 8 - length..size - 8)
        .await?;
    let metadata = ParquetMetaDataReader::decode_metadata(&footer)?;
    Ok(metadata.file_metadata().num_rows())
}
