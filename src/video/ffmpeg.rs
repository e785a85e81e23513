//! ffmpeg, as `imageio-ffmpeg==0.8.1` ships it on PyPI (a static build of ffmpeg 9.0.2 with
//! its decoders of H.264, H.265, VP9 and AV1): fetched once into the cache as ONNX Runtime is,
//! the wheel and the program each pinned by sha256, and checked once per process.

use std::path::PathBuf;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::runtime::{Wheel, cached_library};

const WHEELS: &[Wheel] = &[Wheel {
    package: "ffmpeg 9.0.2 (imageio-ffmpeg 0.8.1)",
    folder: "imageio_ffmpeg/binaries",
    hint: HINT,
    os: "linux",
    arch: "x86_64",
    url: "de/0f/49292fbef69ee10ebcf97bb741602521caafcc6966d5fa1a2b868cc15655/imageio_ffmpeg-0.8.1-py3-none-manylinux_2_28_x86_64.whl",
    sha256: "050d6850601c3b3890bd2b28306f3b842b3daea390a561101174375a1c460bda",
    library: "ffmpeg-linux-x86_64-v9.0.2",
    members: &[(
        "ffmpeg-linux-x86_64-v9.0.2",
        "0d709a0bed1a43f24cd2c420878c63afea4580671b6949ad19ed124572f3bc3d",
    )],
}];

const HINT: &str = "read_frames fetches ffmpeg from PyPI once; where this machine cannot reach \
                    files.pythonhosted.org, copy the cache folder ffmpeg-9.0.2 (under \
                    BATCHINFER_CACHE_DIR, else ~/.cache/batchinfer) from a machine that did";

const FOLDER: &str = "ffmpeg-9.0.2";

/// Per process: the program is checked once. A failed fetch keeps nothing, so that the next
/// statement tries again.
static CHECKED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The pinned ffmpeg, fetched the first time and checked, ready to run.
pub(super) fn binary() -> Result<PathBuf> {
    let mut checked = CHECKED.lock();
    if let Some(path) = checked.as_ref() {
        return Ok(path.clone());
    }
    let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
    let wheel = WHEELS
        .iter()
        .find(|w| w.os == os && w.arch == arch)
        .ok_or_else(|| {
            Error::Library(format!(
                "ffmpeg: batchinfer has no pinned ffmpeg for {os}/{arch}, so read_frames cannot \
                 decode video here"
            ))
        })?;
    let path = cached_library(wheel, &[], FOLDER)?;
    executable(&path)?;
    *checked = Some(path.clone());
    Ok(path)
}

/// Makes the unpacked program executable (the cache writes files as data).
fn executable(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if meta.permissions().mode() & 0o111 != 0o111 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io(format!("making {} executable", path.display()), e))?;
    }
    Ok(())
}
