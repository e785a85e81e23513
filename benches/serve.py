"""A 10M-row scored result fetched through `batchinfer serve` (Arrow Flight SQL) by ADBC into
pyarrow, beside the command line's COPY of the same query to Parquet.

    cargo build --release
    pip install -r benches/requirements.txt
    python benches/serve.py --rows 10000000 --repeat 5

The input is made once: `--rows` rows of an int64 id and 10 float32 features (seeded), in
row groups of 1,000,000 rows. One server runs for the whole bench (models loaded once, as a
server does); each contender is a process of its own, in rounds (flight, copy, flight, ...),
after a warm-up of each:

- flight: a Python process that connects with ADBC's Flight SQL driver, runs
  `SELECT id, predict('linear', f0..f9) AS score FROM '<input>'` and reads the whole result into
  a `pyarrow.Table` (the whole process; its fetch alone, from the connection to the last row,
  is printed too);
- copy: `batchinfer query -e "COPY (<the same query>) TO '<file>' STORED AS PARQUET"`, the whole
  process (its start and the model's load included).

Printed: min / median / max of each contender's wall s; rows/s and bytes/s of the medians, the
bytes being the result's Arrow size (the same rows for both: 12 bytes a row) and, for copy, the
Parquet file it wrote; each process's peak memory; the server's peak; and the ratio of the
medians.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"
FEATURES = [f"f{i}" for i in range(10)]


def release_binary() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = target / "release" / "batchinfer"
    if not binary.exists():
        raise SystemExit(f"{binary} is missing: run `cargo build --release` first")
    return binary


def make_input(path: Path, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(42)
    data = {"id": pa.array(np.arange(rows, dtype=np.int64))}
    data.update({c: pa.array(rng.standard_normal(rows, dtype=np.float32)) for c in FEATURES})
    pq.write_table(pa.table(data), path, row_group_size=1_000_000, compression="snappy")


def query(features: Path) -> str:
    return f"SELECT id, predict('linear', {', '.join(FEATURES)}) AS score FROM '{features}'"


def flight_client(uri: str, sql: str) -> None:
    """The flight contender's process: prints its wall seconds, rows and Arrow bytes."""
    import adbc_driver_flightsql.dbapi as flightsql

    started = time.perf_counter()
    with flightsql.connect(uri, autocommit=True) as con, con.cursor() as cur:
        cur.execute(sql)
        table = cur.fetch_arrow_table()
    wall = time.perf_counter() - started
    print(f"{wall:.3f} {table.num_rows} {table.nbytes}")


def peak_of(pid: int) -> int:
    """VmHWM of a running process, in bytes."""
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmHWM")


def timed(command: list[str]) -> tuple[float, str, float]:
    """(wall s, stdout, peak MiB) of `command` run as a process of its own."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{command[:3]} failed with status {code}")
    return wall, out, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--client", nargs=2, metavar=("URI", "SQL"), help=argparse.SUPPRESS)
    parser.add_argument("--make-input", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        flight_client(*args.client)
        return
    if args.make_input:
        make_input(Path(args.make_input), args.rows)
        return
    cli = release_binary()
    work = Path(tempfile.mkdtemp(prefix="batchinfer-serve-bench-"))
    features = work / "features.parquet"
    # In a process of its own: a child's peak (ru_maxrss) starts at its parent's size.
    subprocess.run([sys.executable, __file__, "--make-input", str(features),
                    "--rows", str(args.rows)], check=True)
    sql = query(features)
    log = work / "serve.log"
    server = subprocess.Popen(
        [str(cli), "serve", "--models", str(MODELS), "--warehouse", str(work / "wh"),
         "--bind", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )
    try:
        deadline = time.monotonic() + 60
        while not (found := re.search(r"on (grpc://[\d.]+:\d+)", log.read_text())):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {log.read_text()}")
            time.sleep(0.05)
        uri = found.group(1)
        out = work / "scores.parquet"
        contenders = {
            "flight": [sys.executable, __file__, "--client", uri, sql],
            "copy": [str(cli), "query", "--models", str(MODELS), "--warehouse", str(work / "wh"),
                     "-e", f"COPY ({sql}) TO '{out}' STORED AS PARQUET"],
        }
        figures: dict[str, list[tuple[float, float]]] = {n: [] for n in contenders}
        fetches: list[float] = []
        arrow_bytes = 0
        for i in range(args.repeat + 1):  # the first, a warm-up of each
            for name, command in contenders.items():
                wall, printed, peak = timed(command)
                if name == "flight":
                    fetch, rows, arrow_bytes = printed.split()
                    assert int(rows) == args.rows, printed
                    if i > 0:
                        fetches.append(float(fetch))
                elif not out.exists():
                    raise SystemExit("copy wrote nothing")
                if i > 0:
                    figures[name].append((wall, peak))
        parquet_bytes = out.stat().st_size
        server_peak = peak_of(server.pid) / (1 << 20)
    finally:
        server.terminate()
        server.wait(30)
    arrow_bytes = int(arrow_bytes)
    print(f"{args.rows:,} rows scored, {args.repeat} rounds; the result is "
          f"{arrow_bytes / 1e6:.0f} MB as Arrow, {parquet_bytes / 1e6:.0f} MB as Parquet")
    print("| contender | wall s (min / median / max) | rows/s | Arrow MB/s | Parquet MB/s | peak MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    medians = {}
    for name, runs in figures.items():
        walls = [w for w, _ in runs]
        median = medians[name] = statistics.median(walls)
        peak = statistics.median(p for _, p in runs)
        written = f"{parquet_bytes / median / 1e6:.0f}" if name == "copy" else "-"
        print(f"| {name} | {min(walls):.3f} / {median:.3f} / {max(walls):.3f} | "
              f"{args.rows / median / 1e6:.1f}M | {arrow_bytes / median / 1e6:.0f} | {written} | "
              f"{peak:.0f} |")
    fetch = statistics.median(fetches)
    print(f"flight's fetch alone (connect to last row, in the client): median {fetch:.3f} s, "
          f"{args.rows / fetch / 1e6:.1f}M rows/s, {arrow_bytes / fetch / 1e6:.0f} MB/s; "
          f"the server's peak: {server_peak:.0f} MiB")
    print(f"flight / copy, wall: {medians['flight'] / medians['copy']:.2f}x")


if __name__ == "__main__":
    main()
