"""A new SQLite tracking store created beside Ray's start (hpo.tracking_store)."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest

from hpo.tracking_store import StoreWarmup, create_schema, new_sqlite_file


def test_only_a_new_sqlite_file_is_warmed(tmp_path: Path) -> None:
    existing = tmp_path / "old.db"
    existing.write_bytes(b"")
    assert new_sqlite_file(f"sqlite:///{tmp_path / 'new.db'}") == tmp_path / "new.db"
    assert new_sqlite_file(f"sqlite:///{existing}") is None
    assert new_sqlite_file("sqlite://") is None  # in memory
    assert new_sqlite_file("sqlite:///:memory:") is None
    assert new_sqlite_file("http://127.0.0.1:5000") is None
    assert new_sqlite_file("postgresql://db/mlflow") is None
    assert new_sqlite_file(f"sqlite:///{tmp_path / 'q.db'}?timeout=5") == tmp_path / "q.db"


def test_the_store_has_mlflows_schema_once_joined(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    warm = StoreWarmup(f"sqlite:///{path}")
    warm.join()
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("select name from sqlite_master")}
        version = db.execute("select version_num from alembic_version").fetchall()
    assert {"experiments", "runs", "metrics", "tags"} <= tables
    assert len(version) == 1  # migrated to MLflow's head: a client opens it as it is
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{path}")
    assert client.create_experiment("after-warmup")


def test_a_discarded_warmup_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    StoreWarmup(f"sqlite:///{path}").discard()
    assert list(tmp_path.iterdir()) == []


def test_an_existing_store_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"not touched")
    warm = StoreWarmup(f"sqlite:///{path}")
    warm.discard()  # the sweep failed: a store it did not create stays
    assert path.read_bytes() == b"not touched"


def _schema(path: Path) -> list[tuple[str, str, list[str]]]:
    """Every table's, index's and trigger's definition, its lines in order of their text:
    MLflow's own migrations order a table's constraints by hash (two stores it creates in
    two processes differ in that order, run by run)."""
    with sqlite3.connect(path) as db:
        rows = db.execute("select type, name, sql from sqlite_master order by name").fetchall()
    return [
        (kind, name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
        for kind, name, sql in rows
    ]


def test_the_schema_is_the_one_mlflows_own_first_client_creates(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    # MLflow's own migrations sync at every commit: in memory where there is /dev/shm.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else tmp_path) as own:
        reference = Path(own) / "mlflow-own.db"
        MlflowClient(f"sqlite:///{reference}").search_experiments(max_results=1)
        expected = _schema(reference)
    created = tmp_path / "created.db"
    create_schema(created)
    assert _schema(created) == expected
    assert list(tmp_path.iterdir()) == [created]


def test_a_store_that_appeared_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"another process's store")
    create_schema(path)
    assert path.read_bytes() == b"another process's store"
    assert list(tmp_path.iterdir()) == [path]  # the file it built is gone


def test_migrations_that_fail_leave_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow.store.db.utils

    def fail(engine: object) -> None:
        raise RuntimeError("migration 17 failed")

    monkeypatch.setattr(mlflow.store.db.utils, "_initialize_tables", fail)
    with pytest.raises(RuntimeError, match="migration 17"):
        create_schema(tmp_path / "mlflow.db")
    assert list(tmp_path.iterdir()) == []
