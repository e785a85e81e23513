"""Type hints of batchinfer's extension module; the package (``batchinfer``) wraps it."""

from typing import Any, Callable

class Error(Exception):
    """A statement failed; the message says what, and what was expected."""

class ModelError(Error):
    """A model is unknown, cannot be loaded, or failed as it ran (an endpoint model too)."""

class InputError(Error):
    """The data given to a model does not fit it, or more rows failed than the error budget allows."""

class StorageError(Error):
    """A store, file, database or the warehouse could not be read or written."""

class CancelledError(Error):
    """The statement was stopped (Ctrl-C); nothing it wrote was kept."""

def stop_all() -> None:
    """Stops every statement running in the process and waits up to 10 s for them (called as
    Python exits)."""

class Connection:
    def __init__(
        self,
        models: str | None = None,
        warehouse: str | None = None,
        *,
        partitions: int | None = None,
        sessions: int | None = None,
        threads: int | None = None,
        batch_rows: int | None = None,
        graph_optimization: str = "all",
        memory_limit: int | str | None = None,
        device: str = "cpu",
        remote: str | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None: ...
    def sql(self, query: str) -> Relation: ...
    def register(self, name: str, data: Any, once: bool = False) -> None: ...
    def unregister(self, name: str) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...

class Relation:
    def collect(self) -> None: ...
    def __arrow_c_stream__(self, requested_schema: object = None) -> object: ...
    def __arrow_c_schema__(self) -> object: ...
    @property
    def columns(self) -> list[str]: ...
