//! Delta Lake tables, read through delta-rs (`deltalake-core`) over batchinfer's own stores:
//!
//! ```sql
//! CREATE EXTERNAL TABLE customers STORED AS DELTATABLE LOCATION 'data/sample/customers_delta/';
//! CREATE EXTERNAL TABLE customers_v0 STORED AS DELTATABLE LOCATION 'data/sample/customers_delta/'
//! OPTIONS ('version' '0');
//! ```
//!
//! A table reads the version its `_delta_log` holds when a query is planned: each query plans
//! over the newest commit, and reads that one to its end whatever is committed meanwhile (its
//! files are those of the version it planned). `OPTIONS ('version' 'N')` or `('timestamp'
//! 'RFC 3339')` pins one version instead (time travel). The table's columns are those of the
//! version read at CREATE; a query over a later version whose columns changed is refused.
//!
//! The log and the data files are read through the store of the location (local, S3, Google
//! Cloud Storage, Azure, HTTP), with the settings and credentials of every other path.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::TableType;
use datafusion::error::DataFusionError;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::{CreateExternalTable, Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use deltalake_core::delta_datafusion::TableProviderBuilder;
use deltalake_core::kernel::Version;
use deltalake_core::logstore::{LogStoreRef, StorageConfig, default_logstore};
use deltalake_core::{DeltaTable, DeltaTableError};
use object_store::ObjectStore;
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{blank_passwords, folder_location};

/// The names `STORED AS` gives a Delta table.
pub const STORED_AS: [&str; 2] = ["DELTATABLE", "DELTA"];

/// Which version of a table a definition reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum At {
    /// The newest, as each query is planned.
    Newest,
    /// Version N (`OPTIONS ('version' 'N')`).
    Version(Version),
    /// The version current at a time (`OPTIONS ('timestamp' '2026-12-01T10:00:00Z')`).
    Time(chrono::DateTime<chrono::Utc>),
}

impl At {
    /// The version the `OPTIONS` of table `name` ask for; an option Delta tables do not take is
    /// refused, naming it.
    pub fn from_options(name: &str, options: &BTreeMap<String, String>) -> Result<At> {
        let mut at = At::Newest;
        for (key, value) in options {
            let setting =
                |problem: String| Error::setting(key, format!("table '{name}': {problem}"));
            match key.as_str() {
                "version" if at != At::Newest => {
                    return Err(setting("give 'version' or 'timestamp', not both".into()));
                }
                "version" => {
                    let version = value.trim().parse::<Version>().map_err(|_| {
                        setting(format!(
                            "'version' is {value:?}; expected a version number (0, 1, ...)"
                        ))
                    })?;
                    at = At::Version(version);
                }
                "timestamp" if at != At::Newest => {
                    return Err(setting("give 'version' or 'timestamp', not both".into()));
                }
                "timestamp" => {
                    let time = chrono::DateTime::parse_from_rfc3339(value.trim()).map_err(|e| {
                        setting(format!(
                            "'timestamp' is {value:?} ({e}); expected a time as RFC 3339 \
                             ('2026-12-01T10:00:00Z')"
                        ))
                    })?;
                    at = At::Time(time.with_timezone(&chrono::Utc));
                }
                other => {
                    return Err(setting(format!(
                        "a Delta table takes the options 'version' and 'timestamp' (and a \
                         store's settings), not '{other}'"
                    )));
                }
            }
        }
        Ok(at)
    }
}

/// `STORED AS DELTATABLE | DELTA`, among the session's table factories.
#[derive(Debug, Default)]
pub struct DeltaFactory;

#[async_trait]
impl TableProviderFactory for DeltaFactory {
    async fn create(
        &self,
        session: &dyn Session,
        create: &CreateExternalTable,
    ) -> datafusion::error::Result<Arc<dyn TableProvider>> {
        Ok(Arc::new(DeltaTableProvider::create(session, create).await?))
    }
}

/// A Delta table as a table of the session (see the module's text).
#[derive(Debug)]
pub struct DeltaTableProvider {
    name: String,
    /// Where the table is, as a person gave it (passwords blanked).
    location: String,
    log_store: LogStoreRef,
    /// The version every query reads, where one is pinned.
    version: Option<Version>,
    schema: SchemaRef,
}

impl DeltaTableProvider {
    async fn create(session: &dyn Session, create: &CreateExternalTable) -> Result<Self> {
        let name = create.name.to_string();
        let [given] = create.locations.as_slice() else {
            return Err(Error::table(
                &name,
                format!("table '{name}': a Delta table needs one LOCATION (its folder)"),
            ));
        };
        let location = blank_passwords(given);
        if !create.table_partition_cols.is_empty() || !create.schema.fields().is_empty() {
            return Err(Error::table(
                &name,
                format!(
                    "table '{name}': a Delta table's columns and partitions are those of its \
                     log; declare none"
                ),
            ));
        }
        let options = delta_options(create);
        let at = At::from_options(&name, &options)?;
        let url = folder_location(given)?;
        let store = session
            .runtime_env()
            .object_store(ObjectStoreUrl::parse(&url[..url::Position::BeforePath])?)?;
        let table = open(&url, store, &at)
            .await
            .map_err(|e| delta_error(&name, &location, e))?;
        let version = match at {
            At::Newest => None,
            _ => table.version(),
        };
        let provider = TableProviderBuilder::default()
            .with_log_store(table.log_store())
            .with_table_version(table.version())
            .build()
            .await?;
        Ok(DeltaTableProvider {
            name,
            location,
            log_store: table.log_store(),
            version,
            schema: provider.schema(),
        })
    }

    /// The version this table reads (None: the newest when a query is planned).
    pub fn version(&self) -> Option<Version> {
        self.version
    }
}

/// The options of a definition, without the stores' own (`aws.*`, `gcp.*`, `azure.*`, which
/// connect the store) and DataFusion's `format.` prefix.
fn delta_options(create: &CreateExternalTable) -> BTreeMap<String, String> {
    create
        .options
        .iter()
        .map(|(key, value)| {
            let key = key.to_ascii_lowercase();
            let key = key.strip_prefix("format.").unwrap_or(&key).to_string();
            (key, value.clone())
        })
        .filter(|(key, _)| {
            !["aws.", "gcp.", "azure."]
                .iter()
                .any(|p| key.starts_with(p))
        })
        .collect()
}

/// The table at `url` (a folder URL) in `store` (the store of its scheme and host), loaded at
/// `at`.
pub async fn open(
    url: &Url,
    store: Arc<dyn ObjectStore>,
    at: &At,
) -> std::result::Result<DeltaTable, DeltaTableError> {
    let config = StorageConfig::default();
    let prefixed = Arc::from(config.decorate_store(store.clone(), url)?);
    let log_store = default_logstore(prefixed, store, url, &config);
    let mut table = DeltaTable::new(log_store);
    match at {
        At::Newest => table.load().await?,
        At::Version(version) => {
            // A version past the newest is named as such (the kernel's own word is about log
            // segments).
            table.load().await?;
            if table.version().is_some_and(|newest| *version > newest) {
                return Err(DeltaTableError::InvalidVersion(*version));
            }
            table.load_version(*version).await?
        }
        At::Time(time) => table.load_with_datetime(*time).await?,
    }
    Ok(table)
}

/// A delta-rs error as a person reads it: which table, where, and what is wrong.
fn delta_error(name: &str, location: &str, e: DeltaTableError) -> Error {
    let problem = match &e {
        DeltaTableError::NotATable(_) => {
            format!("{location} holds no Delta table (no commit in its _delta_log/)")
        }
        DeltaTableError::InvalidVersion(version) => {
            format!("{location} has no version {version}")
        }
        _ => format!("{location}: {e}"),
    };
    Error::table(name, format!("Delta table '{name}': {problem}"))
}

#[async_trait]
impl TableProvider for DeltaTableProvider {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters are used to skip files by their statistics; every row is filtered again above.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    /// The scan of the version this query reads: the pinned one, or the newest now.
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let scan = TableProviderBuilder::default()
            .with_log_store(self.log_store.clone())
            .with_table_version(self.version)
            .build()
            .await
            .map_err(|e| {
                DataFusionError::from(Error::table(
                    &self.name,
                    format!("Delta table '{}' at {}: {e}", self.name, self.location),
                ))
            })?;
        if scan.schema().fields() != self.schema.fields() {
            return Err(Error::table(
                &self.name,
                format!(
                    "Delta table '{}' at {}: its columns changed since it was defined (now {}); \
                     define it again (CREATE OR REPLACE EXTERNAL TABLE)",
                    self.name,
                    self.location,
                    columns(&scan.schema())
                ),
            )
            .into());
        }
        scan.scan(state, projection, filters, limit).await
    }
}

/// A schema's columns as a person reads them: `id Int64, p Float32`.
fn columns(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of `DESCRIBE HISTORY`, newest commit first.
pub fn history_schema() -> SchemaRef {
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    Arc::new(Schema::new(vec![
        Field::new("version", DataType::UInt64, false),
        Field::new(
            "timestamp",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("operation", DataType::Utf8, true),
        Field::new("operation_parameters", DataType::Utf8, true),
        Field::new("read_version", DataType::UInt64, true),
        Field::new("engine_info", DataType::Utf8, true),
        Field::new("info", DataType::Utf8, true),
    ]))
}

/// `DESCRIBE HISTORY name`: each commit of the Delta table `name` (a table of the session
/// `ctx`), newest first, with what its commit says of itself (Delta's commit info: the
/// operation and its parameters, the engine that wrote it, and the rest of what it recorded).
pub async fn history(
    ctx: &datafusion::prelude::SessionContext,
    name: &str,
) -> Result<datafusion::arrow::array::RecordBatch> {
    use datafusion::arrow::array::{
        RecordBatch, StringArray, TimestampMillisecondArray, UInt64Array,
    };
    let provider = ctx.table_provider(name).await?;
    let Some(table) = provider.downcast_ref::<DeltaTableProvider>() else {
        return Err(Error::table(
            name,
            format!(
                "DESCRIBE HISTORY reads a Delta table's log; '{name}' is not a Delta table \
                 (CREATE EXTERNAL TABLE {name} STORED AS DELTATABLE LOCATION '...')"
            ),
        ));
    };
    let (versions, infos) =
        deltalake_core::logstore::get_all_versions_from(table.log_store.clone(), 0)
            .await
            .map_err(|e| delta_error(&table.name, &table.location, e))?;
    let mut rows: Vec<_> = versions.into_iter().zip(infos).collect();
    rows.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    let text = |map: &std::collections::HashMap<String, serde_json::Value>| {
        (!map.is_empty()).then(|| serde_json::to_string(&sorted(map)).unwrap_or_default())
    };
    let columns: Vec<datafusion::arrow::array::ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|(v, _)| *v))),
        Arc::new(
            TimestampMillisecondArray::from_iter(rows.iter().map(|(_, c)| c.timestamp))
                .with_timezone("UTC"),
        ),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| c.operation.clone()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter()
                .map(|(_, c)| c.operation_parameters.as_ref().and_then(text)),
        )),
        Arc::new(UInt64Array::from_iter(
            rows.iter().map(|(_, c)| c.read_version),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| c.engine_info.clone()),
        )),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|(_, c)| text(&c.info)),
        )),
    ];
    Ok(RecordBatch::try_new(history_schema(), columns)?)
}

/// A JSON object's entries in key order (a `HashMap` has none), so that the text is the same
/// each time.
fn sorted(
    map: &std::collections::HashMap<String, serde_json::Value>,
) -> BTreeMap<&String, &serde_json::Value> {
    map.iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(pairs: &[(&str, &str)]) -> Result<At> {
        let options = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        At::from_options("t", &options)
    }

    #[test]
    fn options_pin_a_version_or_a_time_and_refuse_the_rest() {
        assert_eq!(at(&[]).unwrap(), At::Newest);
        assert_eq!(at(&[("version", "3")]).unwrap(), At::Version(3));
        assert!(matches!(
            at(&[("timestamp", "2026-12-01T10:00:00Z")]).unwrap(),
            At::Time(_)
        ));
        let refused = |pairs: &[(&str, &str)], says: &str| {
            let message = at(pairs).unwrap_err().to_string();
            assert!(message.contains(says), "{message}");
        };
        refused(&[("version", "-1")], "expected a version number");
        refused(&[("version", "three")], "expected a version number");
        refused(&[("timestamp", "yesterday")], "RFC 3339");
        refused(
            &[("version", "1"), ("timestamp", "2026-12-01T10:00:00Z")],
            "not both",
        );
        refused(&[("path", "x")], "not 'path'");
    }
}
