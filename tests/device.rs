//! `--device`, on a machine without an NVIDIA GPU (as CI is): CUDA is refused with what is
//! missing, never run on the CPU instead; `auto` falls back to the CPU and says so; the choice
//! comes from the flag, the environment or `SET batchinfer.device`, and bad values are refused.
//! On a machine with a GPU these tests skip themselves (`scripts/gpu-check.sh` covers it).

mod common;

use std::process::Output;

const SCORES: &str = "SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS p \
                      FROM 'data/sample/features.parquet' ORDER BY id LIMIT 5";

fn batchinfer(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = common::binary();
    command
        .args(["--models", "data/models", "--format", "csv"])
        .args(args)
        .env_remove("BATCHINFER_DEVICE")
        .env(
            "BATCHINFER_WAREHOUSE",
            std::env::temp_dir().join(format!("batchinfer-device-test-{}", std::process::id())),
        );
    for (key, value) in env {
        command.env(key, value);
    }
    common::output_within(&mut command, common::DEADLINE)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// True (and says so) where this machine has a usable NVIDIA GPU.
fn has_gpu() -> bool {
    let gpu = batchinfer::device::gpus().is_ok();
    if gpu {
        eprintln!("skipped: this machine has an NVIDIA GPU");
    }
    gpu
}

fn assert_refused(out: &Output, device: &str) {
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{device} ran:\n{}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).is_empty(), "rows were printed");
    assert!(err.starts_with("Error: "), "{err}");
    assert!(
        err.contains(&format!("device {device} cannot be used")),
        "{err}"
    );
    let why = batchinfer::device::gpus()
        .expect_err("no GPU here")
        .to_string();
    assert!(
        err.contains(&why),
        "the message says what is missing ({why}): {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn cuda_without_a_gpu_is_an_error_that_says_what_is_missing() {
    if has_gpu() {
        return;
    }
    for (flag, device) in [("cuda", "cuda:0"), ("cuda:1", "cuda:1")] {
        let out = batchinfer(&["--device", flag, "query", "-e", SCORES], &[]);
        assert_refused(&out, device);
    }
    let out = batchinfer(&["query", "-e", SCORES], &[("BATCHINFER_DEVICE", "cuda")]);
    assert_refused(&out, "cuda:0");
}

#[test]
fn set_batchinfer_device_applies_to_the_next_statements() {
    if has_gpu() {
        return;
    }
    let out = batchinfer(
        &[
            "query",
            "-e",
            &format!("SET batchinfer.device = 'cuda:0'; {SCORES}"),
        ],
        &[],
    );
    assert_refused(&out, "cuda:0");
    // Back to the CPU within the same process.
    let out = batchinfer(
        &[
            "query",
            "-e",
            &format!(
                "SET batchinfer.device = 'cpu'; {SCORES}; SELECT value FROM information_schema.df_settings WHERE name = 'batchinfer.device'"
            ),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("\ncpu\n"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn auto_falls_back_to_the_cpu_and_says_so() {
    if has_gpu() {
        return;
    }
    let cpu = batchinfer(&["query", "-e", SCORES], &[]);
    let auto = batchinfer(&["--device", "auto", "query", "-e", SCORES], &[]);
    assert!(cpu.status.success(), "{}", text(&cpu.stderr));
    assert!(auto.status.success(), "{}", text(&auto.stderr));
    assert_eq!(text(&auto.stdout), text(&cpu.stdout));
    assert_eq!(
        text(&cpu.stdout).lines().count(),
        6,
        "{}",
        text(&cpu.stdout)
    );
    let err = text(&auto.stderr);
    let why = batchinfer::device::gpus()
        .expect_err("no GPU here")
        .to_string();
    assert!(
        err.contains(&format!("--device auto chose the CPU: {why}")),
        "auto says what it chose and why: {err}"
    );
}

#[test]
fn unknown_devices_are_refused_with_the_choices() {
    let out = batchinfer(&["--device", "tpu", "query", "-e", "SELECT 1"], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("expected cpu, cuda, cuda:N (N = 0, 1, ...) or auto"),
        "{}",
        text(&out.stderr)
    );
    let out = batchinfer(&["query", "-e", "SET batchinfer.device = 'cuda:x'"], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.starts_with("Error: "), "{err}");
    assert!(err.contains("device 'cuda:x': expected cpu, cuda"), "{err}");
}
