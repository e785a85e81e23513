"""`batchinfer serve` through ADBC's Flight SQL driver: results equal to the command line's,
writes the command line reads back, sessions, prepared statements, the catalog browser's calls,
authentication and TLS, cancelled and timed-out statements, and a server that keeps serving."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest.mock

import adbc_driver_manager
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from adbc_driver_flightsql import DatabaseOptions
from conftest import FEATURES, PASSWORD, SCORE, TOKEN, cli

# A statement that never ends: ten billion rows counted.
ENDLESS = "SELECT count(*) AS n FROM generate_series(1, 10000000000)"


def test_predict_equals_the_command_line(serve, warehouse, tmp_path):
    server = serve()
    with server.connect() as con, con.cursor() as cur:
        cur.execute(SCORE)
        served = cur.fetch_arrow_table()
    out = tmp_path / "cli.parquet"
    run = cli(warehouse, f"COPY ({SCORE}) TO '{out}' STORED AS PARQUET")
    assert run.returncode == 0, run.stderr
    expected = pq.read_table(out)
    assert served.num_rows == 10_000
    assert served.schema == expected.schema
    assert served.equals(expected)


def test_create_table_is_read_back_by_the_command_line(serve, warehouse):
    server = serve()
    with server.connect() as con, con.cursor() as cur:
        cur.execute(
            f"CREATE TABLE scores AS SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, "
            f"f7, f8, f9) AS score FROM '{FEATURES}'"
        )
        assert cur.fetchall() == [(10_000,)]
        cur.execute("INSERT INTO scores SELECT id + 100000, score FROM scores WHERE id < 10")
        assert cur.fetchall() == [(10,)]
        cur.execute("SELECT count(*), sum(score) FROM scores")
        served = cur.fetchall()
    run = cli(warehouse, "SELECT count(*), sum(score) FROM scores", "--format", "csv")
    assert run.returncode == 0, run.stderr
    count, total = run.stdout.strip().splitlines()[1].split(",")
    assert int(count) == served[0][0] == 10_010
    assert abs(float(total) - served[0][1]) < 1e-3


def test_each_session_keeps_its_own_settings(serve):
    server = serve()
    with server.connect() as a, server.connect() as b:
        with a.cursor() as ca, b.cursor() as cb:
            ca.execute("SET datafusion.execution.batch_size = 100")
            ca.execute("SHOW datafusion.execution.batch_size")
            cb.execute("SHOW datafusion.execution.batch_size")
            assert ca.fetchall()[0][1] == "100"
            assert cb.fetchall()[0][1] == "8192"
            # Where models run is the server's, for every session.
            with pytest.raises(adbc_driver_manager.Error, match="--device"):
                ca.execute("SET batchinfer.device = 'cpu'")


def test_two_sessions_at_once_each_count_only_their_own_failed_rows_and_budget(serve):
    """Two sessions with different error settings run at once: one lets 11 failed rows of 1000
    through as NULL, the other stops at 5 with 7 failing. Each is told exactly its own."""
    server = serve()
    lenient = (
        "SELECT count(*) AS n, count(p) AS scored FROM (SELECT predict('lookup', CASE WHEN "
        "value % 97 = 0 THEN 100 ELSE value % 10 END) AS p FROM range(1000))"
    )
    strict = lenient.replace("97", "143")
    errors: list[str] = []
    stopped: list[str] = []

    def run(settings: list[str], sql: str, check) -> None:
        try:
            with server.connect() as con, con.cursor() as cur:
                for setting in settings:
                    cur.execute(setting)
                for _ in range(5):
                    check(cur, sql)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(repr(e))

    def passes(cur, sql):
        cur.execute(sql)
        assert cur.fetchall() == [(1000, 989)]

    def stops(cur, sql):
        with pytest.raises(adbc_driver_manager.Error) as e:
            cur.execute(sql)
            cur.fetchall()
        stopped.append(str(e.value))

    threads = [
        threading.Thread(target=run, args=(["SET batchinfer.on_error = 'null'"], lenient, passes)),
        threading.Thread(
            target=run,
            args=(
                ["SET batchinfer.on_error = 'null'", "SET batchinfer.max_errors = '5'"],
                strict,
                stops,
            ),
        ),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(stopped) == 5 and all("batchinfer.max_errors = '5'" in e for e in stopped), stopped
    # Said once each query's rows are all read (after its client saw the end).
    deadline = time.monotonic() + 10
    while True:
        log = server.log.read_text()
        said = re.findall(r"warning: session \d+: (model .* failed on .*)", log)
        if len(said) >= 5 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert said == ["model 'lookup' failed on 11 row(s), which got NULL "
                    "(batchinfer.on_error = 'null')"] * 5, log


def test_prepared_statements_with_parameters(serve, tmp_path):
    server = serve()
    with server.connect() as con, con.cursor() as cur:
        cur.execute(
            f"SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score "
            f"FROM '{FEATURES}' WHERE id >= ? AND id < ? ORDER BY id",
            parameters=(10, 15),
        )
        rows = cur.fetchall()
        cur.execute(f"{SCORE}")
        everything = {i: s for i, s in cur.fetchall()}
        assert [r[0] for r in rows] == [10, 11, 12, 13, 14]
        assert all(everything[i] == s for i, s in rows)
        # `$n` placeholders, a string parameter (a value, never SQL).
        cur.execute("SELECT $2 || $1 AS s", parameters=("b'; DROP TABLE x; --", "a"))
        assert cur.fetchall() == [("ab'; DROP TABLE x; --",)]
        # One INSERT a row of parameters.
        cur.execute("CREATE TABLE picked (id BIGINT, label VARCHAR)")
        cur.executemany(
            "INSERT INTO picked VALUES (?, ?)", [(1, "one"), (2, "two"), (3, "three")]
        )
        cur.execute("SELECT id, label FROM picked ORDER BY id")
        assert cur.fetchall() == [(1, "one"), (2, "two"), (3, "three")]
        with pytest.raises(adbc_driver_manager.Error, match="2 placeholder"):
            cur.execute("SELECT ? + ?", parameters=(1,))


def test_catalog_browser_calls(serve):
    server = serve()
    with server.connect() as con, con.cursor() as cur:
        cur.execute(f"CREATE TABLE scores AS {SCORE} LIMIT 5")
        cur.fetchall()
        info = con.adbc_get_info()
        assert info["vendor_name"] == "batchinfer"
        assert set(con.adbc_get_table_types()) >= {"TABLE", "VIEW"}
        objects = con.adbc_get_objects(depth="all").read_all().to_pylist()
        catalogs = {c["catalog_name"] for c in objects}
        assert "datafusion" in catalogs
        tables = {
            t["table_name"]: [col["column_name"] for col in t["table_columns"]]
            for c in objects
            for s in c["catalog_db_schemas"]
            for t in s["db_schema_tables"]
        }
        assert tables["scores"] == ["id", "score"], tables
        schema = con.adbc_get_table_schema("scores")
        assert schema.names == ["id", "score"]
        assert schema.field("score").type == pa.float32()


def test_tokens_and_passwords(serve):
    server = serve("--user", "ana", env={"BATCHINFER_TOKEN": TOKEN, "BATCHINFER_PASSWORD": PASSWORD})
    # The token, and the user's password (a handshake that gives a session token).
    with server.connect(TOKEN) as con, con.cursor() as cur:
        cur.execute("SELECT 1 AS one")
        assert cur.fetchall() == [(1,)]
    with server.connect(username="ana", password=PASSWORD) as con, con.cursor() as cur:
        cur.execute("SELECT 2 AS two")
        assert cur.fetchall() == [(2,)]
    # Refused: no token, a wrong one, a wrong password.
    for attempt in ({}, {"token": TOKEN[:-1] + "x"}, {"username": "ana", "password": "x" * 20}):
        with pytest.raises(adbc_driver_manager.Error) as refused:
            with server.connect(**attempt) as con, con.cursor() as cur:
                cur.execute("SELECT 1")
        message = str(refused.value)
        assert "UNAUTHENTICATED" in message.upper() or "unauthenticated" in message, message
        assert TOKEN not in message and PASSWORD not in message


def test_not_on_the_network_without_authentication(warehouse):
    from conftest import CLI, MODELS

    refused = subprocess.run(
        [CLI, "serve", "--models", str(MODELS), "--warehouse", str(warehouse),
         "--bind", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60,
    )
    assert refused.returncode == 1
    assert "refusing to serve 0.0.0.0:0 with no authentication" in refused.stderr
    short = subprocess.run(
        [CLI, "serve", "--warehouse", str(warehouse), "--bind", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60, env={"BATCHINFER_TOKEN": "abc123"},
    )
    assert short.returncode == 1 and "shorter than 16" in short.stderr
    assert "abc123" not in short.stderr


def test_tls_with_a_certificate_of_the_tests(serve, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    server = serve("--tls-cert", str(cert), "--tls-key", str(key),
                   env={"BATCHINFER_TOKEN": TOKEN})
    assert server.uri.startswith("grpc+tls://")
    roots = {DatabaseOptions.TLS_ROOT_CERTS.value: cert.read_text()}
    with server.connect(TOKEN, **roots) as con, con.cursor() as cur:
        cur.execute(f"{SCORE} LIMIT 3")
        assert len(cur.fetchall()) == 3
    # A client that does not trust the certificate is not let in.
    with pytest.raises(adbc_driver_manager.Error):
        with server.connect(TOKEN) as con, con.cursor() as cur:
            cur.execute("SELECT 1")
    # Plain gRPC to a TLS port fails too.
    import adbc_driver_flightsql.dbapi as flightsql

    with pytest.raises(adbc_driver_manager.Error):
        with flightsql.connect(f"grpc://{server.address}", db_kwargs={
            DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {TOKEN}",
            DatabaseOptions.TIMEOUT_QUERY.value: "5"}, autocommit=True) as con, con.cursor() as cur:
            cur.execute("SELECT 1")


def test_a_client_that_cancels_and_one_that_times_out(serve, warehouse):
    server = serve("--max-statements", "2")
    with server.connect() as con, con.cursor() as cur:
        # A write cancelled by the client's deadline leaves no table.
        timed = {DatabaseOptions.TIMEOUT_QUERY.value: "2"}
        with server.connect(**timed) as quick, quick.cursor() as qc:
            started = time.monotonic()
            with pytest.raises(adbc_driver_manager.Error):
                qc.execute("CREATE TABLE never AS SELECT value FROM generate_series(1, 10000000000)")
            assert time.monotonic() - started < 30
        # A query cancelled while its rows stream.
        cur.execute(ENDLESS)
        canceller = threading.Timer(1.0, cur.adbc_cancel)
        canceller.start()
        with pytest.raises(adbc_driver_manager.Error):
            cur.fetchall()
        canceller.join()
    time.sleep(1)
    # Both slots are free again, and nothing was committed.
    with server.connect() as con, con.cursor() as cur:
        for _ in range(3):
            cur.execute("SELECT 1")
            cur.fetchall()
        with pytest.raises(adbc_driver_manager.Error, match="never"):
            cur.execute("SELECT * FROM never")
    run = cli(warehouse, "SHOW TABLES")
    assert "never" not in run.stdout


def test_statement_timeout(serve, warehouse):
    server = serve("--statement-timeout", "2s")
    with server.connect() as con, con.cursor() as cur:
        started = time.monotonic()
        with pytest.raises(adbc_driver_manager.Error, match="statement-timeout"):
            cur.execute(ENDLESS)
            cur.fetchall()
        with pytest.raises(adbc_driver_manager.Error, match="nothing it wrote was kept"):
            cur.execute("CREATE TABLE never AS SELECT value FROM generate_series(1, 10000000000)")
        assert time.monotonic() - started < 30
        cur.execute("SELECT 1")
        assert cur.fetchall() == [(1,)]
    assert "never" not in cli(warehouse, "SHOW TABLES").stdout


def test_garbage_idle_connections_and_killed_clients(serve, warehouse):
    # One statement at a time: a slot a killed client kept would stop everything after it.
    server = serve("--max-statements", "1")
    host, port = "127.0.0.1", server.port
    # Garbage: not HTTP/2, then an HTTP/2 preface followed by nonsense.
    for junk in (b"\x00" * 1000, b"GET / HTTP/1.1\r\n\r\n",
                 b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 4096):
        with socket.create_connection((host, port)) as s:
            s.sendall(junk)
            s.settimeout(5)
            try:
                s.recv(100)
            except (socket.timeout, ConnectionResetError):
                pass
    # 100 idle connections, held open.
    idle = [socket.create_connection((host, port)) for _ in range(100)]

    def killed(statement: str, fetch: str) -> None:
        """A client process killed while its statement runs."""
        client = subprocess.Popen(
            [sys.executable, "-c", (
                "import adbc_driver_flightsql.dbapi as f\n"
                f"c = f.connect('{server.uri}', autocommit=True).cursor()\n"
                "print('started', flush=True)\n"
                f"c.execute({statement!r})\n"
                f"{fetch}\n"
            )],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout.readline().strip() == "started"
        time.sleep(2)
        client.kill()
        client.wait()

    # One killed while it reads a large result, one while its CREATE TABLE runs.
    killed("SELECT value FROM generate_series(1, 1000000000)",
           "for b in c.fetch_record_batch(): pass")
    killed("CREATE TABLE gone AS SELECT value FROM generate_series(1, 10000000000)", "")
    # The server still serves, its one slot free again; nothing of the killed write was kept.
    quick = {DatabaseOptions.TIMEOUT_QUERY.value: "30"}
    with server.connect(**quick) as con, con.cursor() as cur:
        for _ in range(10):
            cur.execute(f"{SCORE} LIMIT 2")
            assert len(cur.fetchall()) == 2
        cur.execute("SHOW TABLES")
        assert "gone" not in {row[2] for row in cur.fetchall()}
    for s in idle:
        s.close()
    assert server.proc.poll() is None
    assert "gone" not in cli(warehouse, "SHOW TABLES").stdout


def test_twenty_clients_for_a_minute(serve):
    """Memory and file descriptors stay level under 20 clients for 60 s."""
    server = serve("--max-statements", "4")
    errors: list[str] = []
    done = threading.Event()
    counts = [0] * 20

    def client(n: int) -> None:
        try:
            while not done.is_set():
                with server.connect() as con, con.cursor() as cur:
                    for _ in range(5):
                        cur.execute(
                            f"SELECT count(*), avg(predict('linear', f0, f1, f2, f3, f4, f5, f6, "
                            f"f7, f8, f9)) FROM '{FEATURES}' WHERE id % 20 = ?",
                            parameters=(n,),
                        )
                        assert cur.fetchall()[0][0] == 500
                        counts[n] += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    samples = []
    started = time.monotonic()
    while time.monotonic() - started < 60:
        time.sleep(5)
        samples.append((server.rss(), server.fds()))
    done.set()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert all(c > 0 for c in counts), counts
    # Level: the last third's peak within 25% (and 64 MiB) of the first third's.
    third = len(samples) // 3
    early_rss = max(r for r, _ in samples[:third])
    late_rss = max(r for r, _ in samples[-third:])
    early_fds = max(f for _, f in samples[:third])
    late_fds = max(f for _, f in samples[-third:])
    print(f"statements: {sum(counts)}; rss {early_rss >> 20} -> {late_rss >> 20} MiB; "
          f"fds {early_fds} -> {late_fds}")
    assert late_rss < early_rss * 1.25 + (64 << 20), samples
    assert late_fds <= early_fds + 20, samples


def test_the_documented_examples(serve):
    """docs/serve.md's Python examples run as written, against a server started as it says
    (on a free port instead of 32010)."""
    from conftest import ROOT

    page = (ROOT / "docs/serve.md").read_text()
    command = re.search(r"^batchinfer serve (.*)$", page, flags=re.M).group(1).split()
    assert command == ["--models", "data/models", "--warehouse", "wh"], command
    server = serve(env={"BATCHINFER_TOKEN": TOKEN})
    examples = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    assert len(examples) == 2
    scope: dict = {}
    environ = dict(os.environ, BATCHINFER_TOKEN=TOKEN)
    with unittest.mock.patch.dict(os.environ, environ):
        for example in examples:
            assert "grpc://127.0.0.1:32010" in example or "con." in example
            code = example.replace("grpc://127.0.0.1:32010", server.uri)
            exec(compile(code, "docs/serve.md example", "exec"), scope)
    features = pq.read_table(FEATURES)
    assert scope["scores"].num_rows == features.num_rows
    assert scope["written"] == features.num_rows
    assert [r[0] for r in scope["few"]] == [10, 11, 12, 13, 14]
    assert scope["schema"].names == ["id", "score"]
    assert "scores" in str(scope["tables"].to_pylist())
    with server.connect(TOKEN) as con, con.cursor() as cur:
        cur.execute("SELECT count(*), sum(score) FILTER (WHERE id > 100000) FROM scores")
        assert cur.fetchall() == [(features.num_rows + 2, 0.75)]


def free_ports(n: int) -> int:
    """The first of `n` consecutive free ports (found free; taken by whoever binds first)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n > 65535:
            continue
        try:
            held = []
            for port in range(first, first + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no free ports")


def test_on_a_cluster(serve, warehouse, tmp_path):
    """With `--remote`, the server's statements run on a Ballista cluster."""
    from conftest import CLI

    scheduler_port = free_ports(1)
    executor_port = free_ports(2)
    logs = tmp_path / "cluster.log"
    cluster = [
        subprocess.Popen([CLI, "scheduler", "--bind", f"127.0.0.1:{scheduler_port}"],
                         stdout=subprocess.DEVNULL, stderr=open(logs, "a")),
        subprocess.Popen([CLI, "executor", "--scheduler", f"127.0.0.1:{scheduler_port}",
                          "--bind-host", "127.0.0.1", "--port", str(executor_port),
                          "--work-dir", str(tmp_path / "executor")],
                         stdout=subprocess.DEVNULL, stderr=open(logs, "a")),
    ]
    try:
        server = serve("--remote", f"df://127.0.0.1:{scheduler_port}")
        with server.connect() as con, con.cursor() as cur:
            cur.execute(f"CREATE TABLE scores AS {SCORE}")
            assert cur.fetchall() == [(10_000,)]
            cur.execute("SELECT id, score FROM scores ORDER BY id")
            served = cur.fetch_arrow_table()
        out = tmp_path / "cli.parquet"
        run = cli(warehouse, f"COPY ({SCORE}) TO '{out}' STORED AS PARQUET")
        assert run.returncode == 0, run.stderr
        assert served.equals(pq.read_table(out))
    finally:
        for process in cluster:
            process.terminate()
            process.wait(30)


def flight_sql_query(sql: str) -> bytes:
    """A Flight SQL `CommandStatementQuery`, in its `Any`, as protobuf bytes."""

    def field(number: int, value: bytes) -> bytes:
        length, size = b"", len(value)
        while True:
            length += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
            size >>= 7
            if not size:
                break
        return bytes([number << 3 | 2]) + length + value

    command = field(1, sql.encode())
    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    return field(1, url) + field(2, command)


def test_every_call_needs_a_credential_and_a_plain_token_client_works(serve):
    """A plain Flight client (pyarrow's) that shows the server's token on every call, and never
    the session token it is given, still runs queries; without a token, no call is answered."""
    import pyarrow.flight as flight

    server = serve(env={"BATCHINFER_TOKEN": TOKEN})
    client = flight.FlightClient(server.uri)
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(client.list_actions())
    wrong = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer " + b"x" * 40)])
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(client.list_actions(options=wrong))
    # A wrong token makes its address wait 0.1 s before its next credential is looked at.
    time.sleep(0.3)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
    assert list(client.list_actions(options=options))
    descriptor = flight.FlightDescriptor.for_command(flight_sql_query(f"{SCORE} LIMIT 4"))
    info = client.get_flight_info(descriptor, options=options)
    table = client.do_get(info.endpoints[0].ticket, options=options).read_all()
    assert table.column("id").to_pylist() == [0, 1, 2, 3]
    client.close()


def test_server_settings_are_refused_to_sessions(serve):
    server = serve("--memory-limit", "64M")
    with server.connect() as con, con.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error, match="--memory-limit"):
            cur.execute("SET datafusion.runtime.memory_limit = '8G'")


def test_a_statement_long_in_planning_holds_no_one_else(serve):
    """Planning does not pause: it runs on a thread of its own, and the server keeps answering
    other clients and times it out on time."""
    server = serve("--statement-timeout", "1s", "--max-statements", "2")
    slow = ("SELECT count(*) FROM '" + str(FEATURES) + "' WHERE "
            + "+".join(["f0"] * 400) + " > 0")
    failures: list[float] = []

    def plan() -> None:
        with server.connect() as con, con.cursor() as cur:
            started = time.monotonic()
            try:
                cur.execute(slow)
                cur.fetchall()
            except adbc_driver_manager.Error:
                failures.append(time.monotonic() - started)

    planners = [threading.Thread(target=plan) for _ in range(2)]
    for t in planners:
        t.start()
    time.sleep(1)
    with server.connect() as con, con.cursor() as cur:
        started = time.monotonic()
        cur.execute("SELECT 7")
        assert cur.fetchall() == [(7,)]
        answered = time.monotonic() - started
    for t in planners:
        t.join(120)
    print(f"planning: others answered in {answered:.2f} s; timed out after {failures}")
    assert answered < 2.5, answered
    # Planning takes 9 s here (a debug build): the timeout must not wait for it.
    assert len(failures) == 2 and all(f < 4 for f in failures), failures
    # Both places are given back at the timeout, though the planners' threads are still busy.
    with server.connect() as con, con.cursor() as cur:
        started = time.monotonic()
        cur.execute("SELECT 9")
        assert cur.fetchall() == [(9,)]
        assert time.monotonic() - started < 2.5


def test_a_client_that_stops_reading_frees_its_slot_at_the_timeout(serve):
    server = serve("--statement-timeout", "3s", "--max-statements", "1")
    with server.connect() as stalled, stalled.cursor() as cur:
        cur.execute("SELECT value FROM generate_series(1, 100000000)")
        reader = cur.fetch_record_batch()
        next(iter(reader))  # one batch read, then none
        started = time.monotonic()
        with server.connect() as con, con.cursor() as other:
            other.execute("SELECT 8")
            assert other.fetchall() == [(8,)]
        waited = time.monotonic() - started
        assert waited < 6, waited
        with pytest.raises((adbc_driver_manager.Error, OSError), match="statement-timeout"):
            for _ in reader:
                pass


def test_a_silent_connection_is_closed(serve):
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port)) as silent:
        silent.settimeout(30)
        started = time.monotonic()
        while silent.recv(100):  # the server's HTTP/2 settings, then the end
            pass
        assert 8 < time.monotonic() - started < 20


def peak_rss(server) -> int:
    """The server's peak resident memory so far, in bytes."""
    with open(f"/proc/{server.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_script_keeps_no_rows_of_its_earlier_statements(serve):
    """A script's statements before its last are run to their end and their rows dropped as
    they come: 1 GB of rows before a `SELECT 2` never sits in the server's memory (a plain
    Flight SQL client sends the script as one statement query)."""
    import pyarrow.flight as flight

    server = serve("--memory-limit", "256M", env={"BATCHINFER_TOKEN": TOKEN})
    client = flight.FlightClient(server.uri)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])

    def run(sql: str) -> pa.Table:
        descriptor = flight.FlightDescriptor.for_command(flight_sql_query(sql))
        info = client.get_flight_info(descriptor, options=options)
        return client.do_get(info.endpoints[0].ticket, options=options).read_all()

    assert run("SELECT 1 AS one").column(0).to_pylist() == [1]
    before = peak_rss(server)
    script = "SELECT repeat('x', 1000) AS big FROM unnest(range(0, 1000000)); SELECT 2 AS two"
    assert run(script).column(0).to_pylist() == [2]
    grown = peak_rss(server) - before
    assert grown < 400 << 20, f"the server's peak grew by {grown >> 20} MiB"
    assert run("SELECT 3 AS three").column(0).to_pylist() == [3]
    client.close()


def test_a_confined_server_reaches_only_what_it_was_given(serve, warehouse, tmp_path):
    """`--allow-dir`: clients read and write local files only there, judged where they really
    are (links resolved); a `SET` narrows it, never widens it. The warehouse's own folders are
    written by its own statements alone, and the tables in it still work."""
    import shutil

    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    shutil.copy(FEATURES, allowed / "f.parquet")
    shutil.copy(FEATURES, outside / "f.parquet")
    (outside / "victim.txt").write_text("keep me")
    (allowed / "link").symlink_to(outside)
    model = FEATURES.parents[1] / "models" / "linear.onnx"
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}

    server = serve("--allow-dir", str(allowed))
    with server.connect() as con, con.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM '{allowed}/f.parquet'")
        assert cur.fetchall() == [(10000,)]
        cur.execute(f"COPY (SELECT 1 AS x) TO '{allowed}/new/out.parquet' STORED AS PARQUET")
        assert pq.read_table(allowed / "new" / "out.parquet").column(0).to_pylist() == [1]
        cur.execute(f"CREATE TABLE kept AS SELECT id FROM '{allowed}/f.parquet' WHERE id < 5")
        cur.execute("SELECT count(*) FROM kept")
        assert cur.fetchall() == [(5,)]

        refused = [
            "SELECT * FROM read_text('/etc/passwd')",
            f"SELECT count(*) FROM '{outside}/f.parquet'",
            f"SELECT count(*) FROM '{allowed}/link/f.parquet'",
            f"SELECT count(*) FROM read_blob('{allowed}/link/')",
            "SELECT text FROM read_document('/etc/passwd')",
            f"SELECT text FROM read_document('{allowed}/link/')",
            "SELECT frame FROM read_frames('/etc/passwd', 'fps=1')",
            f"SELECT frame FROM read_frames('{allowed}/link/')",
            f"CREATE EXTERNAL TABLE o STORED AS PARQUET LOCATION '{outside}/f.parquet'",
            f"CREATE EXTERNAL TABLE p STORED AS CSV LOCATION '/etc/passwd'",
            f"COPY (SELECT 'x' AS a) TO '{outside}/victim.txt' STORED AS CSV",
            f"COPY (SELECT 'x' AS a) TO '{allowed}/link/new.csv' STORED AS CSV",
            f"CREATE MODEL stolen FROM '{model}'",
            f"COPY (SELECT 'x' AS a) TO '{warehouse}/llm-cache/ab/forged.json' STORED AS JSON",
            f"COPY (SELECT 'x' AS a) TO '{warehouse}/tables/kept/_delta_log/x.json' STORED AS JSON",
            f"COPY (SELECT 'x' AS a) TO '{warehouse}/x.csv' STORED AS CSV",
            # Whether a file outside exists is not told either.
            "SELECT * FROM read_text('/etc/no-such-file')",
            f"SELECT * FROM predict_table('linear', '{outside}/f.parquet')",
            "SET batchinfer.allowed_directories = '/'",
        ]
        for sql in refused:
            with pytest.raises(adbc_driver_manager.Error,
                               match="outside the folders|refused|only be narrowed"):
                cur.execute(sql)
                cur.fetchall()
        # Rejects meant to go outside: refused where they would be written, and the session
        # can set them elsewhere again.
        cur.execute("SET batchinfer.on_error = 'reject'")
        cur.execute(f"SET batchinfer.rejects = '{outside}/rejects'")
        with pytest.raises(adbc_driver_manager.Error, match="outside the folders"):
            cur.execute("SELECT 1")
            cur.fetchall()
        cur.execute(f"SET batchinfer.rejects = '{allowed}/rejects'")
        cur.execute("SELECT 1 AS one")
        assert cur.fetchall() == [(1,)]
        # Narrowed, then refused what was allowed before.
        cur.execute(f"SET batchinfer.allowed_directories = '{allowed}/new'")
        with pytest.raises(adbc_driver_manager.Error, match="outside the folders"):
            cur.execute(f"SELECT count(*) FROM '{allowed}/f.parquet'")
            cur.fetchall()
    # Another client starts confined as the server says, not as the first narrowed it.
    with server.connect() as con, con.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM '{allowed}/f.parquet'")
        assert cur.fetchall() == [(10000,)]
    after = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    assert after == before
    assert not (warehouse / "llm-cache").exists()
    assert not (warehouse / "x.csv").exists()
    # Nor does any session write into the warehouse, confined or not: the command line, through
    # a link to the warehouse, or a forged commit in a table's log.
    (tmp_path / "whlink").symlink_to(warehouse)
    log = sorted((warehouse / "tables" / "kept" / "_delta_log").iterdir())
    for target in [f"{warehouse}/llm-cache/ab/forged.json",
                   f"{tmp_path}/whlink/tables/kept/_delta_log/00000000000000000009.json",
                   f"file://{warehouse}/tables/kept/evil/", f"{warehouse}/views/x.json"]:
        out = cli(warehouse, f"COPY (SELECT 1 AS a) TO '{target}' STORED AS JSON")
        assert out.returncode != 0 and "refused" in out.stderr, (target, out.stderr)
    assert sorted((warehouse / "tables" / "kept" / "_delta_log").iterdir()) == log
    assert not (warehouse / "llm-cache").exists() and not (warehouse / "views").exists()


def test_a_read_only_server_and_one_with_no_local_files(serve, warehouse):
    """`--read-only`: no statement that writes runs, and a session cannot turn it off;
    `--no-local-files`: no local path, the warehouse's tables still read."""
    assert cli(warehouse, "CREATE TABLE t AS SELECT 1 AS x").returncode == 0
    server = serve("--read-only")
    with server.connect() as con, con.cursor() as cur:
        cur.execute("SELECT x FROM t")
        assert cur.fetchall() == [(1,)]
        cur.execute(f"SELECT count(*) FROM '{FEATURES}'")
        assert cur.fetchall() == [(10000,)]
        for sql in [
            "CREATE TABLE u AS SELECT 1 AS x",
            "INSERT INTO t VALUES (2)",
            "DROP TABLE t",
            f"COPY (SELECT 1) TO '{warehouse.parent}/x.parquet'",
            "VACUUM t",
            "CLEAR LLM CACHE",
            "CREATE MODEL m FROM 'x.onnx'",
            "SET batchinfer.read_only = false",
        ]:
            with pytest.raises(adbc_driver_manager.Error, match="read-only|stays on"):
                cur.execute(sql)
                cur.fetchall()
    server.stop()
    server = serve("--no-local-files")
    with server.connect() as con, con.cursor() as cur:
        cur.execute("SELECT x FROM t")
        assert cur.fetchall() == [(1,)]
        with pytest.raises(adbc_driver_manager.Error, match="no local file"):
            cur.execute(f"SELECT count(*) FROM '{FEATURES}'")
            cur.fetchall()
    # Nothing the read-only server was asked changed the table.
    out = cli(warehouse, "SELECT count(*) AS n, min(x) AS x FROM t", "--format", "csv")
    assert out.stdout.split() == ["n,x", "1,1"], out
    # The same settings from the command line: a SET narrows, never widens.
    out = cli(warehouse, "SET batchinfer.read_only = true; SET batchinfer.read_only = false")
    assert out.returncode != 0 and "stays on" in out.stderr
    out = cli(warehouse, f"SET batchinfer.allowed_directories = '{warehouse}'; "
                         f"SELECT count(*) FROM '{FEATURES}'")
    assert out.returncode != 0 and "outside the folders" in out.stderr, out.stderr


def test_beyond_loopback_a_server_reads_no_local_file_unless_told(warehouse):
    """Listening beyond loopback with no `--allow-dir`, clients reach no local file."""
    log = warehouse.parent / "wide.log"
    proc = subprocess.Popen(
        [os.environ["BATCHINFER_CLI"], "serve", "--warehouse", str(warehouse),
         "--bind", "0.0.0.0:0"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"),
        env={**os.environ, "BATCHINFER_TOKEN": TOKEN},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "Arrow Flight SQL on" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        text = log.read_text()
        assert "no local file (beyond loopback" in text, text
        port = re.search(r"grpc://[\d.]+:(\d+)", text).group(1)
        import adbc_driver_flightsql.dbapi as flightsql
        db = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {TOKEN}"}
        with flightsql.connect(f"grpc://127.0.0.1:{port}", db_kwargs=db,
                               autocommit=True) as con, con.cursor() as cur:
            with pytest.raises(adbc_driver_manager.Error, match="no local file"):
                cur.execute(f"SELECT count(*) FROM '{FEATURES}'")
                cur.fetchall()
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_documented_confinement(serve, warehouse, tmp_path):
    """docs/serve.md's confined server, started as it says (its folder made the test's), says
    what the page says at start and refuses the page's statement with the page's message."""
    from conftest import ROOT

    page = (ROOT / "docs/serve.md").read_text()
    section = page[page.index("## Confining clients"):]
    command = re.search(r"^batchinfer serve (.*)$", section, flags=re.M).group(1).split()
    said = re.search(r"^# (batchinfer serve: .*)$", section, flags=re.M).group(1)
    sql, message = re.search(r"^```sql\n(.*?)\n-- (.*?)\n```", section, flags=re.S | re.M).groups()
    data = tmp_path / "srv-data"
    data.mkdir()
    args = [a.replace("/srv/data", str(data)) for a in command]
    assert args[:2] == ["--warehouse", "wh"], args
    server = serve(*args[2:], env={"BATCHINFER_TOKEN": TOKEN})
    log = server.log.read_text()
    expected = said.replace("/srv/data", str(data)).replace("127.0.0.1:32010", server.address)
    assert expected in log, log
    with server.connect(TOKEN) as con, con.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error) as refused:
            cur.execute(sql)
            cur.fetchall()
    assert message.replace("/srv/data", str(data)) in str(refused.value), refused.value


def test_failed_logins_are_slowed_per_address(serve):
    """Wrong tokens from one address are looked at a few times a second, not thousands: each
    failure makes the address wait (0.1 s, doubling, up to 5 s), refused meanwhile whatever it
    shows. A client already in, holding its session's token, is never held up."""
    import pyarrow.flight as flight

    server = serve(env={"BATCHINFER_TOKEN": TOKEN})
    with server.connect(TOKEN) as con, con.cursor() as cur:
        cur.execute("SELECT 1 AS one")
        client = flight.FlightClient(server.uri)
        wrong = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer " + b"x" * 40)])
        looked_at = waited = 0
        started = time.monotonic()
        while time.monotonic() - started < 3:
            try:
                list(client.list_actions(options=wrong))
            except flight.FlightUnauthenticatedError as e:
                if "too many failed attempts" in str(e):
                    waited += 1
                else:
                    looked_at += 1
            # The session opened before keeps working meanwhile.
            cur.execute("SELECT 2 AS two")
            assert cur.fetchall() == [(2,)]
        print(f"in 3 s: {looked_at} wrong tokens looked at, {waited} refused unread")
        # 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s: at most 6 looked at in 3 s.
        assert 1 <= looked_at <= 6, (looked_at, waited)
        assert waited > looked_at
        # Even the right token waits its turn (a wrong one just before it), then gets in.
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(client.list_actions(options=wrong))
        right = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
        with pytest.raises(flight.FlightUnauthenticatedError, match="too many failed attempts"):
            list(client.list_actions(options=right))
        time.sleep(5.1)
        assert list(client.list_actions(options=right))
        client.close()
