"""Shared test settings: small thread counts (2-core CI machine), deterministic seeds."""

from __future__ import annotations

import gc

import pytest
import torch

# Tiny test models run faster on one intra-op thread than on two contended ones.
torch.set_num_threads(1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module is imported now (torch, mlflow, hypothesis, the packages): move
    what survives a collection into gc's permanent generation, as Tune workers do
    (trainables.memory.freeze_long_lived_objects). Each trainer's construction runs a
    full collection (TrialMemory); without this it walks the whole test process, about
    0.5 s each and hundreds of trainers in the suite."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def ray_session():  # type: ignore[no-untyped-def]
    """One local Ray for the whole test session (start-up costs ~10 s): 2 CPUs and 4
    logical GPUs, so CPU-only tests can check fractional-GPU packing."""
    import ray

    from cluster.connect import ensure_ray

    info = ensure_ray(num_cpus=2, num_gpus=4)
    yield info
    ray.shutdown()


@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory):  # type: ignore[no-untyped-def]
    """An MLflow SQLite store with its schema migrated once (migrations take ~10 s)."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_uri(tmp_path, _mlflow_template) -> str:  # type: ignore[no-untyped-def]
    """A fresh, already-migrated MLflow SQLite store for one test."""
    import shutil

    target = tmp_path / "mlflow.db"
    shutil.copyfile(_mlflow_template, target)
    return f"sqlite:///{target}"


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Under pytest-xdist, every test that starts or uses Ray runs on one worker, one after
    another (they each want the machine's 2 CPUs); the rest spread over the other workers."""
    for item in items:
        if item.get_closest_marker("ray") or "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray"))
