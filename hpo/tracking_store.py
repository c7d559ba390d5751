"""A new SQLite tracking store, created while Ray starts.

MLflow creates a SQLite store's schema by running every one of its migrations, which
takes seconds: for the first sweep into a new ``mlflow.db`` (``make demo``, a user's first
sweep) they would follow Ray's start. :class:`StoreWarmup` runs them on a thread beside
Ray's start, and keeps the promise a sweep makes when the cluster refuses it:
nothing is left behind (the file it created is removed).

Only a SQLite file that does not exist yet is warmed: an existing store opens in
milliseconds, and a server or another database is left to MLflow as it is. A failure on
the thread is not reported here: the sweep's first MLflow call meets it and raises it as
it always did.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

SQLITE_PREFIX = "sqlite:///"


def new_sqlite_file(tracking_uri: str) -> Path | None:
    """The file of a ``sqlite:///`` tracking URI that does not exist yet, else None."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    path = Path(tracking_uri[len(SQLITE_PREFIX) :].split("?", 1)[0])
    if not path.name or path.name == ":memory:" or path.exists():
        return None
    return path


class StoreWarmup:
    """Creates a new SQLite store's schema on a thread (see the module docstring)."""

    def __init__(self, tracking_uri: str) -> None:
        self.path = new_sqlite_file(tracking_uri)
        self._thread: threading.Thread | None = None
        if self.path is None:
            return
        # Imported here, on the caller's thread: two threads importing large packages at
        # once can meet in a circular import, which Python refuses in one of them.
        from mlflow.tracking import MlflowClient

        def create() -> None:
            with contextlib.suppress(Exception):  # the sweep's own first call reports it
                MlflowClient(tracking_uri).search_experiments(max_results=1)

        self._thread = threading.Thread(target=create, name="hpo-mlflow-store", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait until the schema exists (before anything else opens the store)."""
        if self._thread is not None:
            self._thread.join()

    def discard(self) -> None:
        """The sweep did not start: remove the store this created, journal included."""
        self.join()
        if self.path is None:
            return
        for leftover in (
            self.path,
            *(self.path.with_name(self.path.name + s) for s in ("-journal", "-wal", "-shm")),
        ):
            leftover.unlink(missing_ok=True)
