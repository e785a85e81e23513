//! Writes whose files appear whole or not at all: COPY, INSERT and CREATE TABLE ... AS, in this
//! process or on a cluster ([`crate::cluster::Placement::write_to`]), committed as their store
//! commits ([`crate::storage`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};

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

use super::{Engine, table_name};
use crate::error::{Error, Result};
use crate::storage::CommittedWrite;
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

    /// CREATE TABLE name AS query, into the warehouse, with the models and model hashes that
    /// produced it in each file's metadata: the table appears when the statement succeeds
    /// ([`crate::storage::Tables`]), or not at all.
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
        let stores = self.registry.stores();
        let table = warehouse.begin_table(&name, ct.or_replace, |target| {
            self.placement.write_to(stores, target)
        })?;
        let written = match df
            .write_parquet(table.target(), DataFrameWriteOptions::new(), Some(options))
            .await
        {
            Ok(written) => written,
            Err(e) => {
                table.abort().await;
                return Err(e.into());
            }
        };
        table.commit(empty_file).await?;
        if self.ctx.table_exist(TableReference::bare(name.as_str()))? {
            self.ctx
                .deregister_table(TableReference::bare(name.as_str()))?;
        }
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
