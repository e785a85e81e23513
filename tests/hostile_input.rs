//! Hostile input, through the real binary: no file, FIFO, device, footer, server or statement
//! makes batchinfer allocate without bound, hang or crash; each is one clear error naming it.

mod common;
mod fixtures;
mod s3_server;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{assert_failure, assert_ok, bin, changes, query, snapshot};
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
