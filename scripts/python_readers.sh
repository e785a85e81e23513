#!/usr/bin/env bash
# Installs the Python readers the Delta Lake tests compare batchinfer's tables against, once per
# machine, into a virtual environment at
# ${BATCHINFER_PYTHON_READERS:-~/.cache/batchinfer-python-readers}: the `deltalake` package
# (delta-rs's Python binding) and Polars, from PyPI, at pinned versions. Prints the environment's
# python. Safe to run from several tests at once.
set -euo pipefail

DELTALAKE=deltalake==1.1.4
POLARS=polars==2.1.0
PYARROW=pyarrow==26.0.1

dest="${BATCHINFER_PYTHON_READERS:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-python-readers}"
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9

if [ ! -x "$dest/ready" ]; then
    rm -rf "$dest"
    python3 -m venv "$dest"
    "$dest/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$DELTALAKE" "$POLARS" "$PYARROW" >&2
    printf '#!/bin/sh\n' > "$dest/ready"
    chmod +x "$dest/ready"
fi

echo "$dest/bin/python"
