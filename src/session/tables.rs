//! What features write and register through the session: the Parquet options of a write, tables
//! registered for as long as a statement needs them, and the rows a write reports.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Schema, UInt64Type};
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::config::TableParquetOptions;
use datafusion::execution::context::SessionContext;

use super::Session;
use crate::error::Result;

impl Session {
    /// The Parquet options of a write of rows of `schema`: the session's, with row groups of
    /// fewer rows where rows are wide ([`row_group_rows`]).
    pub fn parquet_options(&self, schema: &Schema) -> TableParquetOptions {
        let mut options = self.ctx.state().default_table_options().parquet;
        options.global.max_row_group_size =
            row_group_rows(schema, options.global.max_row_group_size);
        options
    }
}

/// The rows a write reports in `counts` (its `count` column).
pub fn rows_in(counts: &[RecordBatch]) -> u64 {
    counts
        .first()
        .and_then(|b| b.columns().first())
        .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        .map_or(0, |c| c.values().iter().sum::<u64>())
}

/// A table registered under a hidden name (or a given one) for as long as this lives.
pub struct Registered<'a> {
    ctx: &'a SessionContext,
    name: String,
}

impl<'a> Registered<'a> {
    /// `table`, registered under a name no statement names.
    pub fn hidden(ctx: &'a SessionContext, table: Arc<dyn TableProvider>) -> Result<Self> {
        // Per process: a counter for unique names.
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "__batchinfer_staged_{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        Self::named(ctx, &name, table)
    }

    /// `table`, registered as `name`.
    pub fn named(
        ctx: &'a SessionContext,
        name: &str,
        table: Arc<dyn TableProvider>,
    ) -> Result<Self> {
        ctx.register_table(TableReference::bare(name), table)?;
        Ok(Registered {
            ctx,
            name: name.to_string(),
        })
    }

    /// The name it is registered as.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let _ = self
            .ctx
            .deregister_table(TableReference::bare(self.name.as_str()));
    }
}

/// What a row group the Parquet writer holds in memory may take: a write holds a few (the one it
/// encodes, the ones it writes out), so memory stays flat whatever the number of rows.
const ROW_GROUP_BYTES: usize = 16 << 20;

/// Rows per row group for rows of `schema`: `configured` (256Ki by default), fewer when the rows
/// are wide, such as vectors (384 float32 are 1.5 KiB: 256Ki rows would be 384 MiB held), but
/// never under 4,096. A row group size set by the session (`SET
/// datafusion.execution.parquet.max_row_group_size`) is kept as it is.
pub fn row_group_rows(schema: &Schema, configured: usize) -> usize {
    let width: usize = schema
        .fields()
        .iter()
        .map(|f| estimated_width(f.data_type()))
        .sum();
    if configured != crate::context::ROW_GROUP_ROWS {
        return configured;
    }
    (ROW_GROUP_BYTES / width.max(1)).clamp(4_096, configured)
}

/// Bytes a value of type `t` takes, about: exact for fixed widths, a guess for the rest.
fn estimated_width(t: &datafusion::arrow::datatypes::DataType) -> usize {
    use datafusion::arrow::datatypes::DataType;
    match t {
        DataType::FixedSizeList(item, n) => {
            (*n).max(0) as usize * estimated_width(item.data_type())
        }
        DataType::Struct(fields) => fields.iter().map(|f| estimated_width(f.data_type())).sum(),
        DataType::List(item) | DataType::LargeList(item) | DataType::ListView(item) => {
            8 * estimated_width(item.data_type())
        }
        other => other.primitive_width().unwrap_or(32),
    }
}
