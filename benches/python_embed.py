#!/usr/bin/env python3
"""The embedding job a user would write today: pyarrow -> tokenizers -> onnxruntime -> pyarrow,
32 rows per batch as sentence-transformers does by default, mean pooling and L2 normalization.

    python3 benches/python_embed.py MODEL_DIR INPUT.parquet OUTPUT.parquet
"""
import sys

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer


def main() -> None:
    model_dir, source, target = sys.argv[1:4]
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()
    session = ort.InferenceSession(f"{model_dir}/model.onnx", providers=["CPUExecutionProvider"])
    writer = None
    for batch in pq.ParquetFile(source).iter_batches(batch_size=32, columns=["id", "body"]):
        encodings = tokenizer.encode_batch(batch.column("body").to_pylist())
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        vectors = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        dim = vectors.shape[1]
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype(np.float32).reshape(-1)), dim)
        out = pa.record_batch([batch.column("id"), column], names=["id", "v"])
        if writer is None:
            writer = pq.ParquetWriter(target, out.schema)
        writer.write_batch(out)
    if writer is not None:
        writer.close()


if __name__ == "__main__":
    main()
