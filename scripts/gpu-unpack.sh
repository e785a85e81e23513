#!/usr/bin/env bash
# On the GPU machine, after every piece of scripts/gpu-carry.sh has been carried there: joins them
# and unpacks the binary into target/release/ and ONNX Runtime's CUDA build and the MiniLM model
# into batchinfer's cache, where batchinfer and scripts/gpu-check.sh look for them.
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${BATCHINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer}"
ls .carry/*/part.* >/dev/null
: >/tmp/batchinfer-carry.tar.xz
for part in $(ls .carry/*/part.* | xargs -n1 basename | sort); do
  cat .carry/*/"$part" >>/tmp/batchinfer-carry.tar.xz
done
stage=$(mktemp -d)
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" /tmp/batchinfer-carry.tar.xz "$stage"
mkdir -p target/release "$cache"
cp "$stage/bin/batchinfer" target/release/batchinfer
cp -r "$stage/cache/." "$cache/"
touch "$cache/models/all-MiniLM-L6-v2/.complete"
rm -rf "$stage" /tmp/batchinfer-carry.tar.xz
echo "unpacked: target/release/batchinfer, $cache/onnxruntime-gpu-1.31.1, $cache/models/all-MiniLM-L6-v2"
