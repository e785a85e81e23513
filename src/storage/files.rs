//! Whole files read from synchronous code: a model and the files beside it, read when a
//! statement's planning first needs the model, local or in S3 alike.

use std::path::PathBuf;

use url::Url;

use super::{StoreRegistry, block_on_io, no_store_for, read_body, reserve, too_large};
use crate::error::{Error, Result};

impl StoreRegistry {
    /// What changes when the file at `url` is written again ([`super::file_version`]); `None`
    /// where there is no such file.
    pub async fn file_version(&self, url: &Url) -> Result<Option<String>> {
        let store = self.store_for(url)?;
        match object_store::ObjectStoreExt::head(&store, &super::object_path(url)?).await {
            Ok(meta) => Ok(Some(super::file_version(url.scheme() == "file", &meta))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads the whole file `url` (at most `cap` bytes) into memory. A local file is read only if
    /// it is a regular file ([`read_capped`]); an object is read on a thread and runtime of its
    /// own, with a client of its own (connections pooled by a runtime do not outlive it).
    pub fn read_file(&self, url: &Url, cap: u64) -> Result<Vec<u8>> {
        if let Some(path) = file_path(url)? {
            return read_capped(&path, cap);
        }
        let (store, path) = self.own_client(url)?;
        block_on_io(async move { read_body(&store, &path, url.as_str(), cap).await })?
    }

    /// Writes the whole file `url`, from synchronous code: it appears whole (locally a hidden
    /// sibling renamed over it, in S3 one PUT), its folders made as needed.
    pub fn write_file(&self, url: &Url, bytes: Vec<u8>) -> Result<()> {
        let Some(path) = file_path(url)? else {
            let store = self.commit_store(url)?;
            if let Some(name) = store.read_only() {
                return Err(super::read_only(url, name));
            }
            let (store, path) = self.own_client(url)?;
            return block_on_io(async move {
                object_store::ObjectStoreExt::put(&store, &path, bytes.into()).await?;
                Ok(())
            })?;
        };
        let at = |what: &str, e| Error::io(format!("{what} {}", path.display()), e);
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).map_err(|e| at("creating the folder of", e))?;
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let hidden = path.with_file_name(format!(".{name}.partial"));
        std::fs::write(&hidden, bytes).map_err(|e| at("writing", e))?;
        std::fs::rename(&hidden, &path).map_err(|e| {
            let _ = std::fs::remove_file(&hidden);
            at("writing", e)
        })
    }

    /// [`StoreRegistry::read_file`], or `None` when there is no such file.
    pub fn read_file_if_exists(&self, url: &Url, cap: u64) -> Result<Option<Vec<u8>>> {
        match self.read_file(url, cap) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(Error::ObjectStore(object_store::Error::NotFound { .. })) => Ok(None),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The files in the folder `url` and in the folders in it, relative to it (`NAME`,
    /// `FOLDER/NAME`): where a folder of models keeps them. Locally, anything that is not a
    /// folder counts as a file (a FIFO too: reading it says what is wrong). `shown` names the
    /// folder in messages, as the person gave it.
    pub fn list_two_levels(&self, url: &Url, shown: &str) -> Result<Vec<String>> {
        let Some(dir) = file_path(url)? else {
            let (store, prefix) = self.own_client(url)?;
            let objects: Vec<object_store::ObjectMeta> = block_on_io(async {
                futures::TryStreamExt::try_collect(object_store::ObjectStore::list(
                    &store,
                    Some(&prefix),
                ))
                .await
            })??;
            return Ok(objects
                .iter()
                .filter_map(|o| {
                    let parts: Vec<_> = o.location.prefix_match(&prefix)?.collect();
                    let parts: Vec<&str> = parts.iter().map(|p| p.as_ref()).collect();
                    (parts.len() <= 2).then(|| parts.join("/"))
                })
                .collect());
        };
        let read_dir = |dir: &std::path::Path| {
            std::fs::read_dir(dir).map_err(|e| Error::io(format!("reading {shown}"), e))
        };
        let mut files = Vec::new();
        for entry in read_dir(&dir)? {
            let entry = entry.map_err(|e| Error::io(format!("reading {shown}"), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !entry.path().is_dir() {
                files.push(name);
                continue;
            }
            for inner in read_dir(&entry.path())?.flatten() {
                if !inner.path().is_dir() {
                    files.push(format!("{name}/{}", inner.file_name().to_string_lossy()));
                }
            }
        }
        files.sort();
        Ok(files)
    }

    /// The file `url` names, for a statement that reads it (CREATE MODEL): `url` itself, or where
    /// it names a folder, the file `in_folder` in it; `None` when there is nothing there.
    pub async fn file_or_folder(&self, url: &Url, in_folder: &str) -> Result<Option<Url>> {
        let in_folder_of = |url: &Url| {
            super::folder_url(url.clone()).join(in_folder).map_err(|e| {
                Error::location(super::blank_passwords(url.as_str()), format!("{url}: {e}"))
            })
        };
        if let Some(path) = file_path(url)? {
            let file = if path.is_dir() {
                in_folder_of(url)?
            } else {
                url.clone()
            };
            let exists = file_path(&file)?.is_some_and(|p| p.symlink_metadata().is_ok());
            return Ok(exists.then_some(file));
        }
        let store = self.commit_store(url)?.inner().clone();
        let exists = |url: Url| {
            let store = store.clone();
            async move {
                match object_store::ObjectStoreExt::head(&store, &super::object_path(&url)?).await {
                    Ok(_) => Ok(Some(url)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(Error::from(e)),
                }
            }
        };
        if !url.path().ends_with('/')
            && let Some(file) = exists(url.clone()).await?
        {
            return Ok(Some(file));
        }
        exists(in_folder_of(url)?).await
    }

    /// The rows of the rejects files in the folder `url`, per model (a file is named
    /// `MODEL-PID-N.parquet`; its rows are counted from its footer).
    pub async fn count_rejects(&self, url: &Url) -> Result<Vec<(String, u64)>> {
        use datafusion::parquet::file::metadata::ParquetMetaDataReader;
        use futures::TryStreamExt;
        use object_store::ObjectStoreExt;
        let store = self.store_for(url)?;
        let folder = super::object_path(url)?;
        let files: Vec<object_store::ObjectMeta> =
            match store.list(Some(&folder)).try_collect().await {
                Ok(files) => files,
                Err(object_store::Error::NotFound { .. }) => Vec::new(),
                Err(e) => return Err(e.into()),
            };
        let mut counts: Vec<(String, u64)> = Vec::new();
        for file in files {
            let Some(model) = file
                .location
                .filename()
                .and_then(|f| f.strip_suffix(".parquet"))
                .and_then(|f| f.rsplitn(3, '-').nth(2))
                .map(str::to_string)
            else {
                continue;
            };
            let unreadable = || {
                Error::location(
                    &file.location,
                    format!("{} is not a Parquet file", file.location),
                )
            };
            // The footer: the metadata's length and `PAR1`, after the metadata.
            let size = file.size;
            let tail = store
                .get_range(&file.location, size.saturating_sub(8)..size)
                .await?;
            let tail = <[u8; 8]>::try_from(tail.as_ref()).map_err(|_| unreadable())?;
            let length = super::footer::metadata_len(
                &file.location,
                size,
                tail,
                super::footer::DEFAULT_MAX_FOOTER_BYTES,
            )
            .map_err(|e| Error::location(&file.location, e.to_string()))?;
            let metadata = store
                .get_range(&file.location, size - 8 - length..size - 8)
                .await?;
            let rows = ParquetMetaDataReader::decode_metadata(&metadata)
                .map_err(|_| unreadable())?
                .file_metadata()
                .num_rows();
            let rows = u64::try_from(rows).unwrap_or(0);
            match counts.iter_mut().find(|(m, _)| *m == model) {
                Some((_, n)) => *n += rows,
                None => counts.push((model, rows)),
            }
        }
        counts.sort();
        Ok(counts)
    }

    /// Refuses a folder location that is something else where it exists (a file, a FIFO, a
    /// device); an object store has no such things.
    pub fn check_folder(&self, url: &Url) -> Result<()> {
        // Without its trailing '/': "file/" does not exist as such when "file" is a file.
        let path = file_path(url)?.map(|p| p.components().collect::<PathBuf>());
        match path {
            Some(path) if path.exists() && !path.is_dir() => Err(Error::location(
                path.display().to_string(),
                format!("{} is not a folder", path.display()),
            )),
            _ => Ok(()),
        }
    }

    /// Why nothing can be read at `location` (a path or a URL): `None` when there is a file or
    /// an object there, or under it.
    pub async fn why_nothing_at(&self, location: &str) -> Result<Option<String>> {
        let url = super::location_url(location)?;
        let store = self.store_for(&url)?;
        let path = super::object_path(&url)?;
        match object_store::ObjectStoreExt::head(&store, &path).await {
            Ok(_) => return Ok(None),
            // An HTTP server lists no folders: a file it does not have is just not there.
            Err(object_store::Error::NotFound { .. })
                if super::Cloud::of(&url) == Some(super::Cloud::Http) =>
            {
                return Ok(Some(format!(
                    "the HTTP server has no file at {} (it answered 404 Not Found)",
                    super::blank_passwords(location)
                )));
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        // What is under it, as far as a look tells: files of its own, or only in subfolders
        // (which a folder's table does not read).
        let mut listed = store.list(Some(&path));
        let mut nested = None;
        for _ in 0..1_000 {
            let Some(meta) = futures::StreamExt::next(&mut listed).await.transpose()? else {
                break;
            };
            let Some(mut rest) = meta.location.prefix_match(&path) else {
                continue;
            };
            match (rest.next(), rest.next()) {
                (Some(_), None) => return Ok(None),
                (Some(folder), Some(_)) if nested.is_none() => {
                    nested = Some(folder.as_ref().to_string());
                }
                _ => {}
            }
        }
        if let Some(folder) = nested {
            let base = location.trim_end_matches('/');
            return Ok(Some(format!(
                "the folder {location} has no files of its own, only subfolders ({folder}/, ...): \
                 a folder's table reads the files in it, not in its subfolders; name one \
                 (FROM '{base}/{folder}/') or each file"
            )));
        }
        Ok(Some(match file_path(&url)? {
            Some(path) if path.is_dir() => format!("the folder {location} holds no files"),
            Some(_) => format!("no file or folder at {location}"),
            None => format!("no object at {location}: nothing is stored under that key"),
        }))
    }
}

/// The local path of a `file:` URL; `None` for the URL of an object store.
fn file_path(url: &Url) -> Result<Option<PathBuf>> {
    match url.scheme() {
        "file" => url.to_file_path().map(Some).map_err(|()| {
            Error::location(
                super::blank_passwords(url.as_str()),
                format!("'{url}' is not a usable local path"),
            )
        }),
        _ if super::Cloud::of(url).is_some() => Ok(None),
        _ => Err(no_store_for(url)),
    }
}
/// Reads a whole local file of at most `cap` bytes. Only a regular file is read (a symbolic link
/// to one too): a FIFO, a device such as `/dev/zero` or a folder is refused without reading it,
/// and so is a file over the cap, so no file can make batchinfer wait forever or fill its memory.
pub fn read_capped(path: &std::path::Path, cap: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking, so that opening a FIFO does not wait for a writer; the check is made on the
    // file opened, not on the path, so the file cannot be swapped in between.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if !meta.is_file() {
        return Err(Error::location(
            path.display().to_string(),
            format!(
                "{} is not a regular file (a FIFO, a device or a folder): batchinfer reads only \
                 regular files here",
                path.display()
            ),
        ));
    }
    if meta.len() > cap {
        return Err(too_large(&path.display().to_string(), meta.len(), cap));
    }
    let mut bytes = reserve(&path.display().to_string(), meta.len())?;
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if bytes.len() as u64 > cap {
        return Err(too_large(
            &path.display().to_string(),
            bytes.len() as u64,
            cap,
        ));
    }
    Ok(bytes)
}
