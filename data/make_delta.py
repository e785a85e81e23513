#!/usr/bin/env python3
"""Makes the Delta Lake table the tests read, with the Python `deltalake` package (delta-rs's own
Python binding, a reader and writer apart from batchinfer), and what that package reads of each
of its versions, as the reference.

    pip install deltalake==1.1.4 pyarrow
    python3 data/make_delta.py     # writes data/sample/customers_delta/, data/reference/customers_delta.json

The table holds the rows of data/sample/customers.parquet in three versions:
  0: the customers with id < 1000 (the table created),
  1: the others appended (all 2,000 rows),
  2: overwritten by the customers who churned.
"""
import json
import pathlib
import shutil

import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

HERE = pathlib.Path(__file__).parent
TABLE = HERE / "sample" / "customers_delta"
REFERENCE = HERE / "reference" / "customers_delta.json"


def main():
    customers = pq.read_table(HERE / "sample" / "customers.parquet")
    shutil.rmtree(TABLE, ignore_errors=True)
    first = customers.filter(pc.less(customers["id"], 1000))
    rest = customers.filter(pc.greater_equal(customers["id"], 1000))
    churned = customers.filter(pc.equal(customers["churned"], 1))
    write_deltalake(TABLE, first, mode="overwrite")
    write_deltalake(TABLE, rest, mode="append")
    write_deltalake(TABLE, churned, mode="overwrite")
    reference = {}
    for version in range(3):
        rows = DeltaTable(TABLE, version=version).to_pyarrow_table()
        reference[str(version)] = {
            "rows": rows.num_rows,
            "sum_id": pc.sum(rows["id"]).as_py(),
            "sum_spend": pc.sum(pc.cast(rows["spend"], "float64")).as_py(),
            "cities": sorted(set(rows["city"].to_pylist())),
            "columns": [f"{f.name} {f.type}" for f in rows.schema],
        }
    reference["history"] = [
        {"version": c["version"], "operation": c["operation"], "timestamp": c["timestamp"]}
        for c in DeltaTable(TABLE).history()
    ]
    REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main()
