//! Data safety, through the real binary with hostile but plausible input: no statement touches
//! what it does not name, a failed statement leaves the old state, concurrent writers lose
//! nothing, and no input makes batchinfer allocate without bound, hang or crash. Each test is
//! named after the guarantee it checks, and each compares the whole folder around its target
//! before and after (nothing outside the target is touched).

mod common;
mod fixtures;
mod s3_server;
use common::{lines_of, sha256_of};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    assert_failure, assert_ok, bin, changes, query, snapshot, stdout, wait_with_deadline,
};

/// `command` started with its input written by the test: the process, its input, and the lines
/// of its output and of its errors as they come (each channel closes with its stream).
fn piped(
    command: &mut Command,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::sync::mpsc::Receiver<String>,
    std::sync::mpsc::Receiver<String>,
) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let out = lines_of(child.stdout.take().unwrap());
    let err = lines_of(child.stderr.take().unwrap());
    (child, stdin, out, err)
}

/// Table names that are paths, or that would land on the warehouse's own files.
fn hostile_names() -> Vec<String> {
    let mut names: Vec<String> = [
        "../../victim",
        "..",
        ".",
        "a/b",
        "a\\b",
        "/tmp/victim",
        ".staging-x",
        ".hidden",
        "%2e%2e",
        "a?b",
        "a#b",
        "tab\tname",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    names.push("x".repeat(201));
    names
}

/// A base folder holding a warehouse (with a model and a table) and, beside it, a victim folder.
fn warehouse_with_neighbours() -> (tempfile::TempDir, std::path::PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let wh = base.path().join("wh");
    std::fs::create_dir_all(base.path().join("victim")).unwrap();
    std::fs::write(base.path().join("victim/keep.txt"), "keep").unwrap();
    assert_ok(&query(
        &wh,
        "CREATE MODEL kept FROM 'data/models/linear.onnx'; CREATE TABLE kept AS SELECT 1 AS x",
    ));
    (base, wh)
}

#[test]
fn table_names_are_names_never_paths_in_a_local_warehouse() {
    let (base, wh) = warehouse_with_neighbours();
    let before = snapshot(base.path());
    for name in hostile_names() {
        let quoted = name.replace('"', "\"\"");
        for sql in [
            format!("CREATE TABLE \"{quoted}\" AS SELECT 1 AS x"),
            format!("CREATE OR REPLACE TABLE \"{quoted}\" AS SELECT 1 AS x"),
            format!("DROP TABLE \"{quoted}\""),
            format!("DROP TABLE IF EXISTS \"{quoted}\""),
        ] {
            let out = query(&wh, &sql);
            assert_failure(&out, &["is not usable"]);
            let changed = changes(&before, &snapshot(base.path()));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    // The empty name, which SQL cannot even quote.
    let out = query(&wh, "DROP TABLE IF EXISTS \"\"");
    assert_failure(&out, &[]);
    assert!(changes(&before, &snapshot(base.path())).is_empty());
    // Model names are names too: they become the warehouse's model definition files.
    for name in ["../../victim/keep", "..", "a/b", ".hidden"] {
        let out = query(
            &wh,
            &format!("CREATE MODEL \"{name}\" FROM 'data/models/linear.onnx'"),
        );
        assert_failure(&out, &["is not usable"]);
        let out = query(&wh, &format!("DROP MODEL IF EXISTS \"{name}\""));
        assert_failure(&out, &["is not usable"]);
    }
    assert!(changes(&before, &snapshot(base.path())).is_empty());
    // And the table that is there still reads.
    assert_eq!(assert_ok(&query(&wh, "SELECT x FROM kept")), "x\n1\n");
}

#[test]
fn table_names_are_names_never_paths_in_an_s3_warehouse() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    std::fs::create_dir_all(server.root.join("lake/other")).unwrap();
    std::fs::write(server.root.join("lake/other/keep.txt"), "keep").unwrap();
    let run = |sql: &str| {
        bin()
            .env("AWS_ACCESS_KEY_ID", s3_server::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", s3_server::SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", server.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .args(["--warehouse", "s3://lake/wh/", "query", "-e", sql])
            .output()
            .unwrap()
    };
    assert_ok(&run("CREATE TABLE kept AS SELECT 1 AS x"));
    let before = snapshot(&server.root);
    for name in hostile_names() {
        for sql in [
            format!("CREATE TABLE \"{name}\" AS SELECT 1 AS x"),
            format!("DROP TABLE IF EXISTS \"{name}\""),
        ] {
            assert_failure(&run(&sql), &["is not usable"]);
            let changed = changes(&before, &snapshot(&server.root));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    assert_eq!(assert_ok(&run("SELECT x FROM kept")), "x\n1\n");
}

/// A statement that fails after 1.5M of its 2M rows were written: division by zero.
const FAILS_LATE: &str = "SELECT value AS id, 10 / (value - 1500000) AS q FROM range(2000000)";
/// The same through a model error: `lookup` fails on an index outside 0..9.
const MODEL_FAILS_LATE: &str = "SELECT value AS id, predict('lookup', CASE WHEN value = 1500000 THEN 99 ELSE value % 10 END) AS q FROM range(2000000)";

#[test]
fn a_failed_copy_leaves_what_was_there_before() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let file = dir.path().join("out.parquet");
    let folder = dir.path().join("out");
    assert_ok(&query(
        &wh,
        &format!(
            "COPY (SELECT 7 AS old) TO '{}' STORED AS PARQUET;
             COPY (SELECT 8 AS old) TO '{}/' STORED AS PARQUET",
            file.display(),
            folder.display()
        ),
    ));
    let before = snapshot(dir.path());
    for failing in [FAILS_LATE, MODEL_FAILS_LATE] {
        for target in [file.display().to_string(), format!("{}/", folder.display())] {
            let sql = format!("COPY ({failing}) TO '{target}' STORED AS PARQUET");
            assert_failure(&query(&wh, &sql), &[]);
            let changed = changes(&before, &snapshot(dir.path()));
            assert!(changed.is_empty(), "{sql} changed {changed:?}");
        }
    }
    // Failing into targets that did not exist leaves nothing at all.
    for target in ["new.parquet", "new/"] {
        let target = dir.path().join(target);
        let sql = format!(
            "COPY ({FAILS_LATE}) TO '{}' STORED AS PARQUET",
            target.display()
        );
        assert_failure(&query(&wh, &sql), &["Divide by zero"]);
        assert!(changes(&before, &snapshot(dir.path())).is_empty());
    }
    assert_eq!(
        assert_ok(&query(
            &wh,
            &format!("SELECT old FROM '{}'", file.display())
        )),
        "old\n7\n"
    );
}

/// An external table `t` in `dir/t/` holding two rows; the statement that defines it, for each
/// process to run before its own.
fn table_of_two_rows(dir: &Path, wh: &Path) -> String {
    let define = format!(
        "CREATE EXTERNAL TABLE t (id BIGINT, q BIGINT) STORED AS PARQUET LOCATION '{}/'",
        dir.join("t").display()
    );
    assert_ok(&query(
        wh,
        &format!("{define}; INSERT INTO t VALUES (1, 1), (2, 2)"),
    ));
    define
}

#[test]
fn a_failed_insert_adds_none_of_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let define = table_of_two_rows(dir.path(), &wh);
    let before = snapshot(dir.path());
    for failing in [FAILS_LATE, MODEL_FAILS_LATE] {
        let out = query(&wh, &format!("{define}; INSERT INTO t {failing}"));
        assert_failure(&out, &[]);
        let changed = changes(&before, &snapshot(dir.path()));
        assert!(changed.is_empty(), "INSERT changed {changed:?}");
    }
    let out = query(&wh, &format!("{define}; SELECT count(*) AS n FROM t"));
    assert_eq!(assert_ok(&out), "n\n2\n");
    // A successful INSERT adds all of its rows.
    let out = query(
        &wh,
        &format!(
            "{define}; INSERT INTO t SELECT value AS id, value AS q FROM range(300000); SELECT count(*) AS n FROM t"
        ),
    );
    assert!(assert_ok(&out).ends_with("n\n300002\n"));
}

#[test]
fn concurrent_catalog_changes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let spawn = |sql: String| {
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .args(["query", "-e", &sql])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut children: Vec<_> = (0..16)
        .map(|i| spawn(format!("CREATE MODEL m{i} FROM 'data/models/linear.onnx'")))
        .chain((0..8).map(|i| spawn(format!("CREATE TABLE t{i} AS SELECT {i} AS x"))))
        .collect();
    for child in &mut children {
        let status = wait_with_deadline(child, Duration::from_secs(120), "a CREATE");
        assert!(status.success());
    }
    let out = query(&wh, "SELECT name FROM models() ORDER BY name");
    let listed = assert_ok(&out);
    for i in 0..16 {
        assert!(
            listed.contains(&format!("\nm{i}\n")),
            "m{i} is lost:\n{listed}"
        );
    }
    let out = query(
        &wh,
        &(0..8)
            .map(|i| format!("SELECT x FROM t{i}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL "),
    );
    let mut xs: Vec<String> = stdout(&out).lines().skip(1).map(str::to_string).collect();
    xs.sort();
    assert_eq!(xs, (0..8).map(|i| i.to_string()).collect::<Vec<_>>());
    // Nothing half-written is left in the warehouse.
    let leftovers: Vec<_> = snapshot(&wh)
        .into_keys()
        .filter(|p| p.to_string_lossy().contains("/."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Address space for a hostile input's run: far less than what the input asks for.
const MEMORY: u64 = 6 << 30;
const DEADLINE: Duration = Duration::from_secs(60);

fn bounded(warehouse: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut command = bin();
    command.arg("--warehouse").arg(warehouse).args(args);
    common::run_bounded(command, MEMORY, DEADLINE)
}

#[test]
fn no_unbounded_allocation_from_a_parquet_schema_claiming_huge_lists() {
    use datafusion::arrow::array::{FixedSizeListArray, Float32Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::parquet::arrow::ArrowWriter;
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.parquet");
    let item = Arc::new(Field::new_list_field(DataType::Float32, true));
    let schema = Arc::new(Schema::new(vec![Field::new(
        "v",
        DataType::FixedSizeList(item.clone(), i32::MAX),
        true,
    )]));
    let empty = FixedSizeListArray::try_new(
        item,
        i32::MAX,
        Arc::new(Float32Array::from(Vec::<f32>::new())),
        None,
    )
    .unwrap();
    let batch = datafusion::arrow::record_batch::RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(empty)],
    )
    .unwrap();
    let mut writer =
        ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() < 2048);
    let wh = dir.path().join("wh");
    for sql in [
        format!("SELECT * FROM '{}'", path.display()),
        format!("SELECT v[1] FROM '{}'", path.display()),
        format!(
            "CREATE EXTERNAL TABLE h STORED AS PARQUET LOCATION '{}'; SELECT count(v) FROM h",
            path.display()
        ),
    ] {
        let out = bounded(&wh, &["query", "-e", &sql]);
        assert_failure(&out, &["column 'v'", "2147483647", "values per row"]);
    }
}

#[test]
fn no_unbounded_allocation_from_a_model_with_an_absurd_fixed_batch() {
    let dir = tempfile::tempdir().unwrap();
    for (model, rows) in [("batch_1e9", "1000000000"), ("batch_2p32", "4294967297")] {
        let sql =
            format!("CREATE MODEL m FROM 'data/fixtures/{model}.onnx'; SELECT predict('m', 1.0)");
        let out = bounded(&dir.path().join(model), &["query", "-e", &sql]);
        assert_failure(
            &out,
            &["model 'm'", &format!("fixed at {rows} rows"), "65536"],
        );
    }
}

#[test]
fn no_crash_from_expressions_nested_too_deep() {
    let dir = tempfile::tempdir().unwrap();
    let sum = format!("SELECT {}", vec!["1"; 10_000].join("+"));
    let ors = format!(
        "SELECT count(*) FROM range(10) WHERE {}",
        (0..30_000)
            .map(|i| format!("value = {i}"))
            .collect::<Vec<_>>()
            .join(" OR ")
    );
    let script = dir.path().join("deep.sql");
    for sql in [&sum, &ors] {
        std::fs::write(&script, sql).unwrap();
        let out = bounded(
            &dir.path().join("wh"),
            &["query", "-f", script.to_str().unwrap()],
        );
        assert_failure(&out, &["expression too deep", "1000 levels"]);
    }
    // Deep, but within the limit: planned and run.
    let sum = format!("SELECT {} AS n", vec!["1"; 900].join("+"));
    let out = bounded(&dir.path().join("wh"), &["query", "-e", &sum]);
    assert_eq!(assert_ok(&out), "n\n900\n");
}

#[test]
fn no_crash_from_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let out = bounded(
        &dir.path().join("wh"),
        &["--batch-rows", "0", "query", "-e", "SELECT 1"],
    );
    assert_failure(&out, &["--batch-rows", "must be from 1 to"]);
    for endpoint in ["http://[::1", "ftp://host:21", "http://", "not a url"] {
        let out = common::run_bounded(through_endpoint(endpoint), MEMORY, DEADLINE);
        assert_failure(&out, &["S3 endpoint", "is not usable"]);
    }
}

/// A query of an S3 object through the endpoint `endpoint` (any text), with static keys.
fn through_endpoint(endpoint: &str) -> Command {
    let mut command = bin();
    command
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint)
        .args(["query", "-e", "SELECT * FROM 's3://bucket/x.parquet'"]);
    command
}

/// A FIFO no one writes to: reading it whole would wait forever.
fn fifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; mkfifo reads it and nothing else.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

#[test]
fn no_hang_or_unbounded_read_from_fifos_devices_and_links_to_them() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    fifo(&base.join("pipe.onnx"));
    std::os::unix::fs::symlink("/dev/zero", base.join("zero.onnx")).unwrap();
    std::os::unix::fs::symlink(base.join("pipe.onnx"), base.join("link.onnx")).unwrap();
    let wh = base.join("wh");
    for model in ["pipe.onnx", "zero.onnx", "link.onnx"] {
        let path = base.join(model);
        // CREATE MODEL ... FROM it, and a --models folder holding it.
        let out = bounded(
            &wh,
            &[
                "query",
                "-e",
                &format!("CREATE MODEL m FROM '{}'", path.display()),
            ],
        );
        assert_failure(&out, &["model"]);
        let out = bounded(
            &wh,
            &[
                "--models",
                base.to_str().unwrap(),
                "query",
                "-e",
                &format!("SELECT predict('{}', 1.0)", model.trim_end_matches(".onnx")),
            ],
        );
        assert_failure(&out, &["not a regular file"]);
    }
    // A text model folder whose tokenizer or pooling configuration is one.
    let minilm = fixtures::models_with_minilm().join("minilm");
    for (file, target) in [
        ("tokenizer.json", None),
        ("tokenizer.json", Some("/dev/zero")),
        ("1_Pooling/config.json", None),
        ("1_Pooling/config.json", Some("/dev/zero")),
        ("batchinfer.json", None),
    ] {
        let folder = tempfile::tempdir().unwrap();
        std::fs::copy("data/models/linear.onnx", folder.path().join("model.onnx")).unwrap();
        std::fs::copy(
            minilm.join("tokenizer.json"),
            folder.path().join("tokenizer.json"),
        )
        .unwrap();
        std::fs::create_dir_all(folder.path().join("1_Pooling")).unwrap();
        let hostile = folder.path().join(file);
        let _ = std::fs::remove_file(&hostile);
        match target {
            None => fifo(&hostile),
            Some(target) => std::os::unix::fs::symlink(target, &hostile).unwrap(),
        }
        let sql = format!("CREATE MODEL t FROM '{}/'", folder.path().display());
        let out = bounded(&wh, &["query", "-e", &sql]);
        assert_failure(
            &out,
            &[file.rsplit('/').next().unwrap(), "not a regular file"],
        );
    }
    // A file over its cap says the cap.
    let folder = tempfile::tempdir().unwrap();
    std::fs::copy("data/models/linear.onnx", folder.path().join("model.onnx")).unwrap();
    std::fs::copy(
        minilm.join("tokenizer.json"),
        folder.path().join("tokenizer.json"),
    )
    .unwrap();
    let big = std::fs::File::create(folder.path().join("batchinfer.json")).unwrap();
    big.set_len(2 << 20).unwrap();
    let sql = format!("CREATE MODEL t FROM '{}/'", folder.path().display());
    assert_failure(
        &bounded(&wh, &["query", "-e", &sql]),
        &["batchinfer.json", "2097152 bytes", "1048576 bytes"],
    );
}

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
        let mut command = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
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
    for file in [
        "model.onnx",
        "tokenizer.json",
        "config.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
    ] {
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

#[test]
fn a_models_external_data_stays_with_the_model() {
    // The working directory holds a weights.bin of its own: the model's is in its folder.
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("weights.bin"), vec![0x3f; 44]).unwrap();
    let root = std::fs::canonicalize(".").unwrap();
    let external = root.join("data/fixtures/external");
    let sql = format!(
        "CREATE MODEL e FROM '{}/';
         SELECT count(*) AS n, sum(CASE WHEN abs(predict('e', v.features) - r.score) <= 1e-6 * greatest(abs(r.score), 1) THEN 1 ELSE 0 END) AS same
         FROM '{}' v JOIN '{}' r ON v.id = r.id",
        external.display(),
        root.join("data/sample/vectors.parquet").display(),
        external.join("reference.parquet").display()
    );
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh", "query", "-e", &sql])
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "n,same\n100,100\n");
    // Protobuf fields batchinfer's reader might pass over (a group, which parsers accept and
    // skip) change nothing: the data still comes from the model's folder.
    let grouped = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(external.join("model.onnx")).unwrap();
    bytes.extend_from_slice(&[0x9b, 0x06, 0x08, 0x01, 0x9c, 0x06]);
    std::fs::write(grouped.path().join("model.onnx"), bytes).unwrap();
    std::fs::copy(
        external.join("weights.bin"),
        grouped.path().join("weights.bin"),
    )
    .unwrap();
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh1", "query", "-e"])
        .arg(sql.replacen(
            &format!("{}/", external.display()),
            &format!("{}/", grouped.path().display()),
            1,
        ))
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "n,same\n100,100\n");
    // The data counts in the model's sha256: other weights, another hash.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(external.join("model.onnx"), copy.path().join("model.onnx")).unwrap();
    std::fs::write(copy.path().join("weights.bin"), vec![0x3f; 44]).unwrap();
    let hashes = format!(
        "CREATE MODEL a FROM '{}/'; CREATE MODEL b FROM '{}/';
         SELECT count(DISTINCT sha256) AS n FROM models() WHERE name IN ('a', 'b')",
        external.display(),
        copy.path().display()
    );
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh2", "query", "-e", &hashes])
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "n\n2\n");
    // A model whose data file is named outside its folder is refused.
    let bytes = std::fs::read(external.join("model.onnx")).unwrap();
    let mut bytes = bytes.clone();
    let at = bytes.windows(11).position(|w| w == b"weights.bin").unwrap();
    bytes[at..at + 11].copy_from_slice(b"../ghts.bin");
    std::fs::write(copy.path().join("model.onnx"), &bytes).unwrap();
    let out = bin()
        .current_dir(cwd.path())
        .args(["--warehouse", "wh3", "query", "-e"])
        .arg(format!("CREATE MODEL x FROM '{}/'", copy.path().display()))
        .output()
        .unwrap();
    assert_failure(
        &out,
        &["../ghts.bin", "not a plain path inside the model's folder"],
    );
}

#[test]
fn secrets_stay_secret() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("bkt");
    let secret = "SuperSecretValue42";
    let token = "SessionTokenValue42";
    let options = format!(
        "OPTIONS ('aws.access_key_id' 'AKIAEXAMPLE', 'aws.secret_access_key' '{secret}', \
         'aws.session_token' '{token}', 'aws.region' 'us-east-1', \
         'aws.endpoint' '{}', 'aws.allow_http' 'true')",
        server.endpoint()
    );
    let wh = dir.path().join("wh");
    let statements = [
        format!("EXPLAIN COPY (SELECT 1 AS x) TO 's3://bkt/out/' STORED AS PARQUET {options}"),
        format!(
            "EXPLAIN VERBOSE COPY (SELECT 1 AS x) TO 's3://bkt/out/' STORED AS PARQUET {options}"
        ),
        // Refused by the server (the key is wrong): the error names neither.
        format!("COPY (SELECT 1 AS x) TO 's3://bkt/out/' STORED AS PARQUET {options}"),
        format!(
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://bkt/t/' {options}; \
             SHOW CREATE TABLE t"
        ),
    ];
    for sql in statements {
        let out = query(&wh, &sql);
        let shown = format!("{}{}", stdout(&out), common::stderr(&out));
        assert!(
            !shown.contains(secret) && !shown.contains(token),
            "{sql}\nshows a secret:\n{shown}"
        );
        assert!(!shown.contains("panicked"), "{shown}");
    }
}

#[test]
fn the_cluster_warns_that_it_is_not_an_open_door() {
    let listen = |role: &str, address: &str| {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_batchinfer"));
        match role {
            "scheduler" => command.args(["scheduler", "--bind", &format!("{address}:{port}")]),
            _ => command.args([
                "executor",
                "--bind-host",
                address,
                "--port",
                &port.to_string(),
                "--scheduler",
                "127.0.0.1:1",
            ]),
        };
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr");
        let mut child = command
            .env("BATCHINFER_WAREHOUSE", dir.path().join("wh"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut text = String::new();
        common::poll_until(Duration::from_secs(30), "the banner", || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains(&format!("batchinfer {role}"))
        });
        let _ = child.kill();
        let _ = child.wait();
        text
    };
    let exposed = listen("scheduler", "0.0.0.0");
    assert!(
        exposed.contains("warning:") && exposed.contains("no authentication"),
        "{exposed}"
    );
    assert!(!listen("scheduler", "127.0.0.1").contains("warning:"));
    let exposed = listen("executor", "0.0.0.0");
    assert!(exposed.contains("no authentication"), "{exposed}");
}

#[test]
fn predict_table_reads_s3_paths_as_every_path_does() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.put_file(
        "data",
        "customers.parquet",
        Path::new("data/sample/customers.parquet"),
    );
    let sql = |from: &str| {
        format!(
            "SELECT id, label, probabilities[2] AS p FROM predict_table('churn', '{from}') ORDER BY id"
        )
    };
    let out = bin()
        .env("AWS_ACCESS_KEY_ID", s3_server::ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3_server::SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ALLOW_HTTP", "true")
        .arg("--warehouse")
        .arg(dir.path().join("wh"))
        .args(["--models", "data/models", "query", "-e"])
        .arg(sql("s3://data/customers.parquet"))
        .output()
        .unwrap();
    let remote = assert_ok(&out);
    let local = assert_ok(&query(
        &dir.path().join("wh"),
        &sql("data/sample/customers.parquet"),
    ));
    assert_eq!(remote.lines().count(), 2001);
    assert_eq!(remote, local);
}

/// The same through the library, on a single-threaded runtime (as `#[tokio::test]` gives): the
/// look-up of the S3 path needs a runtime to drive its requests while planning waits for it.
#[test]
fn predict_table_reads_s3_paths_on_a_single_threaded_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.put_file(
        "data",
        "customers.parquet",
        Path::new("data/sample/customers.parquet"),
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(predict_table_over_s3(&server));
}

async fn predict_table_over_s3(server: &s3_server::S3Server) {
    let engine = batchinfer::Engine::new(batchinfer::EngineConfig {
        models_dir: Some("data/models".into()),
        ..Default::default()
    })
    .unwrap();
    let connect = format!(
        "CREATE EXTERNAL TABLE c STORED AS PARQUET LOCATION 's3://data/customers.parquet' \
         OPTIONS ('aws.access_key_id' '{}', 'aws.secret_access_key' '{}', 'aws.region' \
         'us-east-1', 'aws.endpoint' '{}', 'aws.allow_http' 'true')",
        s3_server::ACCESS_KEY,
        s3_server::SECRET_KEY,
        server.endpoint()
    );
    engine.sql(&connect).await.unwrap().collect().await.unwrap();
    let counted = tokio::time::timeout(Duration::from_secs(60), async {
        let frame = engine
            .sql("SELECT count(label) AS n FROM predict_table('churn', 's3://data/customers.parquet')")
            .await
            .map_err(|e| batchinfer::message::display_error(&e))?;
        frame.collect().await.map_err(|e| e.to_string())
    })
    .await
    .expect("predict_table over S3 did not finish within 60 s")
    .unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&counted)
        .unwrap()
        .to_string();
    assert!(text.contains("| 2000 |"), "{text}");
}

/// Targets are named plainly: a folder with a space, the same as a `file://` URL (where the space
/// is `%20`), and never a pattern (`*`, `?`, `[`), which DataFusion would read as one and write
/// beside.
#[test]
fn writes_land_exactly_where_they_are_named() {
    let base = tempfile::tempdir().unwrap();
    let spaced = base.path().join("with space");
    std::fs::create_dir_all(&spaced).unwrap();
    std::fs::create_dir_all(base.path().join("g")).unwrap();
    let wh = base.path().join("wh");
    let url = format!("file://{}/with%20space/b.parquet", base.path().display());
    let sql = format!(
        "COPY (SELECT 1 AS x) TO '{}/a.parquet' STORED AS PARQUET;
         COPY (SELECT 2 AS x) TO '{url}' STORED AS PARQUET;
         CREATE EXTERNAL TABLE e STORED AS PARQUET LOCATION '{}/';
         INSERT INTO e SELECT 3 AS x;
         SELECT x FROM e ORDER BY x",
        spaced.display(),
        spaced.display()
    );
    assert_eq!(
        assert_ok(&query(&wh, &sql)),
        "count\n1\ncount\n1\ncount\n1\nx\n1\n2\n3\n"
    );
    let names: Vec<String> = std::fs::read_dir(&spaced)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    let before = snapshot(base.path());
    for target in ["g/*.parquet", "g/?.parquet", "g/[ab].parquet", "g/*/"] {
        let sql = format!(
            "COPY (SELECT 1 AS x) TO '{}/{target}' STORED AS PARQUET",
            base.path().display()
        );
        assert_failure(&query(&wh, &sql), &["glob character", target]);
    }
    let out = query(&base.path().join("w[1]"), "CREATE TABLE t AS SELECT 1 AS x");
    assert_failure(&out, &["warehouse cannot be used", "glob character '['"]);
    assert!(changes(&before, &snapshot(base.path())).is_empty());
}

/// A quoted name keeps its case, an unquoted one is lower-cased (as DataFusion does): `"T"` and
/// `t` are two tables, and dropping one leaves the other.
#[test]
fn table_names_differing_in_case_are_two_tables() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let out = query(
        &wh,
        "CREATE TABLE \"T\" AS SELECT 1 AS x; CREATE TABLE t AS SELECT 2 AS x;
         SELECT x FROM \"T\"; SELECT x FROM T",
    );
    assert_eq!(assert_ok(&out), "x\n1\nx\n2\n");
    assert_eq!(
        assert_ok(&query(&wh, "DROP TABLE t; SELECT x FROM \"T\"")),
        "x\n1\n"
    );
    assert_failure(&query(&wh, "SELECT x FROM t"), &["t"]);
}

/// An S3 warehouse through the in-process S3 server.
fn s3_warehouse(server: &s3_server::S3Server) -> impl Fn(&str) -> Command {
    let endpoint = server.endpoint();
    move |sql: &str| {
        let mut command = bin();
        command
            .env("AWS_ACCESS_KEY_ID", s3_server::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", s3_server::SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", &endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .args(["--warehouse", "s3://lake/wh/", "query", "-e", sql]);
        command
    }
}

#[test]
fn a_model_dropped_from_an_s3_warehouse_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let run = s3_warehouse(&server);
    let create = "CREATE MODEL m FROM 'data/models/linear.onnx';
                  CREATE MODEL m2 FROM 'data/models/linear.onnx'";
    assert_ok(&run(create).output().unwrap());
    assert_ok(&run("DROP MODEL m").output().unwrap());
    // A new process reads the warehouse afresh: m is gone, m2 (a longer name) is not.
    let out = run("SELECT name FROM models() ORDER BY name")
        .output()
        .unwrap();
    assert_eq!(assert_ok(&out), "name\nm2\n");
    assert_eq!(server.keys("lake", "wh/models/"), vec!["wh/models/m2.json"]);
}

/// Two processes create the same table in one S3 warehouse: the one that finishes second fails,
/// and deletes nothing of the first's.
#[test]
fn a_table_created_meanwhile_in_s3_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let run = s3_warehouse(&server);
    // Incompressible rows, enough for a few seconds of writing.
    let columns: Vec<String> = (0..10).map(|i| format!("random() AS f{i}")).collect();
    let sql = format!(
        "CREATE TABLE t AS SELECT value AS id, {} FROM range(1500000)",
        columns.join(", ")
    );
    let mut slow = run(&sql)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it writes, another process's table appears (as the other's commit would make it).
    common::poll_until(Duration::from_secs(120), "an upload", || {
        std::fs::read_dir(&server.root)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".upload"))
    });
    let theirs = server.root.join("lake/wh/tables/t");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::copy(
        "data/sample/features.parquet",
        theirs.join("theirs.parquet"),
    )
    .unwrap();
    wait_with_deadline(&mut slow, common::DEADLINE, "the CREATE TABLE");
    let out = slow.wait_with_output().unwrap();
    assert_failure(&out, &["table 't' already exists"]);
    assert_eq!(
        server.keys("lake", "wh/tables/"),
        vec!["wh/tables/t/theirs.parquet"]
    );
}

/// Out-of-range engine options are refused by name; so are endpoints that are not URLs, and
/// plain HTTP unless asked for.
#[test]
fn engine_options_and_endpoints_out_of_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (option, value) in [
        ("--partitions", "0"),
        ("--partitions", "100000"),
        ("--sessions", "5000"),
        ("--threads", "0"),
        ("--batch-rows", "100000000"),
    ] {
        let out = bounded(
            &dir.path().join("wh"),
            &[option, value, "query", "-e", "SELECT 1"],
        );
        assert_failure(&out, &[option, "must be from 1 to"]);
    }
    for endpoint in ["http://host name:9000", "http://host%41:9000"] {
        let out = common::run_bounded(through_endpoint(endpoint), MEMORY, DEADLINE);
        assert_failure(&out, &["S3 endpoint", "is not usable"]);
    }
    let mut command = through_endpoint("http://127.0.0.1:9");
    command.env_remove("AWS_ALLOW_HTTP");
    let out = common::run_bounded(command, MEMORY, DEADLINE);
    assert_failure(&out, &["http://127.0.0.1:9", "AWS_ALLOW_HTTP"]);
}

/// Of two CREATE TABLEs of one name in an S3 warehouse, the one that comes second fails even
/// while the first has written nothing visible yet: the first has claimed the name.
#[test]
fn of_two_s3_create_tables_of_one_name_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let run = s3_warehouse(&server);
    // One file: its upload begun (1), its part (2), the claim (3), held at its completion (4).
    let held = server.hold_write_under("lake/wh/tables/t/", 4);
    let mut first = run("CREATE TABLE t AS SELECT 1 AS who")
        .arg("--partitions")
        .arg("1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    held.recv_timeout(Duration::from_secs(120))
        .expect("the first CREATE TABLE reaches its commit");
    let second = run("CREATE TABLE t AS SELECT 2 AS who").output().unwrap();
    assert_failure(&second, &["table 't' already exists"]);
    let _ = first.kill();
    let _ = first.wait();
    assert_eq!(
        server.keys("lake", "wh/tables/"),
        vec!["wh/tables/t/_batchinfer_table"],
        "the second wrote nothing; the first's claim stays"
    );
}

/// Every spelling DataFusion reads as a URL is written as it reads it: `S3://`, `FILE:///`,
/// `file:/path` targets are committed like any other (a failed COPY leaves nothing), a
/// `file://` warehouse is its folder (not a folder named `file:` in the working directory), and
/// a scheme with no store is one clear error.
#[test]
fn url_spellings_are_written_as_they_are_read() {
    let base = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&base.path().join("s3"));
    server.bucket("lake");
    let cwd = base.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let out_dir = base.path().join("out");
    let before = snapshot(base.path());
    let root = out_dir.display().to_string();
    for target in [
        format!("file:{root}/a/"),
        format!("FILE://{root}/b/"),
        format!("file://{root}/c.parquet"),
        "S3://lake/up/".to_string(),
    ] {
        let sql = format!("COPY ({FAILS_LATE}) TO '{target}' STORED AS PARQUET");
        let out = s3_warehouse(&server)(&sql)
            .current_dir(&cwd)
            .output()
            .unwrap();
        assert_failure(&out, &["Divide by zero"]);
        let changed = changes(&before, &snapshot(base.path()));
        assert!(changed.is_empty(), "{target} left {changed:?}");
    }
    let url = format!("file://{}/w%20x", base.path().display());
    let out = bin()
        .current_dir(&cwd)
        .args([
            "--warehouse",
            &url,
            "query",
            "-e",
            "CREATE TABLE t AS SELECT 1 AS x",
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(base.path().join("w x/tables/t").is_dir());
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0);
    let out = bin()
        .current_dir(&cwd)
        .args(["--warehouse", "wh", "query", "-e"])
        .arg("COPY (SELECT 1 AS x) TO 'a:b.parquet' STORED AS PARQUET")
        .output()
        .unwrap();
    assert_failure(&out, &["scheme 'a:'", "no store for", "'./'"]);
}

/// A model in S3 cannot name external data outside its folder by escaping `..` in the URL.
#[test]
fn an_s3_models_external_data_stays_in_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let external = Path::new("data/fixtures/external");
    let mut bytes = std::fs::read(external.join("model.onnx")).unwrap();
    while let Some(at) = bytes.windows(11).position(|w| w == b"weights.bin") {
        bytes[at..at + 11].copy_from_slice(b"%2e%2e/w.bn");
    }
    let model = dir.path().join("esc.onnx");
    std::fs::write(&model, bytes).unwrap();
    server.put_file("lake", "models/m/esc.onnx", &model);
    server.put_file("lake", "models/w.bn", &external.join("weights.bin"));
    let out = s3_warehouse(&server)(
        "CREATE MODEL esc FROM 's3://lake/models/m/esc.onnx'; SELECT predict('esc', [1.0, 1, 1, 1, 1, 1, 1, 1, 1, 1]) AS p",
    )
    .output()
    .unwrap();
    assert_failure(&out, &["model 'esc'", "external data"]);
}

/// What no file, FIFO or statement can make batchinfer do: wait on a FIFO for ever, read an
/// endless script, or plan without bound.
#[test]
fn no_hang_or_unbounded_work_from_fifo_tables_endless_scripts_or_wide_plans() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let table = dir.path().join("f.parquet");
    fifo(&table);
    let out = bounded(
        &wh,
        &[
            "query",
            "-e",
            &format!("SELECT * FROM '{}'", table.display()),
        ],
    );
    assert_failure(&out, &["f.parquet", "not a regular file"]);
    let out = bounded(&wh, &["query", "-f", "/dev/zero"]);
    assert_failure(&out, &["/dev/zero", "more than 67108864 bytes"]);
    let script = dir.path().join("wide.sql");
    let ctes: Vec<String> = (1..2000)
        .map(|i| format!("a{i} AS (SELECT x FROM a{})", i - 1))
        .collect();
    let joins: Vec<String> = (0..2000)
        .map(|i| format!("JOIN (VALUES (1)) t{i}(c{i}) ON true"))
        .collect();
    for sql in [
        format!("SELECT CAST(NULL AS INT{})", "[]".repeat(10_000)),
        format!(
            "WITH a0 AS (SELECT 1 AS x), {} SELECT * FROM a1999",
            ctes.join(", ")
        ),
        format!("SELECT 1 FROM (VALUES (1)) s(c) {}", joins.join(" ")),
    ] {
        std::fs::write(&script, &sql).unwrap();
        let out = bounded(&wh, &["query", "-f", script.to_str().unwrap()]);
        assert_failure(&out, &["expression too deep", "1000"]);
    }
    let out = bounded(
        &wh,
        &[
            "query",
            "-e",
            "SET datafusion.execution.target_partitions = 1000000",
        ],
    );
    assert_failure(&out, &["target_partitions must be at most 1024"]);
}

/// A file name as long as a file system allows is written, staged under a shorter hidden name.
#[test]
fn long_file_names_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("{}.parquet", "n".repeat(240));
    let target = dir.path().join(&name);
    let sql = format!(
        "COPY (SELECT 1 AS x) TO '{}' STORED AS PARQUET; SELECT x FROM '{}'",
        target.display(),
        target.display()
    );
    assert_eq!(
        assert_ok(&query(&dir.path().join("wh"), &sql)),
        "count\n1\nx\n1\n"
    );
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![name], "nothing staged is left");
}

const PREDICT_M: &str = "predict('m', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9)";

/// The score of row 0 of the sample features by the model file `file`, from a process of its own.
fn score_of(file: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "CREATE MODEL m FROM '{file}'; \
         SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0"
    );
    let out = assert_ok(&query(&dir.path().join("wh"), &sql));
    out.lines().nth(1).unwrap().to_string()
}

/// Results never come from a stale model: a process running statements one after another (a
/// shell reading a pipe) scores, at each statement, with the model the warehouse defines then,
/// whatever another process redefined or dropped meanwhile, the same file with new bytes
/// included. (A file changed on disk without a redefinition keeps its loaded model.)
#[test]
fn a_model_redefined_by_another_process_is_used_from_the_next_statement() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let file = dir.path().join("m.onnx");
    std::fs::copy("data/models/linear.onnx", &file).unwrap();
    let (linear, doubled) = (
        score_of("data/models/linear.onnx"),
        score_of("data/fixtures/linear_doubled.onnx"),
    );
    assert_ne!(linear, doubled);
    let elsewhere = |sql: &str| {
        let out = common::output_within(
            bin().arg("--warehouse").arg(&wh).args(["query", "-e", sql]),
            common::DEADLINE,
        );
        assert_ok(&out);
    };
    elsewhere(&format!("CREATE MODEL m FROM '{}'", file.display()));

    let mut command = bin();
    command.arg("--warehouse").arg(&wh).arg("shell");
    let (mut shell, mut stdin, out, err) = piped(&mut command);
    let mut score = || {
        writeln!(
            stdin,
            "SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0;"
        )
        .unwrap();
        loop {
            let line = out
                .recv_timeout(common::DEADLINE)
                .expect("the shell answers");
            if line != "s" {
                return line;
            }
        }
    };
    assert_eq!(score(), linear);
    // The file changes, nobody redefines the model: the loaded model keeps serving.
    std::fs::copy("data/fixtures/linear_doubled.onnx", &file).unwrap();
    assert_eq!(score(), linear);
    // Another process redefines it from that same file: its new bytes from the next statement.
    elsewhere(&format!(
        "CREATE OR REPLACE MODEL m FROM '{}'",
        file.display()
    ));
    assert_eq!(score(), doubled);
    // From another file.
    elsewhere("CREATE OR REPLACE MODEL m FROM 'data/models/linear.onnx'");
    assert_eq!(score(), linear);
    // Dropped: the shell no longer has it.
    elsewhere("DROP MODEL m");
    writeln!(
        stdin,
        "SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0;"
    )
    .unwrap();
    loop {
        let line = err
            .recv_timeout(common::DEADLINE)
            .expect("the shell reports the error");
        if line.contains("unknown model 'm'") {
            break;
        }
    }
    drop(stdin);
    wait_with_deadline(&mut shell, common::DEADLINE, "the shell");
}

/// A model dropped or redefined after it scored in the same process: the statement succeeds
/// (its counts of scored rows go with the old model), and the warehouse says what it did.
#[test]
fn a_model_used_then_redefined_or_dropped_in_one_process_reports_success() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let sql = format!(
        "CREATE MODEL m FROM 'data/models/linear.onnx'; \
         SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0; \
         CREATE OR REPLACE MODEL m FROM 'data/fixtures/linear_doubled.onnx'; \
         SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0; \
         DROP MODEL m"
    );
    let out = assert_ok(&query(&wh, &sql));
    let expected = format!(
        "s\n{}\ns\n{}\n",
        score_of("data/models/linear.onnx"),
        score_of("data/fixtures/linear_doubled.onnx")
    );
    assert_eq!(out, expected);
    assert!(!wh.join("models/m.json").exists());
}

/// A model of `--models` is its file: a statement that would redefine or drop it (and leave a
/// definition the file hides in the next process) is refused, and a warehouse definition the
/// folder hides is said at start.
#[test]
fn models_of_the_models_folder_are_not_redefined_by_statements() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    for sql in [
        "CREATE OR REPLACE MODEL linear FROM 'data/fixtures/linear_doubled.onnx'",
        "DROP MODEL linear",
    ] {
        let out = query(&wh, sql);
        assert_failure(&out, &["model 'linear' is a file of --models"]);
        assert!(!wh.join("models/linear.json").exists());
    }
    // Defined in the warehouse by a process without --models, then hidden by the folder's file.
    let out = common::output_within(
        bin().arg("--warehouse").arg(&wh).args([
            "query",
            "-e",
            "CREATE MODEL linear FROM 'data/fixtures/linear_doubled.onnx'",
        ]),
        common::DEADLINE,
    );
    assert_ok(&out);
    let out = query(
        &wh,
        "SELECT predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS s \
         FROM 'data/sample/features.parquet' WHERE id = 0",
    );
    assert_eq!(
        assert_ok(&out),
        format!("s\n{}\n", score_of("data/models/linear.onnx"))
    );
    assert!(
        common::stderr(&out).contains("warning: model 'linear' of --models"),
        "{}",
        common::stderr(&out)
    );
}

/// An UNBOUNDED table is a stream (read until its writer stops; an INSERT appends to its file in
/// place): refused, so a FIFO cannot make a statement wait forever nor `/dev/zero` fill the
/// memory, and a failed INSERT cannot leave part of its rows.
#[test]
fn unbounded_tables_are_refused() {
    let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let wh = elsewhere.path().join("wh");
    let fifo = elsewhere.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let csv = dir.path().join("s.csv");
    std::fs::write(&csv, "id,q\n1,1\n").unwrap();
    let before = snapshot(dir.path());
    for location in [fifo.display().to_string(), "/dev/zero".into()] {
        let sql = format!(
            "CREATE UNBOUNDED EXTERNAL TABLE s (id BIGINT, q BIGINT) STORED AS CSV \
             LOCATION '{location}'; SELECT * FROM s LIMIT 1"
        );
        let out = bounded(&wh, &["query", "-e", &sql]);
        assert_failure(&out, &["table 's' cannot be UNBOUNDED"]);
    }
    let sql = format!(
        "CREATE UNBOUNDED EXTERNAL TABLE s (id BIGINT, q BIGINT) STORED AS CSV LOCATION '{}' \
         OPTIONS ('format.has_header' 'true'); \
         INSERT INTO s SELECT id, 10 / (id - 9000) FROM 'data/sample/features.parquet'",
        csv.display()
    );
    let out = bounded(&wh, &["query", "-e", &sql]);
    assert_failure(&out, &["table 's' cannot be UNBOUNDED"]);
    assert_eq!(
        changes(&before, &snapshot(dir.path())),
        Vec::<String>::new()
    );
}

/// sqlparser reads `CAST(`, `NOT (` and the like two ways, the second where the first fails, so
/// a few hundred bytes of them nested around a syntax error would take it years: refused before
/// parsing, while a dozen levels still parse.
#[test]
fn no_hang_from_calls_nested_around_a_syntax_error() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let nested = |n: usize, inner: &str, close: &str| {
        format!(
            "SELECT {}{inner}{} AS x",
            "CAST(".repeat(n),
            close.repeat(n)
        )
    };
    for sql in [
        nested(48, "1", " AS BIGINT)"),
        nested(40, &format!("{}true", "NOT ".repeat(12)), " AS BOOLEAN)"),
        format!("SELECT {}true{}", "NOT (".repeat(48), ")".repeat(48)),
        format!("SELECT {}1{}", "ARRAY[".repeat(48), "]".repeat(48)),
    ] {
        let out = bounded(&wh, &["query", "-e", &sql]);
        assert_failure(&out, &["expression too deep"]);
    }
    let out = bounded(&wh, &["query", "-e", &nested(12, "1", " AS BIGINT)")]);
    assert_eq!(assert_ok(&out), "x\n1\n");
}

/// A password written in a URL (a model's source, a COPY target, an endpoint) is never printed.
#[test]
fn a_password_in_a_url_is_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    for sql in [
        "CREATE MODEL m FROM 'ftp://user:PASSW0RD1@127.0.0.1:1/m.onnx'",
        "COPY (SELECT 1 AS x) TO 'ftp://user:PASSW0RD1@127.0.0.1:1/x.parquet' STORED AS PARQUET",
    ] {
        let out = bounded(&wh, &["query", "-e", sql]);
        let err = assert_failure(&out, &["REDACTED", "which batchinfer has no store for"]);
        assert!(!err.contains("PASSW0RD1"), "{err}");
    }
    for sql in [
        "CREATE MODEL m FROM 'https://user:PASSW0RD1@127.0.0.1:1/m.onnx'",
        "SELECT * FROM 'https://user:PASSW0RD1@127.0.0.1:1/x.parquet'",
        "COPY (SELECT 1 AS x) TO 'https://user:PASSW0RD1@127.0.0.1:1/x.parquet' STORED AS PARQUET",
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 'az://user:PASSW0RD1@c/x/'",
    ] {
        let out = bounded(&wh, &["query", "-e", sql]);
        let err = assert_failure(&out, &[]);
        assert!(!err.contains("PASSW0RD1"), "{err}");
    }
    for endpoint in [
        "http://user:PASSW0RD1@127.0.0.1:1",
        "ftp://user:PASSW0RD1@h",
    ] {
        let out = common::run_bounded(through_endpoint(endpoint), MEMORY, DEADLINE);
        let err = assert_failure(&out, &["S3 endpoint"]);
        assert!(!err.contains("PASSW0RD1"), "{err}");
    }
    // Plans and table definitions that quote the URL, and a warehouse given as one.
    let out = bounded(
        &wh,
        &[
            "query",
            "-e",
            "EXPLAIN COPY (SELECT 1 AS x) TO 's3://u:PASSW0RD1@b/x.parquet'; \
             CREATE EXTERNAL TABLE t (a INT) STORED AS CSV LOCATION 's3://u:PASSW0RD1@b/t.csv'; \
             SHOW CREATE TABLE t",
        ],
    );
    let text = assert_ok(&out);
    assert!(text.contains("s3://u:REDACTED@b/t.csv"), "{text}");
    assert!(!text.contains("PASSW0RD1"), "{text}");
    let out = bounded(
        Path::new("https://u:PASSW0RD1@h/wh/"),
        &["query", "-e", "SELECT 1"],
    );
    let err = assert_failure(&out, &["REDACTED"]);
    assert!(!err.contains("PASSW0RD1"), "{err}");
}

/// A model definition in the warehouse that cannot be read (empty, not JSON) is left out with a
/// warning: the other models and the statements go on, and DROP MODEL IF EXISTS removes it.
#[test]
fn one_unreadable_model_definition_does_not_take_the_warehouse_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE MODEL m FROM 'data/models/linear.onnx'"));
    std::fs::write(wh.join("models/bad.json"), "").unwrap();
    let score = format!("SELECT {PREDICT_M} AS s FROM 'data/sample/features.parquet' WHERE id = 0");
    let out = query(&wh, &score);
    assert_eq!(
        assert_ok(&out),
        format!("s\n{}\n", score_of("data/models/linear.onnx"))
    );
    let err = common::stderr(&out);
    assert!(
        err.contains("warning: a model definition is left out") && err.contains("bad.json"),
        "{err}"
    );
    assert_ok(&query(&wh, "DROP MODEL IF EXISTS bad"));
    assert!(!wh.join("models/bad.json").exists());
    let out = query(&wh, &score);
    assert_ok(&out);
    assert_eq!(common::stderr(&out), "");
}

#[test]
fn a_file_url_naming_another_machine_or_with_a_query_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    for warehouse in [
        format!("file://otherhost{path}/wh"),
        format!("file://{path}/wh?x=1"),
        format!("file://{path}/wh#frag"),
    ] {
        let before = snapshot(dir.path());
        let out = common::output_within(
            bin().args(["--warehouse", &warehouse, "query", "-e"]).arg(
                "CREATE MODEL m FROM 'data/models/linear.onnx'; CREATE TABLE t AS SELECT 1 AS a",
            ),
            common::DEADLINE,
        );
        assert_failure(&out, &["warehouse"]);
        assert!(!common::stderr(&out).contains("nternal error"));
        let changed = changes(&before, &snapshot(dir.path()));
        assert!(changed.is_empty(), "{warehouse} changed {changed:?}");
    }
    let target = format!("file://otherhost{path}/out.parquet");
    let out = query(
        &dir.path().join("wh"),
        &format!("COPY (SELECT 1 AS a) TO '{target}' STORED AS PARQUET"),
    );
    assert_failure(&out, &["names the machine 'otherhost'"]);
    assert!(!dir.path().join("out.parquet").exists());
}

#[test]
fn concurrent_replaces_of_one_table_all_succeed_and_leave_one_whole() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE TABLE two AS SELECT 0 AS v"));
    for _round in 0..3 {
        let mut children: Vec<_> = (1..=6)
            .map(|i| {
                bin()
                    .arg("--warehouse")
                    .arg(&wh)
                    .args([
                        "query",
                        "-e",
                        &format!(
                            "CREATE OR REPLACE TABLE two AS SELECT {i} AS v FROM generate_series(1, 100000)"
                        ),
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in &mut children {
            let status = wait_with_deadline(child, Duration::from_secs(120), "a replace");
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(status.success(), "a replace that committed failed: {err}");
        }
        let out = query(&wh, "SELECT count(*) AS n, count(DISTINCT v) AS k FROM two");
        assert_eq!(assert_ok(&out), "n,k\n100000,1\n");
    }
}

#[test]
fn a_running_process_sees_tables_other_processes_create_replace_and_drop() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(
        &wh,
        "CREATE TABLE t AS SELECT 1 AS gen FROM generate_series(1, 10)",
    ));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let engine = batchinfer::Engine::open(batchinfer::EngineConfig {
                warehouse: Some(wh.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
            let sql = |text: &'static str| {
                let engine = &engine;
                async move {
                    let frame = engine.sql(text).await?;
                    let batches = frame.collect().await?;
                    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                        .unwrap()
                        .to_string();
                    Ok::<_, batchinfer::Error>(text)
                }
            };
            let counts = "SELECT gen, count(*) AS n FROM t GROUP BY gen";
            assert!(sql(counts).await.unwrap().contains("| 1   | 10 |"));
            // Replaced elsewhere: read from its new files.
            assert_ok(&query(
                &wh,
                "CREATE OR REPLACE TABLE t AS SELECT 2 AS gen FROM generate_series(1, 5)",
            ));
            let now = sql(counts).await.unwrap();
            assert!(
                now.contains("| 2   | 5 |") && !now.contains("| 1 "),
                "{now}"
            );
            // Created elsewhere: there.
            assert_ok(&query(&wh, "CREATE TABLE u AS SELECT 7 AS x"));
            assert!(sql("SELECT x FROM u").await.unwrap().contains("| 7 |"));
            // Replaced elsewhere with other columns: read with its new columns.
            assert_ok(&query(
                &wh,
                "CREATE OR REPLACE TABLE t AS SELECT 'x' AS gen, 9 AS w",
            ));
            let now = sql("SELECT gen, w FROM t").await.unwrap();
            assert!(now.contains("| x   | 9 |"), "{now}");
            // Dropped elsewhere: gone, and its name free again.
            assert_ok(&query(&wh, "DROP TABLE t"));
            let gone = sql("SELECT * FROM t").await.unwrap_err().to_string();
            assert!(gone.contains("t"), "{gone}");
            sql("CREATE TABLE t AS SELECT 3 AS gen").await.unwrap();
            assert!(sql(counts).await.unwrap().contains("| 3   | 1 |"));
        });
}

#[test]
fn models_folder_names_are_names_and_one_models_each() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(models.join("dup")).unwrap();
    for file in [
        "x.y.onnx",
        ".hidden.onnx",
        "p%20q.onnx",
        "ok.onnx",
        "dup.onnx",
    ] {
        std::fs::copy("data/models/linear.onnx", models.join(file)).unwrap();
    }
    std::fs::copy("data/models/lookup.onnx", models.join("dup/model.onnx")).unwrap();
    let with_models = |sql: &str| {
        common::output_within(
            bin()
                .arg("--warehouse")
                .arg(dir.path().join("wh"))
                .arg("--models")
                .arg(&models)
                .args(["query", "-e", sql]),
            common::DEADLINE,
        )
    };
    let out = with_models("SELECT name FROM models() ORDER BY name");
    assert_eq!(assert_ok(&out), "name\ndup\nok\n");
    let err = common::stderr(&out);
    for file in ["x.y.onnx", ".hidden.onnx", "p%20q.onnx", "dup/model.onnx"] {
        assert!(
            err.contains(&format!("warning: {file} in")),
            "{file}: {err}"
        );
    }
    // `dup` is dup.onnx (the linear model), not the folder's.
    let out = with_models("DESCRIBE MODEL dup");
    assert!(assert_ok(&out).contains("[N, 10]"), "{}", stdout(&out));
}

#[test]
fn an_unreadable_model_definition_can_be_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE MODEL m FROM 'data/models/linear.onnx'"));
    std::fs::write(wh.join("models/broken.json"), "not json").unwrap();
    let out = query(&wh, "DROP MODEL broken");
    assert_ok(&out);
    assert!(!wh.join("models/broken.json").exists());
    assert!(wh.join("models/m.json").exists());
    assert_failure(
        &query(&wh, "DROP MODEL broken"),
        &["unknown model 'broken'"],
    );
}

#[test]
fn a_failed_explain_analyze_of_a_write_leaves_what_was_there() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let define = table_of_two_rows(dir.path(), &wh);
    let before = snapshot(dir.path());
    for write in [
        format!("{define}; EXPLAIN ANALYZE INSERT INTO t {FAILS_LATE}"),
        format!(
            "EXPLAIN ANALYZE COPY ({FAILS_LATE}) TO '{}' STORED AS PARQUET",
            dir.path().join("out.parquet").display()
        ),
        format!(
            "EXPLAIN ANALYZE COPY ({FAILS_LATE}) TO '{}/' STORED AS PARQUET",
            dir.path().join("out").display()
        ),
    ] {
        assert_failure(&query(&wh, &write), &[]);
        let changed = changes(&before, &snapshot(dir.path()));
        assert!(changed.is_empty(), "{write} changed {changed:?}");
    }
    // One that succeeds writes, and explains itself.
    let out = query(
        &wh,
        &format!(
            "{define}; EXPLAIN ANALYZE INSERT INTO t VALUES (3, 3); SELECT count(*) AS n FROM t"
        ),
    );
    let printed = assert_ok(&out);
    assert!(
        printed.contains("DataSinkExec") && printed.ends_with("n\n3\n"),
        "{printed}"
    );
}

#[test]
fn hidden_files_of_a_killed_insert_are_removed_by_the_next_process() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    assert_ok(&query(&wh, "CREATE TABLE t AS SELECT 1 AS a"));
    // A process that is gone, and this one (running).
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let folder = wh.join("tables/t");
    let dead = folder.join(format!(".x_0.parquet.batchinfer-{gone_pid}-0.partial#1"));
    let live = folder.join(format!(
        ".y_0.parquet.batchinfer-{}-0.partial",
        std::process::id()
    ));
    // Last written two hours ago (a writer's file is left alone for an hour).
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    for (file, text) in [(&dead, "half a file"), (&live, "being written")] {
        std::fs::write(file, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(two_hours_ago)
            .unwrap();
    }
    let recent = folder.join(format!(".r_0.parquet.batchinfer-{gone_pid}-1.partial"));
    std::fs::write(&recent, "written a moment ago").unwrap();
    // A folder holding only a write in progress is no table (yet).
    std::fs::create_dir_all(wh.join("tables/u")).unwrap();
    std::fs::write(
        wh.join(format!(
            "tables/u/.z_0.parquet.batchinfer-{}-0.partial",
            std::process::id()
        )),
        "being written",
    )
    .unwrap();
    let out = query(&wh, "SELECT count(*) AS n FROM t");
    assert_eq!(assert_ok(&out), "n\n1\n");
    assert!(
        !common::stderr(&out).contains("warning"),
        "{}",
        common::stderr(&out)
    );
    assert!(!dead.exists(), "the killed writer's file is left");
    assert!(live.exists(), "a running writer's file was removed");
    assert!(recent.exists(), "a file written a moment ago was removed");
}

/// A file whose last 8 bytes claim `claimed` bytes of metadata, `size` bytes long (sparse: it
/// takes no room on disk).
fn claiming_footer(path: &Path, size: u64, claimed: u32) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
    file.write_all_at(b"PAR1", 0).unwrap();
    let mut tail = claimed.to_le_bytes().to_vec();
    tail.extend_from_slice(b"PAR1");
    file.write_all_at(&tail, size - 8).unwrap();
}

/// A footer is not trusted for its length: a 6 GB sparse file claiming 4 GiB of metadata, run
/// under a 3 GiB address-space limit, is one error naming the file and the setting (it was an
/// abort on a 4 GiB allocation); the setting bounds real files too.
#[test]
fn a_parquet_footer_claiming_gigabytes_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.parquet");
    claiming_footer(&huge, 6 << 30, u32::MAX - 15);
    for streaming in ["true", "false"] {
        let mut command = bin();
        command.args([
            "query",
            "-e",
            &format!(
                "SET batchinfer.streaming_scan = {streaming}; SELECT count(*) FROM '{}'",
                huge.display()
            ),
        ]);
        let out = common::run_bounded(command, 3 << 30, DEADLINE);
        let stderr = assert_failure(
            &out,
            &[
                "huge.parquet",
                "4294967280 bytes of metadata",
                "batchinfer.max_footer_bytes",
            ],
        );
        assert!(!stderr.contains("internal error"), "{stderr}");
    }
    let out = query(
        &dir.path().join("wh"),
        "SET batchinfer.max_footer_bytes = '100'; SELECT count(*) FROM 'data/sample/features.parquet'",
    );
    assert_failure(
        &out,
        &[
            "features.parquet",
            "more than batchinfer.max_footer_bytes (100)",
        ],
    );
    let out = query(
        &dir.path().join("wh"),
        "SET batchinfer.max_footer_bytes = '-1'",
    );
    assert_failure(&out, &["batchinfer.max_footer_bytes", "-1"]);
    let out = query(&dir.path().join("wh"), "SET batchinfer.batch_size = '-1'");
    assert_failure(&out, &["batchinfer.batch_size = '-1'"]);
}

/// Files that end like Parquet and lie about the rest (`PAR1garbagePAR1`, a footer longer than
/// the file, a file of 8 bytes) are errors naming the file, never panics.
#[test]
fn junk_files_ending_like_parquet_are_errors_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>); 3] = [
        ("garbage.parquet", b"PAR1garbagePAR1".to_vec()),
        ("longer.parquet", {
            let mut bytes = b"PAR1".to_vec();
            bytes.extend_from_slice(&[7u8; 100]);
            bytes.extend_from_slice(&1000u32.to_le_bytes());
            bytes.extend_from_slice(b"PAR1");
            bytes
        }),
        ("eight.parquet", b"\0\0\0\0PAR1".to_vec()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        for streaming in ["true", "false"] {
            let out = query(
                &dir.path().join("wh"),
                &format!(
                    "SET batchinfer.streaming_scan = {streaming}; SELECT * FROM '{}'",
                    path.display()
                ),
            );
            let stderr = assert_failure(&out, &[name]);
            assert!(!stderr.contains("internal error"), "{name}: {stderr}");
            assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        }
    }
}

/// The head of one HTTP request (its request line and headers), read from `stream`.
fn read_request(stream: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    let mut request = Vec::new();
    let mut byte = [0u8; 1];
    while !request.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => request.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&request).into_owned()
}

/// An HTTP server answering as if its object were replaced between requests: HEAD gives one
/// size and the reads the bytes of a shorter file. Serves until the test ends.
fn replacing_http_server(first: Vec<u8>, second: Vec<u8>) -> String {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let request = read_request(&mut stream);
            let range = request.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                if !name.eq_ignore_ascii_case("range") {
                    return None;
                }
                let (start, end) = value.trim().strip_prefix("bytes=")?.split_once('-')?;
                Some((start.parse::<usize>().ok()?, end.parse::<usize>().ok()?))
            });
            let headers = "ETag: \"v1\"\r\nLast-Modified: Tue, 01 Dec 2026 00:00:00 GMT\r\n\
                           Connection: close\r\n";
            let response = if request.starts_with("HEAD") {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{headers}\r\n",
                    first.len()
                )
                .into_bytes()
            } else {
                let (start, end) = range.unwrap_or((0, second.len() - 1));
                let end = end.min(second.len() - 1);
                if start > end {
                    format!(
                        "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n{headers}\r\n"
                    )
                    .into_bytes()
                } else {
                    let mut response = format!(
                        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\n\
                         Content-Range: bytes {start}-{end}/{}\r\n{headers}\r\n",
                        end - start + 1,
                        second.len()
                    )
                    .into_bytes();
                    response.extend_from_slice(&second[start..=end]);
                    response
                }
            };
            let _ = stream.write_all(&response);
        }
    });
    url
}

/// An HTTP object replaced by a shorter one between the requests that read it is an error
/// naming it (it was a panic inside parquet's decoder).
#[test]
fn an_http_object_replaced_while_it_is_read_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
    assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "COPY (SELECT value AS id, value * 2 AS x FROM range(20000)) TO '{}' STORED AS PARQUET;
             COPY (SELECT value AS id FROM range(100)) TO '{}' STORED AS PARQUET",
            a.display(),
            b.display()
        ),
    ));
    let url = replacing_http_server(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let out = query(
        &dir.path().join("wh"),
        &format!("SELECT count(*) FROM '{url}/data/f.parquet'"),
    );
    let stderr = assert_failure(&out, &["f.parquet"]);
    assert!(!stderr.contains("internal error"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A folder whose Parquet files are only in subfolders says so, naming one; a number too large
/// for any number type is refused, not read as infinity.
#[test]
fn a_folder_of_subfolders_and_a_huge_number_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("d/2026-12-01");
    std::fs::create_dir_all(&sub).unwrap();
    assert_ok(&query(
        &dir.path().join("wh"),
        &format!(
            "COPY (SELECT 1 AS one) TO '{}' STORED AS PARQUET",
            sub.join("a.parquet").display()
        ),
    ));
    let out = query(
        &dir.path().join("wh"),
        &format!("SELECT * FROM '{}/d/'", dir.path().display()),
    );
    assert_failure(&out, &["no files of its own", "2026-12-01/", "FROM '"]);
    let huge = "9".repeat(5_000_000);
    let script = dir.path().join("huge.sql");
    std::fs::write(&script, format!("SELECT {huge} AS x")).unwrap();
    let mut command = bin();
    command.args(["query", "-f", script.to_str().unwrap()]);
    let out = common::run_bounded(command, MEMORY, DEADLINE);
    let stderr = assert_failure(
        &out,
        &["larger than any number type holds", "5000000 characters"],
    );
    assert!(stderr.len() < 1_000, "{}", stderr.len());
    assert_failure(
        &query(&dir.path().join("wh"), "SELECT 1e400 AS x"),
        &["the number 1e400 is larger"],
    );
}

/// An HTTP server whose every answer is a redirect to `to`, counting the requests it gets.
fn redirecting_http_server(to: String) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = asked.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            read_request(&mut stream);
            let _ = stream.write_all(
                format!(
                    "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\
                     Connection: close\r\n\r\n"
                )
                .as_bytes(),
            );
        }
    });
    (url, asked)
}

/// An HTTP server redirecting to another host is not followed there: the other host gets no
/// request, and the read is one error naming the redirect.
#[test]
fn http_redirects_to_another_host_are_not_followed() {
    let (elsewhere, reached) = redirecting_http_server("http://127.0.0.1:9/x".into());
    let (server, _) = redirecting_http_server(format!("{elsewhere}/f.parquet"));
    let dir = tempfile::tempdir().unwrap();
    let out = query(
        &dir.path().join("wh"),
        &format!("SELECT count(*) FROM '{server}/data/f.parquet'"),
    );
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("f.parquet"), "{stderr}");
    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the redirect to another host was followed: {stderr}"
    );
}
