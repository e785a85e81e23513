//! Where models run: the CPU, or an NVIDIA GPU through ONNX Runtime's CUDA execution provider.
//!
//! `--device cpu` (the default), `cuda` (GPU 0), `cuda:N`, or `auto`: CUDA when this machine has a
//! usable GPU, else the CPU, decided at start-up and said. Asking for CUDA where it cannot run is an
//! error that says what is missing; it never runs on the CPU instead.
//!
//! What CUDA needs, checked in this order before anything is fetched:
//! 1. the NVIDIA driver (`libcuda.so.1`) and a GPU with the requested number;
//! 2. the CUDA 13 libraries ONNX Runtime's CUDA provider links against (cudart, cuBLAS, cuRAND;
//!    cuDNN 9 and cuFFT where present, though the PyPI build carries its own): found in
//!    `BATCHINFER_CUDA_LIBS` (folders, `:`-separated), `CUDA_HOME`/`CUDA_PATH`,
//!    `/usr/local/cuda`, the system's library folders, `LD_LIBRARY_PATH`, or NVIDIA's PyPI
//!    wheels (`nvidia-cuda-runtime`, `nvidia-cublas`, `nvidia-curand`, ...) in a Python
//!    environment (a virtualenv, the user's and the system's site-packages, conda);
//! 3. the CUDA build of ONNX Runtime (`onnxruntime-gpu==1.31.1`), fetched on first use like the
//!    CPU build (see [`crate::runtime`]).

use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;

pub use crate::config::{Device, Target};
use crate::error::Error;
use crate::runtime;

impl Device {
    /// Where models run when this device is asked for: `auto` is CUDA (GPU 0) where the driver
    /// reports a GPU and the CUDA libraries are found, else the CPU, decided once per process
    /// (at start-up for `--device`) and said.
    pub fn resolve(self) -> Target {
        // Per process: the machine's GPUs are the same for every session.
        static AUTO: OnceLock<Target> = OnceLock::new();
        match self {
            Device::Cpu => Target::Cpu,
            Device::Cuda(n) => Target::Cuda(n),
            Device::Auto => *AUTO.get_or_init(|| match usable_gpu(0) {
                Ok(name) => {
                    crate::say!("batchinfer: --device auto chose cuda:0 ({name})");
                    Target::Cuda(0)
                }
                Err(why) => {
                    crate::say!("batchinfer: --device auto chose the CPU: {why}");
                    Target::Cpu
                }
            }),
        }
    }
}

/// GPU `n`'s name, once the driver reports it and the CUDA libraries are loaded; or what is
/// missing.
fn usable_gpu(n: u32) -> crate::error::Result<String> {
    let name = check_gpu(n)?;
    preload_cuda_libraries()?;
    Ok(name)
}

/// A check of ONNX Runtime's library made ahead of a session by [`Target::prepare`].
#[must_use]
pub struct Prepared(());

impl Drop for Prepared {
    fn drop(&mut self) {
        runtime::forget_cpu_check();
    }
}

/// What running on a device implies, decided here and nowhere else.
impl Target {
    /// Checks ONNX Runtime's library for this device against its pinned sha256 ahead of a
    /// model's session, so that the check runs while the model's files are read. Loads, fetches
    /// and records nothing else: the library is loaded (and fetched if need be) with the session.
    /// The check serves the session built while the returned guard is held; a library loaded
    /// after it is dropped is hashed again.
    pub fn prepare(self) -> Prepared {
        let prepared = Prepared(());
        if self == Target::Cpu {
            runtime::check_cpu_library();
        }
        prepared
    }

    /// Rows per record batch read from the input when none was asked for: a GPU is kept busy by
    /// large calls, a core's caches by small ones.
    pub fn batch_rows(self) -> usize {
        match self {
            Target::Cuda(_) => 65_536,
            Target::Cpu => 8_192,
        }
    }

    /// Tokens (rows x padded length) per `embed` call when none was set.
    pub fn token_budget(self) -> usize {
        match self {
            Target::Cuda(_) => 16_384,
            Target::Cpu => 256,
        }
    }

    /// Calls a model runs at once, `wanted` being one per partition. A GPU runs one at a time:
    /// each call fills it, a second would only split it.
    pub fn sessions(self, wanted: usize) -> usize {
        match self {
            Target::Cuda(_) => 1,
            Target::Cpu => wanted,
        }
    }

    /// The execution providers a session is built with (none: ONNX Runtime's CPU provider).
    /// Nodes CUDA has no kernel for still run on the CPU, as ONNX Runtime places them; a provider
    /// that fails to start is an error, never a silent move to the CPU.
    pub fn execution_providers(self) -> Vec<ort::ep::ExecutionProviderDispatch> {
        match self {
            Target::Cuda(n) => vec![
                ort::ep::CUDA::default()
                    .with_device_id(i32::try_from(n).unwrap_or(i32::MAX))
                    .build()
                    .error_on_failure(),
            ],
            Target::Cpu => Vec::new(),
        }
    }

    /// The ONNX Runtime environment that runs models here. The first call of the process decides
    /// which build of ONNX Runtime is loaded: the CUDA build for `cuda`, else the CPU build.
    pub fn environment(self) -> crate::error::Result<&'static Environment> {
        let mut loaded = runtime::loaded();
        if let Some((env, build)) = *loaded {
            return match (self, build) {
                (Target::Cpu, _) => Ok(env),
                (Target::Cuda(n), runtime::Build::Cuda) => {
                    check_gpu(n).map_err(|e| cuda_error(self, &e))?;
                    Ok(env)
                }
                (Target::Cuda(n), runtime::Build::Cpu) => {
                    check_gpu(n).map_err(|e| cuda_error(self, &e))?;
                    Err(cuda_error(
                        self,
                        "this process already loaded ONNX Runtime's CPU build for an earlier model; \
                         choose CUDA before the first model runs (--device cuda or auto, \
                         BATCHINFER_DEVICE, or SET batchinfer.device first)",
                    ))
                }
            };
        }
        let (env, build) = match self {
            Target::Cuda(n) => {
                let name = usable_gpu(n).map_err(|e| cuda_error(self, &e))?;
                let env = runtime::load_cuda().map_err(|e| cuda_error(self, &e))?;
                crate::say!("batchinfer: running models on cuda:{n} ({name})");
                (env, runtime::Build::Cuda)
            }
            Target::Cpu => (runtime::load_cpu()?, runtime::Build::Cpu),
        };
        *loaded = Some((env, build));
        Ok(env)
    }
}

fn cuda_error(device: Target, why: impl std::fmt::Display) -> Error {
    Error::Gpu(format!("device {device} cannot be used: {why}"))
}

/// The CUDA libraries ONNX Runtime 1.31's CUDA provider (`libonnxruntime_providers_cuda.so` of
/// `onnxruntime-gpu==1.31.1`) is linked against (its `DT_NEEDED` entries, besides the driver),
/// dependencies first.
pub const CUDA_LIBRARIES: &[&str] = &[
    "libcudart.so.13",
    "libcublasLt.so.13",
    "libcublas.so.13",
    "libcurand.so.10",
];

/// Libraries the provider may open by name at run time (NVRTC for some kernels) or that other
/// builds link dynamically (cuDNN 9, cuFFT): loaded where found, not required. The PyPI build links
/// cuDNN and cuFFT into the provider itself.
pub const OPTIONAL_LIBRARIES: &[&str] = &[
    "libnvrtc.so.13",
    "libcufft.so.12",
    "libcudnn.so.9",
    "libcudnn_graph.so.9",
    "libcudnn_ops.so.9",
    "libcudnn_heuristic.so.9",
    "libcudnn_adv.so.9",
    "libcudnn_cnn.so.9",
    "libcudnn_engines_precompiled.so.9",
    "libcudnn_engines_runtime_compiled.so.9",
];

/// Asks the NVIDIA driver (`libcuda.so.1`) for the names of the GPUs, or says why there are none
/// to use.
pub fn gpus() -> crate::error::Result<Vec<String>> {
    type CuInit = unsafe extern "C" fn(c_int) -> c_int;
    type CuDeviceGetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
    type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
    type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
    // SAFETY: loading the NVIDIA driver library runs its initializers, which expect nothing of us.
    let driver = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| {
        Error::Gpu(format!(
            "no NVIDIA driver: libcuda.so.1 cannot be loaded ({e})"
        ))
    })?;
    let symbol =
        |name: &str, e: libloading::Error| Error::Gpu(format!("libcuda.so.1 has no {name}: {e}"));
    // SAFETY: the symbols are the CUDA driver API's, with these C signatures since CUDA 2.0.
    unsafe {
        let init = driver
            .get::<CuInit>("cuInit")
            .map_err(|e| symbol("cuInit", e))?;
        let count_of = driver
            .get::<CuDeviceGetCount>("cuDeviceGetCount")
            .map_err(|e| symbol("cuDeviceGetCount", e))?;
        let device_get = driver
            .get::<CuDeviceGet>("cuDeviceGet")
            .map_err(|e| symbol("cuDeviceGet", e))?;
        let name_of = driver
            .get::<CuDeviceGetName>("cuDeviceGetName")
            .map_err(|e| symbol("cuDeviceGetName", e))?;
        let status = init(0);
        if status != 0 {
            return Err(Error::Gpu(format!(
                "the NVIDIA driver is installed but cuInit failed with CUDA error {status} \
                 (100: no GPU visible; check nvidia-smi and CUDA_VISIBLE_DEVICES)"
            )));
        }
        let mut count: c_int = 0;
        if count_of(&mut count) != 0 || count <= 0 {
            return Err(Error::Gpu(
                "the NVIDIA driver sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)".into(),
            ));
        }
        let mut names = Vec::new();
        for ordinal in 0..count {
            let mut device: c_int = 0;
            let mut name = [0 as c_char; 256];
            let named = device_get(&mut device, ordinal) == 0
                && name_of(name.as_mut_ptr(), name.len() as c_int, device) == 0;
            names.push(if named {
                std::ffi::CStr::from_ptr(name.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            } else {
                format!("GPU {ordinal}")
            });
        }
        Ok(names)
    }
}

/// Checks that GPU `n` exists; its name.
pub fn check_gpu(n: u32) -> crate::error::Result<String> {
    let names = gpus()?;
    names.get(n as usize).cloned().ok_or_else(|| {
        Error::Gpu(format!(
            "there is no GPU {n}: this machine has {} ({})",
            names.len(),
            names
                .iter()
                .enumerate()
                .map(|(i, name)| format!("cuda:{i} {name}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// Folders that may hold the CUDA and cuDNN libraries, most specific first.
fn library_folders() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let split = |var: &str| -> Vec<PathBuf> {
        std::env::var_os(var)
            .map(|v| std::env::split_paths(&v).collect())
            .unwrap_or_default()
    };
    dirs.extend(split("BATCHINFER_CUDA_LIBS"));
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(PathBuf::from(&root).join("lib64"));
            dirs.push(PathBuf::from(&root).join("lib"));
        }
    }
    dirs.extend(split("LD_LIBRARY_PATH"));
    for dir in [
        "/usr/local/cuda/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ] {
        dirs.push(PathBuf::from(dir));
    }
    // NVIDIA's PyPI wheels put their libraries in site-packages/nvidia/<component>/lib.
    for site in site_packages() {
        let nvidia = site.join("nvidia");
        let Ok(components) = std::fs::read_dir(&nvidia) else {
            continue;
        };
        let mut found: Vec<PathBuf> = components
            .flatten()
            .map(|c| c.path().join("lib"))
            .filter(|lib| lib.is_dir())
            .collect();
        found.sort();
        dirs.extend(found);
    }
    dirs
}

/// Python package folders: the active virtualenv or conda environment, that of the `python3` on
/// PATH, the user's, the system's.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(root) = std::env::var_os(var) {
            roots.push(PathBuf::from(root).join("lib"));
        }
    }
    // The environment of the `python3` on PATH (an image's /opt/torch/.venv, say), activated or
    // not.
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("python3").exists()
                && let Some(env) = dir.parent()
            {
                roots.push(env.join("lib"));
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(&home).join(".local/lib"));
        if let Ok(versions) = std::fs::read_dir(PathBuf::from(&home).join(".pyenv/versions")) {
            roots.extend(versions.flatten().map(|v| v.path().join("lib")));
        }
    }
    roots.extend(
        [
            "/usr/local/lib",
            "/usr/lib",
            "/opt/conda/lib",
            "/usr/local/lib64",
        ]
        .map(PathBuf::from),
    );
    let mut sites = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("python3") {
                for leaf in ["site-packages", "dist-packages"] {
                    let site = entry.path().join(leaf);
                    if site.is_dir() {
                        sites.push(site);
                    }
                }
            }
        }
    }
    sites
}

/// Where each of `names` is, first folder first, or the list of those not found.
fn find_in(folders: &[PathBuf], names: &[&'static str]) -> Result<Vec<PathBuf>, Vec<&'static str>> {
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for name in names {
        match folders.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
            Some(path) => found.push(path),
            None => missing.push(*name),
        }
    }
    if missing.is_empty() {
        Ok(found)
    } else {
        Err(missing)
    }
}

/// Loads the CUDA libraries into the process, so that ONNX Runtime's CUDA provider finds them
/// wherever they are installed (no `LD_LIBRARY_PATH` needed).
pub fn preload_cuda_libraries() -> crate::error::Result<()> {
    let folders = library_folders();
    let found = find_in(&folders, CUDA_LIBRARIES).map_err(|missing| {
        Error::Gpu(format!(
            "the CUDA 13 libraries {} were not found (looked in BATCHINFER_CUDA_LIBS, CUDA_HOME, \
             LD_LIBRARY_PATH, /usr/local/cuda, the system's library folders and NVIDIA's PyPI \
             wheels in Python's site-packages). Install them, for example with `pip install \
             nvidia-cuda-runtime nvidia-cublas nvidia-curand` (CUDA 13), or set \
             BATCHINFER_CUDA_LIBS to their folders",
            missing.join(", ")
        ))
    })?;
    for path in &found {
        preload(path)?;
    }
    for name in OPTIONAL_LIBRARIES {
        if let Some(path) = folders.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
            preload(&path)?;
        }
    }
    Ok(())
}

fn preload(path: &Path) -> crate::error::Result<()> {
    ort::util::preload_dylib(path)
        .map_err(|e| Error::Gpu(format!("{} cannot be loaded: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        for (text, device) in [
            ("cpu", Device::Cpu),
            ("CUDA", Device::Cuda(0)),
            ("cuda:1", Device::Cuda(1)),
            (" auto ", Device::Auto),
        ] {
            assert_eq!(text.parse::<Device>().unwrap(), device);
        }
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        assert_eq!("cuda:1".parse::<Device>().unwrap().to_string(), "cuda:1");
        for bad in ["tpu", "cuda:", "cuda:-1", "cuda:x", ""] {
            let err = bad.parse::<Device>().unwrap_err().to_string();
            assert!(err.contains("expected cpu, cuda, cuda:N"), "{err}");
        }
    }

    #[test]
    fn libraries_are_looked_up_folder_by_folder() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("libcudart.so.13"), b"").unwrap();
        std::fs::write(b.path().join("libcudart.so.13"), b"").unwrap();
        std::fs::write(b.path().join("libcudnn.so.9"), b"").unwrap();
        let folders = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        let found = find_in(&folders, &["libcudart.so.13", "libcudnn.so.9"]).unwrap();
        assert_eq!(found[0], a.path().join("libcudart.so.13"));
        assert_eq!(found[1], b.path().join("libcudnn.so.9"));
        let missing = find_in(&folders, &["libcudart.so.13", "libcublas.so.13"]).unwrap_err();
        assert_eq!(missing, vec!["libcublas.so.13"]);
    }
}
