//! The values of the options that confine a session (`batchinfer.allowed_directories`,
//! `batchinfer.allowed_urls`): read, made canonical, and only ever narrowed by a `SET`, so that a
//! server's client (or code handed a connection) cannot undo what confined it.

use datafusion::error::DataFusionError;

/// The folders of `value` (comma-separated), each made canonical: absolute, with every
/// symbolic link resolved. Each must exist and be a folder.
pub(super) fn folders(value: &str) -> datafusion::error::Result<Vec<String>> {
    let mut folders = Vec::new();
    for given in value.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let given = given.strip_prefix("file://").unwrap_or(given);
        let folder = std::fs::canonicalize(given).map_err(|e| {
            DataFusionError::Configuration(format!(
                "batchinfer.allowed_directories: the folder '{given}' cannot be used ({e})"
            ))
        })?;
        if !folder.is_dir() {
            return Err(DataFusionError::Configuration(format!(
                "batchinfer.allowed_directories: '{given}' is not a folder"
            )));
        }
        let folder = folder.to_str().ok_or_else(|| {
            DataFusionError::Configuration(format!(
                "batchinfer.allowed_directories: '{given}' is not UTF-8"
            ))
        })?;
        folders.push(folder.to_string());
    }
    Ok(folders)
}

/// The URL prefixes of `value` (comma-separated), each a URL of an object store (`s3://bucket/`,
/// `https://host/path/`): local paths are `batchinfer.allowed_directories`' to allow.
pub(super) fn url_prefixes(value: &str) -> datafusion::error::Result<Vec<String>> {
    let mut prefixes = Vec::new();
    for given in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let url = url::Url::parse(given).map_err(|e| {
            DataFusionError::Configuration(format!(
                "batchinfer.allowed_urls: '{given}' is not a URL ({e}); local folders are \
                 batchinfer.allowed_directories'"
            ))
        })?;
        if url.scheme() == "file" || url.cannot_be_a_base() {
            return Err(DataFusionError::Configuration(format!(
                "batchinfer.allowed_urls: '{given}' is not an object store's URL; local folders \
                 are batchinfer.allowed_directories'"
            )));
        }
        if url.query().is_some() || url.fragment().is_some() || url.path().contains("..") {
            return Err(DataFusionError::Configuration(format!(
                "batchinfer.allowed_urls: '{given}' must be a plain prefix (no '..', '?' or '#')"
            )));
        }
        prefixes.push(url.to_string());
    }
    Ok(prefixes)
}

/// Whether `url` is `prefix` or under it: `s3://b/data` holds `s3://b/data/x` but not
/// `s3://b/database`.
pub fn url_within(url: &str, prefix: &str) -> bool {
    match url.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Refuses a `SET` of `key` that would widen what the session may reach: every new entry must
/// be within one of the old (where the session had some).
pub(super) fn narrower(
    key: &str,
    old: Option<&[String]>,
    new: &[String],
    within: impl Fn(&str, &str) -> bool,
) -> datafusion::error::Result<()> {
    let Some(old) = old else {
        return Ok(());
    };
    for entry in new {
        if !old.iter().any(|o| within(entry, o)) {
            return Err(DataFusionError::Configuration(format!(
                "batchinfer.{key} can only be narrowed in a session: '{entry}' is not within {}",
                if old.is_empty() {
                    "nothing (none is allowed)".to_string()
                } else {
                    old.join(", ")
                }
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_hold_their_own_paths_only() {
        assert!(url_within("s3://b/data/x.parquet", "s3://b/data"));
        assert!(url_within("s3://b/data/x.parquet", "s3://b/data/"));
        assert!(!url_within("s3://b/database/x", "s3://b/data"));
        assert!(!url_within("s3://c/data/x", "s3://b/data"));
    }

    #[test]
    fn a_set_can_narrow_but_never_widen() {
        let old = vec!["/srv/data".to_string()];
        let inside = |a: &str, b: &str| std::path::Path::new(a).starts_with(b);
        assert!(narrower("k", Some(&old), &["/srv/data/x".into()], inside).is_ok());
        assert!(narrower("k", Some(&old), &["/srv".into()], inside).is_err());
        assert!(narrower("k", Some(&[]), &["/srv".into()], inside).is_err());
        assert!(narrower("k", Some(&old), &[], inside).is_ok());
        assert!(narrower("k", None, &["/".into()], inside).is_ok());
    }
}
