//! What a session may read and write: its `batchinfer.read_only`,
//! `batchinfer.allowed_directories` and `batchinfer.allowed_urls` (set by `SET`, only ever
//! narrowed, or by `batchinfer serve --read-only --allow-dir --allow-url --no-local-files` for
//! every client). A local path is judged by where it really is: its symbolic links resolved, and
//! for a file that does not exist yet, its deepest folder that does. The warehouse's own files are
//! the catalog's: its statements read and write them wherever the warehouse is.

use std::fmt;
use std::path::{Path, PathBuf};

use url::Url;

use crate::config::{BatchInferOptions, url_within};

/// What is done to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// One session's confinement, as its options say now.
#[derive(Debug, Clone, Default)]
pub struct Access {
    read_only: bool,
    /// Canonical folders (None: any).
    folders: Option<Vec<PathBuf>>,
    /// URL prefixes of object stores (None: any).
    urls: Option<Vec<String>>,
    /// The warehouse's root: a canonical folder, or a URL.
    warehouse: Option<Place>,
}

#[derive(Debug, Clone)]
enum Place {
    Local(PathBuf),
    Remote(String),
}

/// Why a path was refused (the whole message, naming the path and the setting).
#[derive(Debug)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl Access {
    /// The confinement `options` describe, with `warehouse` as the catalog's own place.
    pub fn new(options: &BatchInferOptions, warehouse: Option<&Url>) -> Self {
        let warehouse = warehouse.and_then(|root| match root.scheme() {
            "file" => root
                .to_file_path()
                .ok()
                .and_then(|p| resolved(&p))
                .map(Place::Local),
            _ => Some(Place::Remote(root.to_string())),
        });
        Access {
            read_only: options.read_only,
            folders: options
                .allowed_directories
                .as_ref()
                .map(|f| f.iter().map(PathBuf::from).collect()),
            urls: options.allowed_urls.clone(),
            warehouse,
        }
    }

    /// Whether anything is refused at all (nothing is checked otherwise).
    pub fn confined(&self) -> bool {
        self.read_only || self.folders.is_some() || self.urls.is_some()
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Refuses a statement that writes in a read-only session; `what` names it.
    pub fn check_writes(&self, what: &str) -> Result<(), Refused> {
        if self.read_only {
            return Err(Refused(format!(
                "{what} is refused: this session is read-only (batchinfer.read_only, or the \
                 server's --read-only)"
            )));
        }
        Ok(())
    }

    /// Refuses `op` on `url` (a local file's or an object's) where the session may not, the
    /// warehouse's own files allowed when `catalog` (its statements read and write them).
    pub fn check(&self, url: &Url, op: Op, catalog: bool) -> Result<(), Refused> {
        if !self.confined() {
            return Ok(());
        }
        if url.scheme() == "file" {
            let path = url
                .to_file_path()
                .map_err(|()| Refused(format!("'{url}' is not a local path")))?;
            return self.check_local(&path, op, catalog);
        }
        let shown = crate::storage::display_location(url);
        let text = url.to_string();
        let in_warehouse = catalog
            && matches!(&self.warehouse, Some(Place::Remote(root)) if url_within(&text, root));
        if op == Op::Write && self.read_only && !in_warehouse {
            return Err(Refused(format!(
                "writing '{shown}' is refused: this session is read-only"
            )));
        }
        match &self.urls {
            Some(prefixes) if !in_warehouse && !prefixes.iter().any(|p| url_within(&text, p)) => {
                Err(Refused(format!(
                    "'{shown}' is outside the locations this session may {} ({}: {})",
                    verb(op),
                    "batchinfer.allowed_urls, or the server's --allow-url",
                    listed(prefixes.iter().map(String::as_str))
                )))
            }
            _ => Ok(()),
        }
    }

    /// [`Access::check`] for a local path.
    pub fn check_local(&self, path: &Path, op: Op, catalog: bool) -> Result<(), Refused> {
        if !self.confined() {
            return Ok(());
        }
        let shown = path.display();
        let Some(real) = resolved(path) else {
            return Err(Refused(format!(
                "'{shown}' is refused: it goes through '..' or a symbolic link that leads nowhere \
                 (a confined session names paths as they are)"
            )));
        };
        let in_warehouse = catalog
            && matches!(&self.warehouse, Some(Place::Local(root)) if real.starts_with(root));
        if op == Op::Write && self.read_only && !in_warehouse {
            return Err(Refused(format!(
                "writing '{shown}' is refused: this session is read-only"
            )));
        }
        match &self.folders {
            Some(folders) if !in_warehouse && !folders.iter().any(|f| real.starts_with(f)) => {
                let also = if real != path {
                    format!(" (it is {})", real.display())
                } else {
                    String::new()
                };
                Err(Refused(format!(
                    "'{shown}'{also} is outside the folders this session may {} ({}: {})",
                    verb(op),
                    "batchinfer.allowed_directories, or the server's --allow-dir",
                    if folders.is_empty() {
                        "none: no local file".to_string()
                    } else {
                        listed(folders.iter().map(|f| f.to_str().unwrap_or("?")))
                    }
                )))
            }
            _ => Ok(()),
        }
    }
}

fn verb(op: Op) -> &'static str {
    match op {
        Op::Read => "read",
        Op::Write => "write",
    }
}

fn listed<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.collect::<Vec<_>>().join(", ")
}

/// Where `path` really is: its deepest part that exists made canonical (links resolved), the
/// names below it that do not exist yet appended. None for a path through `..` below what
/// exists, or whose first missing part is a link that leads nowhere (a write there would follow
/// it).
pub fn resolved(path: &Path) -> Option<PathBuf> {
    let mut missing = Vec::new();
    let mut at = path;
    loop {
        match std::fs::canonicalize(at) {
            Ok(mut real) => {
                for name in missing.iter().rev() {
                    real.push(name);
                }
                return Some(real);
            }
            Err(_) => {
                if std::fs::symlink_metadata(at).is_ok() {
                    return None;
                }
                let name = at.file_name()?;
                if name == ".." || name == "." {
                    return None;
                }
                missing.push(name.to_owned());
                at = at.parent()?;
                if at.as_os_str().is_empty() {
                    at = Path::new(".");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn confined_to(folder: &Path) -> Access {
        let options = BatchInferOptions {
            allowed_directories: Some(vec![
                std::fs::canonicalize(folder).unwrap().display().to_string(),
            ]),
            ..Default::default()
        };
        Access::new(&options, None)
    }

    #[test]
    fn paths_are_judged_where_they_really_are() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("nowhere"), allowed.join("dangling")).unwrap();
        let access = confined_to(&allowed);
        let ok = |p: &Path, op| access.check_local(p, op, false).is_ok();
        assert!(ok(&allowed.join("new/deeper/x.parquet"), Op::Write));
        assert!(ok(&allowed, Op::Read));
        assert!(!ok(&outside.join("secret"), Op::Read));
        assert!(!ok(&allowed.join("link/secret"), Op::Read));
        assert!(!ok(&allowed.join("link/new.parquet"), Op::Write));
        assert!(!ok(&allowed.join("dangling"), Op::Write));
        assert!(!ok(&allowed.join("missing/../../outside/secret"), Op::Read));
        assert!(!ok(&allowed.join("../outside/secret"), Op::Read));
        let url = Url::from_file_path(outside.join("secret")).unwrap();
        assert!(access.check(&url, Op::Read, false).is_err());
        // Object stores are not confined by folders.
        let s3 = Url::parse("s3://bucket/x.parquet").unwrap();
        assert!(access.check(&s3, Op::Write, false).is_ok());
    }

    #[test]
    fn the_warehouse_is_the_catalogs_and_read_only_writes_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let wh = dir.path().join("wh");
        std::fs::create_dir_all(&wh).unwrap();
        let options = BatchInferOptions {
            read_only: true,
            allowed_directories: Some(vec![]),
            allowed_urls: Some(vec!["s3://b/in/".into()]),
            ..Default::default()
        };
        let root = Url::from_directory_path(&wh).unwrap();
        let access = Access::new(&options, Some(&root));
        let file = wh.join("tables/t/part.parquet");
        assert!(access.check_local(&file, Op::Read, true).is_ok());
        assert!(access.check_local(&file, Op::Write, true).is_ok());
        assert!(access.check_local(&file, Op::Read, false).is_err());
        assert!(
            access
                .check_local(&dir.path().join("x"), Op::Read, true)
                .is_err()
        );
        let read = |u: &str, op| access.check(&Url::parse(u).unwrap(), op, false).is_ok();
        assert!(read("s3://b/in/x.parquet", Op::Read));
        assert!(!read("s3://b/in/x.parquet", Op::Write));
        assert!(!read("s3://b/inside/x.parquet", Op::Read));
        assert!(!read("gs://b/in/x.parquet", Op::Read));
    }
}
