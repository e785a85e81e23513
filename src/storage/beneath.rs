//! Deletes that stay in the folder they are for. A folder batchinfer owns (a table's, the LLM
//! cache's) may hold a symbolic link put there by someone else (`llm-cache/zz -> /elsewhere`):
//! a listing that follows it, or a delete whose path goes through it, would remove files the
//! folder never held. Here each folder on the way is opened without following links
//! (`openat` with `O_NOFOLLOW`, one at a time, so that nothing swapped in meanwhile is
//! followed either), and the file is unlinked in the last of them: a link there is removed
//! itself, never what it points to.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Why a file was not deleted.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error(
        "{} is a symbolic link (or not a folder) on the way to {}: batchinfer deletes nothing \
         through a link",
        link.display(),
        file.display()
    )]
    Link { link: PathBuf, file: PathBuf },
    #[error("{} is not a path under {}", file.display(), root.display())]
    Outside { file: PathBuf, root: PathBuf },
    #[error("deleting {}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
}

impl BeneathError {
    /// Whether the file was not there (nothing to delete).
    pub fn is_not_found(&self) -> bool {
        matches!(self, BeneathError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Deletes the file `file` under the folder `root` (a path under it, or relative to it) without
/// following any link below `root` ([`BeneathError::Link`] where one is on the way). `root`
/// itself is opened as given.
pub fn remove_file_beneath(root: &Path, file: &Path) -> Result<(), BeneathError> {
    let relative = file.strip_prefix(root).unwrap_or(file);
    let outside = || BeneathError::Outside {
        file: file.to_path_buf(),
        root: root.to_path_buf(),
    };
    let parts: Vec<&std::ffi::OsStr> = relative
        .components()
        .map(|c| match c {
            Component::Normal(part) => Ok(part),
            _ => Err(outside()),
        })
        .collect::<Result<_, _>>()?;
    let Some((last, folders)) = parts.split_last() else {
        return Err(outside());
    };
    let io = |source| BeneathError::Io {
        file: root.join(relative),
        source,
    };
    let mut dir = open_dir(libc::AT_FDCWD, root.as_os_str(), false).map_err(io)?;
    let mut walked = root.to_path_buf();
    for folder in folders {
        walked.push(folder);
        dir = match open_dir(dir.as_raw_fd(), folder, true) {
            Ok(next) => next,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                return Err(BeneathError::Link {
                    link: walked,
                    file: root.join(relative),
                });
            }
            Err(e) => return Err(io(e)),
        };
    }
    let name = CString::new(last.as_bytes()).map_err(|_| outside())?;
    // SAFETY: `dir` is an open folder and `name` a NUL-terminated name in it.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The first symbolic link among the folders from below `root` down to `file`'s own (None where
/// there is none, or `file` is not under `root`): a listing of `root` that followed it.
pub fn link_on_the_way(root: &Path, file: &Path) -> Option<PathBuf> {
    let relative = file.strip_prefix(root).ok()?;
    let mut walked = root.to_path_buf();
    let mut parts = relative.components().peekable();
    while let Some(part) = parts.next() {
        parts.peek()?;
        walked.push(part);
        if std::fs::symlink_metadata(&walked).is_ok_and(|m| !m.is_dir()) {
            return Some(walked);
        }
    }
    None
}

/// The folder `name` in the open folder `at` (or a path from the working folder with
/// `AT_FDCWD`), opened to read; with `no_follow`, a link there is an error (ELOOP).
fn open_dir(at: libc::c_int, name: &std::ffi::OsStr, no_follow: bool) -> std::io::Result<OwnedFd> {
    let name = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    if no_follow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: `name` is NUL-terminated; the descriptor returned is owned here.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_never_goes_through_a_link_below_its_folder() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("kept.txt"), "x").unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        std::fs::write(root.path().join("a/gone.txt"), "x").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("zz")).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path().join("kept.txt"),
            root.path().join("a/link.txt"),
        )
        .unwrap();

        remove_file_beneath(root.path(), &root.path().join("a/gone.txt")).unwrap();
        assert!(!root.path().join("a/gone.txt").exists());
        let e = remove_file_beneath(root.path(), Path::new("zz/kept.txt")).unwrap_err();
        assert!(matches!(e, BeneathError::Link { .. }), "{e}");
        // A link as the file itself: the link goes, what it points to stays.
        remove_file_beneath(root.path(), Path::new("a/link.txt")).unwrap();
        assert!(elsewhere.path().join("kept.txt").exists());
        assert!(remove_file_beneath(root.path(), Path::new("../x")).is_err());
        assert!(
            remove_file_beneath(root.path(), Path::new("a/none"))
                .unwrap_err()
                .is_not_found()
        );
        assert_eq!(
            link_on_the_way(root.path(), &root.path().join("zz/kept.txt")),
            Some(root.path().join("zz"))
        );
        assert_eq!(link_on_the_way(root.path(), &root.path().join("a/x")), None);
    }
}
