//! Writes whose files appear whole or not at all: COPY to object stores and from a cluster's
//! executors, and CREATE TABLE ... AS into the warehouse (local folder or S3).

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::{Schema, UInt64Type};
use datafusion::common::TableReference;
use datafusion::config::TableParquetOptions;
use datafusion::dataframe::{DataFrame, DataFrameWriteOptions};
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::prelude::ParquetReadOptions;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{CreateTable, Statement as SQLStatement};
use futures::StreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use super::{Engine, parse_url, table_name};
use crate::error::{Error, Result};
use crate::storage::{CommittedWrite, delete_prefix, object_path};
use crate::warehouse::Warehouse;

impl Engine {
    /// COPY, whose files appear all at once when it succeeds, or not at all, wherever it runs
    /// ([`crate::cluster::Placement::write_to`]).
    pub(super) async fn copy_committed(&self, statement: DFStatement) -> Result<DataFrame> {
        let DFStatement::CopyTo(mut copy) = statement else {
            return Err(Error::Usage("expected a COPY statement".into()));
        };
        let (write_to, output) = self
            .placement
            .write_to(self.registry.stores(), &copy.target)?;
        copy.target = write_to;
        self.run_then_commit(DFStatement::CopyTo(copy), vec![output])
            .await
    }

    /// A statement writing into `targets` (INSERT INTO a table's folders) whose new files appear
    /// together when it succeeds, or not at all.
    pub(super) async fn write_committed(
        &self,
        statement: DFStatement,
        targets: &[String],
    ) -> Result<DataFrame> {
        let stores = self.registry.stores();
        let writes = targets
            .iter()
            .map(|target| stores.begin_write(target).map(CommittedWrite::Deferred))
            .collect::<Result<Vec<_>>>()?;
        self.run_then_commit(statement, writes).await
    }

    /// Runs `statement` to the end, then commits `writes`; on failure (or when the future is
    /// dropped: cancellation) they are discarded.
    async fn run_then_commit(
        &self,
        statement: DFStatement,
        writes: Vec<CommittedWrite>,
    ) -> Result<DataFrame> {
        let written = match self.execute(statement).await {
            Ok(df) => df.collect().await.map_err(Error::from),
            Err(e) => Err(e),
        };
        match written {
            Ok(batches) => {
                for write in writes {
                    write.commit().await?;
                }
                Ok(self.results.read_batches(batches)?)
            }
            Err(e) => {
                for write in writes {
                    write.abort().await;
                }
                Err(e)
            }
        }
    }

    /// CREATE TABLE name AS query, into the warehouse: written to a staging folder, with the
    /// models and model hashes that produced it in each file's metadata, then committed by rename.
    pub(super) async fn create_table_as(
        &self,
        warehouse: &Warehouse,
        ct: &CreateTable,
    ) -> Result<DataFrame> {
        let name = table_name(&ct.name)?;
        if self.ctx.table_exist(TableReference::bare(name.as_str()))? {
            if ct.if_not_exists {
                return self.empty();
            }
            if !ct.or_replace {
                return Err(Error::Usage(format!(
                    "table '{name}' already exists (use CREATE OR REPLACE TABLE)"
                )));
            }
        }
        let query = ct
            .query
            .clone()
            .ok_or_else(|| Error::Usage("CREATE TABLE AS needs a query".into()))?;
        let df = self
            .execute(DFStatement::Statement(Box::new(SQLStatement::Query(query))))
            .await?;
        let models = self.models_used(df.logical_plan())?;
        let mut options = TableParquetOptions::default();
        options
            .key_value_metadata
            .insert("batchinfer.models".to_string(), Some(models.clone()));
        let empty_file = empty_table_file(df.schema().inner().clone(), &models)?;
        let written = if warehouse.bucket().is_some() {
            let written = self
                .write_table_in_bucket(warehouse, &name, ct.or_replace, df, options, empty_file)
                .await?;
            if self.ctx.table_exist(TableReference::bare(name.as_str()))? {
                self.ctx
                    .deregister_table(TableReference::bare(name.as_str()))?;
            }
            written
        } else {
            let staging = warehouse.staging_dir(&name)?;
            let written = df
                .write_parquet(
                    &dir_url(staging.dir()),
                    DataFrameWriteOptions::new(),
                    Some(options),
                )
                .await?;
            write_if_empty(staging.dir(), &empty_file)?;
            warehouse.commit(staging, &name, ct.or_replace)?;
            if self.ctx.table_exist(TableReference::bare(name.as_str()))? {
                self.ctx
                    .deregister_table(TableReference::bare(name.as_str()))?;
            }
            written
        };
        self.ctx
            .register_parquet(
                TableReference::bare(name.as_str()),
                &warehouse.table_location(&name)?,
                ParquetReadOptions::default(),
            )
            .await?;
        self.rows_written(&written)
    }

    /// A result of no columns whose rows are the rows a write reports in `counts` (its
    /// `count`): nothing to print, and the summary of the statement says how many.
    fn rows_written(&self, counts: &[RecordBatch]) -> Result<DataFrame> {
        let rows = counts
            .first()
            .and_then(|b| b.columns().first())
            .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            .map_or(0, |c| c.values().iter().sum::<u64>());
        let rows = usize::try_from(rows).unwrap_or(usize::MAX);
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        Ok(self.results.read_batch(batch)?)
    }

    /// A warehouse table in S3. From this process, the new files are uploaded with their
    /// completion held back; from a cluster's executors, they go to a staging folder. Once all
    /// are written, the old table's files are deleted (with `replace`; without, a table another
    /// statement created meanwhile makes this one fail) and the new ones committed.
    async fn write_table_in_bucket(
        &self,
        warehouse: &Warehouse,
        name: &str,
        replace: bool,
        df: DataFrame,
        options: TableParquetOptions,
        empty_file: Vec<u8>,
    ) -> Result<Vec<RecordBatch>> {
        let location = warehouse.table_location(name)?;
        let url = parse_url(&location)?;
        let prefix = object_path(&url)?;
        let stores = self.registry.stores();
        let (write_to, output) = self.placement.write_to(stores, &location)?;
        let store = stores.store_for(&url)?;
        // Straight to the bucket: the claim is not held back with the table's files.
        let bucket = stores.commit_store(&url)?.inner().clone();
        let claim = prefix.clone().join(crate::warehouse::TABLE_CLAIM);
        let written = async {
            let counts = df
                .write_parquet(&write_to, DataFrameWriteOptions::new(), Some(options))
                .await?;
            if replace {
                // Objects already complete under the prefix are the old table's.
                delete_prefix(store.as_ref(), &prefix).await?;
                bucket.put(&claim, PutPayload::new()).await?;
            } else {
                claim_table(bucket.as_ref(), &prefix, &claim, name).await?;
            }
            Ok::<_, Error>(counts)
        }
        .await;
        let counts = match written {
            Ok(counts) => counts,
            Err(e) => {
                output.abort().await;
                return Err(e);
            }
        };
        let committed = match output.commit().await {
            Ok(files) => files,
            Err(e) => {
                if !replace {
                    let _ = bucket.delete(&claim).await;
                }
                return Err(e);
            }
        };
        if committed == 0 {
            store
                .put(&prefix.clone().join("part-0.parquet"), empty_file.into())
                .await?;
        }
        Ok(counts)
    }

    /// JSON naming each model a plan calls (by literal name) with its file's sha256.
    fn models_used(&self, plan: &LogicalPlan) -> Result<String> {
        let mut names = BTreeMap::new();
        plan.apply(|node| {
            node.apply_expressions(|expr| {
                expr.apply(|e| {
                    if let Expr::ScalarFunction(f) = e
                        && matches!(f.name(), "predict" | "embed")
                        && let Some(Expr::Literal(
                            ScalarValue::Utf8(Some(n)) | ScalarValue::Utf8View(Some(n)),
                            _,
                        )) = f.args.first()
                    {
                        names.insert(n.clone(), ());
                    }
                    Ok(TreeNodeRecursion::Continue)
                })
            })
        })?;
        let models: Vec<serde_json::Value> = names
            .keys()
            .filter_map(|n| self.registry.get(n).ok())
            .map(|m| serde_json::json!({"name": m.name, "sha256": m.sha256, "source": m.source.to_string()}))
            .collect();
        Ok(serde_json::Value::Array(models).to_string())
    }
}

/// Writes `file` as the table's one file when the write made none.
fn write_if_empty(dir: &Path, file: &[u8]) -> Result<()> {
    let has_files = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
        .next()
        .is_some();
    if has_files {
        return Ok(());
    }
    let path = dir.join("part-0.parquet");
    std::fs::write(&path, file).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// An empty result writes no file; a table needs one to carry its schema: this one, with no rows.
fn empty_table_file(
    schema: datafusion::arrow::datatypes::SchemaRef,
    models: &str,
) -> Result<Vec<u8>> {
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::metadata::KeyValue;
    use datafusion::parquet::file::properties::WriterProperties;
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(vec![KeyValue::new(
            "batchinfer.models".to_string(),
            models.to_string(),
        )]))
        .build();
    let mut bytes = Vec::new();
    let writer = ArrowWriter::try_new(&mut bytes, schema, Some(props))
        .map_err(|e| Error::Usage(e.to_string()))?;
    writer.close().map_err(|e| Error::Usage(e.to_string()))?;
    Ok(bytes)
}

/// A folder as a listing-table location (trailing slash: every file in it).
fn dir_url(dir: &Path) -> String {
    let mut s = dir.display().to_string();
    if !s.ends_with('/') {
        s.push('/');
    }
    s
}

/// Claims table `name` in S3 for a CREATE TABLE: the claim is created only where none exists
/// (S3's conditional PUT), so of two statements creating one table at once exactly one goes on.
/// A table with files and no claim (written before claims were made) counts as taken too.
async fn claim_table(
    bucket: &dyn ObjectStore,
    prefix: &object_store::path::Path,
    claim: &object_store::path::Path,
    name: &str,
) -> Result<()> {
    let taken = || {
        Error::Usage(format!(
            "table '{name}' already exists (another statement created it meanwhile)"
        ))
    };
    match bucket
        .put_opts(claim, PutPayload::new(), PutMode::Create.into())
        .await
    {
        Ok(_) => {}
        Err(object_store::Error::AlreadyExists { .. }) => return Err(taken()),
        // A store without conditional writes: the listing below is the only check.
        Err(object_store::Error::NotImplemented { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let mut objects = bucket.list(Some(prefix));
    while let Some(object) = objects.next().await {
        if object?.location != *claim {
            let _ = bucket.delete(claim).await;
            return Err(taken());
        }
    }
    Ok(())
}
