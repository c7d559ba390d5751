"""Shared test settings: small thread counts (2-core CI machine), deterministic seeds."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from trainables.memory import pause_collection, resume_collection

# Collection imports every test module (torch, mlflow, Ray Tune, hypothesis): with the
# cyclic collector paused, as `hpo sweep` imports, 3 of a worker's 13 CPU-s less;
# pytest_collection_finish resumes it.
pause_collection()

import torch  # noqa: E402 - after the pause, which is what it is for

# Tiny test models run faster on one intra-op thread than on two contended ones.
torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        resume_collection()  # xdist's controller collects nothing: its workers do


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module is imported now (torch, mlflow, hypothesis, the packages): move
    what survives a collection into gc's permanent generation, as Tune workers do
    (trainables.memory.freeze_long_lived_objects). Each trainer's construction runs a
    full collection (TrialMemory); without this it walks the whole test process, about
    0.5 s each and hundreds of trainers in the suite."""
    gc.collect()
    gc.freeze()
    resume_collection()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test module's last test, once its module-scoped fixtures are torn down:
    freeze again. The suite keeps importing lazily (mlflow's stores, sympy and
    torch.distributed.tensor on a first vmap, Ray): over a whole run the process grows to
    hundreds of thousands of objects, and each later trainer's collection walked all of
    them (147 ms per trainer after two MLflow test files against 14 ms in a fresh process:
    bench/README.md, "Where the test suite's time goes"). Module boundaries, not each
    test: what lives across one is what lives for long (imports, caches, session
    fixtures), while a module's own fixtures, which may hold reference cycles, are gone."""
    yield
    if (
        _session_ray_tests_run_together(item.config)
        and _uses_the_session_ray(item)
        and not _uses_the_session_ray(nextitem)
    ):
        SESSION_RAY.stop()
    if nextitem is None or nextitem.module is not item.module:  # type: ignore[attr-defined]
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


class _SessionRay:
    """The local Ray of the tests that use one (the ``ray_session`` fixture, whose value
    is this object): 2 CPUs and 4 logical GPUs, so CPU-only tests can check
    fractional-GPU packing; ``info`` describes it (:func:`cluster.connect.ensure_ray`).

    Under ``--dist loadgroup`` (``make test``) those tests run one after another on one
    worker (pytest_collection_modifyitems), so the Ray starts for the first and stops
    after the last (pytest_runtest_teardown): an idle Ray costs 5 % of a core
    (bench/README.md, "Where the test suite's time goes"). Elsewhere (a serial run, where
    they are spread over the files) it stays up to the session's end, as it always did.
    The session-scoped fixture cannot start it again once stopped, so each test's setup
    starts it (pytest_runtest_setup): a no-op while it runs."""

    def __init__(self) -> None:
        self.info: object = None

    def start(self) -> _SessionRay:
        import ray

        from cluster.connect import ensure_ray

        if self.info is None or not ray.is_initialized():
            self.info = ensure_ray(num_cpus=2, num_gpus=4)
        return self

    def stop(self) -> None:
        import ray

        ray.shutdown()
        self.info = None


SESSION_RAY = _SessionRay()
SESSION_RAY_FIXTURE = "ray_session"
SESSION_RAY_GROUP = "session-ray"


def _uses_the_session_ray(item: pytest.Item | None) -> bool:
    return item is not None and SESSION_RAY_FIXTURE in getattr(item, "fixturenames", ())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller, for each worker: whether the session Ray's tests come to it as
    one group (a worker's own ``dist`` option always reads "no")."""
    node.workerinput[SESSION_RAY_GROUP] = node.config.getoption("dist") == "loadgroup"


def _session_ray_tests_run_together(config: pytest.Config) -> bool:
    return bool(getattr(config, "workerinput", {}).get(SESSION_RAY_GROUP, False))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _uses_the_session_ray(item):
        SESSION_RAY.start()


@pytest.fixture(scope="session")
def ray_session():  # type: ignore[no-untyped-def]
    """The session's local Ray (:class:`_SessionRay`)."""
    yield SESSION_RAY.start()
    SESSION_RAY.stop()


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


SHARED_SCOPES = ("module", "class", "package")


def _uses_a_shared_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definitions[-1].scope in SHARED_SCOPES for definitions in info.name2fixturedefs.values()
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into node ids
def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    """Under pytest-xdist (``--dist loadgroup``), the tests of a module that share a module-
    or class-scoped fixture (a finished sweep, a tracking server) run on one worker: spread
    out, each worker would build it again. The tests that use the session Ray, directly or
    through a fixture, run on one worker too, one after another (one Ray start;
    :class:`_SessionRay` stops it after them). A test with a group of its own keeps it.
    The CLI's end-to-end tests start Ray their own way and spread like the rest."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if _uses_the_session_ray(item):
            item.add_marker(pytest.mark.xdist_group(SESSION_RAY_GROUP))
        elif _uses_a_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
