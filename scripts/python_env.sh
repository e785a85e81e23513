#!/usr/bin/env bash
# Makes the virtual environment the Python package's tests run in, once per machine, at
# ${BATCHINFER_PYTHON_ENV:-~/.cache/batchinfer-python-env}: pytest, and what the tests compare
# batchinfer against or hand it (pyarrow, pandas, polars, numpy, onnxruntime), the Arrow Flight SQL
# client `batchinfer serve` is tested with (ADBC's driver), from PyPI at
# pinned versions; maturin too, which builds the wheel (docs/python.md). Prints the
# environment's python. Safe to run from several tests at once.
set -euo pipefail

PACKAGES=(
    pytest==9.2.0
    maturin==1.16.0
    pyarrow==26.0.1
    pandas==3.1.1
    polars==2.1.0
    numpy==2.4.6
    onnxruntime==1.31.1
    adbc-driver-manager==1.13.0
    adbc-driver-flightsql==1.13.0
)

dest="${BATCHINFER_PYTHON_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-python-env}"
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9

# The list of packages is the environment's identity: another list makes it anew.
want="${PACKAGES[*]}"
if [ ! -x "$dest/ready" ] || [ "$(cat "$dest/packages" 2>/dev/null)" != "$want" ]; then
    rm -rf "$dest"
    python3 -m venv "$dest"
    "$dest/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2
    echo "$want" > "$dest/packages"
    printf '#!/bin/sh\n' > "$dest/ready"
    chmod +x "$dest/ready"
fi

echo "$dest/bin/python"
