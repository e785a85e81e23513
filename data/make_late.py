#!/usr/bin/env python3
"""Makes the `late` model (a scikit-learn pipeline trained with missing values), its flights and
the scikit-learn reference: the README's "you have a scikit-learn model" walk-through and the
tests of `SET batchinfer.nulls = 'nan'` and of columns bound by name.

Flights of three months from three airports, as monthly Parquet files, with the weather at
departure missing for some (NULL in Parquet, NaN to scikit-learn, which learned from missing
values). The pipeline one-hot encodes carrier, origin and dest, passes the numbers through and
fits a HistGradientBoostingClassifier; skl2onnx exports it with one input per column (a string
tensor for each text column) and `zipmap=False`. The reference scores are scikit-learn's own
`predict_proba` on the same rows. Re-runnable: the same seed gives the same files.

    python3 data/make_late.py     # scikit-learn 1.9.1, skl2onnx 1.20.0, onnx 1.17.0, protobuf<5,
                                  # numpy, pandas, pyarrow
"""
import pathlib

import numpy as np
import onnx
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType, StringTensorType
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder

HERE = pathlib.Path(__file__).resolve().parent
MODELS, SAMPLE, REFERENCE = HERE / "models", HERE / "sample", HERE / "reference"
TEXT = ["carrier", "origin", "dest"]
NUMBERS = ["month", "hour", "distance", "temp", "wind_speed"]


def flights(rng: np.random.Generator, n: int, month: int) -> pd.DataFrame:
    carriers = np.array(["AA", "B6", "DL", "EV", "MQ", "UA", "US", "WN", "9E"])
    origins = np.array(["EWR", "JFK", "LGA"])
    dests = np.array(["ATL", "BOS", "CLT", "DEN", "DFW", "LAX", "MCO", "MIA", "ORD", "SFO"])
    frame = pd.DataFrame({
        "carrier": rng.choice(carriers, n),
        "origin": rng.choice(origins, n),
        "dest": rng.choice(dests, n),
        "month": np.full(n, month, dtype=np.float32),
        "hour": rng.integers(5, 23, n).astype(np.float32),
        "distance": rng.gamma(4.0, 250.0, n).astype(np.float32).round(),
        "temp": rng.normal(40 + 10 * month, 12, n).astype(np.float32).round(1),
        "wind_speed": rng.gamma(2.0, 5.0, n).astype(np.float32).round(1),
    })
    for column in ("temp", "wind_speed"):
        frame.loc[rng.random(n) < 0.06, column] = np.nan
    return frame


def lateness(rng: np.random.Generator, frame: pd.DataFrame) -> np.ndarray:
    wind = frame["wind_speed"].fillna(25.0).to_numpy()
    logit = (0.18 * (frame["hour"].to_numpy() - 14) + 0.08 * (wind - 10)
             + np.where(frame["carrier"].isin(["EV", "9E"]), 0.9, -0.2)
             + np.where(frame["origin"] == "EWR", 0.4, 0.0) - 0.8)
    return (rng.random(len(frame)) < 1 / (1 + np.exp(-logit))).astype(np.int64)


def main() -> None:
    rng = np.random.default_rng(20131201)
    train = flights(rng, 20_000, 6)
    train["month"] = rng.integers(1, 13, len(train)).astype(np.float32)
    pipe = Pipeline([
        ("prep", ColumnTransformer([
            ("text", OneHotEncoder(handle_unknown="ignore", sparse_output=False), TEXT),
            ("numbers", "passthrough", NUMBERS),
        ])),
        ("clf", HistGradientBoostingClassifier(max_iter=60, random_state=0)),
    ])
    pipe.fit(train, lateness(rng, train))
    inputs = [(c, StringTensorType([None, 1])) for c in TEXT]
    inputs += [(c, FloatTensorType([None, 1])) for c in NUMBERS]
    model = convert_sklearn(pipe, "late", inputs,
                            options={id(pipe.steps[-1][1]): {"zipmap": False}},
                            target_opset={"": 17, "ai.onnx.ml": 3})
    model.ir_version = min(model.ir_version, 9)
    model.producer_version = ""
    model.doc_string = "Is a flight more than 15 minutes late? HistGradientBoosting, NaN for missing weather."
    onnx.checker.check_model(model)
    (MODELS / "late.onnx").write_bytes(model.SerializeToString())

    folder = SAMPLE / "flights"
    folder.mkdir(exist_ok=True)
    references = []
    next_id = 0
    for month in (1, 2, 3):
        frame = flights(rng, 1_000, month)
        ids = np.arange(next_id, next_id + len(frame), dtype=np.int64)
        next_id += len(frame)
        table = pa.table({"id": ids, **{c: pa.array(frame[c], from_pandas=True) for c in frame}})
        pq.write_table(table, folder / f"2013-{month:02d}.parquet", row_group_size=500,
                       compression="zstd")
        references.append(pd.DataFrame({
            "id": ids, "label": pipe.predict(frame).astype(np.int64),
            "p_late": pipe.predict_proba(frame)[:, 1],
        }))
    reference = pd.concat(references)
    pq.write_table(pa.Table.from_pandas(reference, preserve_index=False),
                   REFERENCE / "late.parquet", compression="zstd")


if __name__ == "__main__":
    main()
