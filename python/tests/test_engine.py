"""The engine from Python: memory (registered data not copied, results streamed in bounded
memory), the GIL released, Ctrl-C, errors as the command line says them, the warehouse, views,
rejects, progress and a cluster."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchinfer
from conftest import MODELS, SAMPLE, cli_error, memory, reset_peak
from test_results import FEATURES, LINEAR, features, linear_reference

GIB = 1 << 30


def big_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(11)
    return pa.table({c: rng.random(rows, dtype=np.float32) for c in FEATURES})


def test_a_registered_table_is_not_copied(con):
    table = big_table(27_000_000)  # 10 float32 columns: 1.0 GiB
    assert table.nbytes >= GIB
    reset_peak()
    before = memory("VmRSS")
    con.register("big", table)
    out = con.sql(f"SELECT count(*) AS n, sum({LINEAR}) AS s FROM big").to_arrow()
    grown = memory("VmHWM") - before
    assert out["n"][0].as_py() == 27_000_000
    # A copy of the table would add 1 GiB; what scoring holds at once is batches.
    assert grown < table.nbytes // 4, f"the process grew by {grown >> 20} MiB"


def test_a_streamed_result_keeps_memory_flat(con):
    rows = 10_000_000
    con.register("big", big_table(rows))
    relation = con.sql(f"SELECT {', '.join(FEATURES)}, {LINEAR} AS p FROM big")
    reset_peak()
    before = memory("VmRSS")
    seen = 0
    for batch in relation.fetch_record_batches():
        seen += batch.num_rows
    grown = memory("VmHWM") - before
    assert seen == rows
    # The result is 10M rows of 44 bytes (440 MB) whole; streamed, a few batches at a time.
    assert grown < 100 << 20, f"the process grew by {grown >> 20} MiB"


def test_the_gil_is_released_and_two_connections_run_at_once():
    frame = features(3_000_000)
    expected = float(linear_reference(frame).sum(dtype=np.float64))
    slow = f"SELECT count(*) AS n, sum({LINEAR}) AS s FROM feats"
    results, spans = {}, {}

    def work(name: str) -> None:
        with batchinfer.connect(models=MODELS, partitions=1) as con:
            con.register("feats", frame)
            started = time.monotonic()
            results[name] = con.sql(slow).to_arrow().to_pylist()[0]
            spans[name] = (started, time.monotonic())

    threads = [threading.Thread(target=work, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    # While the statements run, this thread runs Python: the GIL is free.
    ticks = 0
    while any(t.is_alive() for t in threads):
        ticks += 1
        time.sleep(0.001)
    for t in threads:
        t.join()
    assert ticks > 50, "the main thread hardly ran while the statements did"
    (a0, a1), (b0, b1) = spans["a"], spans["b"]
    assert a0 < b1 and b0 < a1, "the two statements did not overlap"
    for name in ("a", "b"):
        assert results[name]["n"] == len(frame)
        assert abs(results[name]["s"] - expected) < 1e-6 * len(frame)


def interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


# Long enough to be stopped: 300 million rows scored.
LONG = (
    "SELECT value AS id, predict('linear', CAST(value AS FLOAT), "
    + ", ".join(["1.0"] * 9)
    + ") AS p FROM range(300000000)"
)


def test_ctrl_c_cancels_and_commits_nothing(tmp_path):
    out = tmp_path / "scores.parquet"
    with batchinfer.connect(models=MODELS, warehouse=tmp_path / "wh") as con:
        for statement, written in [
            (f"COPY ({LONG}) TO '{out}' STORED AS PARQUET", lambda: out.exists()),
            (f"CREATE TABLE scores AS {LONG}", lambda: (tmp_path / "wh" / "tables" / "scores").exists()),
        ]:
            started = time.monotonic()
            timer = interrupt_after(1.5)
            with pytest.raises(KeyboardInterrupt):
                con.sql(statement)
            timer.cancel()
            assert time.monotonic() - started < 30
            assert not written(), statement
        # The connection goes on, and the table was never made.
        with pytest.raises(batchinfer.Error, match="scores"):
            con.sql("SELECT count(*) FROM scores").to_arrow()
        assert con.sql("SELECT 40 + 2 AS x").to_arrow()["x"].to_pylist() == [42]
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and "scores" in p.name]
    assert leftovers == []


def test_errors_are_classes_with_the_command_lines_message(tmp_path):
    con = batchinfer.connect(models=MODELS, warehouse=tmp_path / "wh")
    cases = [
        ("SELECT predict('nope', 1.0)", batchinfer.ModelError),
        ("SELECT predict('linear', 1.0, 2.0)", batchinfer.InputError),
        ("SELECT predict('lookup', v) FROM (VALUES (1), (99)) t(v)", batchinfer.ModelError),
        (f"SELECT * FROM '{tmp_path}/missing.parquet'", batchinfer.Error),
        ("SELEC 1", batchinfer.Error),
    ]
    for sql, kind in cases:
        with pytest.raises(kind) as raised:
            con.sql(sql).to_arrow()
        assert str(raised.value) == cli_error(sql, "--warehouse", str(tmp_path / "wh")), sql
    assert issubclass(batchinfer.ModelError, batchinfer.Error)


def test_bad_options_and_data_are_one_error_each(tmp_path):
    for options, said in [
        ({"partitions": 0}, "partitions must be from 1 to 1024"),
        ({"device": "tpu"}, "^device 'tpu': expected cpu, cuda"),
        ({"remote": "df://:50050"}, "is not a scheduler address: expected df://HOST:PORT"),
        ({"memory_limit": "lots"}, "^memory_limit: 'lots' is not a size"),
        ({"graph_optimization": "max"}, "'max' is not one of"),
    ]:
        with pytest.raises(batchinfer.Error, match=said):
            batchinfer.connect(models=MODELS, **options)
    con = batchinfer.connect(models=MODELS)
    with pytest.raises(batchinfer.Error, match="a dict is not data batchinfer can read"):
        con.register("t", {"a": [1]})
    with pytest.raises(batchinfer.Error, match="cannot name a table"):
        con.register("", pa.table({"a": [1]}))
    con.close()
    with pytest.raises(batchinfer.Error, match="the connection is closed"):
        con.sql("SELECT 1")


def test_the_warehouse_views_and_rejects(tmp_path, capsys):
    wh = tmp_path / "wh"
    frame = features(20_000)
    with batchinfer.connect(models=MODELS, warehouse=wh) as con:
        con.sql(f"CREATE MODEL scorer FROM '{MODELS / 'linear.onnx'}'")
        # What the command line says on stderr, said on sys.stderr.
        assert "model 'scorer' created as version 1" in capsys.readouterr().err
        con.register("feats", frame)
        written = con.sql(f"CREATE TABLE scores AS SELECT id, predict('scorer', {', '.join(FEATURES)}) AS p FROM feats")
        assert "20000" in repr(written)
        copy = tmp_path / "scores.parquet"
        con.sql(f"COPY (SELECT * FROM scores ORDER BY id) TO '{copy}' STORED AS PARQUET")

    # A new connection over the warehouse finds the model and the table; the file re-read.
    with batchinfer.connect(warehouse=wh) as con:
        kept = con.sql("SELECT id, p FROM scores ORDER BY id").to_pandas()
        assert con.sql("SELECT name FROM models()").to_pandas()["name"].tolist() == ["scorer"]
    expected = linear_reference(frame)
    np.testing.assert_allclose(kept["p"].to_numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pq.read_table(copy)["p"].to_numpy(), expected, rtol=1e-5, atol=1e-5)

    # A materialized view over a folder: refreshed when a file is added.
    folder = tmp_path / "incoming"
    folder.mkdir()
    pq.write_table(pa.Table.from_pandas(frame.iloc[:1000], preserve_index=False), folder / "a.parquet")
    with batchinfer.connect(models=MODELS, warehouse=wh) as con:
        con.sql(f"CREATE MATERIALIZED VIEW v AS SELECT id, {LINEAR} AS p FROM '{folder}/'")
        pq.write_table(pa.Table.from_pandas(frame.iloc[1000:1500], preserve_index=False), folder / "b.parquet")
        con.sql("REFRESH MATERIALIZED VIEW v")
        assert con.sql("SELECT count(*) AS n FROM v").to_arrow()["n"].to_pylist() == [1500]

        # Rows a model fails on: kept as rejects, and said as a warning.
        con.sql("SET batchinfer.on_error = 'reject'")
        with pytest.warns(RuntimeWarning, match=r"model 'lookup' failed on 11 row\(s\)"):
            out = con.sql(
                "SELECT count(*) AS n, count(p) AS scored FROM (SELECT predict('lookup', "
                "CASE WHEN value % 97 = 0 THEN 100 ELSE value % 10 END) AS p FROM range(1000))"
            ).to_arrow()
        assert out.to_pylist() == [{"n": 1000, "scored": 989}]
        rejects = con.sql("SELECT count(*) AS n FROM batchinfer_rejects()").to_arrow()
        assert rejects["n"].to_pylist() == [11]

        # A query read after the connection ran another statement is told its own failed rows.
        later = con.sql(
            "SELECT count(p) AS scored FROM (SELECT predict('lookup', "
            "CASE WHEN value % 143 = 0 THEN 100 ELSE value % 10 END) AS p FROM range(1000))"
        )
        assert con.sql("SELECT 1 AS one").to_arrow()["one"].to_pylist() == [1]
        with pytest.warns(RuntimeWarning, match=r"model 'lookup' failed on 7 row\(s\)"):
            assert later.to_arrow().to_pylist() == [{"scored": 993}]


def test_progress_is_shown_when_asked(capsys):
    with batchinfer.connect(models=MODELS, progress=True, partitions=1) as con:
        con.register("feats", big_table(8_000_000))
        con.sql(f"SELECT sum({LINEAR}) AS s FROM feats").to_arrow()
    err = capsys.readouterr().err
    assert "rows scored" in err and "\r" in err, err[-500:]
    with batchinfer.connect(models=MODELS) as con:
        con.register("feats", big_table(8_000_000))
        con.sql(f"SELECT sum({LINEAR}) AS s FROM feats").to_arrow()
    assert "rows scored" not in capsys.readouterr().err


def free_port_pair() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65000:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                    return port
                except OSError:
                    continue


def test_statements_on_a_cluster(tmp_path):
    cli = os.environ["BATCHINFER_CLI"]
    port, executor_port = free_port_pair(), free_port_pair()
    env = dict(os.environ, BATCHINFER_WAREHOUSE=str(tmp_path / "cluster-wh"))
    log = open(tmp_path / "cluster.log", "w")
    processes = [
        subprocess.Popen([cli, "scheduler", "--bind", f"127.0.0.1:{port}"], env=env, stdout=log, stderr=log),
        subprocess.Popen(
            [cli, "executor", "--scheduler", f"127.0.0.1:{port}", "--port", str(executor_port),
             "--concurrent-tasks", "2", "--work-dir", str(tmp_path / "executor"), "--models", str(MODELS)],
            env=env, stdout=log, stderr=log,
        ),
    ]
    try:
        sample = SAMPLE / "features.parquet"
        query = f"SELECT id, {LINEAR} AS p FROM '{sample}' ORDER BY id"
        with batchinfer.connect(models=MODELS) as local:
            expected = local.sql(query).to_pandas()
        deadline = time.monotonic() + 60
        while True:
            try:
                with batchinfer.connect(models=MODELS, remote=f"df://127.0.0.1:{port}") as con:
                    out = con.sql(query).to_pandas()
                break
            except batchinfer.Error:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        pd.testing.assert_frame_equal(out, expected)
    finally:
        for process in processes:
            process.kill()
            process.wait()
        log.close()


def test_one_connection_from_two_threads_takes_turns():
    con = batchinfer.connect(models=MODELS, partitions=1)
    con.register("big", big_table(8_000_000))
    relation = con.sql(f"SELECT sum({LINEAR}) AS s FROM big")
    done = {}

    def first() -> None:
        done["first"] = relation.to_arrow()["s"][0].as_py()

    def second() -> None:
        # Each waits for the statement the other thread runs, with the GIL free meanwhile.
        done["closed"] = con.closed
        done["second"] = con.sql("SELECT 41 + 1 AS x").to_arrow()["x"][0].as_py()
        done["repr"] = repr(relation)

    a = threading.Thread(target=first, daemon=True)
    a.start()
    time.sleep(0.2)
    b = threading.Thread(target=second, daemon=True)
    b.start()
    a.join(120)
    b.join(120)
    assert not a.is_alive() and not b.is_alive(), "a thread never finished"
    assert done["closed"] is False and done["second"] == 42
    assert "s" in done["repr"] and done["first"] is not None


def test_a_query_planned_before_a_ctrl_c_still_runs(tmp_path):
    with batchinfer.connect(models=MODELS) as con:
        con.register("feats", features(10_000))
        planned = con.sql(f"SELECT count({LINEAR}) AS n FROM feats")
        timer = interrupt_after(1.0)
        with pytest.raises(KeyboardInterrupt):
            con.sql(f"COPY ({LONG}) TO '{tmp_path / 'out.parquet'}' STORED AS PARQUET")
        timer.cancel()
        # The Ctrl-C stopped the COPY; the query planned before it runs now.
        assert planned.to_arrow()["n"].to_pylist() == [10_000]


EXIT_WHILE_RUNNING = """
import sys, threading, time
import pyarrow as pa
import batchinfer

con = batchinfer.connect()
schema = pa.schema([("x", pa.float64())])

def batches():
    while True:
        time.sleep(0.05)
        yield pa.record_batch([pa.array([1.0] * 1000)], schema=schema)

con.register("g", pa.RecordBatchReader.from_batches(schema, batches()))

def run():
    try:
        con.sql("SELECT count(x) FROM g").to_arrow()
    except batchinfer.Error:
        pass

threading.Thread(target=run, daemon=True).start()
time.sleep(1)
print("exiting", flush=True)
"""


def test_python_exits_cleanly_while_a_daemon_thread_reads_a_generator(tmp_path):
    script = tmp_path / "exit.py"
    script.write_text(EXIT_WHILE_RUNNING)
    env = dict(os.environ)
    for attempt in range(3):
        run = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
        )
        assert run.returncode == 0, (attempt, run.returncode, run.stderr[-2000:])
        assert "exiting" in run.stdout and "panicked" not in run.stderr


def test_registered_names_are_names_never_paths(tmp_path):
    wh = tmp_path / "wh"
    with batchinfer.connect(models=MODELS, warehouse=wh) as con:
        con.sql("SELECT 1").to_arrow()
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        for name in ["../escape", "tables/x", "a.b", "/etc/passwd", "Feats"]:
            con.register(name, pa.table({"v": [1, 2, 3]}))
            quoted = '"' + name.replace('"', '""') + '"'
            assert con.sql(f"SELECT sum(v) AS s FROM {quoted}").to_arrow()["s"].to_pylist() == [6]
            con.unregister(name)
        # Nothing was written for them, in the warehouse or beside it.
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        assert not (tmp_path / "escape").exists()


def minimal_pdf(pages: list[str]) -> bytes:
    """A PDF of a page for each text, in Helvetica, with its cross-reference table."""
    bodies = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>"
        % (b" ".join(b"%d 0 R" % (4 + 2 * k) for k in range(len(pages))), len(pages)),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for text in pages:
        content = b"BT /F1 12 Tf 72 720 Td (%s) Tj ET" % text.encode()
        page = len(bodies) + 1
        bodies.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (page + 1)
        )
        bodies.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for k, body in enumerate(bodies):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (k + 1, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(bodies) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(bodies) + 1, xref)
    return bytes(out)


def test_pdfs_are_read_by_workers_of_this_python(con, tmp_path):
    (tmp_path / "a.pdf").write_bytes(minimal_pdf(["first page", "second page"]))
    (tmp_path / "b.md").write_text("# notes\n")
    table = con.sql(
        f"SELECT regexp_replace(filename, '.*/', '') AS file, page, text, error "
        f"FROM read_document('{tmp_path}/') ORDER BY file, page"
    ).to_arrow()
    assert table.to_pylist() == [
        {"file": "a.pdf", "page": 1, "text": "first page", "error": None},
        {"file": "a.pdf", "page": 2, "text": "second page", "error": None},
        {"file": "b.md", "page": 1, "text": "# notes\n", "error": None},
    ]
