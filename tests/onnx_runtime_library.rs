//! The ONNX Runtime library batchinfer loads is the one it checked: fetched from PyPI against its
//! pinned sha256, verified in the cache before every load, never half-written, and quiet (no
//! telemetry sent home).

mod common;
mod fixtures;
mod s3_server;
use common::{piped, sha256_of};

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{assert_failure, assert_ok, bin, snapshot, wait_with_deadline};
/// Where this machine's batchinfer cache is, by the same rules as batchinfer's (so that a test
/// with another HOME does not fetch ONNX Runtime again).
fn real_cache() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("BATCHINFER_CACHE_DIR") {
        return dir.into();
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
        return Path::new(&dir).join("batchinfer");
    }
    Path::new(&std::env::var_os("HOME").unwrap()).join(".cache/batchinfer")
}

/// Scores a few rows with a real model, so that ONNX Runtime is loaded and runs.
const SCORE: &str =
    "SELECT predict('linear', features) AS p FROM 'data/sample/vectors.parquet' LIMIT 3";

#[test]
fn onnx_runtime_sends_nothing_home() {
    let home = tempfile::tempdir().unwrap();
    let out = bin()
        .env("HOME", home.path())
        .env_remove("XDG_CACHE_HOME")
        .env_remove("ORT_DISABLE_TELEMETRY")
        .env("BATCHINFER_CACHE_DIR", real_cache())
        .arg("--warehouse")
        .arg(home.path().join("wh"))
        .args(["--models", "data/models", "query", "-e", SCORE])
        .output()
        .unwrap();
    assert_ok(&out);
    let written: Vec<_> = snapshot(home.path())
        .into_keys()
        .filter(|p| !p.starts_with("wh"))
        .collect();
    assert!(
        written.is_empty(),
        "ONNX Runtime wrote into the home folder: {written:?}"
    );
}

fn library_in(cache: &Path) -> std::path::PathBuf {
    cache.join("onnxruntime-1.31.1/libonnxruntime.so.1.31.1")
}

/// batchinfer with ONNX Runtime from the cache folder `cache`, and its warehouse there too.
fn with_cache(cache: &Path) -> Command {
    let mut command = bin();
    command
        .env("BATCHINFER_CACHE_DIR", cache)
        .env_remove("ORT_DYLIB_PATH")
        .arg("--warehouse")
        .arg(cache.join("wh"));
    command
}

#[test]
fn what_is_loaded_is_what_was_checked() {
    let real = library_in(&real_cache());
    assert!(
        real.is_file(),
        "the tests run after ONNX Runtime is fetched"
    );
    let pinned = sha256_of(&real);
    // A truncated copy and a planted library (another shared object) in the cache: each is
    // found out before it is loaded, and fetched again from PyPI.
    for planted in ["truncated", "another library"] {
        let cache = tempfile::tempdir().unwrap();
        let library = library_in(cache.path());
        std::fs::create_dir_all(library.parent().unwrap()).unwrap();
        match planted {
            "truncated" => {
                let bytes = std::fs::read(&real).unwrap();
                std::fs::write(&library, &bytes[..bytes.len() / 3]).unwrap();
            }
            _ => {
                let libc = [
                    "/lib/x86_64-linux-gnu/libc.so.6",
                    "/lib/aarch64-linux-gnu/libc.so.6",
                ]
                .into_iter()
                .find(|p| Path::new(p).exists())
                .unwrap();
                std::fs::copy(libc, &library).unwrap();
            }
        }
        let out = with_cache(cache.path())
            .args(["--models", "data/models", "query", "-e", SCORE])
            .output()
            .unwrap();
        assert_ok(&out);
        assert!(
            common::stderr(&out).contains("not the pinned"),
            "{planted}: {}",
            common::stderr(&out)
        );
        assert_eq!(sha256_of(&library), pinned, "{planted}");
    }
    // The cache is an absolute folder or nothing: never one under the working directory.
    let cwd = tempfile::tempdir().unwrap();
    let attempts: [(&str, Option<&str>, Option<&str>); 3] = [
        (
            "relative BATCHINFER_CACHE_DIR",
            Some("rel-cache"),
            Some("/nonexistent-home"),
        ),
        ("no HOME", None, None),
        ("relative HOME", None, Some("home")),
    ];
    for (what, cache_dir, home) in attempts {
        let mut command = common::binary();
        command
            .current_dir(cwd.path())
            .env_remove("BATCHINFER_CACHE_DIR")
            .env_remove("XDG_CACHE_HOME")
            .env_remove("HOME")
            .env_remove("ORT_DYLIB_PATH");
        if let Some(dir) = cache_dir {
            command.env("BATCHINFER_CACHE_DIR", dir);
        }
        if let Some(home) = home {
            command.env("HOME", home);
        }
        let models = std::fs::canonicalize("data/models").unwrap();
        let data = std::fs::canonicalize("data/sample/vectors.parquet").unwrap();
        command.arg("--models").arg(models).args([
            "--warehouse",
            "wh",
            "query",
            "-e",
            &format!(
                "SELECT predict('linear', features) FROM '{}' LIMIT 1",
                data.display()
            ),
        ]);
        let out = command.output().unwrap();
        assert_failure(&out, &["absolute"]);
        let made: Vec<_> = snapshot(cwd.path())
            .into_keys()
            .filter(|p| !p.starts_with("wh"))
            .collect();
        assert!(made.is_empty(), "{what}: {made:?}");
    }
}

#[test]
fn a_model_that_cannot_be_read_fetches_and_replaces_nothing() {
    // A cached library that is not the pinned one, checked while the model's files are read:
    // the model cannot be read, so the statement fails on it, and the library is neither
    // fetched nor replaced (it is fetched when a session needs it, as the test above shows).
    let cache = tempfile::tempdir().unwrap();
    let library = library_in(cache.path());
    std::fs::create_dir_all(library.parent().unwrap()).unwrap();
    std::fs::write(&library, b"not the pinned library").unwrap();
    // A FIFO where the model file should be: found, then refused when it is read.
    let unreadable = cache.path().join("model.onnx");
    let made = Command::new("mkfifo").arg(&unreadable).status().unwrap();
    assert!(made.success());
    let out = with_cache(cache.path())
        .args([
            "query",
            "-e",
            &format!("CREATE MODEL m FROM '{}'", unreadable.display()),
        ])
        .output()
        .unwrap();
    assert_failure(&out, &["not a regular file"]);
    let said = common::stderr(&out);
    assert!(!said.contains("fetching"), "{said}");
    assert!(!said.contains("not the pinned"), "{said}");
    assert_eq!(std::fs::read(&library).unwrap(), b"not the pinned library");
}

#[test]
fn a_check_made_ahead_serves_one_load_only() {
    // The library is checked while a model's files are read. Statement 1's model is read (so the
    // library is checked) and then refused before any session; the library is then changed
    // through a shared mapping whose page was written already, which keeps the file's times,
    // size and inode. Statement 2 loads the library: it is hashed again and found out.
    let dir = tempfile::tempdir().unwrap();
    let library = library_in(dir.path());
    std::fs::create_dir_all(library.parent().unwrap()).unwrap();
    std::fs::copy(library_in(&real_cache()), &library).unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(models.join("refused")).unwrap();
    std::fs::copy("data/models/linear.onnx", models.join("linear.onnx")).unwrap();
    std::fs::copy("data/models/linear.onnx", models.join("refused/model.onnx")).unwrap();
    std::fs::write(models.join("refused/tokenizer.json"), "{}").unwrap();
    std::fs::write(models.join("refused/modules.json"), "{not json").unwrap();

    // A writable shared mapping of the library's last page, written once (same byte) before
    // the check: later writes to the page do not change the file's times.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&library)
        .unwrap();
    let len = file.metadata().unwrap().len() as usize;
    let page = 4096;
    let start = (len - 1) / page * page;
    // SAFETY: a fresh shared mapping of one page inside the file, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            start as libc::off_t,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    let last = unsafe { (map as *mut u8).add(len - 1 - start) };
    // SAFETY: `last` is within the mapped page.
    unsafe { last.write_volatile(last.read_volatile()) };

    let mut command = with_cache(dir.path());
    command.arg("--models").arg(&models).arg("shell");
    let (mut shell, mut stdin, printed, lines) = piped(&mut command);
    use std::io::Write;
    writeln!(
        stdin,
        "SELECT predict('refused', features) FROM 'data/sample/vectors.parquet' LIMIT 1;"
    )
    .unwrap();
    let mut before = Vec::new();
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("statement 1 answered");
        let done = line.contains("modules.json");
        before.push(line);
        if done {
            break;
        }
    }
    // SAFETY: as above; the byte changes, the page stays dirty, the file's times stay.
    unsafe { last.write_volatile(last.read_volatile() ^ 0xff) };
    assert_ne!(sha256_of(&library), sha256_of(library_in(&real_cache())));
    writeln!(
        stdin,
        "SELECT predict('linear', features) AS p FROM 'data/sample/vectors.parquet' LIMIT 1;"
    )
    .unwrap();
    drop(stdin);
    let status = wait_with_deadline(&mut shell, Duration::from_secs(300), "the shell");
    // SAFETY: the mapping made above, no longer used.
    unsafe { libc::munmap(map, page) };
    // Every line: the streams close with the process.
    let after: Vec<String> = lines.iter().collect();
    let rows: Vec<String> = printed.iter().collect();
    // Statement 1 failed (the shell says so at the end); statement 2 scored its row.
    assert_eq!(status.code(), Some(1), "{before:?} {after:?}");
    assert!(
        !after.iter().any(|l| l.starts_with("Error: model")),
        "{after:?}"
    );
    assert!(
        rows.len() == 2 && rows[0] == "p" && rows[1].parse::<f32>().is_ok(),
        "{rows:?}"
    );
    assert!(
        after.iter().any(|l| l.contains("not the pinned")),
        "the changed library was loaded without being hashed again: {before:?} {after:?}"
    );
    assert_eq!(sha256_of(&library), sha256_of(library_in(&real_cache())));
}

#[test]
fn a_fetch_that_cannot_be_kept_leaves_no_partial_file() {
    // A folder where the library goes: the fetched library cannot be renamed there, and the
    // copy written beside it is removed.
    let cache = tempfile::tempdir().unwrap();
    let library = library_in(cache.path());
    std::fs::create_dir_all(&library).unwrap();
    let out = with_cache(cache.path())
        .args(["--models", "data/models", "query", "-e", SCORE])
        .output()
        .unwrap();
    let said = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("Error: model 'linear' could not be loaded") && said.contains("directory"),
        "{said}"
    );
    let left: Vec<_> = std::fs::read_dir(library.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name.to_string_lossy().starts_with(".partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_truncated_library_is_one_clear_error() {
    // ORT_DYLIB_PATH is the user's library, not hashed: a truncated one is refused before the
    // loader maps it (which would end the process with SIGBUS).
    let real = std::fs::read(library_in(&real_cache())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for keep in [5_000, 1 << 20, real.len() - 1] {
        let cut = dir.path().join(format!("libonnxruntime-{keep}.so"));
        std::fs::write(&cut, &real[..keep]).unwrap();
        let out = bin()
            .env("ORT_DYLIB_PATH", &cut)
            .args(["--models", "data/models", "query", "-e", SCORE])
            .output()
            .unwrap();
        assert_failure(&out, &["truncated", "ORT_DYLIB_PATH"]);
    }
}

#[test]
fn what_is_loaded_is_what_was_checked_for_the_text_model_too() {
    // A copy of the fetched model folder with an edited tokenizer is fetched again.
    let cache = tempfile::tempdir().unwrap();
    let folder = cache.path().join("models/all-MiniLM-L6-v2");
    let real = fixtures::models_with_minilm().join("minilm");
    std::fs::create_dir_all(folder.join("1_Pooling")).unwrap();
    for file in fixtures::MINILM_FILES {
        std::fs::copy(real.join(file), folder.join(file)).unwrap();
    }
    let run = || {
        Command::new("bash")
            .arg("scripts/fetch_minilm.sh")
            .env("BATCHINFER_CACHE_DIR", cache.path())
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success());
    assert!(
        !common::stderr(&out).contains("fetching"),
        "a good copy is used as it is"
    );
    let edited = std::fs::read_to_string(folder.join("tokenizer.json")).unwrap();
    std::fs::write(
        folder.join("tokenizer.json"),
        edited.replace("[CLS]", "[CLX]"),
    )
    .unwrap();
    let out = run();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("does not match its pinned sha256s"));
    assert_eq!(
        sha256_of(folder.join("tokenizer.json")),
        sha256_of(real.join("tokenizer.json"))
    );
    let leftovers: Vec<_> = snapshot(&cache.path().join("models"))
        .into_keys()
        .filter(|p| p.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
