"""What the tests share: the repository's test models and data, the command line to compare
messages with, and this process's memory as Linux counts it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "data" / "models"
SAMPLE = ROOT / "data" / "sample"


@pytest.fixture
def con():
    import batchinfer

    with batchinfer.connect(models=MODELS) as con:
        yield con


def cli_error(sql: str, *args: str) -> str:
    """The message the command line prints for ``sql`` (``Error: `` taken off)."""
    cli = os.environ["BATCHINFER_CLI"]
    run = subprocess.run(
        [cli, "query", "--models", str(MODELS), *args, "-e", sql],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run
    return run.stderr.strip().removeprefix("Error: ")


def memory(key: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (the peak since the last reset), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


def reset_peak() -> None:
    """Makes ``VmHWM`` start again from ``VmRSS`` (Linux's clear_refs)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
