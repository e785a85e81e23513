"""batchinfer's scores from Python against onnxruntime's over the same data: from pandas (with
categorical columns and NaN), pyarrow and polars, out as pyarrow, pandas and polars."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

import batchinfer
from conftest import MODELS, SAMPLE

FEATURES = [f"f{i}" for i in range(10)]
LINEAR = f"predict('linear', {', '.join(FEATURES)})"
LATE_INPUTS = ["carrier", "origin", "dest", "month", "hour", "distance", "temp", "wind_speed"]
LATE = f"predict('late', {', '.join(LATE_INPUTS)})"


def features(rows: int, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({c: rng.standard_normal(rows).astype(np.float32) for c in FEATURES})
    frame.insert(0, "id", np.arange(rows, dtype=np.int64))
    return frame


def linear_reference(frame: pd.DataFrame) -> np.ndarray:
    session = ort.InferenceSession(str(MODELS / "linear.onnx"))
    matrix = frame[FEATURES].to_numpy(dtype=np.float32)
    return session.run(None, {"input": matrix})[0][:, 0]


def test_pandas_in_pandas_out_equals_onnxruntime(con):
    frame = features(50_000)
    con.register("feats", frame)
    out = con.sql(f"SELECT id, {LINEAR} AS p FROM feats ORDER BY id").to_pandas()
    assert list(out.columns) == ["id", "p"]
    assert out["id"].tolist() == frame["id"].tolist()
    # The same float32 matrix product; summed in another order by another build.
    np.testing.assert_allclose(out["p"].to_numpy(), linear_reference(frame), rtol=1e-5, atol=1e-5)


def test_pyarrow_table_and_record_batch(con):
    frame = features(3_000, seed=1)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    con.register("t", table)
    con.register("b", table.to_batches()[0])
    expected = linear_reference(frame)
    for name in ["t", "b"]:
        out = con.sql(f"SELECT id, {LINEAR} AS p FROM {name} ORDER BY id").to_arrow()
        assert out.schema.field("p").type == pa.float32()
        np.testing.assert_allclose(out["p"].to_numpy(), expected, rtol=1e-5, atol=1e-5)


def test_polars_in_polars_out(con):
    frame = features(4_000, seed=2)
    con.register("pl_feats", pl.from_pandas(frame))
    out = con.sql(f"SELECT id, {LINEAR} AS p FROM pl_feats ORDER BY id").to_polars()
    assert isinstance(out, pl.DataFrame)
    np.testing.assert_allclose(out["p"].to_numpy(), linear_reference(frame), rtol=1e-5, atol=1e-5)
    # polars reads a result through __arrow_c_stream__ itself.
    counted = pl.DataFrame(con.sql("SELECT count(*) AS n FROM pl_feats"))
    assert counted["n"].to_list() == [4_000]


def flights() -> pd.DataFrame:
    frame = ds.dataset(SAMPLE / "flights").to_table().to_pandas()
    for column in ["carrier", "origin", "dest"]:
        frame[column] = frame[column].astype("category")
    return frame


def late_reference(frame: pd.DataFrame) -> np.ndarray:
    session = ort.InferenceSession(str(MODELS / "late.onnx"))
    feeds = {}
    for column in LATE_INPUTS:
        values = frame[column]
        if column in ("carrier", "origin", "dest"):
            feeds[column] = values.astype(str).to_numpy(dtype=object).reshape(-1, 1)
        else:
            feeds[column] = values.to_numpy(dtype=np.float32).reshape(-1, 1)
    return session.run(["probabilities"], feeds)[0]


def test_pandas_categoricals_and_nan(con):
    frame = flights()
    # Missing weather, as pandas has it: NaN.
    assert frame["temp"].isna().sum() > 0
    con.register("flights", frame)
    schema = con.sql("SELECT carrier FROM flights").schema
    assert pa.types.is_dictionary(schema.field("carrier").type)

    # NaN is a missing value, NULL in SQL: by default a row with one gets NULL, unscored.
    scored = con.sql(f"SELECT id, {LATE}['probabilities'][2] AS p FROM flights ORDER BY id").to_pandas()
    missing = frame.sort_values("id")[["temp", "wind_speed"]].isna().any(axis=1).to_numpy()
    assert scored["p"].isna().to_numpy().tolist() == missing.tolist()

    # batchinfer.nulls = 'nan' gives the model NaN, as the model was trained with: every row
    # scored, as onnxruntime scores the same frame.
    out = con.sql(
        f"SET batchinfer.nulls = 'nan'; "
        f"SELECT id, carrier, {LATE}['probabilities'][2] AS p FROM flights ORDER BY id"
    ).to_pandas()
    ordered = frame.sort_values("id").reset_index(drop=True)
    expected = late_reference(ordered)[:, 1]
    np.testing.assert_allclose(out["p"].to_numpy(), expected, rtol=1e-5, atol=1e-6)
    # The categorical column comes back categorical, with its values.
    assert isinstance(out["carrier"].dtype, pd.CategoricalDtype)
    assert out["carrier"].astype(str).tolist() == ordered["carrier"].astype(str).tolist()


def test_record_batch_reader_is_read_once(con):
    frame = features(5_000, seed=3)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=700))
    con.register("stream", reader)
    out = con.sql(f"SELECT id, {LINEAR} AS p FROM stream ORDER BY id").to_arrow()
    np.testing.assert_allclose(out["p"].to_numpy(), linear_reference(frame), rtol=1e-5, atol=1e-5)
    with pytest.raises(batchinfer.Error, match="was read by an earlier statement, and a stream is read once"):
        con.sql("SELECT count(*) FROM stream").to_arrow()


def test_a_python_generator_behind_a_reader(con):
    """Batches made by Python code as the statement reads them (the GIL taken by pyarrow)."""
    schema = pa.schema([("id", pa.int64())] + [(c, pa.float32()) for c in FEATURES])
    frames = [features(1_000, seed=s) for s in range(5)]

    def batches():
        for number, frame in enumerate(frames):
            frame = frame.assign(id=frame["id"] + number * 1_000)
            yield pa.RecordBatch.from_pandas(frame, schema=schema, preserve_index=False)

    con.register("made", pa.RecordBatchReader.from_batches(schema, batches()))
    out = con.sql(f"SELECT id, {LINEAR} AS p FROM made ORDER BY id").to_pandas()
    expected = np.concatenate([linear_reference(f) for f in frames])
    np.testing.assert_allclose(out["p"].to_numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_relation_runs_once(con):
    frame = features(2_000)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    # A stream can be read once: a second run of the query would fail on it.
    con.register("once", pa.RecordBatchReader.from_batches(table.schema, table.to_batches()))
    relation = con.sql(f"SELECT sum({LINEAR}) AS s FROM once")
    assert "not yet run" in repr(relation)
    first = relation.to_arrow()
    assert relation.to_pandas()["s"].tolist() == first["s"].to_pylist()
    assert relation.to_polars()["s"].to_list() == first["s"].to_pylist()
    assert abs(first["s"][0].as_py() - float(linear_reference(frame).sum(dtype=np.float64))) < 1e-2

    con.register("feats", table)
    streamed = con.sql(f"SELECT id, {LINEAR} AS p FROM feats")
    rows = sum(batch.num_rows for batch in streamed.fetch_record_batches())
    assert rows == 2_000
    with pytest.raises(batchinfer.Error, match="streamed already"):
        streamed.to_arrow()


def test_results_stream_to_other_readers(con):
    con.register("feats", features(10_000))
    reader = con.sql(f"SELECT id, {LINEAR} AS p FROM feats").fetch_record_batches()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema.names == ["id", "p"]
    assert sum(b.num_rows for b in reader) == 10_000
    # pyarrow reads the capsule of a relation directly.
    assert pa.table(con.sql("SELECT 1 AS one")).to_pylist() == [{"one": 1}]


def test_pandas_nan_is_null_in_every_float_type(con):
    frame = pd.DataFrame(
        {
            "a": np.array([1.0, np.nan, 3.0, np.nan], dtype=np.float64),
            "b": np.array([np.nan, 2.0, 3.0, 4.0], dtype=np.float32),
            "c": pd.array([1.5, None, 2.5, 3.5], dtype="Float64"),  # pandas' own nullable type
            "n": [1, 2, 3, 4],
            "s": ["w", None, "y", "z"],
        },
        index=[10, 20, 30, 40],  # left out
    )
    con.register("f", frame)
    out = con.sql(
        "SELECT count(*) AS rows, count(a) AS a, count(b) AS b, count(c) AS c, count(s) AS s, "
        "sum(a) AS sum_a, sum(b) AS sum_b FROM f"
    ).to_arrow().to_pylist()
    assert out == [{"rows": 4, "a": 2, "b": 3, "c": 3, "s": 3, "sum_a": 4.0, "sum_b": 9.0}]
    assert con.sql("SELECT * FROM f").columns == ["a", "b", "c", "n", "s"]
    back = con.sql("SELECT a, b, n FROM f ORDER BY n").to_pandas()
    assert back["a"].isna().tolist() == [False, True, False, True]
    assert back["b"].isna().tolist() == [True, False, False, False]
    # The DataFrame itself is untouched: its NaN are NaN.
    assert np.isnan(frame["a"].to_numpy()).sum() == 2
