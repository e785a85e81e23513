//! The warehouse's records of a model's batches in progress, `llm-batches/<model>/<record>.json`
//! beside the cache (`<model>`: the sha256 of its endpoint and name): a record is written before
//! its batch is made, names the batch once it is, and is removed once the batch's answers are in
//! the cache. A process that starts a model's batch mode goes on with the batches its records
//! name, so that one killed while it waited submits nothing twice.

use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

/// The warehouse's folder of records, beside `llm-cache`.
pub const FOLDER: &str = "llm-batches";

/// The largest record read (a batch's keys: 65 bytes each).
const MAX_RECORD: u64 = 8 << 20;

/// One batch's record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// Its name, also the batch's `metadata.batchinfer_record`.
    pub record: String,
    /// The cache keys of its requests (each its line's `custom_id`).
    pub keys: Vec<String>,
    /// The provider's batch, once made.
    #[serde(default)]
    pub batch: Option<String>,
    /// Whether the batch was asked for (it may exist though the record names none).
    #[serde(default)]
    pub creating: bool,
    /// When it was written (seconds since 1970).
    pub created: u64,
}

impl Record {
    /// A record's name, letters and digits only.
    pub fn fine(&self) -> bool {
        !self.record.is_empty()
            && self.record.len() <= 64
            && self.record.chars().all(|c| c.is_ascii_alphanumeric())
            && self
                .keys
                .iter()
                .all(|k| k.len() == 64 && k.chars().all(|c| c.is_ascii_hexdigit()))
    }
}

/// A model's records in a warehouse.
#[derive(Debug, Clone)]
pub struct Records {
    store: Arc<dyn ObjectStore>,
    folder: Path,
}

impl Records {
    /// The records of the model `model` at `endpoint`, in the folder beside the cache
    /// `cache_prefix` (the warehouse's `llm-cache`) of `store`.
    pub fn beside(
        store: Arc<dyn ObjectStore>,
        cache_prefix: &Path,
        endpoint: &str,
        model: &str,
    ) -> Records {
        let (folder, name) = crate::llm::cache::beside(cache_prefix, FOLDER, endpoint, model);
        Records {
            store,
            folder: folder.join(name.as_str()),
        }
    }

    fn path(&self, record: &str) -> Path {
        self.folder.clone().join(format!("{record}.json").as_str())
    }

    /// Keeps `record`; whether the store took it.
    pub async fn write(&self, record: &Record) -> bool {
        crate::storage::write_small_json(&self.store, &self.path(&record.record), record).await
    }

    /// Removes `record`.
    pub async fn remove(&self, record: &str) {
        let _ = self.store.delete(&self.path(record)).await;
    }

    /// The records kept; `Err` where they cannot be listed or one cannot be read now (a record
    /// missed would have its requests submitted again). A file that is not a record (edited by
    /// hand, or another's) is left alone and not trusted.
    pub async fn all(&self) -> Result<Vec<Record>, String> {
        let listed = self
            .store
            .list(Some(&self.folder))
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| {
                format!(
                    "the batches' records ({}) cannot be listed: {e}",
                    self.folder
                )
            })?;
        let mut records = Vec::new();
        for meta in listed {
            if meta.size > MAX_RECORD {
                continue;
            }
            let bytes = match self.store.get(&meta.location).await {
                Ok(got) => got.bytes().await,
                // Removed meanwhile: its batch was taken.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => Err(e),
            }
            .map_err(|e| format!("the batch record {} cannot be read: {e}", meta.location))?;
            let record = serde_json::from_slice::<Record>(&bytes).ok();
            if let Some(record) = record.filter(Record::fine)
                && meta.location == self.path(&record.record)
            {
                records.push(record);
            }
        }
        Ok(records)
    }
}
