#!/usr/bin/env python3
"""References for int8 quantization: paraphrase-MiniLM-L3-v2 (float32, fetched by
`scripts/fetch_minilm.sh paraphrase-MiniLM-L3-v2`) on the first 300 sentences of
`data/sample/sentences.parquet`, embedded by the Python stack a user would write (`tokenizers` +
onnxruntime, mean pooling over the attention mask, truncation at 128 tokens, no normalization),
once in float32 and once quantized by onnxruntime's own `quantize_dynamic` (weights int8 per
channel in 7 bits, `reduce_range`, the method batchinfer's OPTIONS ('quantize' 'int8') follows).

    python3 data/make_quantized.py            # writes data/reference/paraphrase_l3.parquet

With `--check MODEL.onnx` it loads a quantized model that batchinfer wrote (its warehouse's
`quantized/KEY/model.onnx`) in Python onnxruntime instead, embeds the same sentences, and
compares with the reference: the quantized graph is one that onnxruntime in Python reads and runs
as batchinfer does. The comparison of the churn MLP (data/models/churn_mlp.onnx) follows, when
`--check-mlp MODEL.onnx` names batchinfer's quantized MLP.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from onnxruntime.quantization import QuantType, quantize_dynamic
from tokenizers import Tokenizer

HERE = pathlib.Path(__file__).resolve().parent
ROWS = 300
MAX_TOKENS = 128
OUTPUT = "onnx::Shape_422"  # the token vectors [N, tokens, 384]


def session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def embed(model_dir: pathlib.Path, model: pathlib.Path, texts: list) -> np.ndarray:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.enable_padding()
    sess = session(model)
    out = []
    for start in range(0, len(texts), 16):
        encodings = tokenizer.encode_batch(texts[start:start + 16])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        hidden = sess.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]
        weights = mask[:, :, None].astype(np.float32)
        out.append((hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9))
    return np.concatenate(out).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def fixed(values: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def check_mlp(model: pathlib.Path) -> bool:
    test = pq.read_table(HERE / "sample" / "churn_test.parquet")
    feeds = {
        "city": np.array(test["city"].to_pylist(), dtype=object).reshape(-1, 1),
        "age": test["age"].to_numpy().reshape(-1, 1),
        "spend": test["spend"].to_numpy().reshape(-1, 1),
    }
    ours = session(model).run(None, feeds)
    fp32 = pq.read_table(HERE / "reference" / "churn_mlp.parquet")["label"].to_numpy()
    agreement = (ours[0] == fp32).mean()
    print(f"churn MLP quantized by batchinfer, run by Python onnxruntime: label agreement with "
          f"float32 {agreement:.4f} on {len(fp32)} rows")
    return agreement >= 0.995


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", type=pathlib.Path, help="batchinfer's quantized L3 model.onnx")
    parser.add_argument("--check-mlp", type=pathlib.Path, help="batchinfer's quantized churn MLP")
    args = parser.parse_args()
    model_dir = pathlib.Path(subprocess.check_output(
        ["bash", str(HERE.parent / "scripts" / "fetch_minilm.sh"), "paraphrase-MiniLM-L3-v2"],
        text=True).strip())
    texts = pq.read_table(HERE / "sample" / "sentences.parquet")["body"].to_pylist()[:ROWS]
    reference = HERE / "reference" / "paraphrase_l3.parquet"

    if args.check or args.check_mlp:
        ok = True
        if args.check:
            table = pq.read_table(reference)
            int8 = np.stack(table["int8"].to_numpy(zero_copy_only=False))
            fp32 = np.stack(table["fp32"].to_numpy(zero_copy_only=False))
            ours = embed(model_dir, args.check, texts)
            close = np.abs(ours - int8).max()
            cos = cosine(ours, fp32)
            print(f"{args.check} in Python onnxruntime: max |ours - quantize_dynamic| {close:.2e}; "
                  f"cosine with float32 mean {cos.mean():.4f}, min {cos.min():.4f}")
            ok &= bool(close < 1e-3 and cos.mean() >= 0.99)
        if args.check_mlp:
            ok &= check_mlp(args.check_mlp)
        sys.exit(0 if ok else 1)

    fp32 = embed(model_dir, model_dir / "model.onnx", texts)
    with tempfile.TemporaryDirectory() as tmp:
        quantized = pathlib.Path(tmp) / "model.int8.onnx"
        quantize_dynamic(str(model_dir / "model.onnx"), str(quantized), per_channel=True,
                         weight_type=QuantType.QInt8, reduce_range=True)
        int8 = embed(model_dir, quantized, texts)
    cos = cosine(int8, fp32)
    print(f"quantize_dynamic: cosine with float32 mean {cos.mean():.4f}, min {cos.min():.4f}")
    pq.write_table(pa.table({
        "id": np.arange(ROWS, dtype=np.int64), "fp32": fixed(fp32), "int8": fixed(int8),
    }), reference, compression="zstd")


if __name__ == "__main__":
    main()
