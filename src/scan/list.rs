//! `FixedSizeList` columns of numbers that are never NULL, read straight from their Parquet
//! leaf as a flat column of values.

use std::fs::File;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, ArrowPrimitiveType, FixedSizeListArray, PrimitiveArray};
use datafusion::arrow::buffer::ScalarBuffer;
use datafusion::arrow::datatypes::{
    ArrowNativeType, DataType, FieldRef, Float32Type, Float64Type, Int32Type, Int64Type,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::parquet::arrow::arrow_reader::ArrowReaderMetadata;
use datafusion::parquet::basic::{Encoding, Type as PhysicalType};
use datafusion::parquet::column::reader::{ColumnReader, ColumnReaderImpl, get_column_reader};
use datafusion::parquet::data_type::DataType as ParquetDataType;
use datafusion::parquet::errors::{ParquetError, Result as ParquetResult};
use datafusion::parquet::file::metadata::RowGroupMetaData;
use datafusion::parquet::file::serialized_reader::SerializedPageReader;
use datafusion::parquet::schema::types::ColumnDescriptor;

use super::levels::FullListPages;

/// A `FixedSizeList` column whose values are never NULL (per the footer's statistics), read
/// straight from its Parquet leaf as a flat column of values (levels checked, not decoded), the
/// values handed over as the list's child without another pass. arrow-rs's general list reader
/// builds validity bitmaps and walks every level for lists of any shape, 2.5x the time.
#[derive(Debug, Clone)]
pub(crate) struct ListColumn {
    pub(super) leaf: usize,
    pub(super) size: usize,
    pub(super) item: FieldRef,
}

impl ListColumn {
    /// Root column `root` as a list column this reader reads directly, if it is one: a
    /// `FixedSizeList` of Float32, Float64, Int32 or Int64 over one Parquet leaf, whose every
    /// row group's statistics count no NULLs (null or empty lists, null items).
    pub(super) fn for_root(metadata: &ArrowReaderMetadata, root: usize) -> Option<Self> {
        let field = metadata.schema().fields().get(root)?;
        let DataType::FixedSizeList(item, size) = field.data_type() else {
            return None;
        };
        let physical = match item.data_type() {
            DataType::Float32 => PhysicalType::FLOAT,
            DataType::Float64 => PhysicalType::DOUBLE,
            DataType::Int32 => PhysicalType::INT32,
            DataType::Int64 => PhysicalType::INT64,
            _ => return None,
        };
        let parquet = metadata.parquet_schema();
        let mut leaves =
            (0..parquet.num_columns()).filter(|&l| parquet.get_column_root_idx(l) == root);
        let leaf = leaves.next()?;
        if leaves.next().is_some() {
            return None;
        }
        let column = parquet.column(leaf);
        if column.max_rep_level() != 1 || column.physical_type() != physical {
            return None;
        }
        // Levels in the RLE/bit-packed hybrid (not the long-deprecated BIT_PACKED levels).
        let no_nulls = metadata.metadata().row_groups().iter().all(|group| {
            let chunk = group.column(leaf);
            chunk.statistics().and_then(|s| s.null_count_opt()) == Some(0)
                && !chunk.encodings().any(|e| {
                    #[allow(deprecated)] // Named only to be refused.
                    let old = Encoding::BIT_PACKED;
                    e == old
                })
        });
        let size = usize::try_from(*size).ok().filter(|&s| s > 0)?;
        no_nulls.then(|| Self {
            leaf,
            size,
            item: item.clone(),
        })
    }

    /// A reader of this column in `group` (of `rows` rows) of the file `handle`.
    pub(super) fn open(
        &self,
        handle: &Arc<File>,
        group: &RowGroupMetaData,
        rows: usize,
    ) -> ParquetResult<Box<dyn ListReader>> {
        let pages = SerializedPageReader::new(handle.clone(), group.column(self.leaf), rows, None)?;
        let descr = group.schema_descr().column(self.leaf);
        let pages = FullListPages::new(pages, self.size, descr.max_def_level());
        // The leaf's values as a column of their own: the pages reach it without levels.
        let flat = Arc::new(ColumnDescriptor::new(
            descr.self_type_ptr(),
            0,
            0,
            descr.path().clone(),
        ));
        let column = get_column_reader(flat, Box::new(pages));
        Ok(match column {
            ColumnReader::FloatColumnReader(r) => {
                Box::new(TypedList::<Float32Type, _>::new(self, r))
            }
            ColumnReader::DoubleColumnReader(r) => {
                Box::new(TypedList::<Float64Type, _>::new(self, r))
            }
            ColumnReader::Int32ColumnReader(r) => Box::new(TypedList::<Int32Type, _>::new(self, r)),
            ColumnReader::Int64ColumnReader(r) => Box::new(TypedList::<Int64Type, _>::new(self, r)),
            _ => {
                return Err(ParquetError::General("not a list of numbers".to_string()));
            }
        })
    }
}

/// Reads a list column's records in batches.
pub(super) trait ListReader: Send {
    fn skip(&mut self, records: usize) -> Result<()>;
    fn read(&mut self, records: usize) -> Result<ArrayRef>;
}

pub(super) struct TypedList<A: ArrowPrimitiveType, P: ParquetDataType> {
    pub(super) column: ListColumn,
    pub(super) reader: ColumnReaderImpl<P>,
    pub(super) _arrow: std::marker::PhantomData<fn() -> A>,
}

impl<A: ArrowPrimitiveType, P: ParquetDataType> TypedList<A, P> {
    fn new(column: &ListColumn, reader: ColumnReaderImpl<P>) -> Self {
        Self {
            column: column.clone(),
            reader,
            _arrow: std::marker::PhantomData,
        }
    }
}

impl<A, P> ListReader for TypedList<A, P>
where
    A: ArrowPrimitiveType<Native = P::T>,
    P: ParquetDataType,
    P::T: ArrowNativeType,
{
    fn skip(&mut self, records: usize) -> Result<()> {
        let values = records * self.column.size;
        let skipped = self.reader.skip_records(values)?;
        if skipped != values {
            return Err(DataFusionError::Execution(format!(
                "list column ended after {skipped} of {values} values"
            )));
        }
        Ok(())
    }

    fn read(&mut self, records: usize) -> Result<ArrayRef> {
        let size = self.column.size;
        let want = records * size;
        let mut values: Vec<P::T> = Vec::with_capacity(want);
        while values.len() < want {
            let (n, _, _) =
                self.reader
                    .read_records(want - values.len(), None, None, &mut values)?;
            if n == 0 {
                return Err(DataFusionError::Execution(format!(
                    "list column ended after {} of {want} values",
                    values.len()
                )));
            }
        }
        let values = PrimitiveArray::<A>::new(ScalarBuffer::from(values), None);
        Ok(Arc::new(FixedSizeListArray::try_new(
            self.column.item.clone(),
            size as i32,
            Arc::new(values),
            None,
        )?))
    }
}
