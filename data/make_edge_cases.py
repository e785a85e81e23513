#!/usr/bin/env python3
"""Makes the fixtures of the edge cases the tests hold batchinfer to, with Python references.

Models derive from the committed `data/models/linear.onnx` (its weights, not a retraining), so
re-running this script changes nothing else in the repository. Re-runnable: same files each time.

    pip install numpy onnx onnxruntime==1.31.1 pyarrow tokenizers
    python3 data/make_edge_cases.py

Writes:
- data/models/linear_fixed4.onnx, lookup_fixed4.onnx: batch dimension fixed at 4 (the padding
  path), with references data/reference/fixed4.parquet computed by onnxruntime on padded chunks.
- data/fixtures/linear_doubled.onnx: linear's weights and bias doubled (a second model with the
  same inputs, to tell two definitions of one name apart).
- data/fixtures/external/model.onnx + weights.bin: linear with its weights as ONNX external data;
  reference data/fixtures/external/reference.parquet.
- data/fixtures/batch_1e9.onnx, batch_2p32.onnx: an absurd fixed batch dimension.
- data/fixtures/scan/*.parquet: files pyarrow writes that a reader must read: lists with empty
  data pages (v1, v2, int64), and one row group of 1M rows in every encoding pyarrow writes
  (encodings.parquet, delta.parquet); expected.json holds pyarrow's own aggregates of each.
- data/reference/minilm_variants.parquet: all-MiniLM-L6-v2 vectors with CLS and max pooling,
  without normalization, and truncated at 16 tokens, on sentences and on texts longer than the
  model's 256 tokens (the same Python stack as data/make_text.py).
"""
import json
import pathlib
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
MODELS, REFERENCE, FIXTURES = HERE / "models", HERE / "reference", HERE / "fixtures"
OPSET = 17


def save(model: onnx.ModelProto, path: pathlib.Path, **kwargs) -> pathlib.Path:
    model.ir_version = min(model.ir_version, 9)
    model.producer_version = ""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), **kwargs)
    onnx.checker.check_model(str(path))
    return path


def linear_weights():
    model = onnx.load(str(MODELS / "linear.onnx"))
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return init["W"], init["b"]


def linear_graph(w, b, batch, name):
    k = w.shape[0]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["score"])],
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [batch, 1])],
        [numpy_helper.from_array(w.astype(np.float32), "W"),
         numpy_helper.from_array(b.astype(np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def lookup_graph(batch):
    table = (np.arange(10, dtype=np.float32) * 1.5).reshape(10)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["value"], axis=0)],
        "lookup_fixed4",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, [batch])],
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def padded_chunks(values: np.ndarray, size: int):
    """Chunks of `size` rows, the last padded by repeating its last row: what the model sees."""
    for start in range(0, len(values), size):
        chunk = values[start:start + size]
        pad = np.repeat(chunk[-1:], size - len(chunk), axis=0)
        yield len(chunk), np.concatenate([chunk, pad])


def make_fixed4() -> None:
    w, b = linear_weights()
    linear = save(linear_graph(w, b, 4, "linear_fixed4"), MODELS / "linear_fixed4.onnx")
    lookup = save(lookup_graph(4), MODELS / "lookup_fixed4.onnx")
    features = pq.read_table(HERE / "sample" / "vectors.parquet").slice(0, 10)
    x = np.stack(features.column("features").to_numpy(zero_copy_only=False)).astype(np.float32)
    session = ort.InferenceSession(str(linear), providers=["CPUExecutionProvider"])
    scores = []
    for n, chunk in padded_chunks(x, 4):
        scores.extend(session.run(None, {"input": chunk})[0].reshape(-1)[:n])
    # lookup: a chunk that fails is scored row by row (each row alone, padded), as on_error='null'
    # isolates failing rows; a row that fails alone is NULL.
    idx = np.array([1, 3, 42, 5, 11, 0, -3, 7, 9, 100], dtype=np.int64)
    session = ort.InferenceSession(str(lookup), providers=["CPUExecutionProvider"])
    values = []
    for row in idx:
        try:
            values.append(float(session.run(None, {"idx": np.repeat(row, 4)})[0][0]))
        except Exception:
            values.append(None)
    pq.write_table(pa.table({
        "id": pa.array(np.arange(10, dtype=np.int64)),
        "score": pa.array(np.array(scores, dtype=np.float32)),
        "idx": pa.array(idx),
        "value": pa.array(values, pa.float32()),
    }), REFERENCE / "fixed4.parquet")


def make_models() -> None:
    w, b = linear_weights()
    save(linear_graph(2 * w, 2 * b, "batch", "linear_doubled"), FIXTURES / "linear_doubled.onnx")
    external = FIXTURES / "external"
    model = linear_graph(w, b, "batch", "linear_external")
    # onnx appends to an existing data file: start from none.
    (external / "weights.bin").unlink(missing_ok=True)
    save(model, external / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
         location="weights.bin", size_threshold=0)
    (external / "weights.bin").chmod(0o644)
    features = pq.read_table(HERE / "sample" / "vectors.parquet").slice(0, 100)
    x = np.stack(features.column("features").to_numpy(zero_copy_only=False)).astype(np.float32)
    session = ort.InferenceSession(str(external / "model.onnx"), providers=["CPUExecutionProvider"])
    pq.write_table(pa.table({
        "id": pa.array(np.arange(100, dtype=np.int64)),
        "score": pa.array(session.run(None, {"input": x})[0].reshape(-1)),
    }), external / "reference.parquet")
    for name, batch in [("batch_1e9", 10**9), ("batch_2p32", 2**32 + 1)]:
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 1])],
        )
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]),
             FIXTURES / f"{name}.onnx")


def make_scan() -> dict:
    scan = FIXTURES / "scan"
    scan.mkdir(parents=True, exist_ok=True)
    expected = {}
    # Lists with empty data pages: dictionary-encoded values, tiny pages, one row per write.
    n = 8193
    for name, dtype, version in [("empty_pages_v1", np.float32, "1.0"),
                                 ("empty_pages_v2", np.float32, "2.0"),
                                 ("empty_pages_int64", np.int64, "1.0")]:
        values = pa.array(np.arange(n * 4).astype(dtype))
        table = pa.table({"id": pa.array(np.arange(n, dtype=np.int64)),
                          "v": pa.FixedSizeListArray.from_arrays(values, 4)})
        pq.write_table(table, scan / f"{name}.parquet", data_page_size=64, write_batch_size=1,
                       data_page_version=version, use_dictionary=True)
        back = pq.read_table(scan / f"{name}.parquet")
        first = pa.compute.list_element(back.column("v"), 0)
        expected[name] = {"rows": back.num_rows, "sum_id": int(pa.compute.sum(back.column("id")).as_py()),
                          "sum_v1": float(pa.compute.sum(first).as_py())}
    # One row group of 1M rows, a column in each encoding pyarrow writes: those a reader may
    # skip through (split into row ranges), and the DELTA_* ones (read whole).
    n = 1_000_000
    ids = np.arange(n, dtype=np.int64)
    files = {
        "encodings": (pa.table({
            "id": pa.array(ids),
            "split": pa.array(ids.astype(np.float64) * 0.25),
            "dict_text": pa.array([f"city{i % 7}" for i in range(n)]),
            "plain_text": pa.array([f"r{i % 1000}" for i in range(n)]),
            "flag": pa.array(ids % 3 == 0),
            "plain": pa.array(ids * 3),
        }), {"split": "BYTE_STREAM_SPLIT", "plain_text": "PLAIN", "flag": "RLE",
             "plain": "PLAIN", "id": "PLAIN"}),
        "delta": (pa.table({
            "id": pa.array(ids),
            "h": pa.array(((ids * 2654435761) % 2**32).astype(np.uint32)),
            "d32": pa.array((ids * 7 - 3_000_000).astype(np.int32)),
            "len_text": pa.array([f"r{i % 1000}" for i in range(n)]),
            "prefix_text": pa.array([f"prefix-{i // 100:06d}" for i in range(n)]),
        }), {"id": "PLAIN", "h": "DELTA_BINARY_PACKED", "d32": "DELTA_BINARY_PACKED",
             "len_text": "DELTA_LENGTH_BYTE_ARRAY", "prefix_text": "DELTA_BYTE_ARRAY"}),
    }
    for name, (table, encodings) in files.items():
        path = scan / f"{name}.parquet"
        pq.write_table(table, path, row_group_size=n, compression="zstd",
                       use_dictionary=["dict_text"], column_encoding=encodings)
        back = pq.read_table(path)
        metadata = pq.ParquetFile(path).metadata
        summary = {
            "rows": back.num_rows,
            "row_groups": metadata.num_row_groups,
            "encodings": {metadata.row_group(0).column(i).path_in_schema:
                          sorted(metadata.row_group(0).column(i).encodings)
                          for i in range(metadata.num_columns)},
        }
        for column in back.column_names:
            values = back.column(column)
            if pa.types.is_string(values.type):
                summary[f"distinct_{column}"] = len(pa.compute.unique(values))
            else:
                summary[f"sum_{column}"] = pa.compute.sum(values.cast(pa.float64())).as_py()
        expected[name] = summary
    (scan / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    return expected


def embed(model_dir, texts, pooling="mean", normalize=True, max_tokens=256):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_tokens)
    tokenizer.enable_padding()
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for start in range(0, len(texts), 8):
        encodings = tokenizer.encode_batch(texts[start:start + 8])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.array([e.type_ids for e in encodings], dtype=np.int64)
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
        if pooling == "cls":
            pooled = hidden[:, 0, :]
        elif pooling == "max":
            pooled = np.where(mask[:, :, None] > 0, hidden, -np.inf).max(axis=1)
        else:
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        if normalize:
            pooled = pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        out.append(pooled)
    return np.concatenate(out).astype(np.float32)


VARIANTS = {
    "cls": {"pooling": "cls"},
    "max": {"pooling": "max"},
    "raw": {"normalize": False},
    "short": {"max_tokens": 16},
    "default": {},
}


def make_embed_variants() -> None:
    model_dir = pathlib.Path(subprocess.check_output(
        ["bash", str(HERE.parent / "scripts" / "fetch_minilm.sh")], text=True).strip())
    sentences = pq.read_table(HERE / "sample" / "sentences.parquet").column("body").to_pylist()
    # 40 sentences, then 10 texts of 40 sentences each: far over the model's 256 tokens.
    texts = sentences[:40] + [" ".join(sentences[100 + 40 * k:140 + 40 * k]) for k in range(10)]
    columns = {"variant": [], "id": [], "body": [], "v": []}
    for variant, settings in VARIANTS.items():
        vectors = embed(model_dir, texts, **settings)
        for i, (text, vector) in enumerate(zip(texts, vectors)):
            columns["variant"].append(variant)
            columns["id"].append(i)
            columns["body"].append(text)
            columns["v"].append(vector)
    v = np.stack(columns["v"])
    pq.write_table(pa.table({
        "variant": pa.array(columns["variant"]),
        "id": pa.array(np.array(columns["id"], dtype=np.int64)),
        "body": pa.array(columns["body"]),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1]),
    }), REFERENCE / "minilm_variants.parquet", compression="zstd")
    (FIXTURES / "minilm_variants.json").write_text(json.dumps(VARIANTS, indent=1) + "\n")


def main() -> None:
    FIXTURES.mkdir(exist_ok=True)
    make_fixed4()
    make_models()
    make_scan()
    make_embed_variants()
    for d in (FIXTURES, FIXTURES / "external", FIXTURES / "scan"):
        for f in sorted(p for p in d.iterdir() if p.is_file()):
            print(f"{f.relative_to(HERE.parent)}  {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
