"""`batchinfer serve` started by the tests, and ADBC's Flight SQL driver as its client."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql
import pytest
from adbc_driver_flightsql import DatabaseOptions

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "data" / "models"
FEATURES = ROOT / "data" / "sample" / "features.parquet"
CLI = os.environ["BATCHINFER_CLI"]

# The test token and password: long enough for the server, never printed by it.
TOKEN = "tok-" + "7f3a9c" * 6
PASSWORD = "pw-" + "c0ffee" * 5

SCORE = (
    "SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS score "
    f"FROM '{FEATURES}' ORDER BY id"
)


class Server:
    """A `batchinfer serve` process on a port of its own (it binds port 0 and says which)."""

    def __init__(self, warehouse: Path, *args: str, env: dict | None = None):
        self.log = warehouse.parent / f"serve-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen(
            [CLI, "serve", "--models", str(MODELS), "--warehouse", str(warehouse),
             "--bind", "127.0.0.1:0", *args],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"),
            env={**os.environ, **(env or {})},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"on (grpc(?:\+tls)?)://([\d.]+:\d+)", self.log.read_text())
            if found:
                self.scheme, self.address = found.groups()
                self.uri = f"{self.scheme}://{self.address}"
                self.port = int(self.address.rsplit(":", 1)[1])
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited: {self.log.read_text()}")
            time.sleep(0.05)
        raise AssertionError(f"serve did not start: {self.log.read_text()}")

    def connect(self, token: str | None = None, **options: str):
        """An ADBC connection; with `token`, shown as the bearer token."""
        db = {**options}
        if token is not None:
            db[DatabaseOptions.AUTHORIZATION_HEADER.value] = f"Bearer {token}"
        return flightsql.connect(self.uri, db_kwargs=db, autocommit=True)

    def rss(self) -> int:
        """The server's resident memory, in bytes."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def fds(self) -> int:
        """The server's open file descriptors."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


@pytest.fixture
def warehouse(tmp_path):
    return tmp_path / "wh"


@pytest.fixture
def serve(warehouse):
    """Starts servers over the test's warehouse; all are stopped at its end."""
    servers = []

    def start(*args: str, env: dict | None = None) -> Server:
        server = Server(warehouse, *args, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        log = server.stop()
        # Never a secret in what the server says.
        assert TOKEN not in log and PASSWORD not in log, log


def cli(warehouse: Path, sql: str, *args: str) -> subprocess.CompletedProcess:
    """The command line over the same models and warehouse."""
    return subprocess.run(
        [CLI, "query", "--models", str(MODELS), "--warehouse", str(warehouse), *args, "-e", sql],
        capture_output=True,
        text=True,
        timeout=300,
    )
