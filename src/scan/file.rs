//! One file as the scan reads it: its footer with the table's types, and where each column
//! read comes from (arrow-rs's reader, or a list reader).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};

use super::list::ListColumn;

/// One file as this scan reads it.
#[derive(Debug)]
pub(crate) struct ScanFile {
    pub(crate) path: PathBuf,
    /// Footer metadata, with the table's column types as the schema to read.
    pub(crate) metadata: ArrowReaderMetadata,
    /// The file's top-level columns arrow-rs's reader reads (None: none).
    pub(crate) mask: Option<ProjectionMask>,
    /// The `FixedSizeList` columns read by [`ListReader`] instead.
    pub(crate) lists: Vec<ListColumn>,
    /// Where each column read comes from.
    pub(crate) columns: Vec<Source>,
}

/// Where a column read comes from: arrow-rs's batch (its position there) or a list reader.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source {
    Arrow(usize),
    List(usize),
}

impl ScanFile {
    /// The file at `path` read as columns `names` of `table`, typed as `output`; None when the
    /// file cannot be read that way (DataFusion's reader then reads it, and reports any error).
    pub(crate) fn open(
        path: PathBuf,
        table: &Schema,
        names: &[&str],
        output: &Schema,
        footer_cap: u64,
    ) -> Option<Self> {
        // Opening a FIFO would wait for a writer: regular files only.
        if !std::fs::metadata(&path).ok()?.is_file() {
            return None;
        }
        let file = File::open(&path).ok()?;
        // A footer claiming more than the file holds, or than the cap, is left to DataFusion's
        // reader, whose store reports it (`storage::footer`): parquet would allocate it.
        let size = file.metadata().ok()?.len();
        let mut tail = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut tail, size.checked_sub(8)?).ok()?;
        crate::storage::footer::metadata_len(&path.display(), size, tail, footer_cap).ok()?;
        let metadata = with_table_types(&file, table)?;
        let schema = metadata.schema().clone();
        for (name, field) in names.iter().zip(output.fields()) {
            let read = schema.field_with_name(name).ok()?;
            if read.data_type() != field.data_type() || (read.is_nullable() && !field.is_nullable())
            {
                return None;
            }
        }
        // Roots to read, in file order; those that are lists of never-NULL numbers go to a
        // list reader.
        let name_roots: Vec<usize> = names
            .iter()
            .map(|n| schema.index_of(n).ok())
            .collect::<Option<_>>()?;
        let mut roots = name_roots.clone();
        roots.sort_unstable();
        roots.dedup();
        let mut arrow_roots = Vec::new();
        let mut lists = Vec::new();
        let mut list_roots = Vec::new();
        for &root in &roots {
            match ListColumn::for_root(&metadata, root) {
                Some(list) => {
                    lists.push(list);
                    list_roots.push(root);
                }
                None => arrow_roots.push(root),
            }
        }
        let columns: Vec<Source> = name_roots
            .iter()
            .map(|root| match arrow_roots.iter().position(|r| r == root) {
                Some(i) => Some(Source::Arrow(i)),
                None => list_roots.iter().position(|r| r == root).map(Source::List),
            })
            .collect::<Option<_>>()?;
        let mask = (!arrow_roots.is_empty())
            .then(|| ProjectionMask::roots(metadata.parquet_schema(), arrow_roots));
        Some(Self {
            path,
            metadata,
            mask,
            lists,
            columns,
        })
    }
}

/// The metadata of `file` with its columns typed as those of `table` (DataFusion reads strings
/// as views, ...).
fn with_table_types(file: &File, table: &Schema) -> Option<ArrowReaderMetadata> {
    let natural = ArrowReaderMetadata::load(file, ArrowReaderOptions::new()).ok()?;
    let fields: Vec<Field> = natural
        .schema()
        .fields()
        .iter()
        .map(|f| match table.field_with_name(f.name()) {
            Ok(t) if t.data_type() != f.data_type() => {
                f.as_ref().clone().with_data_type(t.data_type().clone())
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    let hint = Arc::new(Schema::new_with_metadata(
        fields,
        natural.schema().metadata().clone(),
    ));
    ArrowReaderMetadata::try_new(
        natural.metadata().clone(),
        ArrowReaderOptions::new().with_schema(hint),
    )
    .ok()
}
