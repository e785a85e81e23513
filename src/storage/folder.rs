//! What a table in a local warehouse folder needs beside [`super::table`]: the removal of the
//! hidden files a write killed mid-way left.

use std::sync::atomic::AtomicU64;

/// Numbers the staging folders of this process (a table's, and a local folder's).
/// Per process: a counter for unique names.
pub(super) static STAGING: AtomicU64 = AtomicU64::new(0);

/// Removes the hidden files of writes whose process is gone (an INSERT killed mid-way: SIGKILL
/// or a power cut): `.NAME.batchinfer-PID-N.partial`, and its `#N` upload, in `folder` and the
/// folders below it, `depth` levels at most (partitions), once untouched for
/// [`ABANDONED_AFTER`]. A file of a running process stays.
pub(super) fn remove_abandoned_partials(folder: &std::path::Path, depth: usize) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if depth > 0 {
                remove_abandoned_partials(&path, depth - 1);
            }
            continue;
        }
        let name = entry.file_name();
        let Some(pid) = writer_of(&name.to_string_lossy()) else {
            continue;
        };
        // SAFETY: signal 0 sends nothing; it asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        // A writer on another machine sharing the folder has a PID of its own: its file is
        // left for an hour after its last write.
        let idle = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|idle| idle >= ABANDONED_AFTER);
        if !alive && idle {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// How long a hidden file of a write whose process is gone here stays untouched before it is
/// taken for abandoned.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// The process that writes a hidden file named as [`super::commit`] names them.
fn writer_of(name: &str) -> Option<libc::pid_t> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let name = name.strip_prefix('.')?;
    let (_, rest) = name.rsplit_once(".batchinfer-")?;
    let (pid, rest) = rest.split_once('-')?;
    let (n, suffix) = rest.split_once(".partial")?;
    let upload = match suffix.strip_prefix('#') {
        Some(upload) => digits(upload),
        None => suffix.is_empty(),
    };
    (digits(pid) && digits(n) && upload).then_some(())?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::writer_of;

    #[test]
    fn hidden_files_name_their_writer() {
        assert_eq!(
            writer_of(".a_0.parquet.batchinfer-4242-7.partial"),
            Some(4242)
        );
        assert_eq!(
            writer_of(".a_0.parquet.batchinfer-4242-7.partial#1"),
            Some(4242)
        );
        assert_eq!(writer_of("a_0.parquet"), None);
        assert_eq!(writer_of(".a.batchinfer-x-1.partial"), None);
        assert_eq!(writer_of(".a.batchinfer-12-1.partialx"), None);
        assert_eq!(writer_of(".a.batchinfer-12-1.partial#foo"), None);
        assert_eq!(writer_of(".a.batchinfer-12-1.partial#"), None);
        assert_eq!(writer_of(".a.batchinfer-12-1.partial#1#2"), None);
        assert_eq!(writer_of(".a.batchinfer-12-zz.partial"), None);
        assert_eq!(writer_of(".a.batchinfer-+12-1.partial"), None);
    }
}
