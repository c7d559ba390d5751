"""The test process's own garbage-collector settings (tests/conftest.py), tested in a child
pytest that loads the conftest as a plugin, as the suite does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child_pytest(tmp_path: Path, *options: str) -> str:
    """Run the test files in ``tmp_path`` with this suite's conftest as a plugin; its output,
    once it passed."""
    plugins = ["-p", "tests.conftest", "-p", "no:cacheprovider", *options]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run.stdout


EARLIER = """
CACHE = []

def test_imports_something_large_lazily():
    # What a lazy import leaves (torch.distributed.tensor, sympy, mlflow's stores: tens of
    # thousands of objects that live to the end of the process).
    CACHE.extend([] for _ in range(200_000))
"""

LATER = """
import gc

def test_a_collection_walks_only_what_this_module_made():
    alive = len(gc.get_objects())  # what a full gc.collect() (TrialMemory's) walks
    assert alive < 50_000, alive
"""


def test_what_an_earlier_test_module_left_is_not_walked_by_later_collections(
    tmp_path: Path,
) -> None:
    """Every trainer's construction runs a full ``gc.collect()`` (``TrialMemory``). Lazily
    imported modules accumulate over the suite; frozen once their test module ends, they
    are not walked again by every later trainer's collection."""
    (tmp_path / "test_a_earlier.py").write_text(EARLIER)
    (tmp_path / "test_b_later.py").write_text(LATER)
    assert "2 passed" in _child_pytest(tmp_path)


SESSION_RAY_USERS = """
import pytest

import tests.conftest as suite

EVENTS = []


class CountingRay:  # stands in for the local Ray: what matters is when it starts and stops
    running = False

    def start(self):
        if not self.running:
            EVENTS.append("start")
            self.running = True
        return self

    def stop(self):
        if self.running:
            EVENTS.append("stop")
            self.running = False


suite.SESSION_RAY = CountingRay()


def test_first_user(ray_session, request):
    assert ray_session is suite.SESSION_RAY and EVENTS == ["start"]
    assert request.node.get_closest_marker("xdist_group").args == ("session-ray",)


def test_a_test_without_it_runs_after_them_with_it_stopped(request):
    assert EVENTS == ["start", "stop"]
    assert request.node.get_closest_marker("xdist_group") is None


def test_second_user_runs_with_the_first(ray_session):
    assert EVENTS == ["start"]


@pytest.mark.xdist_group("a-group-of-its-own")
def test_a_user_in_a_group_of_its_own_starts_it_again(ray_session):
    assert EVENTS == ["start", "stop", "start"]
"""


def test_the_session_ray_runs_only_while_its_tests_do(tmp_path: Path) -> None:
    """An idle local Ray costs 5 % of a core: under ``--dist loadgroup`` (one xdist worker
    here) it starts for the first test that uses it and stops after the last of a run of
    them; those tests run on one worker, grouped."""
    (tmp_path / "test_session_ray.py").write_text(SESSION_RAY_USERS)
    assert "4 passed" in _child_pytest(tmp_path, "-n", "1", "--dist", "loadgroup")


COLLECTED_WITHOUT_THE_COLLECTOR = """
import gc

DURING_COLLECTION = gc.isenabled()  # the module's imports run as it is collected


def test_collection_paused_the_collector_and_the_tests_run_with_it():
    assert DURING_COLLECTION is False
    assert gc.isenabled()
"""


def test_the_collection_imports_with_the_collector_paused(tmp_path: Path) -> None:
    """As `hpo sweep`'s imports (trainables.memory.pause_collection): each worker
    imports every test module (torch, MLflow, Ray Tune) as it collects."""
    (tmp_path / "test_collected.py").write_text(COLLECTED_WITHOUT_THE_COLLECTOR)
    assert "1 passed" in _child_pytest(tmp_path)
