//! Materialized views: a row-wise query's results kept in the warehouse and brought up to date by
//! input file.
//!
//! ```text
//! warehouse/views/NAME/
//!   manifest-<version>.json     what the view holds: the newest version is the view
//!   data/<generation>/<unit>/   the Parquet files of one commit's worth of input files
//! ```
//! A refresh lists the view's input files and compares them with the manifest: files not seen
//! before are scored; a file whose size or version (ETag, or a local file's identity) changed,
//! and a file that is gone, take the unit of files they were committed with out of the view, and
//! the unit's other files are scored again. Each unit is committed as one new manifest version
//! ([`crate::storage::Manifests`]), so a refresh that is killed keeps the units it committed and
//! the next one scores only the rest. Readers read the files the newest manifest lists, never a
//! listing of the folder.
//!
//! A view's rows come from one *generation*: the query and the sha256 of each model it used.
//! When either changes (CREATE OR REPLACE MODEL with other bytes, CREATE OR REPLACE MATERIALIZED
//! VIEW), the next refresh builds a new generation beside the current one, which stays what
//! readers read until the new one is complete.

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// The manifest format written.
pub const FORMAT: u32 = 1;

/// One version of a view's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub name: String,
    /// The view's query, as CREATE MATERIALIZED VIEW gave it (normalized by the parser).
    pub query: String,
    /// The files the query reads, as a person reads them.
    pub source: String,
    /// Where the query names its files by path (`FROM 'folder/'`): those files and their
    /// schema, so that a refresh plans the query without reading any of them.
    #[serde(default)]
    pub source_table: Option<SourceTable>,
    /// When the view was created, and last committed a refresh (milliseconds since 1970).
    pub created_ms: u64,
    pub refreshed_ms: Option<u64>,
    /// What readers read.
    pub current: Option<Generation>,
    /// A generation being built (the query or a model changed), until it is complete.
    pub pending: Option<Generation>,
    /// Files that left the view (their unit replaced, their generation superseded), and when:
    /// readers of an older manifest may still read them for a while.
    #[serde(default)]
    pub retired: Vec<Retired>,
    /// The view was dropped: this version stays as the newest, so that no statement that read
    /// an older one can commit after the drop (it would have to create this version).
    #[serde(default)]
    pub dropped: bool,
    /// The settings its refreshes score with, as CREATE had them (`on_error`, `rejects`,
    /// `max_errors`: [`VIEW_SETTINGS`]), whatever session refreshes it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
}

/// The `batchinfer.*` settings a view keeps from its CREATE.
pub const VIEW_SETTINGS: [&str; 4] = ["on_error", "rejects", "max_errors", "nulls"];

/// A file of the view's folder that a commit took out of the view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    pub path: String,
    pub at_ms: u64,
}

/// The Parquet files a view's query names by path, as the query was planned when it was created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceTable {
    /// The path as the query names it (the table DataFusion looks up).
    pub name: String,
    /// Each location: a URL, and a glob its files match.
    pub paths: Vec<(String, Option<String>)>,
    pub extension: String,
    /// The Arrow schema of the files, as hex of its IPC encoding.
    pub schema: String,
}

/// The rows of one query with one set of models.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    pub id: String,
    pub query: String,
    /// Model name -> sha256 of the model that scored these rows.
    pub models: BTreeMap<String, String>,
    /// The Arrow schema of the rows, as hex of its IPC encoding.
    pub schema: String,
    pub units: Vec<Unit>,
}

/// Input files scored and committed together, and the files their rows are in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    pub id: String,
    pub inputs: Vec<Input>,
    pub files: Vec<OutputFile>,
    pub rows: u64,
    /// Why its one input could not be read: the file is left out of the view (no rows) until it
    /// changes ([`failed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An input file as it was when it was scored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Input {
    /// Its URL.
    pub path: String,
    pub size: u64,
    /// Its ETag, or where a store has none, when it was last written.
    pub version: String,
}

/// A file of a view's rows: its path under the view's folder, and its size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    pub path: String,
    pub size: u64,
}

impl Manifest {
    /// The version that says view `name` was dropped.
    pub fn dropped(name: &str) -> Self {
        Manifest {
            format: FORMAT,
            name: name.to_string(),
            query: String::new(),
            source: String::new(),
            source_table: None,
            created_ms: now_ms(),
            refreshed_ms: None,
            current: None,
            pending: None,
            retired: Vec::new(),
            dropped: true,
            settings: BTreeMap::new(),
        }
    }

    /// The generation folders under `data/` whose files this manifest names (current, pending,
    /// retired): what a DROP of the view removes.
    pub fn data_folders(&self) -> std::collections::BTreeSet<String> {
        let generations = self.current.iter().chain(self.pending.iter());
        let retired = self
            .retired
            .iter()
            .filter_map(|r| r.path.split('/').nth(1).map(str::to_string));
        generations.map(|g| g.id.clone()).chain(retired).collect()
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::Internal(format!("writing a manifest: {e}")))
    }

    pub fn from_bytes(bytes: &[u8], shown: &str) -> Result<Self> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::warehouse(shown, format!("{shown} is not a view manifest: {e}")))?;
        if manifest.format != FORMAT {
            return Err(Error::warehouse(
                shown,
                format!(
                    "{shown} has format {}; this batchinfer reads format {FORMAT}",
                    manifest.format
                ),
            ));
        }
        Ok(manifest)
    }

    /// The generation with id `id`, current or pending.
    pub fn generation_mut(&mut self, id: &str) -> Option<&mut Generation> {
        [self.current.as_mut(), self.pending.as_mut()]
            .into_iter()
            .flatten()
            .find(|g| g.id == id)
    }

    /// Input files and rows of what readers read.
    pub fn totals(&self) -> (u64, u64) {
        self.current.as_ref().map_or((0, 0), |g| {
            g.units
                .iter()
                .filter(|u| u.error.is_none())
                .fold((0, 0), |(files, rows), u| {
                    (files + u.inputs.len() as u64, rows + u.rows)
                })
        })
    }

    /// The input files left out for errors, with the error: the current generation's, or the
    /// pending one's while a rebuild is under way.
    pub fn failed_inputs(&self) -> Vec<(&str, &str)> {
        let generation = self.pending.as_ref().or(self.current.as_ref());
        generation.map_or_else(Vec::new, |g| g.failed_inputs())
    }
}

impl Generation {
    /// The generation's schema.
    pub fn schema(&self) -> Result<SchemaRef> {
        decode_schema(&self.schema)
    }

    /// The input files its units could not read, with why.
    pub fn failed_inputs(&self) -> Vec<(&str, &str)> {
        self.units
            .iter()
            .filter_map(|u| Some((u.inputs.first()?.path.as_str(), u.error.as_deref()?)))
            .collect()
    }

    /// The files readers read, in unit order.
    pub fn files(&self) -> impl Iterator<Item = &OutputFile> {
        self.units.iter().flat_map(|u| u.files.iter())
    }
}

/// The newest manifest of a view, unless there is none or it says the view was dropped.
pub async fn newest_view(
    manifests: &crate::storage::Manifests,
    shown: &str,
) -> Result<Option<(u64, Manifest)>> {
    let Some((version, bytes)) = manifests.latest().await? else {
        return Ok(None);
    };
    let manifest = Manifest::from_bytes(&bytes, shown)?;
    Ok((!manifest.dropped).then_some((version, manifest)))
}

/// An Arrow schema as a manifest keeps it: hex of its IPC encoding.
pub fn encode_schema(schema: &Schema) -> Result<String> {
    use datafusion::arrow::ipc::writer::StreamWriter;
    let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
    writer.finish()?;
    Ok(hex::encode(writer.into_inner()?))
}

/// The schema [`encode_schema`] encoded.
pub fn decode_schema(hex_text: &str) -> Result<SchemaRef> {
    use datafusion::arrow::ipc::reader::StreamReader;
    let bytes = hex::decode(hex_text).map_err(|e| {
        Error::warehouse(
            "a view's schema",
            format!("a view's schema is not hex: {e}"),
        )
    })?;
    let reader = StreamReader::try_new(std::io::Cursor::new(bytes), None)?;
    Ok(reader.schema())
}

/// When the unit or generation named `id` ([`new_id`]) began (milliseconds since 1970).
pub fn id_time(id: &str) -> Option<u64> {
    let hex = id.get(1..)?.split('-').next()?;
    u64::from_str_radix(hex, 16).ok()
}

/// An id unique to this process and moment: generations and units are named with one.
pub fn new_id(kind: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Per process: a counter for unique names.
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{kind}{:x}-{}-{}",
        now_ms(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Milliseconds since 1970.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
/// The newest manifest, unless it says the view was dropped (one that cannot be read counts as
/// a view).
pub fn live(latest: Option<(u64, Vec<u8>)>) -> Option<(u64, Vec<u8>)> {
    latest.filter(|(_, bytes)| {
        Manifest::from_bytes(bytes, "the view's manifest").map_or(true, |m| !m.dropped)
    })
}
