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

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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
    /// The sha256 of each member batchinfer unpacks from it (the library, the CUDA providers).
    members: &'static [(&'static str, &'static str)],
}

const PYPI: &str = "https://files.pythonhosted.org/packages";

const WHEELS: &[Wheel] = &[
    Wheel {
        os: "linux",
        arch: "x86_64",
        url: "eb/27/c6a823bac55b2977bea2027c3ec9393a2c1002cb9a09eb40354563e02730/onnxruntime-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl",
        sha256: "1f3dea47f2f0e5117c2404cea7d21fd253ae7836a3bf167a501cdfbb2600d536",
        library: "libonnxruntime.so.1.31.1",
        members: &[(
            "libonnxruntime.so.1.31.1",
            "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3",
        )],
    },
    Wheel {
        os: "linux",
        arch: "aarch64",
        url: "ba/e4/1ed1a7a5f4702d899091fa2b976d377995250c307326ec8dc9ae6378aa13/onnxruntime-1.31.1-cp312-cp312-manylinux_2_28_aarch64.whl",
        sha256: "0b9a492176886992e0e875f06bc0367e333f5fff11711a2d642e18b02f3009cc",
        library: "libonnxruntime.so.1.31.1",
        members: &[(
            "libonnxruntime.so.1.31.1",
            "8aa3b76b28c778a2b1dd660d34161adb1d508c9ccd04ff9dc80e26eca5df8467",
        )],
    },
    Wheel {
        os: "macos",
        arch: "aarch64",
        url: "0e/f7/cecc0efeeea83bff2f7789ae1b80f27fa0f0210d6d9d66d1f0031a6b5e47/onnxruntime-1.31.1-cp312-cp312-macosx_14_0_arm64.whl",
        sha256: "96dd2564b10ea7153ad9c207e7cd8e5917cb3ba521e0e0a62ac03486fdc8d56c",
        library: "libonnxruntime.1.31.1.dylib",
        members: &[(
            "libonnxruntime.1.31.1.dylib",
            "d586cbe89effc085a09d3341b3cfbd5c322517f9d397aeb20814af21433f2b36",
        )],
    },
];

/// The ONNX Runtime build a process loaded: the CPU one, or the CUDA one (which runs on the CPU
/// too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Build {
    Cpu,
    Cuda,
}

/// The CUDA 13 build, `onnxruntime-gpu==1.31.1`, and the provider libraries taken from it beside
/// `libonnxruntime`: ONNX Runtime looks for its providers in its own folder.
const CUDA_WHEELS: &[Wheel] = &[Wheel {
    os: "linux",
    arch: "x86_64",
    url: "22/97/9531b4d9e566cf2a0f04b4b5c26a3bc0ef2e2e0b6bc943a02c0eead98cf7/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl",
    sha256: "05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7",
    library: "libonnxruntime.so.1.31.1",
    members: &[
        (
            "libonnxruntime.so.1.31.1",
            "5104254339ecadae808da771bd0b63b240f0dbd466514234905e54372435c303",
        ),
        (
            "libonnxruntime_providers_shared.so",
            "086ec1d5388f64153d9c63470d126693db9a182c8ce236d3a1119068471b8a0d",
        ),
        (
            "libonnxruntime_providers_cuda.so",
            "8387867e857499e045caff5d13ac6a5de29571c801562fa2dde0e45f1f31de52",
        ),
    ],
}];
const CUDA_PROVIDERS: &[&str] = &[
    "libonnxruntime_providers_shared.so",
    "libonnxruntime_providers_cuda.so",
];

/// The process's one environment, once loaded. A failed CUDA load stores nothing, so that a later
/// call for the CPU can still succeed.
static LOADED: Mutex<Option<(&'static Environment, Build)>> = Mutex::new(None);

/// Why the CPU build could not be loaded, kept so that later models fail at once with the same
/// message instead of fetching again.
static CPU_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// The CPU build, or the reason it is not there (remembered).
pub(crate) fn load_cpu() -> Result<&'static Environment> {
    let mut failure = CPU_FAILURE.lock().unwrap_or_else(|p| p.into_inner());
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
pub(crate) fn loaded() -> std::sync::MutexGuard<'static, Option<(&'static Environment, Build)>> {
    LOADED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The CUDA build (the CUDA libraries it links against already loaded: see
/// [`crate::device`]).
pub(crate) fn load_cuda() -> std::result::Result<&'static Environment, String> {
    let path = cuda_library_path().map_err(|e| e.to_string())?;
    load(&path).map_err(|e| e.to_string())
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
fn check_elf(path: &Path) -> std::result::Result<(), String> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let unreadable = |e: std::io::Error| format!("it cannot be read: {e}");
    // Non-blocking, so that a FIFO does not wait for a writer.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err("it is not a regular file".to_string());
    }
    let len = meta.len();
    let mut header = [0u8; 64];
    file.read_exact(&mut header)
        .map_err(|_| "it is too short to be a shared library".to_string())?;
    // ELF, 64-bit, little-endian: the only builds batchinfer fetches (x86_64, aarch64).
    if &header[..6] != b"\x7fELF\x02\x01" {
        return Err("it is not a 64-bit little-endian ELF shared library".to_string());
    }
    let half = |at: usize| u64::from(u16::from_le_bytes([header[at], header[at + 1]]));
    let (program_headers, section_headers) = (le_u64(&header, 0x20), le_u64(&header, 0x28));
    let (entry, entries) = (half(0x36), half(0x38));
    let truncated = |needed: u64| {
        format!("it is truncated: its ELF headers describe {needed} bytes, the file has {len}")
    };
    let table_end = program_headers.saturating_add(entry * entries);
    if table_end > len {
        return Err(truncated(table_end));
    }
    // Each program header: p_offset at 8, p_filesz at 32 (64-bit ELF).
    if entry < 40 {
        return Err("its ELF program headers are malformed".to_string());
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
    let checked = CPU_CHECKED.lock().unwrap_or_else(|p| p.into_inner());
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
        *CPU_CHECKED.lock().unwrap_or_else(|p| p.into_inner()) = Some((path, identity));
    }
}

/// Whether the check made ahead, `(at, identity)`, is of `path` as it is now.
fn still_checked((at, identity): &(PathBuf, FileIdentity), path: &Path) -> bool {
    at == path && FileIdentity::of(path).as_ref() == Some(identity)
}

/// Whether `path` was checked ahead and has not changed since; the check is used up either way.
fn take_check(path: &Path) -> bool {
    let taken = CPU_CHECKED.lock().unwrap_or_else(|p| p.into_inner()).take();
    taken.is_some_and(|check| still_checked(&check, path))
}

/// Forgets a check made ahead: the library is hashed again before it is loaded. A check serves
/// one session's load, right after it was made, and no later one: a file's identity does not
/// change with every write (a page written again through a shared mapping keeps its times).
pub(crate) fn forget_cpu_check() {
    *CPU_CHECKED.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// The cache folder of the CPU build.
fn cpu_folder() -> String {
    format!("onnxruntime-{ORT_VERSION}")
}

/// The cache folder of the CUDA build.
fn cuda_folder() -> String {
    format!("onnxruntime-gpu-{ORT_VERSION}")
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
fn cached_library(wheel: &Wheel, extra: &[&str], folder: &str) -> Result<PathBuf> {
    let dir = cache_dir()?.join(folder);
    match in_cache(wheel, extra, &dir) {
        Some(Ok(path)) => return Ok(path),
        Some(Err(why)) => eprintln!("batchinfer: {why}; fetching it again"),
        None => {}
    }
    fetch_library(wheel, extra, &dir)?;
    verify_members(wheel, extra, &dir).map_err(Error::Runtime)?;
    Ok(dir.join(wheel.library))
}

/// `wheel`'s library in the cache folder `dir` when it is there, checked (with the `extra`
/// members beside it) against the pinned sha256s.
fn in_cache(
    wheel: &Wheel,
    extra: &[&str],
    dir: &Path,
) -> Option<std::result::Result<PathBuf, String>> {
    let path = dir.join(wheel.library);
    path.is_file()
        .then(|| verify_members(wheel, extra, dir).map(|()| path))
}

/// Checks that the library and `extra` members in `dir` hash to the wheel's pinned sha256s.
fn verify_members(wheel: &Wheel, extra: &[&str], dir: &Path) -> std::result::Result<(), String> {
    for name in extra.iter().chain([&wheel.library]) {
        let path = dir.join(name);
        let pinned = wheel
            .members
            .iter()
            .find(|(member, _)| member == name)
            .map(|(_, sha)| *sha)
            .ok_or_else(|| format!("no sha256 is pinned for {name}"))?;
        let file = std::fs::File::open(&path)
            .map_err(|e| format!("the cached {} cannot be read: {e}", path.display()))?;
        let mut hasher = Sha256::new();
        // Read in large parts: the library is tens of MiB, checked at every start.
        std::io::copy(
            &mut std::io::BufReader::with_capacity(1 << 20, file),
            &mut hasher,
        )
        .map_err(|e| format!("the cached {} cannot be read: {e}", path.display()))?;
        let digest = hex::encode(hasher.finalize());
        if digest != pinned {
            return Err(format!(
                "the cached {} has sha256 {digest}, not the pinned {pinned} (truncated or \
                 replaced)",
                path.display()
            ));
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
fn disable_telemetry() {
    const VAR: &str = "ORT_DISABLE_TELEMETRY";
    if std::env::var_os(VAR).is_none() {
        // SAFETY: called once per process, under the lock of the one environment, before ONNX
        // Runtime (the only reader of this variable) is loaded. Rust's own environment access is
        // synchronized; batchinfer's command line sets it too, before any thread starts.
        unsafe { std::env::set_var(VAR, "1") };
    }
}

/// The one of `wheels` built for this operating system and processor.
fn wheel_for_this_machine(wheels: &'static [Wheel]) -> Option<&'static Wheel> {
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    wheels.iter().find(|w| w.os == os && w.arch == arch)
}

/// Fetches `wheel`, checks its hash, and unpacks `extra` members and then its library into `dir`
/// (the library last: its presence says the folder is complete).
fn fetch_library(wheel: &Wheel, extra: &[&str], dir: &Path) -> Result<()> {
    let url = format!("{PYPI}/{}", wheel.url);
    eprintln!(
        "batchinfer: fetching ONNX Runtime {ORT_VERSION} ({}) from PyPI (once; cached in {})",
        url.rsplit('/').next().unwrap_or(&url),
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
    for name in extra.iter().chain([&wheel.library]) {
        let member = format!("onnxruntime/capi/{name}");
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
fn write_atomically(dir: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
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
fn download(url: &str) -> std::result::Result<Vec<u8>, String> {
    crate::storage::block_on_io(async {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(30))
            .timeout(std::time::Duration::from_secs(600))
            .build()
            .map_err(|e| e.to_string())?;
        let response = client
            .get(url)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(|e| e.to_string())?;
        let bytes = response.bytes().await.map_err(|e| e.to_string())?;
        Ok(bytes.to_vec())
    })
    .map_err(|e| e.to_string())?
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
