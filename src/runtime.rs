//! Finding, fetching and loading the ONNX Runtime shared library.
//!
//! batchinfer links ONNX Runtime dynamically (`ort`'s `load-dynamic`). The library comes from, in
//! order: `ORT_DYLIB_PATH`; the cache (`$BATCHINFER_CACHE_DIR`, else `$XDG_CACHE_HOME/batchinfer`,
//! else `~/.cache/batchinfer`); or, on first use, the official `onnxruntime==1.31.1` wheel from PyPI,
//! checked against its pinned sha256, whose `libonnxruntime` is unpacked into the cache.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ort::environment::Environment;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The ONNX Runtime release batchinfer is built against (`ort` 2.0.0-rc.15).
pub const ORT_VERSION: &str = "1.31.1";

/// One official wheel of `onnxruntime==1.31.1`: where it is and what it must hash to.
struct Wheel {
    os: &'static str,
    arch: &'static str,
    url: &'static str,
    sha256: &'static str,
    library: &'static str,
}

const PYPI: &str = "https://files.pythonhosted.org/packages";

const WHEELS: &[Wheel] = &[
    Wheel {
        os: "linux",
        arch: "x86_64",
        url: "eb/27/c6a823bac55b2977bea2027c3ec9393a2c1002cb9a09eb40354563e02730/onnxruntime-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl",
        sha256: "1f3dea47f2f0e5117c2404cea7d21fd253ae7836a3bf167a501cdfbb2600d536",
        library: "libonnxruntime.so.1.31.1",
    },
    Wheel {
        os: "linux",
        arch: "aarch64",
        url: "ba/e4/1ed1a7a5f4702d899091fa2b976d377995250c307326ec8dc9ae6378aa13/onnxruntime-1.31.1-cp312-cp312-manylinux_2_28_aarch64.whl",
        sha256: "0b9a492176886992e0e875f06bc0367e333f5fff11711a2d642e18b02f3009cc",
        library: "libonnxruntime.so.1.31.1",
    },
    Wheel {
        os: "macos",
        arch: "aarch64",
        url: "0e/f7/cecc0efeeea83bff2f7789ae1b80f27fa0f0210d6d9d66d1f0031a6b5e47/onnxruntime-1.31.1-cp312-cp312-macosx_14_0_arm64.whl",
        sha256: "96dd2564b10ea7153ad9c207e7cd8e5917cb3ba521e0e0a62ac03486fdc8d56c",
        library: "libonnxruntime.1.31.1.dylib",
    },
];

static ENVIRONMENT: OnceLock<std::result::Result<Environment, String>> = OnceLock::new();

/// The process's one ONNX Runtime environment, loading (and on first use fetching) the library.
pub fn environment() -> Result<&'static Environment> {
    ENVIRONMENT
        .get_or_init(|| {
            let path = library_path().map_err(|e| e.to_string())?;
            let builder = ort::init_from(&path).map_err(|e| {
                format!(
                    "{} could not be loaded: {e}. {}",
                    path.display(),
                    how_to_provide()
                )
            })?;
            // ONNX Runtime logs failures to stderr itself; batchinfer reports them in its own
            // errors, so its log is shown only on request (BATCHINFER_ORT_LOG=1).
            let verbose = std::env::var_os("BATCHINFER_ORT_LOG").is_some();
            let logger: ort::logging::LoggerFunction =
                Arc::new(move |level, category, _, location, message| {
                    if verbose {
                        eprintln!("onnxruntime {level:?} [{category}] {location}: {message}");
                    }
                });
            builder
                .with_logger(logger)
                .with_name("batchinfer")
                .with_telemetry(false)
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| Error::Runtime(e.clone()))
}

fn how_to_provide() -> String {
    format!(
        "Set ORT_DYLIB_PATH to an ONNX Runtime {ORT_VERSION} library, for example the one that \
         `pip install onnxruntime=={ORT_VERSION}` puts in site-packages/onnxruntime/capi/"
    )
}

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
    let wheel = wheel_for_this_machine()?;
    let dir = cache_dir().join(format!("onnxruntime-{ORT_VERSION}"));
    let path = dir.join(wheel.library);
    if path.is_file() {
        return Ok(path);
    }
    fetch_library(wheel, &dir, &path)?;
    Ok(path)
}

/// The folder batchinfer caches downloads in.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATCHINFER_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("batchinfer");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache").join("batchinfer"),
        None => PathBuf::from(".cache").join("batchinfer"),
    }
}

fn wheel_for_this_machine() -> Result<&'static Wheel> {
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    WHEELS
        .iter()
        .find(|w| w.os == os && w.arch == arch)
        .ok_or_else(|| {
            Error::Runtime(format!(
                "batchinfer has no pinned ONNX Runtime wheel for {os}/{arch}. {}",
                how_to_provide()
            ))
        })
}

fn fetch_library(wheel: &Wheel, dir: &Path, dest: &Path) -> Result<()> {
    let url = format!("{PYPI}/{}", wheel.url);
    eprintln!(
        "batchinfer: fetching ONNX Runtime {ORT_VERSION} from PyPI (once; cached in {})",
        dir.display()
    );
    let bytes = download(&url).map_err(|e| {
        Error::Runtime(format!(
            "downloading {url} failed: {e}. {}",
            how_to_provide()
        ))
    })?;
    let digest = hex::encode(Sha256::digest(&bytes));
    if digest != wheel.sha256 {
        return Err(Error::Runtime(format!(
            "{url} has sha256 {digest}, expected {}; refusing to use it",
            wheel.sha256
        )));
    }
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| Error::Runtime(format!("{url} is not a readable wheel: {e}")))?;
    let member = format!("onnxruntime/capi/{}", wheel.library);
    let mut library = Vec::new();
    archive
        .by_name(&member)
        .map_err(|e| Error::Runtime(format!("{url} has no {member}: {e}")))?
        .read_to_end(&mut library)
        .map_err(|e| Error::io(format!("unpacking {member}"), e))?;
    write_atomically(dir, dest, &library)
}

/// Writes `dest` through a temporary file and a rename, so that concurrent first runs (parallel
/// tests, say) never see a half-written library.
fn write_atomically(dir: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let tmp = dir.join(format!(
        ".partial-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, dest).map_err(|e| Error::io(format!("writing {}", dest.display()), e))
}

/// A blocking download that is safe to call from inside or outside a tokio runtime: it runs on a
/// thread of its own with a runtime of its own.
fn download(url: &str) -> std::result::Result<Vec<u8>, String> {
    let url = url.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let client = reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(30))
                .timeout(std::time::Duration::from_secs(600))
                .build()
                .map_err(|e| e.to_string())?;
            let response = client
                .get(&url)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .map_err(|e| e.to_string())?;
            let bytes = response.bytes().await.map_err(|e| e.to_string())?;
            Ok(bytes.to_vec())
        })
    })
    .join()
    .map_err(|_| "the download thread panicked".to_string())?
}
