"""A new SQLite tracking store, created while Ray starts.

MLflow creates a SQLite store's schema by running every one of its migrations, which
takes seconds: for the first sweep into a new ``mlflow.db`` (``make demo``, a user's first
sweep) they would follow Ray's start. :class:`StoreWarmup` runs them on a thread beside
Ray's start, and keeps the promise a sweep makes when the cluster refuses it:
nothing is left behind (the file it created is removed).

Most of those seconds are the disk's, not the CPU's: SQLite syncs the file at every
migration's commit. :func:`create_schema` runs the same migrations into a file of its own
with SQLite's syncs off, syncs it once and only then links it in as the store, so a crash
part-way never leaves a half-migrated store behind.

Only a SQLite file that does not exist yet is warmed: an existing store opens in
milliseconds, and a server or another database is left to MLflow as it is. A failure on
the thread is not reported here: the sweep's first MLflow call meets it and raises it as
it always did.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from pathlib import Path
from typing import Any

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

        path = self.path

        def create() -> None:
            # A failure here is left to MLflow: its first open migrates (here or in the
            # sweep's first call, which reports what fails).
            with contextlib.suppress(Exception):
                create_schema(path)
            with contextlib.suppress(Exception):  # MLflow's own first open: its Default
                MlflowClient(tracking_uri).search_experiments(max_results=1)  # experiment

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


def create_schema(path: Path) -> None:
    """MLflow's schema, by MLflow's own migrations (``_initialize_tables``, as a new store's
    first client runs them), at ``path`` unless a file is there by the time it is done.

    They run into a file of their own beside ``path`` with SQLite's syncs off and its
    journal in memory (each migration's commit otherwise waits on the disk: 5.8-6.1 s in
    all against 0.7 s measured on a loaded 2-core machine, 1.1 s of CPU against 0.7 s);
    that file is synced once, then linked in as ``path``, which never replaces a file
    another process created meanwhile. Where the link fails, nothing is at ``path`` and
    MLflow migrates it the usual way."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    building = path.with_name(f".{path.name}.{uuid.uuid4().hex}.creating")
    engine = sqlalchemy.create_engine(f"{SQLITE_PREFIX}{building}")
    sqlalchemy.event.listen(engine, "connect", _without_syncs)
    try:
        _initialize_tables(engine)
        engine.dispose()
        _sync(building)
        with contextlib.suppress(OSError):  # FileExistsError: a store appeared meanwhile
            os.link(building, path)
            _sync(path.parent)
    finally:
        engine.dispose()
        building.unlink(missing_ok=True)


def _without_syncs(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA synchronous = OFF")
    cursor.execute("PRAGMA journal_mode = MEMORY")
    cursor.close()


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
