//! The files of a view's rows, as a query of the view reads them: each under the view's own
//! `data/` folder and of the size recorded when it was committed, or an error naming the view.
//! A manifest is a file in the warehouse that anything with write access can change; it never
//! makes a view read another file, and a view that lost one of its files never answers with the
//! rest as if they were all.

use std::collections::BTreeMap;

use url::Url;

use super::view_manifest::{Generation, OutputFile};
use crate::error::{Error, Result};
use crate::storage::Manifests;

/// The files under a view's `data/` folder, by path relative to the view's folder, with their
/// sizes.
pub async fn present_files(manifests: &Manifests, folder: &Url) -> Result<BTreeMap<String, u64>> {
    let view_prefix = crate::storage::object_path(folder)?;
    Ok(manifests
        .files_under(&view_prefix.clone().join("data"))
        .await?
        .iter()
        .filter_map(|meta| {
            let path = meta.location.prefix_match(&view_prefix)?;
            let path = path.map(|p| p.as_ref().to_string()).collect::<Vec<_>>();
            Some((path.join("/"), meta.size))
        })
        .collect())
}

/// Whether `path`, as a manifest lists it, is a file of `generation`'s own folder
/// (`data/<generation>/<unit>/<file>`), written plainly: no `..`, `.` or empty segment, no
/// scheme, no escape (`%`), no backslash.
fn is_own_file(path: &str, generation: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let plain = |part: &&str| {
        !part.is_empty()
            && *part != "."
            && *part != ".."
            && !part
                .chars()
                .any(|c| matches!(c, '%' | '\\' | ':' | '?' | '#') || c.is_control())
    };
    parts.len() == 4 && parts[0] == "data" && parts[1] == generation && parts.iter().all(plain)
}

/// Refuses a generation listing a file that is not its own (see [`is_own_file`]).
pub fn check_paths(view: &str, generation: &Generation) -> Result<()> {
    match generation
        .files()
        .find(|f| !is_own_file(&f.path, &generation.id))
    {
        None => Ok(()),
        Some(file) => Err(Error::view(
            view,
            format!(
                "materialized view '{view}': its manifest lists the file '{}', which is not one of \
             the view's own (data/{}/UNIT/FILE); the manifest was changed by hand or is \
             damaged: DROP MATERIALIZED VIEW {view} and create it again",
                crate::storage::blank_passwords(&file.path),
                generation.id
            ),
        )),
    }
}

/// Refuses a generation whose files are not all there, each of the size it was written, as
/// `present` ([`present_files`]) lists them: the view would answer with part of its rows.
pub fn check_present(
    view: &str,
    generation: &Generation,
    present: &BTreeMap<String, u64>,
) -> Result<()> {
    let lost: Vec<(&OutputFile, Option<&u64>)> = generation
        .files()
        .map(|f| (f, present.get(&f.path)))
        .filter(|(f, size)| *size != Some(&f.size))
        .collect();
    let Some((file, size)) = lost.first() else {
        return Ok(());
    };
    let what = match size {
        None => "is missing".to_string(),
        Some(size) => format!("is {size} bytes, not the {} it was written with", file.size),
    };
    Err(Error::view(
        view,
        format!(
            "materialized view '{view}': {} of its files {what} ({}{}), so it cannot answer with \
         all of its rows; REFRESH MATERIALIZED VIEW {view} scores the input files of the \
         damaged units again",
            if lost.len() == 1 {
                "one".to_string()
            } else {
                lost.len().to_string()
            },
            file.path,
            if lost.len() > 1 { ", and others" } else { "" },
        ),
    ))
}

/// The rows of `generation`: the files it lists under the view's folder, with its schema; a
/// manifest listing any other file is refused ([`check_paths`]).
pub fn table(
    name: &str,
    folder: &url::Url,
    generation: &Generation,
) -> Result<std::sync::Arc<dyn datafusion::catalog::TableProvider>> {
    use datafusion::datasource::empty::EmptyTable;
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::{
        ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
    };
    use std::sync::Arc;
    check_paths(name, generation)?;
    let schema = generation.schema()?;
    let paths = generation
        .files()
        .map(|f| {
            let url = folder
                .join(&f.path)
                .map_err(|e| Error::view(name, format!("{}: {e}", f.path)))?;
            Ok(ListingTableUrl::try_new(url, None)?)
        })
        .collect::<Result<Vec<_>>>()?;
    if paths.is_empty() {
        return Ok(Arc::new(EmptyTable::new(schema)));
    }
    let options =
        ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(paths)
        .with_listing_options(options)
        .with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

#[cfg(test)]
#[test]
fn a_manifest_names_only_files_of_its_own_generation() {
    for path in ["data/g1/u1/part-0.parquet", "data/g1/u-2/a_b=c.parquet"] {
        assert!(is_own_file(path, "g1"), "{path}");
    }
    for path in [
        "/private/x.parquet",
        "data/../../../../private/x.parquet",
        "data/g1/../../x.parquet",
        "data/g1/u1/../x.parquet",
        "data/g1/u1/%2e%2e",
        "data/g2/u1/x.parquet",
        "file:///etc/x.parquet",
        "http://host/x.parquet",
        "s3://other/x.parquet",
        "data/g1/u1/x\\..\\y",
        "data/g1//x.parquet",
        "data/g1/u1/./x.parquet",
        "data/g1/u1/sub/x.parquet",
        "data/g1/u1/x.parquet?y",
        "",
    ] {
        assert!(!is_own_file(path, "g1"), "{path}");
    }
}
