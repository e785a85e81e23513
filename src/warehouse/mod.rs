//! The warehouse: the folder where batchinfer keeps what outlives a process.
//!
//! ```text
//! warehouse/
//!   models/NAME/             one folder per model, from CREATE MODEL and ALTER MODEL: its
//!                            versions and aliases, one manifest a change ([`models`]); older
//!                            warehouses keep models/NAME.json, a model of one version, until
//!                            its next change
//!   model-files/KEY/         the files of a model's version, as registered: model.onnx, its
//!                            external data and the files beside it, KEY their sha256
//!   tables/NAME/             one Delta Lake table per name, from CREATE TABLE ... AS and
//!                            INSERT INTO: _delta_log/ and each statement's data-UUID/ folder
//!                            ([`crate::delta::write`]); a folder of Parquet files written
//!                            before tables were Delta tables is read as such until replaced
//!   views/NAME/              one folder per materialized view: its manifests and data
//!                            ([`crate::view`])
//!   quantized/KEY/           a model quantized by CREATE MODEL ... OPTIONS ('quantize' ...):
//!                            model.onnx with a text model's files, KEY the sha256 of what it
//!                            was made from ([`crate::quantize`])
//! ```
//! Names are names, never paths: a table or model name is letters, digits, `_` and `-`, at most
//! [`MAX_NAME_BYTES`] bytes ([`check_name`]), checked here, where each name becomes a path or a
//! key, so no statement reaches outside `tables/NAME/` or `models/NAME/`; a model's versions
//! and aliases are parsed ([`crate::model::versions`]) and kept in its manifest, never made
//! into paths.
//!
//! The warehouse is one object store and a prefix in it: a local folder or a prefix in S3, Google
//! Cloud Storage or Azure (`--warehouse s3://bucket/wh/`, `gs://...`, `az://...`), with one
//! layout. A table appears whole or not at all, each table is a Delta table: each statement one
//! commit of its log, which every store makes atomic (a conditional PUT): a statement that fails
//! or is interrupted leaves nothing a later query would read. A model's every change is a new
//! manifest created only where none of its number exists, so concurrent statements never
//! overwrite each other's versions or aliases.
//!
//! Warehouses written before one file per model keep `models.json`; its definitions are moved to
//! `models/` the first time the warehouse is opened.

mod models;
pub mod schema;
pub mod view_files;
pub mod view_manifest;

use std::path::PathBuf;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

use crate::error::{Error, Result};
use crate::storage::{CommitStore, Manifests, StoreRegistry, Tables};

pub use crate::storage::{MAX_NAME_BYTES, check_name};
pub use models::{Definition, Definitions};

/// What identifies a Delta table's version `version`, committed as `commit` (its log file's tag
/// and time): a table made again has versions of the same numbers.
fn delta_key(version: u64, commit: &str) -> String {
    format!("delta:{version}:{commit}")
}

/// A warehouse: a folder (created on first write) or a prefix in S3, Google Cloud Storage or
/// Azure, in one object store.
#[derive(Debug, Clone)]
pub struct Warehouse {
    /// The warehouse's root, ending in `/`: `file:///...`, `s3://bucket/prefix/`, `gs://...`,
    /// `az://...`.
    root: Url,
    store: Arc<CommitStore>,
    tables: Tables,
}

impl Warehouse {
    /// The warehouse at `root`: a folder, or an `s3://bucket/prefix/` (`gs://`, `az://`) whose
    /// objects `stores` reach.
    pub fn new(root: impl Into<PathBuf>, stores: Arc<StoreRegistry>) -> Result<Self> {
        let text = root.into().to_string_lossy().into_owned();
        let unusable = |e: Error| Error::warehouse(&text, format!("warehouse '{text}': {e}"));
        // Absolute, so that the executors of a cluster write where this process reads.
        let root = crate::storage::folder_location(&text).map_err(unusable)?;
        let store = stores.commit_store(&root).map_err(unusable)?;
        if let Some(name) = store.read_only() {
            return Err(unusable(Error::warehouse(
                &text,
                format!(
                    "it is on an {name} server, which batchinfer reads from only; a warehouse is \
                 a folder, or a prefix in S3, Google Cloud Storage or Azure"
                ),
            )));
        }
        // Its tables are written to and read from paths under it, which DataFusion would take
        // for patterns.
        crate::storage::check_write_target(&text)
            .map_err(|e| Error::warehouse(&text, format!("the warehouse cannot be used: {e}")))?;
        crate::storage::object_path(&root).map_err(unusable)?;
        let tables = Tables::new(store.clone(), &root).map_err(unusable)?;
        Ok(Warehouse {
            root,
            store,
            tables,
        })
    }

    /// The object `key` under the warehouse's root.
    fn object(&self, key: &str) -> Result<Path> {
        let url = self
            .root
            .join(key)
            .map_err(|e| Error::warehouse(&self.root, format!("{}{key}: {e}", self.root)))?;
        crate::storage::object_path(&url)
    }

    /// Where `path` is, as a person reads it.
    fn display(&self, path: &Path) -> String {
        let mut url = self.root.clone();
        url.set_path(&format!("/{path}"));
        crate::storage::display_location(&url)
    }

    /// The warehouse's root: a folder's `file:` URL or an object store's.
    pub fn root(&self) -> &Url {
        &self.root
    }

    /// Where rejected rows go unless `batchinfer.rejects` says otherwise: `rejects/`.
    pub fn rejects_location(&self) -> Result<String> {
        let url = self
            .root
            .join("rejects/")
            .map_err(|e| Error::warehouse(&self.root, format!("{}rejects/: {e}", self.root)))?;
        Ok(crate::storage::display_location(&url))
    }

    /// The warehouse folder of its own (`tables/`, `views/`, `models/`, `quantized/`,
    /// `model-files/`, `llm-cache/`) that `url` is in or is, if any: a place nothing else may
    /// write into. A local path is also judged where it really is (its links resolved), as is
    /// the warehouse.
    pub fn own_folder_holding(&self, url: &Url) -> Option<&'static str> {
        if url.scheme() != self.root.scheme() || url.host_str() != self.root.host_str() {
            return None;
        }
        let own = [
            "tables",
            "views",
            "models",
            "quantized",
            models::KEPT_FOLDER,
            crate::llm::cache::FOLDER,
            crate::llm::cache::SECRET,
        ];
        if let (Ok(root), Ok(file)) = (self.root.to_file_path(), url.to_file_path())
            && let (Some(root), Some(file)) = (
                crate::storage::access::resolved(&root),
                crate::storage::access::resolved(&file),
            )
            && let Some(folder) = own
                .into_iter()
                .find(|folder| file.starts_with(root.join(folder)))
        {
            return Some(folder);
        }
        // As the store reads them (escapes decoded: `%74ables` is `tables`).
        let path = crate::storage::object_path(url).ok()?;
        own.into_iter().find(|folder| {
            self.object(folder)
                .is_ok_and(|own| path.prefix_matches(&own))
        })
    }

    /// Refuses a write to `url` in a local warehouse through a symbolic link between the
    /// warehouse's root and the file: a link planted there (`quantized/KEY -> /elsewhere`)
    /// would have the write land outside the warehouse.
    fn no_link_on_the_way(&self, url: &Url) -> Result<()> {
        let (Ok(root), Ok(file)) = (self.root.to_file_path(), url.to_file_path()) else {
            return Ok(());
        };
        let mut folder = file.parent();
        while let Some(dir) = folder {
            if dir == root || !dir.starts_with(&root) {
                break;
            }
            if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(Error::warehouse(
                    dir.display().to_string(),
                    format!(
                        "{} is a symbolic link: batchinfer writes into the warehouse's own folders \
                     only (remove the link)",
                        dir.display()
                    ),
                ));
            }
            folder = dir.parent();
        }
        Ok(())
    }

    /// Where table `name`'s files are, as a listing-table location (`.../tables/NAME/`).
    pub fn table_location(&self, name: &str) -> Result<String> {
        self.tables.location(name)
    }

    /// The store and prefix of the warehouse's folder `folder`, where a feature keeps files
    /// of its own (endpoint models' answers: `llm-cache`).
    pub fn area(&self, folder: &str) -> Result<(Arc<dyn object_store::ObjectStore>, Path, Url)> {
        check_name("folder", folder)?;
        let url = self
            .root
            .join(&format!("{folder}/"))
            .map_err(|e| Error::warehouse(&self.root, format!("{}{folder}: {e}", self.root)))?;
        Ok((self.store.inner().clone(), self.object(folder)?, url))
    }

    /// Names of the table folders (one listing; a table being created may be among them).
    pub async fn table_folders(&self) -> Result<Vec<String>> {
        self.tables.folders().await
    }

    /// What changes when table `name` is written: its newest Delta commit (the version and
    /// what identifies that commit's file), or for a folder of Parquet files what
    /// [`Tables::version`] says.
    pub async fn table_version(&self, name: &str) -> Result<Option<String>> {
        if let Some((version, commit)) = self.delta_version(name).await? {
            return Ok(Some(delta_key(version, &commit)));
        }
        self.files_version(name).await
    }

    /// What identifies table `name` as a folder of Parquet files ([`Tables::version`]); None
    /// where its folder holds none of its own (only what a write to a Delta table that never
    /// committed left: no table).
    pub async fn files_version(&self, name: &str) -> Result<Option<String>> {
        if !self.tables.is_complete(name).await? {
            return Ok(None);
        }
        self.tables.version(name).await
    }

    /// The newest commit of table `name`'s Delta log (its version, and its file's tag and time,
    /// which tell a table made again apart): None where the table is not a Delta table.
    pub async fn delta_version(&self, name: &str) -> Result<Option<(u64, String)>> {
        let log = crate::storage::object_path(&self.tables.table_url(name)?)?.join("_delta_log");
        let store = self.tables.store();
        let newest = crate::delta::newest_commit(store.as_ref(), &log).await?;
        Ok(newest.map(|(version, object)| {
            let commit = format!(
                "{}:{}",
                object.e_tag.unwrap_or_default(),
                object
                    .last_modified
                    .timestamp_nanos_opt()
                    .unwrap_or_default()
            );
            (version, commit)
        }))
    }

    /// Table `name`'s folder (a URL ending in `/`) and the store it is in.
    pub fn table_folder(&self, name: &str) -> Result<(Url, Arc<dyn ObjectStore>)> {
        Ok((self.tables.table_url(name)?, self.tables.store()))
    }

    /// The files directly in table `name`'s folder: those of a table written before tables were
    /// Delta tables ([`Tables::top_level_files`]).
    pub async fn top_level_files(&self, name: &str) -> Result<Vec<Path>> {
        self.tables.top_level_files(name).await
    }

    /// Deletes `files` of table `name` (those of a table written before tables were Delta tables,
    /// once a Delta commit replaced it) and its claim.
    pub async fn remove_files(&self, name: &str, files: &[Path]) -> Result<()> {
        if files.is_empty() {
            return Ok(());
        }
        let store = self.tables.store();
        for file in files {
            match store.delete(file).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let claim = crate::storage::object_path(&self.tables.table_url(name)?)?
            .join(crate::storage::TABLE_CLAIM);
        let _ = store.delete(&claim).await;
        Ok(())
    }

    /// Removes a table's files.
    pub async fn remove_table(&self, name: &str) -> Result<()> {
        self.tables.remove(name).await
    }

    /// Removes what interrupted writes left.
    pub fn remove_abandoned(&self) {
        self.tables.remove_abandoned();
    }

    /// The folder of the quantized model `key` (a hex digest), ending in `/`.
    pub fn quantized_folder(&self, key: &str) -> Result<Url> {
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(Error::model(
                key,
                format!("'{key}' is not a quantized model's key"),
            ));
        }
        self.root.join(&format!("quantized/{key}/")).map_err(|e| {
            Error::warehouse(&self.root, format!("{}quantized/{key}/: {e}", self.root))
        })
    }

    /// Writes one file under the warehouse whole (by rename locally, by one PUT in S3).
    pub async fn put_file(&self, url: &Url, bytes: Vec<u8>) -> Result<()> {
        let path = self.file(url)?;
        self.no_link_on_the_way(url)?;
        self.store.inner().put(&path, bytes.into()).await?;
        Ok(())
    }

    async fn delete(&self, path: &Path) -> Result<()> {
        match self.store.inner().delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes one file under the warehouse, if it is there.
    pub async fn delete_file(&self, url: &Url) -> Result<()> {
        self.delete(&self.file(url)?).await
    }

    /// The object of `url`, which must be under the warehouse's root.
    fn file(&self, url: &Url) -> Result<Path> {
        if !url.as_str().starts_with(self.root.as_str()) {
            return Err(Error::warehouse(
                &self.root,
                format!(
                    "{} is not in the warehouse {}",
                    crate::storage::display_location(url),
                    crate::storage::display_location(&self.root)
                ),
            ));
        }
        crate::storage::object_path(url)
    }

    /// The folder of materialized view `name`, ending in `/`.
    pub fn view_folder(&self, name: &str) -> Result<Url> {
        check_name("view", name)?;
        self.root
            .join(&format!("views/{name}/"))
            .map_err(|e| Error::warehouse(&self.root, format!("{}views/{name}/: {e}", self.root)))
    }

    /// The manifests of materialized view `name`.
    pub fn view_manifests(&self, name: &str) -> Result<Manifests> {
        let folder = crate::storage::object_path(&self.view_folder(name)?)?;
        Ok(Manifests::new(self.store.clone(), folder))
    }

    /// Names of the materialized views' folders (one listing of `views/`).
    pub async fn view_names(&self) -> Result<Vec<String>> {
        let folder = self.object("views/")?;
        crate::storage::named_folders(self.store.inner().as_ref(), &folder, "view").await
    }

    /// After a DROP of view `name`, whose tombstone is now version `version`: the versions
    /// before it, and the generation folders the dropped view's manifest names (all of `data/`
    /// where it could not be read).
    pub async fn remove_view_data(
        &self,
        name: &str,
        version: u64,
        dropped: Option<&view_manifest::Manifest>,
    ) -> Result<()> {
        let manifests = self.view_manifests(name)?;
        manifests.remove_before(version).await?;
        match dropped {
            Some(dropped) => {
                for generation in dropped.data_folders() {
                    let folder = format!("data/{generation}");
                    manifests.remove_folder(Some(&folder)).await?;
                }
                manifests.remove_if_empty("data");
                Ok(())
            }
            None => manifests.remove_folder(Some("data")).await,
        }
    }
}

/// A warehouse table's name: without schema, normalized as DataFusion does (lower case unless
/// quoted), and a plain name ([`check_name`]).
pub fn table_name(name: &datafusion::sql::sqlparser::ast::ObjectName) -> Result<String> {
    object_name("table", name)
}

/// A warehouse object's name (`kind`: table, view), as [`table_name`].
pub fn object_name(
    kind: &str,
    name: &datafusion::sql::sqlparser::ast::ObjectName,
) -> Result<String> {
    use datafusion::sql::sqlparser::ast::ObjectNamePart;
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(ident)] => {
            // As DataFusion normalizes identifiers: ASCII lower case unless quoted.
            let name = match ident.quote_style {
                Some(_) => ident.value.clone(),
                None => ident.value.to_ascii_lowercase(),
            };
            check_name(kind, &name)?;
            Ok(name)
        }
        _ => Err(Error::table(
            name,
            format!("a warehouse {kind} is named without a schema, not '{name}'"),
        )),
    }
}
