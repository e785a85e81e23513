//! PostgreSQL and SQLite tables as sources and sinks, through the real binary: against a real
//! PostgreSQL server the tests start (Debian's package; `psql` reads what batchinfer wrote), and
//! SQLite files checked with SQLite itself (rusqlite).

mod common;
mod postgres;

use std::path::Path;
use std::process::{Command, Output};

use common::{assert_failure, assert_ok};
use postgres::{PASSWORD, Postgres};

/// The churn model's inputs over `rows` customers (ids 0..rows), as Parquet at `path`.
fn customers_parquet(path: &Path, rows: u64) {
    let out = run(
        common::bin(),
        &format!(
            "COPY ({}) TO '{}' STORED AS PARQUET",
            postgres::customers_query(rows),
            path.display()
        ),
    );
    assert_ok(&out);
}

fn run(mut command: Command, sql: &str) -> Output {
    common::output_within(
        command.args(["--models", "data/models", "query", "-e", sql]),
        common::DEADLINE,
    )
}

/// The binary with no `PG*` settings of the test's own environment.
fn batchinfer() -> Command {
    common::bin_without_env(&["PG"])
}

/// The scoring job both ways: id, label and the probability of churn.
const SCORES: &str = "SELECT id, predict('churn', city, age, spend)['label'] AS label,
                             predict('churn', city, age, spend)['probabilities'][2] AS p";

/// Rows `id,label,p` (a header first) as `common::rows` reads them.
fn scored(csv: &str) -> Vec<(i64, Vec<f64>)> {
    common::rows(csv)
}

#[test]
fn postgres_rows_are_scored_and_written_back_as_the_same_job_over_parquet() {
    let Some(pg) = Postgres::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let parquet = dir.path().join("customers.parquet");
    customers_parquet(&parquet, 100_000);
    // The same rows into PostgreSQL, by psql from CSV.
    let csv = dir.path().join("customers.csv");
    let out = run(
        common::bin(),
        &format!("SELECT * FROM '{}' ORDER BY id", parquet.display()),
    );
    std::fs::write(&csv, assert_ok(&out)).unwrap();
    pg.psql(
        "CREATE TABLE customers (id bigint PRIMARY KEY, city text, age real, spend real);
         CREATE TABLE churn_scores (id bigint, label bigint, p real);",
    );
    pg.psql_with_input(
        "\\copy customers FROM STDIN WITH (FORMAT csv, HEADER true)",
        Some(&csv),
    );
    assert_eq!(pg.psql("SELECT count(*) FROM customers"), "100000\n");

    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE customers STORED AS POSTGRES LOCATION 'public.customers' {};
             CREATE EXTERNAL TABLE churn_scores STORED AS POSTGRES LOCATION 'churn_scores'
             OPTIONS ('url' '{}');
             INSERT INTO churn_scores {SCORES} FROM customers",
            pg.options(),
            pg.url()
        ),
    );
    assert_eq!(assert_ok(&out), "count\n100000\n");
    let written = format!(
        "id,label,p\n{}",
        pg.psql("SELECT id, label, p FROM churn_scores ORDER BY id")
    );
    let from_parquet = run(
        common::bin(),
        &format!("{SCORES} FROM '{}' ORDER BY id", parquet.display()),
    );
    let expected = scored(&assert_ok(&from_parquet));
    let written = scored(&written);
    assert_eq!(written.len(), 100_000);
    // Labels exactly; probabilities as PostgreSQL's real keeps them (float32, printed to 6
    // significant digits by psql).
    common::assert_same_rows(&written, &expected, 1e-5);
    let labels: std::collections::BTreeSet<i64> =
        written.iter().map(|(_, r)| r[0] as i64).collect();
    assert_eq!(labels.len(), 2, "both classes are predicted");
}

/// docs/databases.md's PostgreSQL example, run against the tests' server (its settings in place
/// of the example's): the labels written are those of the same job over the Parquet file.
#[test]
fn the_databases_guides_postgres_example_runs() {
    let Some(pg) = Postgres::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("customers.csv");
    let out = run(
        common::bin(),
        "SELECT id, city, age, spend FROM 'data/sample/customers.parquet' ORDER BY id",
    );
    std::fs::write(&csv, assert_ok(&out)).unwrap();
    pg.psql(
        "CREATE TABLE customers (id bigint PRIMARY KEY, city text, age real, spend real);
         CREATE TABLE churn_scores (id bigint, label bigint);",
    );
    pg.psql_with_input(
        "\\copy customers FROM STDIN WITH (FORMAT csv, HEADER true)",
        Some(&csv),
    );
    let examples = common::examples_with("docs/databases.md", "STORED AS POSTGRES");
    assert_eq!(examples.len(), 1, "{examples:?}");
    let example = examples[0]
        .replace(
            "OPTIONS ('host' 'db.internal', 'port' '5432', 'db' 'shop', 'user' 'app', 'pass' '...')",
            &pg.options(),
        )
        .replace("postgres://app:...@db.internal:5432/shop", &pg.url());
    assert!(!example.contains("db.internal"), "{example}");
    assert_ok(&run(batchinfer(), &example));
    let written = pg.psql("SELECT id, label FROM churn_scores ORDER BY id");
    let from_parquet = run(
        common::bin(),
        "SELECT id, predict('churn', city, age, spend)['label'] AS label \
         FROM 'data/sample/customers.parquet' ORDER BY id",
    );
    let expected = assert_ok(&from_parquet);
    assert_eq!(format!("id,label\n{written}"), expected);
}

#[test]
fn filters_and_projections_run_in_postgres() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql(
        "CREATE TABLE customers (id bigint, city text, age real, spend real);
         INSERT INTO customers SELECT i, 'c' || (i % 7), 20 + i % 50, i FROM generate_series(1, 5000) i;",
    );
    // Settings from the PG* variables, as libpq reads them.
    let mut command = batchinfer();
    command
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", pg.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGPASSWORD", PASSWORD)
        .env("PGDATABASE", "postgres")
        .env("PGSSLMODE", "disable");
    let out = run(
        command,
        "CREATE EXTERNAL TABLE customers STORED AS POSTGRES LOCATION 'customers';
         SELECT count(*) AS n, sum(id) AS s FROM customers WHERE age > 60 AND city = 'c3';
         EXPLAIN SELECT id FROM customers WHERE id > 4000 LIMIT 5",
    );
    let text = assert_ok(&out);
    let expected =
        pg.psql("SELECT count(*), sum(id) FROM customers WHERE age > 60 AND city = 'c3'");
    assert!(
        text.starts_with(&format!("n,s\n{expected}")),
        "{text}\nexpected {expected}"
    );
    // The query PostgreSQL runs reads one column, filters and limits there.
    let sql = text
        .lines()
        .find(|l| l.contains("SqlExec sql="))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(sql.contains("WHERE") && sql.contains("LIMIT 5"), "{sql}");
    assert!(!sql.contains("spend") && !sql.contains('*'), "{sql}");
}

#[test]
fn a_failing_insert_leaves_the_postgres_table_as_it_was() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql(
        "CREATE TABLE scores (id bigint, q bigint);
         INSERT INTO scores VALUES (1, 10), (2, 20), (3, 30);",
    );
    let before = pg.psql("SELECT * FROM scores ORDER BY id");
    // `lookup` fails on the input 99, given on the last of 200,000 rows: by then the earlier
    // rows have been sent to PostgreSQL.
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE scores STORED AS POSTGRES LOCATION 'scores' OPTIONS ('url' '{}');
             INSERT INTO scores SELECT value AS id,
               predict('lookup', CASE WHEN value = 199999 THEN 99 ELSE value % 10 END) AS q
             FROM range(200000)",
            pg.url()
        ),
    );
    assert_failure(&out, &["model 'lookup' failed"]);
    assert_eq!(pg.psql("SELECT * FROM scores ORDER BY id"), before);
}

#[test]
fn postgres_errors_name_the_table_and_server_never_the_password() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql("CREATE TABLE customers (id bigint)");
    let wrong = "not-the-Password-42";
    for options in [
        format!(
            "OPTIONS ('host' '127.0.0.1', 'port' '{}', 'user' 'postgres', 'db' 'postgres', \
             'pass' '{wrong}', 'sslmode' 'disable')",
            pg.port
        ),
        format!(
            "OPTIONS ('url' 'postgres://postgres:{wrong}@127.0.0.1:{}/postgres?sslmode=disable')",
            pg.port
        ),
    ] {
        let out = run(
            batchinfer(),
            &format!("CREATE EXTERNAL TABLE c STORED AS POSTGRES LOCATION 'customers' {options}"),
        );
        let err = assert_failure(
            &out,
            &[
                "'c'",
                &format!("postgres@127.0.0.1:{}/postgres", pg.port),
                "password",
            ],
        );
        assert!(!err.contains(wrong), "{err}");
    }
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS POSTGRES LOCATION 'public.nosuch' {}",
            pg.options()
        ),
    );
    let err = assert_failure(&out, &["'c'", "nosuch", "no such table"]);
    assert!(!err.contains(PASSWORD), "{err}");
    // Created by the session's table factory, which the password reaches; neither an EXPLAIN
    // of the statement nor what the session says of its tables shows it.
    let create = format!(
        "CREATE EXTERNAL TABLE c STORED AS POSTGRES LOCATION 'customers' {}",
        pg.options()
    );
    let out = run(
        batchinfer(),
        &format!(
            "EXPLAIN {create}; {create}; SELECT count(*) AS n FROM c;              SELECT * FROM information_schema.tables; SHOW COLUMNS FROM c"
        ),
    );
    let shown = format!("{}{}", assert_ok(&out), common::stderr(&out));
    assert!(shown.contains("CreateExternalTable"), "{shown}");
    assert!(!shown.contains(PASSWORD), "{shown}");
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS POSTGRES LOCATION 'customers' {}",
            pg.options().replace("'host'", "'hots'")
        ),
    );
    assert_failure(&out, &["no option 'hots'", "'host'"]);
}

fn sqlite(path: &Path, sql: &str) {
    rusqlite::Connection::open(path)
        .unwrap()
        .execute_batch(sql)
        .unwrap();
}

fn sqlite_rows(path: &Path, sql: &str) -> Vec<(i64, f64)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn.prepare(sql).unwrap();
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn sqlite_tables_are_read_and_written_in_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db");
    let parquet = dir.path().join("customers.parquet");
    customers_parquet(&parquet, 2_000);
    sqlite(
        &db,
        "CREATE TABLE customers (id INTEGER PRIMARY KEY, city TEXT, age REAL, spend REAL);
         CREATE TABLE churn_scores (id INTEGER, label INTEGER, p REAL);",
    );
    // Filled by batchinfer from Parquet, scored from SQLite into the empty table beside it.
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE customers STORED AS SQLITE LOCATION '{db}';
             CREATE EXTERNAL TABLE scores STORED AS SQLITE LOCATION '{db}'
             OPTIONS ('table' 'churn_scores');
             INSERT INTO customers SELECT * FROM '{parquet}';
             INSERT INTO scores {SCORES} FROM customers;
             SELECT count(*) AS n FROM customers",
            db = db.display(),
            parquet = parquet.display()
        ),
    );
    assert_eq!(assert_ok(&out), "count\n2000\ncount\n2000\nn\n2000\n");
    let written: Vec<(i64, Vec<f64>)> = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut statement = conn
            .prepare("SELECT id, label, p FROM churn_scores ORDER BY id")
            .unwrap();
        statement
            .query_map([], |row| {
                Ok((row.get(0)?, vec![row.get::<_, i64>(1)? as f64, row.get(2)?]))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    let from_parquet = run(
        common::bin(),
        &format!("{SCORES} FROM '{}' ORDER BY id", parquet.display()),
    );
    common::assert_same_rows(&written, &scored(&assert_ok(&from_parquet)), 1e-6);
    // A failing INSERT: nothing of it stays.
    let before = sqlite_rows(&db, "SELECT id, p FROM churn_scores ORDER BY id");
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE scores STORED AS SQLITE LOCATION '{}'
             OPTIONS ('table' 'churn_scores');
             INSERT INTO scores SELECT value, predict('lookup', CASE WHEN value = 99999 THEN 99
               ELSE value % 10 END), 0.5 FROM range(100000)",
            db.display()
        ),
    );
    assert_failure(&out, &["model 'lookup' failed"]);
    assert_eq!(
        sqlite_rows(&db, "SELECT id, p FROM churn_scores ORDER BY id"),
        before
    );
    // Columns declared without a telling type are what their rows hold; two kinds in one column
    // are refused, naming it.
    sqlite(
        &db,
        "CREATE TABLE loose (a, b DATETIME);
         INSERT INTO loose VALUES (1, 1700000000), (2, 1700000060);
         CREATE TABLE mixed (id INTEGER, c NUMERIC);
         INSERT INTO mixed VALUES (1, 1), (2, 'two');",
    );
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE l STORED AS SQLITE LOCATION '{}' OPTIONS ('table' 'loose');
             SELECT sum(a) AS a, max(b) AS b FROM l",
            db.display()
        ),
    );
    assert_eq!(assert_ok(&out), "a,b\n3,1700000060\n");
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE m STORED AS SQLITE LOCATION '{}' OPTIONS ('table' 'mixed')",
            db.display()
        ),
    );
    assert_failure(
        &out,
        &["column 'c' holds values of several kinds (integer, text)"],
    );
    // The database file is as it was: no journal mode changed, no file beside it.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    assert!(!dir.path().join("shop.db-wal").exists());
    // A missing file is not created; a missing table is named.
    let missing = dir.path().join("missing.db");
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS SQLITE LOCATION '{}'",
            missing.display()
        ),
    );
    assert_failure(&out, &["missing.db"]);
    assert!(!missing.exists());
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS SQLITE LOCATION '{}' OPTIONS ('table' 'nosuch')",
            db.display()
        ),
    );
    assert_failure(&out, &["no table 'nosuch'"]);
    // A table name is a name, never SQL: hostile ones are no table, and the database is as it was.
    let before = std::fs::read(&db).unwrap();
    for hostile in [
        "customers\"; DROP TABLE customers; --",
        "customers' OR '1'='1",
        "x\") UNION SELECT sql FROM sqlite_master --",
    ] {
        let out = run(
            batchinfer(),
            &format!(
                "CREATE EXTERNAL TABLE t STORED AS SQLITE LOCATION '{}' OPTIONS ('table' '{}')",
                db.display(),
                hostile.replace('\'', "''")
            ),
        );
        assert_failure(&out, &["no table"]);
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

/// A LOCATION is a table's name, never SQL: one that is not the name of a table is refused
/// before anything of it reaches the server.
#[test]
fn a_postgres_location_is_a_name_never_sql() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql("CREATE SEQUENCE probe; CREATE TABLE likes (id bigint)");
    for location in [
        "(select nextval('probe') as n) t",
        "likes, (select nextval('probe')) x --",
        "likes l, pg_sleep(3) --",
    ] {
        let out = run(
            batchinfer(),
            &format!(
                "CREATE EXTERNAL TABLE w STORED AS POSTGRES LOCATION '{}' {}",
                location.replace('\'', "''"),
                pg.options()
            ),
        );
        assert_failure(&out, &["no such table"]);
    }
    assert_eq!(pg.psql("SELECT is_called FROM probe"), "f\n");
}

/// Filters the database would answer otherwise than DataFusion stay in DataFusion: the answers
/// are those of the same rows in Parquet.
#[test]
fn filters_answer_as_datafusion_does_whatever_runs_them() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql(
        "CREATE TABLE t (id bigint, s text COLLATE \"und-x-icu\", r real);
         INSERT INTO t VALUES (1, 'abc', 20.1), (2, 'ABC', 1.5), (3, 'aXc', 20.1), (4, 'a%c', 3);",
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("t.db");
    sqlite(
        &db,
        "CREATE TABLE t (id INTEGER, s TEXT COLLATE NOCASE, r REAL, d DATE);
         INSERT INTO t VALUES (1, 'abc', 20.1, '2024-01-02'), (2, 'ABC', 1.5, '1999-12-31'),
                              (3, 'aXc', 20.1, '2024-05-06'), (4, 'a%c', 3, NULL);",
    );
    let filters = [
        ("s LIKE 'a_c'", "1 3 4"),
        ("s LIKE '%C'", "2"),
        ("s NOT LIKE 'a%'", "2"),
        ("s ILIKE 'A%'", "1 2 3 4"),
        // Bytes, not the database's collation (ICU's puts 'abc' before 'B'; NOCASE makes
        // 'ABC' equal 'abc').
        ("s = 'abc'", "1"),
        ("s IN ('abc', 'x')", "1"),
        ("s <> 'abc'", "2 3 4"),
        ("s < 'B'", "2"),
        ("s BETWEEN 'A' AND 'B'", "2"),
        // The same number as the column's type holds it (PostgreSQL's real is a float, SQLite's
        // a double).
        ("r = CAST(20.1 AS {real})", "1 3"),
        ("r < CAST('inf' AS DOUBLE) AND id > 2", "3 4"),
        ("id > 1 AND id <= 3", "2 3"),
    ];
    for (store, table, real) in [
        (
            "POSTGRES",
            format!("LOCATION 't' OPTIONS ('url' '{}')", pg.url()),
            "REAL",
        ),
        ("SQLITE", format!("LOCATION '{}'", db.display()), "DOUBLE"),
    ] {
        for (filter, ids) in filters {
            let filter = filter.replace("{real}", real);
            let out = run(
                batchinfer(),
                &format!(
                    "CREATE EXTERNAL TABLE t STORED AS {store} {table};
                     SELECT id FROM t WHERE {filter} ORDER BY id"
                ),
            );
            let got: Vec<String> = assert_ok(&out)
                .lines()
                .skip(1)
                .map(str::to_string)
                .collect();
            assert_eq!(got.join(" "), ids, "{store}: {filter}");
        }
    }
    // SQLite's dates are text, compared as text.
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS SQLITE LOCATION '{}';
             SELECT id, max(d) OVER () AS last FROM t WHERE d > '2000-01-01' ORDER BY id",
            db.display()
        ),
    );
    assert_eq!(assert_ok(&out), "id,last\n1,2024-05-06\n3,2024-05-06\n");
}

/// A server that takes the connection and never answers: an error within the connect timeout.
#[test]
fn a_postgres_server_that_never_answers_is_an_error_not_a_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(4) {
            held.push(stream);
        }
        std::thread::sleep(std::time::Duration::from_secs(60));
    });
    let started = std::time::Instant::now();
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS POSTGRES LOCATION 't'
             OPTIONS ('host' '127.0.0.1', 'port' '{port}', 'user' 'u', 'pass' 'p', 'sslmode' 'disable')"
        ),
    );
    assert_failure(&out, &["did not answer within 30 s"]);
    assert!(started.elapsed() < std::time::Duration::from_secs(45));
    drop(held);
}

/// A bare name is the table the search path finds, its columns and its rows alike; declared
/// columns that are not the table's are refused, not used.
#[test]
fn a_bare_postgres_name_is_the_search_paths_table() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql(
        "CREATE SCHEMA app;
         CREATE TABLE app.t (id bigint, a text);
         INSERT INTO app.t VALUES (1, 'from app');
         CREATE TABLE public.t (x integer);
         INSERT INTO public.t VALUES (7);
         ALTER ROLE postgres SET search_path = app, public;
         CREATE TABLE app.scores (id bigint, label bigint);",
    );
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE t STORED AS POSTGRES LOCATION 't' OPTIONS ('url' '{}');
             SELECT * FROM t",
            pg.url()
        ),
    );
    assert_eq!(assert_ok(&out), "id,a\n1,from app\n");
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE s (id BIGINT, other TEXT) STORED AS POSTGRES LOCATION 'scores'
             OPTIONS ('url' '{}')",
            pg.url()
        ),
    );
    assert_failure(&out, &["exists with other columns", "label"]);
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE s (id BIGINT, label BIGINT) STORED AS POSTGRES
             LOCATION 'scores' OPTIONS ('url' '{url}');
             CREATE EXTERNAL TABLE n (id BIGINT, note TEXT) STORED AS POSTGRES
             LOCATION 'notes' OPTIONS ('url' '{url}');
             INSERT INTO n VALUES (1, 'new');",
            url = pg.url()
        ),
    );
    assert_eq!(assert_ok(&out), "count\n1\n");
    assert_eq!(pg.psql("SELECT * FROM app.notes"), "1,new\n");
}

/// Rows of `sql` (one integer column) read by SQLite itself.
fn sqlite_count(path: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(sql, [], |row| row.get(0))
        .unwrap()
}

/// The database is whole and holds just the rows it had: no journal left beside it, SQLite's
/// integrity check passes on a copy of the file alone, and batchinfer reads and writes it.
fn assert_sqlite_as_it_was(dir: &Path, db: &Path) {
    let journal = dir.join("o.db-journal");
    assert!(!journal.exists(), "a hot journal was left: {journal:?}");
    let copy = dir.join("copy.db");
    std::fs::copy(db, &copy).unwrap();
    let check: String = rusqlite::Connection::open(&copy)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    assert_eq!(sqlite_count(db, "SELECT count(*) FROM o"), 3);
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE o STORED AS SQLITE LOCATION '{}';
             INSERT INTO o VALUES (4, 4.0);
             SELECT count(*) AS n FROM o",
            db.display()
        ),
    );
    assert_eq!(assert_ok(&out), "count\n1\nn\n4\n");
    sqlite(db, "DELETE FROM o WHERE id = 4");
}

/// The plain INSERT the cancellations stop: 3M rows from a table function, no model, so that
/// nothing in the input looks for the stop.
fn big_insert(db: &Path) -> String {
    format!(
        "CREATE EXTERNAL TABLE o STORED AS SQLITE LOCATION '{}';
         INSERT INTO o SELECT value AS id, CAST(value AS DOUBLE) AS x FROM range(3000000)",
        db.display()
    )
}

/// A SQLite INSERT stopped by SIGINT or SIGTERM while its rows flow is rolled back before the
/// process says so and exits: the table holds its old rows, no hot journal is left, and the
/// file is whole on its own.
#[test]
fn a_cancelled_sqlite_insert_is_rolled_back_before_the_process_ends() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    sqlite(
        &db,
        "CREATE TABLE o (id INTEGER, x REAL); INSERT INTO o VALUES (1, 1), (2, 2), (3, 3);",
    );
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut child = batchinfer()
            .args(["query", "-e", &big_insert(&db)])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Rows are in the transaction once SQLite keeps a journal of the pages they change.
        let journal = dir.path().join("o.db-journal");
        common::poll_until(common::DEADLINE, "the INSERT writing rows", || {
            journal.exists()
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the INSERT ended before the signal: the test tests nothing"
        );
        common::send(child.id(), signal);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("nothing it wrote was kept"), "{stderr}");
        assert_sqlite_as_it_was(dir.path(), &db);
    }
}

/// Ctrl-C in the shell during a SQLite INSERT: the prompt comes back once the insert is rolled
/// back, and the same shell reads the table with its old rows.
#[test]
fn ctrl_c_in_the_shell_rolls_a_sqlite_insert_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db");
    sqlite(
        &db,
        "CREATE TABLE o (id INTEGER, x REAL); INSERT INTO o VALUES (1, 1), (2, 2), (3, 3);",
    );
    let command = format!(
        "{} shell --models data/models",
        env!("CARGO_BIN_EXE_batchinfer")
    );
    let mut session =
        rexpect::spawn(&command, Some(60_000)).expect("the shell starts in a pseudo-terminal");
    session.exp_string("batchinfer> ").unwrap();
    session
        .send_line(&format!("{};", big_insert(&db).replace('\n', " ")))
        .unwrap();
    let journal = dir.path().join("o.db-journal");
    common::poll_until(common::DEADLINE, "the INSERT writing rows", || {
        journal.exists()
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    session.send_control('c').unwrap();
    session.exp_string("^C (cancelled)").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    assert!(
        !journal.exists(),
        "the prompt came back before the rollback"
    );
    session.send_line("SELECT count(*) AS n FROM o;").unwrap();
    session.exp_regex(r"\|\s*3\s*\|").unwrap();
    session.exp_string("batchinfer> ").unwrap();
    session.send_line("\\q").unwrap();
    session.exp_eof().unwrap();
    assert_sqlite_as_it_was(dir.path(), &db);
}

/// A row of the table `v` as SQLite holds it: id, real, text, blob.
type SqliteRow = (i64, Option<f64>, Option<String>, Option<Vec<u8>>);

/// Values reach SQLite as parameters: quotes, NUL and every other character of a text as
/// written, infinities as SQLite's own, NaN as NULL (SQLite stores no NaN); a row SQLite
/// refuses is named with its values (texts cut short) and the reason, without the batch's.
#[test]
fn sqlite_inserts_bind_every_value_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("v.db");
    sqlite(
        &db,
        "CREATE TABLE v (id INTEGER, x REAL, s TEXT, b BLOB);
         CREATE TABLE strict (id INTEGER CHECK (id <> 8999), s TEXT);",
    );
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE v STORED AS SQLITE LOCATION '{}';
             INSERT INTO v VALUES
               (1, 'NaN'::double, 'it''s; DROP TABLE v; --', X'00ff'),
               (2, 'inf'::double, concat('a', chr(0), 'b'), NULL),
               (3, '-inf'::double, NULL, X''),
               (4, 1e300, 'é€𝄞', X'41')",
            db.display()
        ),
    );
    assert_eq!(assert_ok(&out), "count\n4\n");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let mut statement = conn
        .prepare("SELECT id, x, s, b FROM v ORDER BY id")
        .unwrap();
    let rows: Vec<SqliteRow> = statement
        .query_map([], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
        })
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (
                1,
                None,
                Some("it's; DROP TABLE v; --".to_string()),
                Some(vec![0, 255])
            ),
            (2, Some(f64::INFINITY), Some("a\0b".to_string()), None),
            (3, Some(f64::NEG_INFINITY), None, Some(vec![])),
            (4, Some(1e300), Some("é€𝄞".to_string()), Some(vec![0x41])),
        ]
    );
    // Row 9,000 of 10,000 breaks a CHECK: one short message naming it; nothing inserted.
    let out = run(
        batchinfer(),
        &format!(
            "CREATE EXTERNAL TABLE strict STORED AS SQLITE LOCATION '{}';
             INSERT INTO strict SELECT value, repeat('x', 40) FROM range(10000)",
            db.display()
        ),
    );
    let stderr = assert_failure(
        &out,
        &[
            "of the insert, (8999, 'xxxxx",
            "…'), was refused",
            "CHECK constraint failed",
        ],
    );
    assert!(stderr.len() < 1_000, "{} bytes: {stderr}", stderr.len());
    assert!(!stderr.contains(&"x".repeat(33)), "{stderr}");
    assert_eq!(sqlite_count(&db, "SELECT count(*) FROM strict"), 0);
}

/// A PostgreSQL INSERT stopped by SIGINT while its rows flow commits nothing.
#[test]
fn a_cancelled_postgres_insert_commits_nothing() {
    let Some(pg) = Postgres::start() else { return };
    pg.psql("CREATE TABLE o (id bigint, x double precision); INSERT INTO o VALUES (1, 1), (2, 2);");
    let mut child = batchinfer()
        .args([
            "query",
            "-e",
            &format!(
                "CREATE EXTERNAL TABLE o STORED AS POSTGRES LOCATION 'o' OPTIONS ('url' '{}');
                 INSERT INTO o SELECT value AS id, CAST(value AS DOUBLE) AS x FROM range(3000000)",
                pg.url()
            ),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Rows are being sent once the server shows the INSERT running.
    common::poll_until(common::DEADLINE, "the INSERT sending rows", || {
        pg.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO%'")
            .trim()
            != "0"
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the INSERT ended before the signal: the test tests nothing"
    );
    common::send(child.id(), libc::SIGINT);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nothing it wrote was kept"), "{stderr}");
    common::poll_until(common::DEADLINE, "the server ending the session", || {
        pg.psql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO%'")
            .trim()
            == "0"
    });
    assert_eq!(pg.psql("SELECT count(*) FROM o"), "2\n");
}

/// `file:a.db` is the URL of `/a.db`: refused, saying what to write, and nothing is opened.
#[test]
fn a_file_url_without_a_root_is_refused_not_read_from_the_root() {
    let out = run(
        batchinfer(),
        "CREATE EXTERNAL TABLE t STORED AS SQLITE LOCATION 'file:a.db'",
    );
    assert_failure(
        &out,
        &["'file:a.db'", "write a path ('a.db') or file:///a.db"],
    );
}
