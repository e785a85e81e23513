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

    /// The table's newest version, where the append that began on `began` may be committed on
    /// it as Delta's conflict rules allow: none of the commits since changed the columns or the
    /// protocol, and none removed rows (`dataChange` removes: a replace, a delete) unless the
    /// statement read nothing of the table (a blind append). OPTIMIZE's removes change no row.
    /// Where it may not, why not: the statement's conflict.
    async fn newer_to_append_on(
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
    async fn still_the_table_read(&self) -> Result<()> {
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
    async fn take_back(&self, actions: &[Action]) {
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

    fn taken(&self) -> Error {
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
    fn conflict_because(&self, why: &str) -> Error {
        self.conflict_message(&format!("{why}; a conflict,"))
    }

    /// A conflict's error, `what` said between what happened and what was committed.
    fn conflict_message(&self, what: &str) -> Error {
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

    fn error(&self, e: DeltaTableError) -> Error {
        let name = &self.name;
        Error::table(
            name,
            format!("Delta table '{name}': {}", super::readable(&e.to_string())),
        )
    }
}

/// The table id a Delta table's `metaData` carries.
fn table_id(metadata: &deltalake_core::kernel::Metadata) -> Option<String> {
    metadata_text(metadata, "id")
}

/// The text field `key` of a `metaData` action, as the log writes it (the kernel keeps its
/// accessors to itself).
fn metadata_text(metadata: &deltalake_core::kernel::Metadata, key: &str) -> Option<String> {
    serde_json::to_value(metadata)
        .ok()?
        .get(key)?
        .as_str()
        .map(str::to_string)
}

/// Whether a commit failed because another commit took its version.
fn lost_race(e: &TransactionError) -> bool {
    matches!(
        e,
        TransactionError::VersionAlreadyExists(_)
            | TransactionError::MaxCommitAttempts(_)
            | TransactionError::CommitConflict(_)
    )
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

/// The protocol a commit sets, where it sets one: for a new table reader version 1 and writer
/// version 2 (what every reader reads), unless its columns hold a time without a time zone
/// (`timestamp_ntz`): then that table feature, on the table's protocol where it has one (versions
/// 3 and 7, its other features kept). None: the table's protocol as it is.
fn protocol(
    table: Option<&deltalake_core::kernel::Protocol>,
    time_ntz: bool,
) -> Result<Option<deltalake_core::kernel::Protocol>> {
    const NTZ: &str = "timestampNtz";
    let invalid = |e: serde_json::Error| Error::Internal(format!("Delta protocol: {e}"));
    let mut protocol = match table {
        Some(table) => serde_json::to_value(table).map_err(invalid)?,
        None => serde_json::json!({"minReaderVersion": 1, "minWriterVersion": 2}),
    };
    let has_ntz = protocol["readerFeatures"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == NTZ));
    if !time_ntz || has_ntz {
        return match table {
            Some(_) => Ok(None),
            None => serde_json::from_value(protocol).map(Some).map_err(invalid),
        };
    }
    for (version, at_least) in [("minReaderVersion", 3), ("minWriterVersion", 7)] {
        let now = protocol[version].as_i64().unwrap_or(0);
        protocol[version] = now.max(at_least).into();
    }
    for features in ["readerFeatures", "writerFeatures"] {
        let mut list = protocol[features].as_array().cloned().unwrap_or_default();
        list.push(NTZ.into());
        protocol[features] = list.into();
    }
    serde_json::from_value(protocol).map(Some).map_err(invalid)
}

/// Whether `schema` holds a time without a time zone, anywhere.
fn holds_time_ntz(schema: &Schema) -> bool {
    fn holds(data_type: &DataType) -> bool {
        match data_type {
            DataType::Timestamp(_, None) => true,
            DataType::Struct(children) => children.iter().any(|c| holds(c.data_type())),
            DataType::List(f)
            | DataType::LargeList(f)
            | DataType::FixedSizeList(f, _)
            | DataType::Map(f, _) => holds(f.data_type()),
            _ => false,
        }
    }
    schema.fields().iter().any(|f| holds(f.data_type()))
}

/// The Delta schema of the Arrow `schema` a table's files are written with; a vector
/// (`FixedSizeList(n)`) keeps its length in its field's metadata ([`FIXED_SIZE_KEY`]). A
/// type Delta has no counterpart of is refused, naming the column.
pub fn delta_schema(name: &str, schema: &Schema) -> Result<StructType> {
    use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
    let fields = schema
        .fields()
        .iter()
        .map(|f| prepared(name, f.as_ref()))
        .collect::<Result<Vec<Field>>>()?;
    let prepared = Schema::new(fields);
    (&prepared).try_into_kernel().map_err(|e| {
        Error::table(
            name,
            format!(
                "table '{name}': its columns ({}) cannot be a Delta table's: {}",
                super::columns(&Arc::new(schema.clone())),
                super::readable(&e.to_string())
            ),
        )
    })
}

/// `field` as a Delta column: the length of each vector in it kept in its metadata, an unsigned
/// integer widened to the signed type that holds all its values (Delta has no unsigned types);
/// a column of no type (only NULLs, which other readers cannot read) and a vector of no values
/// refused, naming the column.
fn prepared(name: &str, field: &Field) -> Result<Field> {
    let refuse = |problem: &str| {
        Err(Error::table(
            name,
            format!("table '{name}': column '{}' {problem}", field.name()),
        ))
    };
    let widened = match field.data_type() {
        DataType::Null => {
            return refuse("has no type (only NULLs): give it one, e.g. CAST(NULL AS DOUBLE)");
        }
        DataType::FixedSizeList(_, n) if *n <= 0 => return refuse("is a vector of no values"),
        DataType::FixedSizeList(item, _) | DataType::List(item) | DataType::LargeList(item)
            if item.data_type() == &DataType::Null =>
        {
            return refuse("is a list of no type (only NULLs): give its items one");
        }
        DataType::UInt8 => DataType::Int16,
        DataType::UInt16 => DataType::Int32,
        DataType::UInt32 | DataType::UInt64 => DataType::Int64,
        DataType::FixedSizeList(_, n) => {
            let mut metadata = field.metadata().clone();
            metadata.insert(FIXED_SIZE_KEY.to_string(), n.to_string());
            return Ok(field.clone().with_metadata(metadata));
        }
        DataType::Struct(children) => {
            let children = children
                .iter()
                .map(|c| prepared(name, c))
                .collect::<Result<Vec<Field>>>()?;
            DataType::Struct(children.into())
        }
        other => other.clone(),
    };
    Ok(field.clone().with_data_type(widened))
}

/// The Arrow schema a Delta table's scan gives (`scanned`) with each vector restored where the
/// table's schema (`delta`) keeps its length ([`FIXED_SIZE_KEY`]).
pub fn restored(scanned: &SchemaRef, delta: &StructType) -> SchemaRef {
    let fields: Vec<Field> = scanned
        .fields()
        .iter()
        .map(|f| match delta.field(f.name()) {
            Some(kept) => restore(f, kept),
            None => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        scanned.metadata().clone(),
    ))
}

fn restore(field: &Field, kept: &deltalake_core::kernel::StructField) -> Field {
    use deltalake_core::kernel::{DataType as DeltaType, MetadataValue};
    let length = match kept.metadata().get(FIXED_SIZE_KEY) {
        Some(MetadataValue::String(n)) => n.parse::<i32>().ok(),
        Some(MetadataValue::Number(n)) => i32::try_from(*n).ok(),
        _ => None,
    };
    match (field.data_type(), kept.data_type(), length) {
        // The item named as Arrow names it (Delta's lists name theirs `element`).
        (DataType::List(item), _, Some(n)) if n > 0 => {
            let item = Field::new_list_field(item.data_type().clone(), item.is_nullable());
            field
                .clone()
                .with_data_type(DataType::FixedSizeList(Arc::new(item), n))
        }
        (DataType::Struct(children), DeltaType::Struct(inner), _) => {
            let children: Vec<Field> = children
                .iter()
                .map(|c| match inner.field(c.name()) {
                    Some(k) => restore(c, k),
                    None => c.as_ref().clone(),
                })
                .collect();
            field
                .clone()
                .with_data_type(DataType::Struct(children.into()))
        }
        _ => field.clone(),
    }
}

/// `schema` with each column's type the one a Delta table's files hold for it: the type Delta
/// reads its values as (a vector as a list, an unsigned integer as the signed one of its width, a
/// nanosecond time as microseconds, a view as a plain string), so that every reader of the table
/// finds in its files the types its log declares.
pub fn written_schema(name: &str, schema: &Schema) -> Result<SchemaRef> {
    use deltalake_core::kernel::engine::arrow_conversion::TryIntoArrow;
    let delta = delta_schema(name, schema)?;
    let fields = schema
        .fields()
        .iter()
        .zip(delta.fields())
        .map(|(field, kept)| {
            let wanted: DataType = kept.data_type().try_into_arrow().map_err(|e| {
                Error::table(
                    name,
                    format!("table '{name}': column '{}': {e}", field.name()),
                )
            })?;
            Ok(field.as_ref().clone().with_data_type(wanted))
        })
        .collect::<Result<Vec<Field>>>()?;
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// Refuses an INSERT into table `name` (columns `table`, those the statement names) of a query
/// (columns `query`) whose columns do not fit: another count, or a column whose values the
/// table's column cannot hold as they are (text into a number, a number into a narrower one, a
/// list into a scalar). Both lists of columns are named.
pub fn check_insert(name: &str, table: &[Field], query: &Schema) -> Result<()> {
    let refuse = |problem: String| {
        let table = Schema::new(table.to_vec());
        Error::table(
            name,
            format!(
                "INSERT INTO {name}: {problem}; the table has ({}), the query gives ({})",
                super::columns(&Arc::new(table)),
                super::columns(&Arc::new(query.clone()))
            ),
        )
    };
    if table.len() != query.fields().len() {
        return Err(refuse(format!(
            "the query gives {} columns for {} of the table's",
            query.fields().len(),
            table.len()
        )));
    }
    for (to, from) in table.iter().zip(query.fields()) {
        if !fits(from.data_type(), to.data_type()) {
            return Err(refuse(format!(
                "column '{}' is {}, which the table's column '{}' ({}) cannot hold as it is",
                from.name(),
                from.data_type(),
                to.name(),
                to.data_type()
            )));
        }
    }
    Ok(())
}

/// Whether values of type `from` go into a column of type `to` as they are (or widened).
fn fits(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let int_bits = |t: &DataType| match t {
        Int8 => Some((8, true)),
        Int16 => Some((16, true)),
        Int32 => Some((32, true)),
        Int64 => Some((64, true)),
        UInt8 => Some((8, false)),
        UInt16 => Some((16, false)),
        UInt32 => Some((32, false)),
        UInt64 => Some((64, false)),
        _ => None,
    };
    let list_item = |t: &DataType| match t {
        List(f) | LargeList(f) | FixedSizeList(f, _) | ListView(f) | LargeListView(f) => {
            Some(f.data_type().clone())
        }
        _ => None,
    };
    if from == to || *from == Null {
        return true;
    }
    match (from, to) {
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => true,
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (Date32 | Date64, Date32 | Date64) | (Timestamp(..), Timestamp(..)) => true,
        (FixedSizeList(_, n), FixedSizeList(_, m)) if n != m => false,
        (Struct(a), Struct(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.name() == y.name() && fits(x.data_type(), y.data_type()))
        }
        _ => match (int_bits(from), int_bits(to), list_item(from), list_item(to)) {
            (Some((a, signed_a)), Some((b, signed_b)), ..) => {
                (signed_a == signed_b && a <= b) || (!signed_a && signed_b && a < b)
            }
            (Some(_), None, ..) => matches!(to, Float32 | Float64),
            (_, _, Some(a), Some(b)) => fits(&a, &b),
            _ => false,
        },
    }
}
