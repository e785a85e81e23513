//! What the end-to-end benchmarks share.

use std::process::Command;
use std::time::Instant;

/// The value after `flag` on the command line (`--python /usr/bin/python3`).
// Not every bench takes arguments.
#[allow(dead_code)]
pub fn arg(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// Runs one command; its wall time and peak resident memory in MiB. The peak comes from GNU
/// time, which starts the command from its own small process: a child forked straight from this
/// (large) benchmark process would count this process's memory in its peak, since Linux keeps
/// the high-water mark of the memory a process had before it called exec.
#[allow(dead_code)]
pub fn run_measured(name: &str, command: Command) -> (f64, f64) {
    let (seconds, peak, said) = run_measured_saying(name, command);
    eprint!("{said}");
    (seconds, peak)
}

/// [`run_measured`], and what the command said on standard error.
// Not every bench reads it.
#[allow(dead_code)]
pub fn run_measured_saying(name: &str, command: Command) -> (f64, f64, String) {
    let peak_file =
        std::env::temp_dir().join(format!("batchinfer-bench-peak-{}", std::process::id()));
    let mut timed = Command::new("/usr/bin/time");
    timed
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&peak_file)
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => timed.env(key, value),
            None => timed.env_remove(key),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        timed.current_dir(dir);
    }
    timed.stdout(std::process::Stdio::null());
    let start = Instant::now();
    let out = timed.output().unwrap_or_else(|e| {
        panic!("{name}: cannot start /usr/bin/time (GNU time is needed for peak memory): {e}")
    });
    let seconds = start.elapsed().as_secs_f64();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{name}: exited with {}: {said}",
        out.status
    );
    let kib: f64 = std::fs::read_to_string(&peak_file)
        .ok()
        .and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok()))
        .unwrap_or(f64::NAN);
    (seconds, kib / 1024.0, said)
}
