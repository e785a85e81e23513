//! Helpers shared by the integration tests that run the real binary.
// Each test crate uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// The batches of `sql` run by `engine` (in the test's own process); a failure panics with the
/// statement and its message as a person reads it.
pub async fn run(
    engine: &batchinfer::Engine,
    sql: &str,
) -> Vec<datafusion::arrow::array::RecordBatch> {
    match engine.sql(sql).await {
        Ok(df) => df.collect().await.unwrap(),
        Err(e) => panic!("{sql}: {}", batchinfer::message::display_error(&e)),
    }
}

/// The batchinfer binary, as it is (no argument, the test's environment).
pub fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_batchinfer"))
}

/// The batchinfer binary, with `--format csv`.
pub fn bin() -> Command {
    let mut command = binary();
    command.args(["--format", "csv"]);
    command
}

/// [`bin`] without the test's environment variables that start with any of `prefixes` (a
/// store's or a database's credentials the machine may have), so that only what a test sets
/// is used.
pub fn bin_without_env(prefixes: &[&str]) -> Command {
    let mut command = bin();
    for (key, _) in std::env::vars() {
        if prefixes.iter().any(|prefix| key.starts_with(prefix)) {
            command.env_remove(key);
        }
    }
    command
}

/// `command` run with `args` to the end, within [`DEADLINE`].
pub fn run_with(mut command: Command, args: &[&str]) -> Output {
    output_within(command.args(args), DEADLINE)
}

/// `command` run to the end, `input` written to its standard input (from a thread of its own,
/// so that a process that does not read it cannot block the test), within [`DEADLINE`].
pub fn output_with_input(command: &mut Command, input: &[u8], what: &str) -> Output {
    use std::io::Write;
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let status = wait_with_deadline(&mut child, DEADLINE, what);
    writer.join().unwrap();
    let mut out = child.wait_with_output().unwrap();
    out.status = status;
    out
}

/// Every file under `dir` (none where it does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// The value of `key` in the footer metadata of the Parquet file at `path`, if it has one.
pub fn parquet_footer_value(path: impl AsRef<Path>, key: &str) -> Option<String> {
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let file = std::fs::File::open(path.as_ref()).unwrap();
    let reader = SerializedFileReader::new(file).unwrap();
    reader
        .metadata()
        .file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .clone()
}

/// Runs `query -e SQL` with `--warehouse WAREHOUSE` and the test models.
pub fn query(warehouse: &Path, sql: &str) -> Output {
    query_with(warehouse, &["--models", "data/models"], sql)
}

/// Runs `query -e SQL` with `--warehouse WAREHOUSE` and the options `options` (as `--timing`).
pub fn query_with(warehouse: &Path, options: &[&str], sql: &str) -> Output {
    output_within(
        bin()
            .arg("--warehouse")
            .arg(warehouse)
            .args(options)
            .args(["query", "-e", sql]),
        DEADLINE,
    )
}

/// `batchinfer refresh VIEW` over `warehouse`.
#[allow(dead_code)]
pub fn refresh(warehouse: &Path, view: &str) -> Output {
    output_within(
        bin()
            .arg("--warehouse")
            .arg(warehouse)
            .args(["refresh", view]),
        DEADLINE,
    )
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A success; its standard output.
pub fn assert_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "batchinfer failed:\nstdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// Exit status 1 with one readable message (no panic, no backtrace) mentioning each of
/// `expected`; the message.
pub fn assert_failure(out: &Output, expected: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit status 1:\nstdout: {}\nstderr: {err}",
        stdout(out)
    );
    assert!(err.starts_with("Error: "), "stderr:\n{err}");
    for text in expected {
        assert!(
            err.contains(text),
            "stderr does not mention {text:?}:\n{err}"
        );
    }
    for bad in [
        "panicked",
        "RUST_BACKTRACE",
        "internal error",
        "stack backtrace",
    ] {
        assert!(!err.contains(bad), "stderr:\n{err}");
    }
    err
}

/// Every file under `dir` (hidden ones too) with its bytes: compare two of these to see that
/// nothing was added, removed or changed.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(dir).unwrap().to_path_buf();
            if entry.file_type().unwrap().is_dir() {
                files.insert(relative.join(""), Vec::new());
                pending.push(path);
            } else {
                files.insert(relative, std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    files
}

/// The names in `before` and `after` that differ, for a readable assertion.
pub fn changes(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
) -> Vec<String> {
    let mut changed = Vec::new();
    for (path, bytes) in before {
        match after.get(path) {
            None => changed.push(format!("removed {}", path.display())),
            Some(b) if b != bytes => changed.push(format!("changed {}", path.display())),
            _ => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        changed.push(format!("added {}", path.display()));
    }
    changed
}

/// Sends `signal` to process `pid`, a child of this test (or the pty's), not yet waited for.
pub fn send(pid: u32, signal: i32) {
    let pid = i32::try_from(pid).expect("a process id");
    // SAFETY: kill(2) on a process id this test spawned and has not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// Waits for `child` at most `limit`; kills it past that and fails the test.
pub fn wait_with_deadline(
    child: &mut Child,
    limit: Duration,
    what: &str,
) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `ready` every 100 ms until it holds, failing the test after `limit`.
pub fn poll_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(
            started.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The longest a test lets one run of the binary take (debug builds, a loaded machine).
pub const DEADLINE: Duration = Duration::from_secs(300);

/// `command`'s output, failing the test if it runs longer than `limit` (it is killed then).
pub fn output_within(command: &mut Command, limit: Duration) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap());
    let mut child = command.spawn().expect("the command runs");
    let status = wait_with_deadline(&mut child, limit, &format!("{command:?}"));
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// Runs `command` with at most `memory` bytes of address space and for at most `limit` (killed
/// and failed past that), its output captured: a hostile input must end in an error, not in an
/// allocation that takes the machine's memory or a wait that never ends.
pub fn run_bounded(mut command: Command, memory: u64, limit: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: memory,
                rlim_max: memory,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    output_within(&mut command, limit)
}

/// CSV rows as (id, the rest's numbers), sorted by id.
pub fn rows(csv: &str) -> Vec<(i64, Vec<f64>)> {
    let mut rows: Vec<(i64, Vec<f64>)> = csv
        .lines()
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (id, rest) = l.split_once(',').unwrap();
            let numbers = rest
                .trim_matches(|c| c == '"' || c == '[' || c == ']')
                .split(',')
                .map(|n| n.trim().parse().unwrap())
                .collect();
            (id.parse().unwrap(), numbers)
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    rows
}

/// The same ids; every number within `tolerance` (ONNX Runtime's float kernels may differ in
/// the last bits between call sizes; embeddings by 1e-5 as in tests/embed.rs).
pub fn assert_same_rows(got: &[(i64, Vec<f64>)], want: &[(i64, Vec<f64>)], tolerance: f64) {
    assert_eq!(got.len(), want.len(), "row counts differ");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.0, w.0, "ids differ");
        assert_eq!(g.1.len(), w.1.len());
        for (a, b) in g.1.iter().zip(&w.1) {
            assert!(
                (a - b).abs() <= tolerance * b.abs().max(1.0),
                "id {}: {a} vs {b}",
                g.0
            );
        }
    }
}

/// The ```sql blocks of a Markdown text, indented ones (in a list) too, without their indent.
pub fn sql_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<String>)> = None;
    for line in markdown.lines() {
        let indent = line.len() - line.trim_start().len();
        match &mut open {
            None if line.trim_start() == "```sql" => open = Some((indent, Vec::new())),
            Some((_, lines)) if line.trim_start() == "```" => {
                blocks.push(lines.join("\n") + "\n");
                open = None;
            }
            Some((at, lines)) => lines.push(line.get(*at..).unwrap_or("").to_string()),
            None => {}
        }
    }
    assert!(open.is_none(), "a ```sql block is not closed");
    blocks
}

/// The ```sql examples of a document (`docs/storage.md`) that contain `mark`.
pub fn examples_with(document: &str, mark: &str) -> Vec<String> {
    let text = std::fs::read_to_string(document).unwrap();
    sql_blocks(&text)
        .into_iter()
        .filter(|sql| sql.contains(mark))
        .collect()
}

/// The sha256 of a file, in hex.
pub fn sha256_of(path: impl AsRef<Path>) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

/// The lines `stream` prints, as they come; the channel closes with the stream.
pub fn lines_of(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stream)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// The Parquet files under `dir`, in its subfolders too, sorted.
pub fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.path().is_dir() {
                stack.push(entry.path());
            } else if entry.path().extension().is_some_and(|e| e == "parquet") {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

/// A query of `rows` rows of ten random doubles (incompressible: each output file passes the
/// 10 MiB after which an object store's upload goes in parts), scored by `lookup`, which fails on
/// the row `fail_at`.
pub fn random_rows(rows: u64, fail_at: u64) -> String {
    let features: Vec<String> = (0..10).map(|i| format!("random() AS f{i}")).collect();
    format!(
        "SELECT value AS id, {}, predict('lookup', CASE WHEN value = {fail_at} THEN 99 ELSE value % 10 END) AS q FROM range({rows})",
        features.join(", ")
    )
}

/// `command` started with its input written by the test: the process, its input, and the lines
/// of its output and of its errors as they come (each channel closes with its stream).
pub fn piped(
    command: &mut Command,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<String>,
    std::sync::mpsc::Receiver<String>,
) {
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    (child, stdin, out, err)
}

/// The scores of the local sample by the linear model (`data/models`), `copies` times over,
/// sorted by id: what a run over copies of it in a store is compared with.
pub fn local_scores(copies: usize) -> Vec<(i64, Vec<f64>)> {
    let out = output_within(
        bin().args(["--models", "data/models", "query", "-e"]).arg(
            "SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS p \
             FROM 'data/sample/features.parquet'",
        ),
        DEADLINE,
    );
    let once = rows(&assert_ok(&out));
    let mut all: Vec<(i64, Vec<f64>)> = once
        .iter()
        .flat_map(|r| std::iter::repeat_n(r.clone(), copies))
        .collect();
    all.sort_by_key(|r| r.0);
    all
}

/// The newest manifest file of a materialized view's folder.
pub fn newest_manifest_file(folder: &Path) -> PathBuf {
    std::fs::read_dir(folder)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("manifest-"))
        .max()
        .unwrap()
}

/// The line `batchinfer refresh` printed for one refresh: its new, changed and removed counts.
pub fn refresh_counts(line: &str) -> (usize, usize, usize) {
    let number = |word: &str| -> usize {
        let at = line
            .find(word)
            .unwrap_or_else(|| panic!("no '{word}' in {line}"));
        line[..at]
            .split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    (number(" new"), number(" changed"), number(" removed"))
}
