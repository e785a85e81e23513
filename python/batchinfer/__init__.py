"""batchinfer: batch inference in SQL, from Python.

ONNX models over tables, with the engine of the ``batchinfer`` command line::

    import batchinfer
    con = batchinfer.connect(models="data/models", warehouse="wh")
    con.register("feats", df)          # pandas, polars, pyarrow: not copied
    r = con.sql("SELECT id, predict('linear', f0, f1, f2, f3, f4, f5, f6, f7, f8, f9) AS p FROM feats")
    r.to_pandas()

Statements run with the GIL released; Ctrl-C stops the one running and keeps nothing it wrote.
Errors are :class:`Error` (and :class:`ModelError`, :class:`InputError`, :class:`StorageError`,
:class:`CancelledError`), with the message the command line prints.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import TYPE_CHECKING, Any, Union

import pyarrow as pa

from . import _native
from ._native import CancelledError, Error, InputError, ModelError, StorageError

# Statements still running in other threads as Python exits are stopped first.
atexit.register(_native.stop_all)

if TYPE_CHECKING:
    import pandas
    import polars

__all__ = [
    "connect",
    "Connection",
    "Relation",
    "Error",
    "ModelError",
    "InputError",
    "StorageError",
    "CancelledError",
]

PathLike = Union[str, "os.PathLike[str]"]


def connect(
    models: PathLike | None = None,
    warehouse: PathLike | None = None,
    *,
    partitions: int | None = None,
    sessions: int | None = None,
    threads: int | None = None,
    batch_rows: int | None = None,
    graph_optimization: str = "all",
    memory_limit: int | str | None = None,
    device: str = "cpu",
    remote: str | None = None,
    progress: bool = False,
) -> Connection:
    """Opens a connection: an engine with the command line's options.

    Args:
        models: a folder (or ``s3://``, ``gs://``, ``az://`` prefix) of ONNX models:
            ``NAME.onnx`` and ``NAME/model.onnx`` are the model ``NAME`` (``--models``).
        warehouse: where ``CREATE MODEL``, ``CREATE TABLE ... AS`` and materialized views
            persist: a folder or an object store prefix (``--warehouse``). ``None`` keeps models
            in this connection's memory, and statements that need a warehouse say so.
        partitions: partitions scored in parallel (default: the cores).
        sessions: model calls at once per model (default: one per partition).
        threads: ONNX Runtime threads inside each call (default: cores / sessions).
        batch_rows: rows per record batch read (default 8192; 65536 on a GPU).
        graph_optimization: ``"disable"``, ``"basic"``, ``"extended"`` or ``"all"``.
        memory_limit: bytes (or ``"2G"``) that sorts, joins and aggregations hold before they
            spill to disk (default: no limit).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
        remote: a Ballista scheduler, ``"df://HOST:PORT"``, to run statements on.
        progress: show a progress line on ``sys.stderr`` while a statement runs for more than a
            second (a terminal or a notebook).

    Example:
        >>> con = batchinfer.connect(models="data/models")
        >>> con.sql("SELECT predict('linear', 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0) AS p").to_arrow()
    """
    writer = _ProgressWriter(sys.stderr) if progress else None
    native = _native.Connection(
        os.fspath(models) if models is not None else None,
        os.fspath(warehouse) if warehouse is not None else None,
        partitions=partitions,
        sessions=sessions,
        threads=threads,
        batch_rows=batch_rows,
        graph_optimization=graph_optimization,
        memory_limit=memory_limit,
        device=device,
        remote=remote,
        progress=writer,
    )
    return Connection(native)


class Connection:
    """One engine: its models, its warehouse and the tables registered on it.

    Statements on one connection run one at a time; use a connection per thread to run them at
    once. A connection is a context manager that closes itself.
    """

    def __init__(self, native: _native.Connection) -> None:
        self._native = native

    def sql(self, query: str) -> Relation:
        """Runs ``query`` (one statement, or several separated by ``;``).

        Every statement runs now (``CREATE MODEL``, ``COPY``, ``CREATE TABLE ... AS``,
        ``INSERT``, ``REFRESH``, ``SET``...) except a final query (``SELECT``, ``WITH``,
        ``VALUES``), which is planned now, so that a mistake in it is raised here, and runs when
        its result is read. Returns the last statement's result.

        Example:
            >>> con.sql("CREATE MODEL churn FROM 'models/churn.onnx'")
            >>> r = con.sql("SELECT id, predict('churn', age, tenure) AS p FROM feats")
            >>> r.to_pandas()
        """
        return Relation(self._native.sql(query))

    def register(self, name: str, data: Any) -> None:
        """Makes ``data`` the table ``name`` for SQL (in place of one registered before).

        ``data``: a pyarrow ``Table``, ``RecordBatch`` or ``RecordBatchReader``, a pandas or
        polars ``DataFrame``, or anything with ``__arrow_c_stream__`` (DuckDB, ...). Its buffers
        are shared with batchinfer, not copied (pandas goes through ``pyarrow.Table.from_pandas``,
        which shares numeric columns; ``NaN`` there is a missing value, ``NULL`` in SQL). A
        ``RecordBatchReader`` is a stream: the first statement that reads it reads it, and
        another must register it again. SQL folds unquoted names to lower case: register
        ``"feats"``, not ``"Feats"``.

        Example:
            >>> con.register("feats", pandas.DataFrame({"x": [1.0, 2.0]}))
            >>> con.sql("SELECT count(*) FROM feats").to_arrow()
        """
        data, once = _arrow_source(data)
        self._native.register(name, data, once)

    def unregister(self, name: str) -> None:
        """Removes the table ``name`` that :meth:`register` made."""
        self._native.unregister(name)

    def close(self) -> None:
        """Closes the connection: later statements are refused."""
        self._native.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<batchinfer.Connection{' (closed)' if self.closed else ''}>"


class Relation:
    """A statement's result.

    A query runs once, when it is first read: :meth:`to_arrow` (and :meth:`to_pandas`,
    :meth:`to_polars`) keep its rows, and later reads return them again;
    :meth:`fetch_record_batches` (or a consumer of ``__arrow_c_stream__``) streams them as they
    are scored, in bounded memory, and the relation is then spent: run the query again for
    another pass. A statement that is not a query has run already; its result is what the
    command line prints (a count, a message).
    """

    def __init__(self, native: _native.Relation) -> None:
        self._native = native

    @property
    def columns(self) -> list[str]:
        """The columns' names."""
        return self._native.columns

    @property
    def schema(self) -> pa.Schema:
        """The columns' names and Arrow types."""
        return pa.schema(self._native)

    def to_arrow(self) -> pa.Table:
        """The rows as a pyarrow Table (the query runs now if it has not).

        Example:
            >>> con.sql("SELECT 1 AS x").to_arrow()
        """
        self._native.collect()
        return pa.table(self._native)

    def to_pandas(self, **kwargs: Any) -> pandas.DataFrame:
        """The rows as a pandas DataFrame; ``kwargs`` go to ``pyarrow.Table.to_pandas``."""
        return self.to_arrow().to_pandas(**kwargs)

    def to_polars(self) -> polars.DataFrame:
        """The rows as a polars DataFrame."""
        import polars

        return polars.from_arrow(self.to_arrow())

    def fetch_record_batches(self) -> pa.RecordBatchReader:
        """The rows as a stream of record batches, each computed as it is read.

        Example:
            >>> for batch in con.sql("SELECT ... FROM big").fetch_record_batches():
            ...     handle(batch)
        """
        return pa.RecordBatchReader.from_stream(self._native)

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        """The Arrow PyCapsule interface: polars, DuckDB and pyarrow read the rows directly."""
        return self._native.__arrow_c_stream__(requested_schema)

    def __arrow_c_schema__(self) -> object:
        return self._native.__arrow_c_schema__()

    def __repr__(self) -> str:
        return repr(self._native)


def _arrow_source(data: Any) -> tuple[Any, bool]:
    """``data`` as an object with ``__arrow_c_stream__``, and whether it is a stream read once."""
    if isinstance(data, pa.RecordBatchReader):
        return data, True
    if isinstance(data, pa.Table):
        return data, False
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data]), False
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        import pandas

        if isinstance(data, pandas.Series):
            data = data.to_frame()
        if isinstance(data, pandas.DataFrame):
            return _from_pandas(data), False
    if isinstance(data, (pa.Array, pa.ChunkedArray)):
        raise Error(
            f"a pyarrow {type(data).__name__} is a column, not a table: register "
            "pyarrow.table({'name': column})"
        )
    if module == "polars":
        import polars

        if isinstance(data, polars.Series):
            data = data.to_frame()
        if isinstance(data, polars.LazyFrame):
            data = data.collect()
        if isinstance(data, polars.DataFrame):
            return data.to_arrow(), False
    if hasattr(data, "__arrow_c_stream__"):
        # Anything else is read once, when registered: its rows stay, its buffers shared.
        return data, False
    raise Error(
        f"a {type(data).__name__} is not data batchinfer can read: register takes a pyarrow "
        "Table, RecordBatch or RecordBatchReader, a pandas or polars DataFrame, or any object "
        "with __arrow_c_stream__"
    )


def _from_pandas(frame: pandas.DataFrame) -> pa.Table:
    """``frame`` as Arrow, its index left out: ``pyarrow.Table.from_pandas``, except that float
    columns (numpy's float32 and float64) are shared as they are, NaN and all, and batchinfer
    makes their NaN NULL as it registers them (pyarrow reads every value to do so, slower).
    The table's schema metadata says which columns those are."""
    import numpy as np

    floats = {
        position
        for position, dtype in enumerate(frame.dtypes)
        if isinstance(dtype, np.dtype) and dtype in (np.float32, np.float64)
    }
    if not floats:
        return pa.Table.from_pandas(frame, preserve_index=False)
    rest = pa.Table.from_pandas(
        frame.iloc[:, [p for p in range(frame.shape[1]) if p not in floats]], preserve_index=False
    )
    arrays, names, taken = [], [], iter(range(rest.num_columns))
    for position, name in enumerate(frame.columns):
        if position in floats:
            arrays.append(pa.array(frame.iloc[:, position].to_numpy(), from_pandas=False))
        else:
            arrays.append(rest.column(next(taken)))
        names.append(str(name))
    marked = ",".join(str(p) for p in sorted(floats))
    return pa.Table.from_arrays(arrays, names=names, metadata={_NAN_IS_NULL: marked})


# The schema metadata that names the float columns whose NaN batchinfer makes NULL.
_NAN_IS_NULL = "batchinfer.nan_is_null"


class _ProgressWriter:
    """Draws the progress line over itself on ``stream`` (a terminal, or a notebook's stderr)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._width = 0

    def __call__(self, line: str) -> None:
        padding = " " * max(0, self._width - len(line))
        self._stream.write(f"\r{line}{padding}" + ("\r" if not line else ""))
        self._stream.flush()
        self._width = len(line)
