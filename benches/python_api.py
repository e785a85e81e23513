"""The 10M-row linear job from a pandas DataFrame in memory, from Python: batchinfer's
``con.sql(...).to_pandas()`` beside onnxruntime over the same DataFrame in a Python loop.

    pip install .                          # batchinfer's wheel, release build (docs/python.md)
    pip install -r benches/requirements.txt
    python benches/python_api.py --rows 10000000 --repeat 5

Each contender runs as a process of its own, in rounds (batchinfer, onnxruntime, batchinfer,
...). Each makes the same DataFrame (10 float32 features and an int64 id, seeded), then times
its job alone: from the DataFrame to a DataFrame of (id, score). Printed, min, median and max:
the job's wall time, the memory the job added at its peak (Linux's high-water mark, reset
before the job, less the resident memory then) and the process's peak (the kernel's, with the
DataFrame); and the ratios of the medians. A contender run alone (``--contender batchinfer``) prints its own
figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "models" / "linear.onnx"
FEATURES = [f"f{i}" for i in range(10)]
# onnxruntime's loop: the batch size batchinfer reads with, and a larger one.
LOOP_BATCH = 65_536


def frame(rows: int):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(42)
    data = {"id": np.arange(rows, dtype=np.int64)}
    data.update({c: rng.standard_normal(rows, dtype=np.float32) for c in FEATURES})
    return pd.DataFrame(data)


def run_batchinfer(df):
    import batchinfer

    con = batchinfer.connect(models=ROOT / "data" / "models")
    con.register("feats", df)
    features = ", ".join(FEATURES)
    return con.sql(f"SELECT id, predict('linear', {features}) AS score FROM feats").to_pandas()


def run_onnxruntime(df):
    import numpy as np
    import onnxruntime as ort
    import pandas as pd

    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    scores = []
    for start in range(0, len(df), LOOP_BATCH):
        chunk = df.iloc[start : start + LOOP_BATCH]
        matrix = chunk[FEATURES].to_numpy(dtype=np.float32)
        scores.append(session.run(None, {"input": matrix})[0][:, 0])
    return pd.DataFrame({"id": df["id"].to_numpy(), "score": np.concatenate(scores)})


def status(key: str) -> int:
    """VmRSS or VmHWM of this process, in bytes (Linux)."""
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")


def contender(name: str, rows: int) -> None:
    df = frame(rows)
    # The job's own peak: from the resident memory before it (the DataFrame made) to its
    # highest, Linux's high-water mark reset first.
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = status("VmRSS")
    started = time.perf_counter()
    out = {"batchinfer": run_batchinfer, "onnxruntime": run_onnxruntime}[name](df)
    wall = time.perf_counter() - started
    assert len(out) == rows and list(out.columns) == ["id", "score"]
    print(f"{wall:.3f} {(status('VmHWM') - before) / (1 << 20):.0f}")


def measure(name: str, rows: int) -> tuple[float, float, float]:
    """(job seconds, the job's added peak MiB, the process's peak MiB) of one run of `name` in
    a process of its own."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--contender", name, "--rows", str(rows)],
        stdout=subprocess.PIPE,
        text=True,
    )
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{name} failed with status {process.returncode}")
    wall, added = out.strip().splitlines()[-1].split()
    return float(wall), float(added), usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--contender", choices=["batchinfer", "onnxruntime"])
    args = parser.parse_args()
    if args.contender:
        contender(args.contender, args.rows)
        return
    names = ["batchinfer", "onnxruntime"]
    figures = {n: [] for n in names}
    for name in names:  # a warm-up of each: ONNX Runtime fetched, caches filled
        measure(name, args.rows)
    for _ in range(args.repeat):
        for name in names:
            figures[name].append(measure(name, args.rows))
    print(
        f"{args.rows:,} rows, {args.repeat} rounds; min / median / max of the job's wall s, "
        "the memory the job added at its peak (MiB), and the process's peak (MiB, with the DataFrame)"
    )
    medians = {}
    for name in names:
        columns = list(zip(*figures[name]))
        medians[name] = [statistics.median(c) for c in columns]
        shown = [f"{min(c):.3f} / {statistics.median(c):.3f} / {max(c):.3f}" if i == 0
                 else f"{min(c):.0f} / {statistics.median(c):.0f} / {max(c):.0f}"
                 for i, c in enumerate(columns)]
        print(f"{name:12} wall {shown[0]}   added {shown[1]}   process {shown[2]}")
    b, o = medians["batchinfer"], medians["onnxruntime"]
    print(f"onnxruntime / batchinfer: wall {o[0] / b[0]:.2f}x, added memory {o[1] / max(b[1], 1):.2f}x")

if __name__ == "__main__":
    main()
