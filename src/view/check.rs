//! What a materialized view's query may be: row-wise over one set of files, so that each input
//! file's rows can be computed, kept and replaced apart from the others.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableUrl};
use datafusion::logical_expr::{Expr, LogicalPlan};

use crate::error::{Error, Result};

/// Refuses a location a view reads (a table its query names by URL, or the files of its
/// source) that carries a credential (`s3://user:password@bucket/`, `https://host/f?sig=...`):
/// a view keeps its query and its source (in every manifest version, in the metadata of each
/// file it writes, in SHOW MATERIALIZED VIEWS), and a credential must be kept nowhere.
/// Credentials come from the environment or from a statement's OPTIONS.
pub fn without_credentials(name: &str, location: &str) -> Result<()> {
    let blanked = crate::storage::blank_passwords(location);
    if blanked == location {
        return Ok(());
    }
    Err(Error::view(
        name,
        format!(
            "materialized view '{name}': it reads a URL with a password or a token in it \
         ({blanked}); a view keeps its query, so its credentials cannot be in it: write the \
         URL without them and give them in the environment (AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, GOOGLE_APPLICATION_CREDENTIALS) or \
         in the session (SET 'aws.secret_access_key' ...)"
        ),
    ))
}

/// How a file's columns differ from those a materialized view reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ColumnMismatch {
    #[error("it has no column '{column}', which the view reads (it has {has})")]
    Missing { column: String, has: String },
    #[error("its column '{column}' is {found}, where the view's is {expected}")]
    Type {
        column: String,
        found: datafusion::arrow::datatypes::DataType,
        expected: datafusion::arrow::datatypes::DataType,
    },
}

/// Whether an input file's columns are the view's: each column the view reads is in the file
/// by the same name, of the same type (strings and binaries in any of Arrow's layouts). A file
/// that differs would be cast silently (text `'1e39'` read as a float's infinity) or read with
/// NULL for what it lacks (`F0` for `f0`): it is that file's error instead.
pub fn check_file_columns(
    view: &datafusion::arrow::datatypes::Schema,
    file: &datafusion::arrow::datatypes::Schema,
) -> std::result::Result<(), ColumnMismatch> {
    for field in view.fields() {
        match file.field_with_name(field.name()) {
            Err(_) => {
                return Err(ColumnMismatch::Missing {
                    column: field.name().clone(),
                    has: file
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            Ok(found) if !reads_as(found.data_type(), field.data_type()) => {
                return Err(ColumnMismatch::Type {
                    column: field.name().clone(),
                    found: found.data_type().clone(),
                    expected: field.data_type().clone(),
                });
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Whether a file's column of type `file` reads as the view's `view` without a cast that
/// changes what it means: the same type (strings and binaries in any of Arrow's layouts, a
/// dictionary by its values, timestamps of the same unit in any time zone), an integer into a
/// wider integer or a float, a float into a wider float, lists and structs element by element.
fn reads_as(
    file: &datafusion::arrow::datatypes::DataType,
    view: &datafusion::arrow::datatypes::DataType,
) -> bool {
    use datafusion::arrow::datatypes::DataType::*;
    let plain = |t: &datafusion::arrow::datatypes::DataType| match t {
        Utf8View | LargeUtf8 => Utf8,
        BinaryView | LargeBinary => Binary,
        other => other.clone(),
    };
    let (file, view) = (plain(file), plain(view));
    if file.equals_datatype(&view) {
        return true;
    }
    match (&file, &view) {
        (Dictionary(_, values), _) => reads_as(values, &view),
        (Timestamp(a, a_zone), Timestamp(b, b_zone)) => {
            a == b && a_zone.is_some() == b_zone.is_some()
        }
        (a, b) if a.is_integer() && b.is_integer() => {
            a.is_signed_integer() == b.is_signed_integer()
                && a.primitive_width() <= b.primitive_width()
        }
        (a, Float64) if a.is_integer() || matches!(a, Float16 | Float32) => true,
        (Int8 | Int16 | UInt8 | UInt16 | Float16, Float32) => true,
        (
            List(a) | LargeList(a) | ListView(a) | LargeListView(a),
            List(b) | LargeList(b) | ListView(b) | LargeListView(b),
        ) => reads_as(a.data_type(), b.data_type()),
        (FixedSizeList(a, n), FixedSizeList(b, m)) => {
            n == m && reads_as(a.data_type(), b.data_type())
        }
        (Struct(a), Struct(b)) => b.iter().all(|field| {
            a.iter()
                .find(|f| f.name() == field.name())
                .is_some_and(|f| reads_as(f.data_type(), field.data_type()))
        }),
        _ => false,
    }
}

/// The files a view reads.
#[derive(Debug, Clone)]
pub struct Source {
    /// The table the query names.
    pub table: datafusion::common::TableReference,
    pub files: SourceFiles,
    pub schema: datafusion::arrow::datatypes::SchemaRef,
}

/// The files of a view's source, by the kind of table they are.
#[derive(Debug, Clone)]
pub enum SourceFiles {
    /// A listing table's paths and format: each file read as a table.
    Listing {
        paths: Vec<ListingTableUrl>,
        options: ListingOptions,
    },
    /// `read_blob`'s or `read_text`'s: each file a row.
    Blob(crate::blob::BlobTable),
}

impl Source {
    /// The files, as a person reads them.
    pub fn shown(&self) -> String {
        let paths = match &self.files {
            SourceFiles::Listing { paths, .. } => paths,
            SourceFiles::Blob(table) => return table.shown(),
        };
        let paths: Vec<String> = paths
            .iter()
            .map(|p| {
                let folder = crate::storage::display_location(p.get_url());
                match p.get_glob() {
                    Some(glob) => format!("{folder}{}", glob.as_str()),
                    None => folder,
                }
            })
            .collect();
        paths.join(", ")
    }
}

/// Why `plan` cannot be a materialized view, if it cannot; else the files it reads.
pub fn row_wise_source(plan: &LogicalPlan, view: &str) -> Result<Source> {
    let refuse = |what: &str| {
        Error::view(
            view,
            format!(
                "materialized view '{view}' must be computed row by row from one set of files, so \
             that new files can be scored alone; its query has {what}. Use CREATE TABLE {view} \
             AS ... for such a query (it is computed whole each time)"
            ),
        )
    };
    let mut scans = Vec::new();
    let mut refused = None;
    plan.apply(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            scans.push(scan.clone());
        }
        let what = not_row_wise(node).or_else(|| has_subquery(node).then_some("a subquery"));
        if let Some(what) = what {
            refused = Some(what);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let Some(what) = refused {
        return Err(refuse(what));
    }
    let [scan] = scans.as_slice() else {
        return Err(refuse("more than one table"));
    };
    let provider = source_as_provider(&scan.source)?;
    if let Some(blob) = provider.downcast_ref::<crate::blob::BlobTable>() {
        return Ok(Source {
            table: scan.table_name.clone(),
            files: SourceFiles::Blob(blob.clone()),
            schema: blob.schema(),
        });
    }
    let Some(listing) = provider.downcast_ref::<ListingTable>() else {
        return Err(refuse(&format!(
            "'{}', which is not a table of files",
            scan.table_name
        )));
    };
    if !listing.options().table_partition_cols.is_empty() {
        return Err(Error::view(
            view,
            format!(
                "materialized view '{view}': '{}' is partitioned by folder names, which a view's \
             source cannot be yet; name its files by a glob instead",
                scan.table_name
            ),
        ));
    }
    Ok(Source {
        table: scan.table_name.clone(),
        files: SourceFiles::Listing {
            paths: listing.table_paths().clone(),
            options: listing.options().clone(),
        },
        schema: listing.schema(),
    })
}

/// What in `node` a view cannot compute row by row, if anything (its expressions aside).
fn not_row_wise(node: &LogicalPlan) -> Option<&'static str> {
    match node {
        LogicalPlan::Projection(_)
        | LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Unnest(_)
        | LogicalPlan::TableScan(_) => None,
        LogicalPlan::Aggregate(_) => Some("an aggregation (GROUP BY, count, sum, ...)"),
        LogicalPlan::Window(_) => Some("a window function"),
        LogicalPlan::Sort(_) => Some("ORDER BY"),
        LogicalPlan::Limit(_) => Some("LIMIT or OFFSET"),
        LogicalPlan::Join(_) => Some("a join"),
        LogicalPlan::Distinct(_) => Some("DISTINCT"),
        LogicalPlan::Union(_) => Some("UNION"),
        LogicalPlan::Values(_) | LogicalPlan::EmptyRelation(_) => {
            Some("no files to read (a view is over a folder, glob, prefix or table of files)")
        }
        _ => Some("a step that is not row by row"),
    }
}

/// Whether an expression of `node` is a subquery.
fn has_subquery(node: &LogicalPlan) -> bool {
    let mut subquery = false;
    let _ = node.apply_expressions(|e| {
        e.apply(|e| {
            subquery |= matches!(
                e,
                Expr::ScalarSubquery(_) | Expr::InSubquery(_) | Expr::Exists(_)
            );
            Ok(TreeNodeRecursion::Continue)
        })
    });
    subquery
}

impl Source {
    /// What a view keeps of these files when the query names them by the path `literal`
    /// (Parquet only): `None` for any other source.
    pub fn as_table(&self, literals: &[String]) -> Result<Option<super::SourceTable>> {
        let SourceFiles::Listing { paths, options } = &self.files else {
            return Ok(None);
        };
        let named_by_path = matches!(&self.table,
            datafusion::common::TableReference::Bare { table } if literals.iter().any(|l| **l == **table));
        if !named_by_path || options.format.get_ext() != "parquet" {
            return Ok(None);
        }
        Ok(Some(super::SourceTable {
            name: self.table.table().to_string(),
            paths: paths
                .iter()
                .map(|p| {
                    let glob = p.get_glob().as_ref().map(|g| g.as_str().to_string());
                    (p.get_url().to_string(), glob)
                })
                .collect(),
            extension: options.file_extension.clone(),
            schema: super::encode_schema(&self.schema)?,
        }))
    }
}

/// The table of files a view keeps ([`Source::as_table`]), read with `parquet` options.
pub fn source_table(
    kept: &super::SourceTable,
    parquet: datafusion::config::TableParquetOptions,
) -> Result<Arc<ListingTable>> {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::ListingTableConfig;
    let paths = kept
        .paths
        .iter()
        .map(|(url, glob)| {
            let parsed = url::Url::parse(url)
                .map_err(|e| Error::warehouse(url, format!("a view's source {url}: {e}")))?;
            let path = ListingTableUrl::try_new(parsed, None)?;
            Ok(match glob {
                Some(glob) => path.with_glob(glob)?,
                None => path,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let options = ListingOptions::new(Arc::new(ParquetFormat::default().with_options(parquet)))
        .with_file_extension(&kept.extension);
    let config = ListingTableConfig::new_with_multi_paths(paths)
        .with_listing_options(options)
        .with_schema(super::decode_schema(&kept.schema)?);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// `plan` with its one table scan reading `table` instead.
pub fn reading(plan: &LogicalPlan, table: Arc<dyn TableProvider>) -> Result<LogicalPlan> {
    let source = provider_as_source(table);
    let plan = plan.clone().transform_up(|node| match node {
        LogicalPlan::TableScan(mut scan) => {
            scan.source = source.clone();
            Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
        }
        node => Ok(Transformed::no(node)),
    })?;
    Ok(plan.data)
}

#[cfg(test)]
#[test]
fn a_file_is_read_only_with_the_views_columns() {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let view = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("f0", DataType::Float32, true),
        Field::new("s", DataType::Utf8View, true),
    ]);
    let file = |fields: Vec<Field>| Schema::new(fields);
    let same = file(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("f0", DataType::Float32, true),
        Field::new("s", DataType::LargeUtf8, true),
        Field::new("extra", DataType::Int8, true),
    ]);
    assert_eq!(check_file_columns(&view, &same), Ok(()));
    let text = file(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("f0", DataType::Utf8, true),
        Field::new("s", DataType::Utf8, true),
    ]);
    assert!(
        check_file_columns(&view, &text)
            .unwrap_err()
            .to_string()
            .contains("'f0' is Utf8")
    );
    let renamed = file(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("F0", DataType::Float32, true),
        Field::new("s", DataType::Utf8, true),
    ]);
    assert!(
        check_file_columns(&view, &renamed)
            .unwrap_err()
            .to_string()
            .contains("no column 'f0'")
    );
}
