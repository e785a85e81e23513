//! The Python package's tests: the pytest suite beside this file (`test_*.py`), run against the
//! extension module this `cargo test` built, in the virtual environment
//! `scripts/python_env.sh` makes (pytest, pyarrow, pandas, polars, numpy and onnxruntime from
//! PyPI). The package is laid out as its wheel lays it out: `batchinfer/` with the extension as
//! `_native.abi3.so` beside the Python files.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("python/ is in the repository")
        .to_path_buf()
}

/// The folder cargo put this build's artifacts in (`target/debug`): this test's executable is
/// in its `deps/`.
fn artifacts() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

#[test]
fn pytest_suite() {
    let root = root();
    let env = Command::new(root.join("scripts/python_env.sh"))
        .output()
        .expect("scripts/python_env.sh runs");
    assert!(
        env.status.success(),
        "scripts/python_env.sh failed:\n{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let python = String::from_utf8(env.stdout).unwrap().trim().to_string();

    // The extension cargo built with this test (the package's cdylib, beside the test in deps/).
    let extension = artifacts().join("deps").join("lib_native.so");
    assert!(
        extension.exists(),
        "{} is missing: cargo builds it for this test",
        extension.display()
    );
    // The command line the tests compare messages with: `cargo test --workspace` builds it.
    let cli = artifacts().join("batchinfer");
    assert!(
        cli.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        cli.display()
    );

    let site = tempfile::tempdir().unwrap();
    let package = site.path().join("batchinfer");
    std::fs::create_dir(&package).unwrap();
    for entry in std::fs::read_dir(root.join("python/batchinfer")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, package.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::copy(&extension, package.join("_native.abi3.so")).unwrap();

    let status = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
        .current_dir(&root)
        .env("PYTHONPATH", site.path())
        .env("BATCHINFER_CLI", &cli)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .status()
        .expect("pytest runs");
    assert!(
        status.success(),
        "the pytest suite failed (its output is above)"
    );
}
