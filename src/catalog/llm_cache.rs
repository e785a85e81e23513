//! `SHOW LLM CACHE` and `CLEAR LLM CACHE`: the endpoint models' answers the warehouse keeps
//! ([`crate::llm::cache`]), counted, or removed.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};

use super::Catalog;
use crate::error::{Error, Result};

impl Catalog {
    /// The answers the cache keeps and their bytes, as one row; with `clear`, the answers
    /// removed (and no bytes left).
    pub(super) async fn llm_cache(&self, clear: bool) -> Result<RecordBatch> {
        let Some(warehouse) = &self.warehouse else {
            return Err(Error::Usage(
                "the LLM cache is kept in the warehouse: give --warehouse DIR".into(),
            ));
        };
        let (store, prefix, url) = warehouse.area(crate::llm::cache::FOLDER)?;
        let cache = crate::llm::cache::Cache::new(store, prefix, url.to_string());
        let (entries, bytes) = match clear {
            true => (cache.clear().await?, 0),
            false => cache.size().await?,
        };
        if clear {
            crate::say!("{entries} kept answers removed from the LLM cache");
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("answers", DataType::UInt64, false),
            Field::new("bytes", DataType::UInt64, false),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(UInt64Array::from(vec![entries])),
            Arc::new(UInt64Array::from(vec![bytes])),
        ];
        Ok(RecordBatch::try_new(schema, columns)?)
    }
}
