#!/usr/bin/env python3
"""Makes the test models, their sample Parquet files and the reference outputs.

Every model here is real: trained with scikit-learn on its bundled datasets (or on seeded synthetic
data) and exported with skl2onnx, or built with the `onnx` package where the point is a specific
graph shape (a fixed batch size, several inputs, every input type). The reference outputs come from
Python onnxruntime on the same rows, so the Rust tests compare batchinfer with an independent
implementation. Re-runnable: the same seeds give the same files.

    python3 data/make_data.py            # writes data/models, data/sample, data/reference
"""
import os
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType, StringTensorType
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer, load_iris
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

HERE = pathlib.Path(__file__).resolve().parent
MODELS, SAMPLE, REFERENCE = HERE / "models", HERE / "sample", HERE / "reference"
OPSET = 17


def save_model(model: onnx.ModelProto, name: str) -> pathlib.Path:
    # IR 9 is what onnxruntime 1.31 and older runtimes all read; onnx 1.23 would default to 14.
    model.ir_version = min(model.ir_version, 9)
    onnx.checker.check_model(model)
    path = MODELS / f"{name}.onnx"
    # Deterministic bytes: no producer version that changes between skl2onnx releases.
    model.producer_version = ""
    path.write_bytes(model.SerializeToString())
    return path


def run_reference(path: pathlib.Path, feeds: dict) -> dict:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def write_parquet(table: pa.Table, path: pathlib.Path, row_group_size: int = 4096) -> None:
    pq.write_table(table, path, row_group_size=row_group_size, compression="zstd")


def fixed_list(values: np.ndarray) -> pa.Array:
    n, k = values.shape
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), k)


def linear_graph(weights: np.ndarray, bias: float, batch, name: str) -> onnx.ModelProto:
    """`Linear(10 -> 1)` as in the tutorial's SimpleModel: y = x @ W + b."""
    k = weights.shape[0]
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["score"]),
        ],
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, [batch, 1])],
        [
            numpy_helper.from_array(weights.reshape(k, 1).astype(np.float32), "W"),
            numpy_helper.from_array(np.array([bias], dtype=np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def make_linear(rng: np.random.Generator) -> None:
    """Linear regression trained on 10 float features; the fixed-batch twin has the same weights."""
    n = 10_000
    x = rng.standard_normal((n, 10)).astype(np.float32)
    true_w = np.linspace(-1.0, 1.0, 10)
    y = x @ true_w + 0.5 + rng.normal(0, 0.1, n)
    reg = LinearRegression().fit(x, y)
    linear = save_model(linear_graph(reg.coef_, float(reg.intercept_), "batch", "linear"), "linear")
    save_model(linear_graph(reg.coef_, float(reg.intercept_), 1, "linear_fixed1"), "linear_fixed1")

    ids = np.arange(n, dtype=np.int64)
    cols = {"id": pa.array(ids)}
    for j in range(10):
        cols[f"f{j}"] = pa.array(x[:, j])
    write_parquet(pa.table(cols), SAMPLE / "features.parquet")
    write_parquet(pa.table({"id": pa.array(ids), "features": fixed_list(x)}), SAMPLE / "vectors.parquet")

    out = run_reference(linear, {"input": x})["score"].reshape(-1)
    write_parquet(pa.table({"id": ids, "score": pa.array(out)}), REFERENCE / "linear.parquet")


def make_iris() -> None:
    """Logistic regression on iris, exported without ZipMap: `label` + `probabilities`."""
    data = load_iris()
    x = data.data.astype(np.float32)
    clf = LogisticRegression(max_iter=500).fit(x, data.target)
    model = convert_sklearn(
        clf, "iris", [("float_input", FloatTensorType([None, 4]))],
        options={id(clf): {"zipmap": False}}, target_opset=OPSET,
    )
    path = save_model(model, "iris")
    names = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
    # Stored as float64, as pandas and most tools write them: predict casts to the model's float32.
    cols = {"id": pa.array(np.arange(len(x), dtype=np.int64))}
    for j, name in enumerate(names):
        cols[name] = pa.array(data.data[:, j])
    cols["species"] = pa.array([data.target_names[t] for t in data.target])
    write_parquet(pa.table(cols), SAMPLE / "iris.parquet", row_group_size=64)

    ref = run_reference(path, {"float_input": data.data.astype(np.float32)})
    write_parquet(pa.table({
        "id": cols["id"], "label": pa.array(ref["label"]),
        "probabilities": fixed_list(ref["probabilities"]),
    }), REFERENCE / "iris.parquet")


def make_breast_cancer() -> None:
    """Gradient-boosted trees on breast_cancer: ONNX TreeEnsembleClassifier."""
    data = load_breast_cancer()
    x = data.data.astype(np.float32)
    clf = GradientBoostingClassifier(n_estimators=60, max_depth=3, random_state=0).fit(x, data.target)
    model = convert_sklearn(
        clf, "breast_cancer", [("input", FloatTensorType([None, x.shape[1]]))],
        options={id(clf): {"zipmap": False}}, target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    path = save_model(model, "breast_cancer")
    names = [n.replace(" ", "_") for n in data.feature_names]
    cols = {"id": pa.array(np.arange(len(x), dtype=np.int64))}
    for j, name in enumerate(names):
        cols[name] = pa.array(x[:, j])
    write_parquet(pa.table(cols), SAMPLE / "breast_cancer.parquet", row_group_size=128)

    ref = run_reference(path, {"input": x})
    write_parquet(pa.table({
        "id": cols["id"], "label": pa.array(ref["label"]),
        "probabilities": fixed_list(ref["probabilities"]),
    }), REFERENCE / "breast_cancer.parquet")


def make_churn(rng: np.random.Generator) -> None:
    """A scikit-learn pipeline with a string categorical input: one-hot(city) + scaled numbers."""
    n = 2_000
    cities = np.array(["berlin", "istanbul", "lagos", "lima", "osaka"])
    city = rng.choice(cities, n)
    age = rng.integers(18, 80, n).astype(np.float32)
    spend = rng.gamma(2.0, 50.0, n).astype(np.float32)
    logit = 0.04 * (age - 45) - 0.01 * (spend - 100) + np.where(city == "lagos", 1.0, -0.3)
    churned = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)

    pipe = Pipeline([
        ("prep", ColumnTransformer([
            ("city", OneHotEncoder(handle_unknown="ignore"), [0]),
            ("num", StandardScaler(), [1, 2]),
        ])),
        ("clf", LogisticRegression(max_iter=500)),
    ])
    table = np.empty((n, 3), dtype=object)
    table[:, 0], table[:, 1], table[:, 2] = city, age, spend
    pipe.fit(table, churned)
    model = convert_sklearn(
        pipe, "churn",
        [("city", StringTensorType([None, 1])), ("age", FloatTensorType([None, 1])),
         ("spend", FloatTensorType([None, 1]))],
        options={id(pipe.steps[-1][1]): {"zipmap": False}}, target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    path = save_model(model, "churn")
    ids = np.arange(n, dtype=np.int64)
    write_parquet(pa.table({"id": ids, "city": city, "age": age, "spend": spend, "churned": churned}),
                  SAMPLE / "customers.parquet", row_group_size=512)

    ref = run_reference(path, {"city": city.reshape(-1, 1), "age": age.reshape(-1, 1),
                               "spend": spend.reshape(-1, 1)})
    write_parquet(pa.table({
        "id": ids, "label": pa.array(ref["label"]),
        "probabilities": fixed_list(ref["probabilities"]),
    }), REFERENCE / "churn.parquet")


def make_churn_mlp(rng: np.random.Generator) -> None:
    """A scikit-learn MLP (two hidden layers of 64) over the churn features, for int8
    quantization: trained on 15,000 rows, its test set the 5,000 others. The references are its
    outputs in float and those of the model quantized by onnxruntime's own quantize_dynamic
    (weights int8 per channel in 7 bits, kept as reference/churn_mlp.int8.onnx), which batchinfer's
    quantization is compared with."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    n, train = 20_000, 15_000
    cities = np.array(["berlin", "istanbul", "lagos", "lima", "osaka"])
    city = rng.choice(cities, n)
    age = rng.integers(18, 80, n).astype(np.float32)
    spend = rng.gamma(2.0, 50.0, n).astype(np.float32)
    logit = 0.04 * (age - 45) - 0.01 * (spend - 100) + np.where(city == "lagos", 1.0, -0.3) \
        + 0.8 * np.sin(age / 7.0) * (spend > 80)
    churned = (rng.random(n) < 1 / (1 + np.exp(-3 * logit))).astype(np.int64)

    pipe = Pipeline([
        ("prep", ColumnTransformer([
            ("city", OneHotEncoder(handle_unknown="ignore"), [0]),
            ("num", StandardScaler(), [1, 2]),
        ])),
        ("clf", MLPClassifier(hidden_layer_sizes=(64, 64), max_iter=300, random_state=7)),
    ])
    table = np.empty((n, 3), dtype=object)
    table[:, 0], table[:, 1], table[:, 2] = city, age, spend
    pipe.fit(table[:train], churned[:train])
    model = convert_sklearn(
        pipe, "churn_mlp",
        [("city", StringTensorType([None, 1])), ("age", FloatTensorType([None, 1])),
         ("spend", FloatTensorType([None, 1]))],
        options={id(pipe.steps[-1][1]): {"zipmap": False}}, target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    path = save_model(model, "churn_mlp")
    test = slice(train, n)
    ids = np.arange(n - train, dtype=np.int64)
    write_parquet(pa.table({"id": ids, "city": city[test], "age": age[test], "spend": spend[test],
                            "churned": churned[test]}),
                  SAMPLE / "churn_test.parquet", row_group_size=1024)

    feeds = {"city": city[test].reshape(-1, 1), "age": age[test].reshape(-1, 1),
             "spend": spend[test].reshape(-1, 1)}
    quantized = REFERENCE / "churn_mlp.int8.onnx"
    quantize_dynamic(str(path), str(quantized), per_channel=True, weight_type=QuantType.QInt8,
                     reduce_range=True)
    for name, model_path in (("churn_mlp", path), ("churn_mlp_int8", quantized)):
        ref = run_reference(model_path, feeds)
        write_parquet(pa.table({
            "id": ids, "label": pa.array(ref["label"]),
            "probabilities": fixed_list(ref["probabilities"]),
        }), REFERENCE / f"{name}.parquet")


def make_dense(rng: np.random.Generator) -> None:
    """Gemm in its forms, for int8 quantization: transB with alpha and beta and a constant C,
    alpha without C, and C computed by the graph (a MatMul) scaled by beta. x [N, 32] -> [N, 4]."""
    f = np.float32
    w1, c1 = rng.normal(0, 0.3, (48, 32)).astype(f), rng.normal(0, 0.1, 48).astype(f)
    w2, w3, w4 = (rng.normal(0, 0.3, s).astype(f) for s in ((48, 16), (16, 4), (32, 4)))
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1", "c1"], ["g1"], transB=1, alpha=0.5, beta=2.0),
            helper.make_node("Relu", ["g1"], ["h1"]),
            helper.make_node("Gemm", ["h1", "w2"], ["h2"], alpha=3.0),
            helper.make_node("MatMul", ["x", "w4"], ["side"]),
            helper.make_node("Gemm", ["h2", "w3", "side"], ["y"], beta=0.5),
        ],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(c1, "c1"),
         numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(w3, "w3"),
         numpy_helper.from_array(w4, "w4")],
    )
    path = save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), "dense")
    n = 2_000
    x = rng.standard_normal((n, 32)).astype(f)
    ids = np.arange(n, dtype=np.int64)
    write_parquet(pa.table({"id": ids, "x": fixed_list(x)}), SAMPLE / "dense.parquet")
    y = run_reference(path, {"x": x})["y"]
    write_parquet(pa.table({"id": ids, "y": fixed_list(y)}), REFERENCE / "dense.parquet")


def make_attention(rng: np.random.Generator) -> None:
    """ONNX Runtime's fused transformer nodes, as its transformer optimizer writes them, for int8
    quantization (to QEmbedLayerNormalization and QAttention): token ids [N, 8] (and segment ids,
    a mask) -> com.microsoft EmbedLayerNormalization (tables of 200 tokens, 8 positions and 2
    segments, 64 wide) -> com.microsoft Attention (4 heads) -> the mean over the 8 positions
    [N, 64]. The references: float outputs, and those of the model quantized by onnxruntime's
    quantize_dynamic."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tokens, hidden, vocabulary = 8, 64, 200
    f = np.float32
    tables = {
        "word": rng.normal(0, 0.5, (vocabulary, hidden)).astype(f),
        "position": rng.normal(0, 0.5, (tokens, hidden)).astype(f),
        "segment": rng.normal(0, 0.5, (2, hidden)).astype(f),
        "gamma": rng.normal(1, 0.1, hidden).astype(f),
        "beta": rng.normal(0, 0.1, hidden).astype(f),
        "w": rng.normal(0, 0.2, (hidden, 3 * hidden)).astype(f),
        "b": rng.normal(0, 0.1, 3 * hidden).astype(f),
    }
    graph = helper.make_graph(
        [
            helper.make_node("EmbedLayerNormalization",
                             ["ids", "segments", "word", "position", "segment", "gamma", "beta", "mask"],
                             ["embedded", "mask_index"], domain="com.microsoft", epsilon=1e-12),
            helper.make_node("Attention", ["embedded", "w", "b", "mask_index"], ["attended"],
                             domain="com.microsoft", num_heads=4),
            helper.make_node("ReduceMean", ["attended"], ["y"], axes=[1], keepdims=0),
        ],
        "attention",
        [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", tokens])
         for name in ("ids", "segments", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", hidden])],
        [numpy_helper.from_array(value, name) for name, value in tables.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    path = MODELS / "attention.onnx"
    model.producer_version = ""
    path.write_bytes(model.SerializeToString())
    n = 500
    ids = rng.integers(0, vocabulary, (n, tokens)).astype(np.int32)
    lengths = rng.integers(1, tokens + 1, n)
    mask = (np.arange(tokens)[None, :] < lengths[:, None]).astype(np.int32)
    segments = (np.arange(tokens)[None, :] >= lengths[:, None] // 2).astype(np.int32) * mask
    rows = np.arange(n, dtype=np.int64)
    write_parquet(pa.table({"id": rows, "ids": fixed_list(ids), "segments": fixed_list(segments),
                            "mask": fixed_list(mask)}), SAMPLE / "attention.parquet")
    quantized = REFERENCE / "attention.int8.onnx"
    quantize_dynamic(str(path), str(quantized), per_channel=True, weight_type=QuantType.QInt8,
                     reduce_range=True)
    feeds = {"ids": ids, "segments": segments, "mask": mask}
    write_parquet(pa.table({
        "id": rows, "y": fixed_list(run_reference(path, feeds)["y"]),
        "y_int8": fixed_list(run_reference(quantized, feeds)["y"]),
    }), REFERENCE / "attention.parquet")
    quantized.unlink()


def make_two_inputs(rng: np.random.Generator) -> None:
    """Two named inputs bound by position: a vector `x` [N,3] and a per-row weight `w` [N]."""
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
            helper.make_node("Mul", ["s", "w"], ["y"]),
        ],
        "two_inputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        [numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")],
    )
    path = save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), "two_inputs")
    n = 1_000
    x = rng.standard_normal((n, 3)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, n).astype(np.float32)
    ids = np.arange(n, dtype=np.int64)
    write_parquet(pa.table({"id": ids, "x": fixed_list(x), "w": w}), SAMPLE / "pairs.parquet", 256)
    y = run_reference(path, {"x": x, "w": w})["y"]
    write_parquet(pa.table({"id": ids, "y": y}), REFERENCE / "two_inputs.parquet")


def make_types(rng: np.random.Generator) -> None:
    """One input of each element type predict binds: int32, int64, float64, bool -> float64."""
    def cast(name, to):
        return helper.make_node("Cast", [name], [f"{name}_d"], to=to)

    graph = helper.make_graph(
        [
            cast("a", TensorProto.DOUBLE), cast("b", TensorProto.DOUBLE), cast("d", TensorProto.DOUBLE),
            helper.make_node("Add", ["a_d", "b_d"], ["ab"]),
            helper.make_node("Add", ["ab", "c"], ["abc"]),
            helper.make_node("Mul", ["d_d", "ten"], ["d10"]),
            helper.make_node("Add", ["abc", "d10"], ["y"]),
        ],
        "types",
        [helper.make_tensor_value_info("a", TensorProto.INT32, ["batch"]),
         helper.make_tensor_value_info("b", TensorProto.INT64, ["batch"]),
         helper.make_tensor_value_info("c", TensorProto.DOUBLE, ["batch"]),
         helper.make_tensor_value_info("d", TensorProto.BOOL, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch"])],
        [numpy_helper.from_array(np.array([10.0]), "ten")],
    )
    path = save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), "types")
    n = 500
    a = rng.integers(-1000, 1000, n).astype(np.int32)
    b = rng.integers(-10**12, 10**12, n).astype(np.int64)
    c = rng.standard_normal(n)
    d = rng.random(n) < 0.5
    ids = np.arange(n, dtype=np.int64)
    write_parquet(pa.table({"id": ids, "a": a, "b": b, "c": c, "d": d}), SAMPLE / "types.parquet", 128)
    y = run_reference(path, {"a": a, "b": b, "c": c, "d": d})["y"]
    write_parquet(pa.table({"id": ids, "y": y}), REFERENCE / "types.parquet")


def make_lookup() -> None:
    """A model that fails inside its graph for some rows: Gather from a 10-entry table, so an
    index outside 0..9 makes ONNX Runtime fail the call (for batchinfer.on_error)."""
    table = (np.arange(10, dtype=np.float32) * 1.5).reshape(10)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "idx"], ["value"], axis=0)],
        "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch"])],
        [numpy_helper.from_array(table, "table")],
    )
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), "lookup")


def make_half() -> None:
    """A model with a float16 input, which batchinfer does not convert yet (an error case)."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        "half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
    )
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), "half")


def make_small_vocabulary_text_model() -> None:
    """A text model (with MiniLM's tokenizer beside it, copied in by the tests) that knows only
    the first 1,100 token ids: the special tokens, punctuation, digits and single letters. A text
    with any other word makes ONNX Runtime fail its call (for embed and batchinfer.on_error).
    Each token's vector is 4 values of its id's row in a fixed table, masked by attention."""
    vocabulary, dim = 1_100, 4
    table = np.arange(vocabulary * dim, dtype=np.float32).reshape(vocabulary, dim) / 1000.0
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "input_ids"], ["vectors"], axis=0),
            helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["mask", "last"], ["mask3"]),
            helper.make_node("Mul", ["vectors", "mask3"], ["last_hidden_state"]),
        ],
        "small_vocabulary",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch", "tokens", dim])],
        [numpy_helper.from_array(table, "table"),
         numpy_helper.from_array(np.array([2], dtype=np.int64), "last")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = min(model.ir_version, 9)
    onnx.checker.check_model(model)
    folder = HERE / "text" / "small_vocabulary"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, folder / "model.onnx")


def main() -> None:
    for d in (MODELS, SAMPLE, REFERENCE):
        d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261130)
    make_linear(rng)
    make_iris()
    make_breast_cancer()
    make_churn(rng)
    make_two_inputs(rng)
    make_types(rng)
    make_lookup()
    make_half()
    make_small_vocabulary_text_model()
    make_churn_mlp(np.random.default_rng(20261201))
    make_dense(np.random.default_rng(20261202))
    make_attention(np.random.default_rng(20261203))
    for d in (MODELS, SAMPLE, REFERENCE):
        for f in sorted(d.iterdir()):
            print(f"{os.path.relpath(f, HERE.parent)}  {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
