//! Finding, fetching and loading the ONNX Runtime shared library.
//!
//! batchinfer links ONNX Runtime dynamically (`ort`'s `load-dynamic`). The library comes from, in
//! order: `ORT_DYLIB_PATH`; the cache (`$BATCHINFER_CACHE_DIR`, else `$XDG_CACHE_HOME/batchinfer`,
//! else `~/.cache/batchinfer`); or, on first use, the official `onnxruntime==1.31.1` wheel from PyPI,
//! checked against its pinned sha256, whose `libonnxruntime` is unpacked into the cache.
//!
//! What is loaded is what was checked: each library unpacked into the cache has a pinned sha256
//! too, verified before every load, and a cached copy that does not match (truncated, replaced)
//! is fetched again. The cache is an absolute folder or nothing: never one relative to the
//! working directory. ONNX Runtime's own telemetry is switched off before the library is loaded
//! (`ORT_DISABLE_TELEMETRY=1`): it would otherwise keep a device id under `~/.cache/Microsoft`
//! and send events to Microsoft.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ort::environment::Environment;
use parking_lot::Mutex;

use crate::error::{Error, Result};

mod fetch;
mod wheels;

pub(crate) use fetch::cached_library;
use fetch::*;
pub use fetch::{cache_dir, cuda_library_path, library_path};
pub(crate) use wheels::Wheel;
use wheels::*;

/// The ONNX Runtime release batchinfer is built against (`ort` 2.0.0-rc.15).
pub const ORT_VERSION: &str = "1.31.1";

/// The ONNX Runtime build a process loaded: the CPU one, or the CUDA one (which runs on the CPU
/// too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Build {
    Cpu,
    Cuda,
}
const CUDA_PROVIDERS: &[&str] = &[
    "libonnxruntime_providers_shared.so",
    "libonnxruntime_providers_cuda.so",
];

/// The process's one environment, once loaded. A failed CUDA load stores nothing, so that a later
/// call for the CPU can still succeed.
/// Per process: ONNX Runtime has one environment per process.
static LOADED: Mutex<Option<(&'static Environment, Build)>> = Mutex::new(None);

/// Why the CPU build could not be loaded, kept so that later models fail at once with the same
/// message instead of fetching again.
/// Per process: the library every session would load is the same.
static CPU_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// The CPU build, or the reason it is not there (remembered).
pub(crate) fn load_cpu() -> Result<&'static Environment> {
    let mut failure = CPU_FAILURE.lock();
    if let Some(message) = failure.as_ref() {
        return Err(Error::Runtime(message.clone()));
    }
    library_path().and_then(|path| load(&path)).map_err(|e| {
        let message = match &e {
            Error::Runtime(m) => m.clone(),
            other => other.to_string(),
        };
        *failure = Some(message.clone());
        Error::Runtime(message)
    })
}

/// The build this process loaded, if any (held while a build is chosen and loaded).
pub(crate) fn loaded() -> parking_lot::MutexGuard<'static, Option<(&'static Environment, Build)>> {
    LOADED.lock()
}

/// The CUDA build (the CUDA libraries it links against already loaded: see
/// [`crate::device`]).
pub(crate) fn load_cuda() -> crate::error::Result<&'static Environment> {
    let path = cuda_library_path()?;
    load(&path)
}

/// Loads the library at `path` as the process's environment.
fn load(path: &Path) -> Result<&'static Environment> {
    let fail = |e: String| Error::Runtime(e);
    check_elf(path).map_err(|why| {
        fail(format!(
            "{} could not be loaded: {why}. {}",
            path.display(),
            how_to_provide()
        ))
    })?;
    disable_telemetry();
    let builder = ort::init_from(path).map_err(|e| {
        fail(format!(
            "{} could not be loaded: {e}. {}",
            path.display(),
            how_to_provide()
        ))
    })?;
    // ONNX Runtime logs failures to stderr itself; batchinfer reports them in its own errors, so
    // its log is shown only on request (BATCHINFER_ORT_LOG=1).
    let verbose = std::env::var_os("BATCHINFER_ORT_LOG").is_some();
    let logger: ort::logging::LoggerFunction =
        Arc::new(move |level, category, _, location, message| {
            if verbose {
                eprintln!("onnxruntime {level:?} [{category}] {location}: {message}");
            }
        });
    let env = builder
        .with_logger(logger)
        .with_name("batchinfer")
        .with_telemetry(false)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    // One per process, for the life of the process.
    Ok(Box::leak(Box::new(env)))
}

fn how_to_provide() -> String {
    format!(
        "Set ORT_DYLIB_PATH to an ONNX Runtime {ORT_VERSION} library, for example the one that \
         `pip install onnxruntime=={ORT_VERSION}` puts in site-packages/onnxruntime/capi/"
    )
}

/// Refuses a file the loader would map past its end, such as a truncated library (given by
/// `ORT_DYLIB_PATH`, which is not hashed): `dlopen` would kill the process with SIGBUS rather
/// than fail. Every segment, and the section headers, that its ELF header names must lie within
/// the file.
fn check_elf(path: &Path) -> crate::error::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |e: std::io::Error| Error::Library(format!("it cannot be read: {e}"));
    // Non-blocking, so that a FIFO does not wait for a writer.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(Error::Library("it is not a regular file".to_string()));
    }
    let len = meta.len();
    let mut header = [0u8; 64];
    file.read_exact(&mut header)
        .map_err(|_| Error::Library("it is too short to be a shared library".to_string()))?;
    // ELF, 64-bit, little-endian: the only builds batchinfer fetches (x86_64, aarch64).
    if &header[..6] != b"\x7fELF\x02\x01" {
        return Err(Error::Library(
            "it is not a 64-bit little-endian ELF shared library".to_string(),
        ));
    }
    let half = |at: usize| u64::from(u16::from_le_bytes([header[at], header[at + 1]]));
    let (program_headers, section_headers) = (le_u64(&header, 0x20), le_u64(&header, 0x28));
    let (entry, entries) = (half(0x36), half(0x38));
    let truncated = |needed: u64| {
        Error::Library(format!(
            "it is truncated: its ELF headers describe {needed} bytes, the file has {len}"
        ))
    };
    let table_end = program_headers.saturating_add(entry * entries);
    if table_end > len {
        return Err(truncated(table_end));
    }
    // Each program header: p_offset at 8, p_filesz at 32 (64-bit ELF).
    if entry < 40 {
        return Err(Error::Library(
            "its ELF program headers are malformed".to_string(),
        ));
    }
    let mut table = vec![0u8; (entry * entries) as usize];
    file.seek(SeekFrom::Start(program_headers))
        .and_then(|_| file.read_exact(&mut table))
        .map_err(unreadable)?;
    let mut needed = section_headers.saturating_add(half(0x3a) * half(0x3c));
    for header in table.chunks_exact(entry as usize) {
        needed = needed.max(le_u64(header, 8).saturating_add(le_u64(header, 32)));
    }
    if needed > len {
        return Err(truncated(needed));
    }
    Ok(())
}

/// The little-endian `u64` at `at` in `bytes`.
fn le_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// The CPU library found in the cache and checked against its pinned sha256 ahead of loading it
/// (by [`check_cpu_library`]), with the file's identity then: loading it hashes it again only if
/// the file changed since.
/// Per process: the library every session would load is the same.
static CPU_CHECKED: Mutex<Option<(PathBuf, FileIdentity)>> = Mutex::new(None);

/// What changes whenever a file is written, truncated or replaced.
#[derive(Debug, PartialEq, Eq)]
struct FileIdentity {
    device: u64,
    inode: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl FileIdentity {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileIdentity {
            device: meta.dev(),
            inode: meta.ino(),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// Checks the CPU library in the cache against its pinned sha256 ahead of loading it, so that
/// the check runs while other work is done (a model's files are read). Fetches, prints and
/// records nothing else: a library that is missing or not the pinned one is fetched when it is
/// loaded, as without this check.
pub(crate) fn check_cpu_library() {
    if std::env::var_os("ORT_DYLIB_PATH").is_some() {
        return;
    }
    let (Some(wheel), Ok(dir)) = (wheel_for_this_machine(WHEELS), cache_dir()) else {
        return;
    };
    let dir = dir.join(cpu_folder());
    let library = dir.join(wheel.library);
    let checked = CPU_CHECKED.lock();
    if checked
        .as_ref()
        .is_some_and(|check| still_checked(check, &library))
    {
        return;
    }
    drop(checked);
    let before = FileIdentity::of(&library);
    if let Some(Ok(path)) = in_cache(wheel, &[], &dir)
        && let Some(identity) =
            before.filter(|before| FileIdentity::of(&path).as_ref() == Some(before))
    {
        *CPU_CHECKED.lock() = Some((path, identity));
    }
}

/// Whether the check made ahead, `(at, identity)`, is of `path` as it is now.
fn still_checked((at, identity): &(PathBuf, FileIdentity), path: &Path) -> bool {
    at == path && FileIdentity::of(path).as_ref() == Some(identity)
}

/// Whether `path` was checked ahead and has not changed since; the check is used up either way.
fn take_check(path: &Path) -> bool {
    let taken = CPU_CHECKED.lock().take();
    taken.is_some_and(|check| still_checked(&check, path))
}

/// Forgets a check made ahead: the library is hashed again before it is loaded. A check serves
/// one session's load, right after it was made, and no later one: a file's identity does not
/// change with every write (a page written again through a shared mapping keeps its times).
pub(crate) fn forget_cpu_check() {
    *CPU_CHECKED.lock() = None;
}

/// The cache folder of the CPU build.
fn cpu_folder() -> String {
    format!("onnxruntime-{ORT_VERSION}")
}

/// The cache folder of the CUDA build.
fn cuda_folder() -> String {
    format!("onnxruntime-gpu-{ORT_VERSION}")
}

#[cfg(test)]
mod tests {
    use super::FileIdentity;

    #[test]
    fn a_file_written_truncated_or_replaced_is_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"the library").unwrap();
        let first = FileIdentity::of(&path).unwrap();
        assert_eq!(FileIdentity::of(&path).as_ref(), Some(&first));
        // Appended to.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"!"))
            .unwrap();
        let appended = FileIdentity::of(&path).unwrap();
        assert_ne!(appended, first);
        // Truncated.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(3))
            .unwrap();
        let truncated = FileIdentity::of(&path).unwrap();
        assert_ne!(truncated, appended);
        // Replaced by a file of the same length, renamed over it.
        let other = dir.path().join("other.so");
        std::fs::write(&other, b"abc").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert_ne!(FileIdentity::of(&path).unwrap(), truncated);
        assert_eq!(FileIdentity::of(&dir.path().join("gone.so")), None);
    }
}
