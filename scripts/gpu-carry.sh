#!/usr/bin/env bash
# Packs what a GPU check needs onto a machine that can reach nothing (the `device` tool's H200,
# whose transfers are capped at 64 MiB a call, the working tree included) into pieces of at most 52 MiB under .carry/ (git
# ignores it): the stripped release binary, ONNX Runtime's CUDA build (onnxruntime-gpu==1.31.1,
# fetched and checked by batchinfer's own pinned sha256) and the MiniLM text model.
#
#   scripts/gpu-carry.sh            # here: builds .carry/1 .. .carry/N and prints the plan
#
# Then one `run` per piece, each carrying `.carry/K` (ignored paths stay on a warm machine between
# calls), the last one running:
#   bash scripts/gpu-unpack.sh && scripts/gpu-check.sh
# The CUDA 13 libraries themselves are not carried: the machine's PyTorch environment has them
# (NVIDIA's wheels), and batchinfer finds them there.
set -euo pipefail
cd "$(dirname "$0")/.."

piece=$((52 * 1024 * 1024))
cache="${BATCHINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer}"
gpu="$cache/onnxruntime-gpu-1.31.1"
if [ ! -f "$gpu/libonnxruntime.so.1.31.1" ]; then
  url="https://files.pythonhosted.org/packages/22/97/9531b4d9e566cf2a0f04b4b5c26a3bc0ef2e2e0b6bc943a02c0eead98cf7/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
  sha=05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7
  tmp=$(mktemp -d)
  echo "fetching onnxruntime-gpu 1.31.1 from PyPI" >&2
  curl -sSfL -o "$tmp/w.whl" "$url"
  echo "$sha  $tmp/w.whl" | sha256sum -c - >/dev/null
  mkdir -p "$gpu"
  python3 - "$tmp/w.whl" "$gpu" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for name in ["libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so", "libonnxruntime.so.1.31.1"]:
    open(f"{sys.argv[2]}/{name}", "wb").write(z.read(f"onnxruntime/capi/{name}"))
PY
  rm -rf "$tmp"
fi
minilm=$(bash scripts/fetch_minilm.sh)

[ -x target/release/batchinfer ] || cargo build --release
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/cache/models"
cp target/release/batchinfer "$stage/bin/" && strip "$stage/bin/batchinfer"
cp -r "$gpu" "$stage/cache/"
cp -rL "$minilm" "$stage/cache/models/"
echo "compressing (a few minutes)" >&2
tar -C "$stage" -cf - bin cache | xz -T0 -6 >"$stage/all.tar.xz"

rm -rf .carry
mkdir -p .carry
split -b "$piece" -d -a 2 "$stage/all.tar.xz" "$stage/part."
k=0
for part in "$stage"/part.*; do
  k=$((k + 1))
  mkdir -p ".carry/$k"
  mv "$part" ".carry/$k/"
done
echo "$k pieces:" >&2
du -sh .carry/* >&2
echo "run with carry [\".carry/1\"] ... [\".carry/$k\"], the last command: bash scripts/gpu-unpack.sh && scripts/gpu-check.sh" >&2
