#!/usr/bin/env python3
"""The script a user would write today: pyarrow batches -> numpy -> onnxruntime -> pyarrow writer.

    python3 benches/python_baseline.py MODEL.onnx INPUT.parquet OUTPUT.parquet [--vectors]

Reads `id, f0..f9` (or `id, features` with --vectors), scores with the model's one input, and
writes `id, score`. This is the baseline batchinfer is measured against in benches/pipeline.rs.
"""
import sys

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq


def main() -> None:
    model, source, target = sys.argv[1:4]
    vectors = "--vectors" in sys.argv[4:]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    columns = ["id", "features"] if vectors else ["id"] + [f"f{i}" for i in range(10)]
    writer = None
    for batch in pq.ParquetFile(source).iter_batches(batch_size=65536, columns=columns):
        if vectors:
            flat = batch.column("features").flatten().to_numpy()
            x = flat.reshape(batch.num_rows, -1).astype(np.float32, copy=False)
        else:
            x = np.column_stack([batch.column(f"f{i}").to_numpy() for i in range(10)]).astype(np.float32)
        score = session.run(None, {input_name: x})[0].reshape(-1)
        out = pa.record_batch([batch.column("id"), pa.array(score)], names=["id", "score"])
        if writer is None:
            writer = pq.ParquetWriter(target, out.schema)
        writer.write_batch(out)
    if writer is not None:
        writer.close()


if __name__ == "__main__":
    main()
