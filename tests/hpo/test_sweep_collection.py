"""A sweep's driver imports with the cyclic collector paused (``hpo sweep`` and ``hpo
resume`` pause it: tests/hpo/test_cli_exit.py) and runs it again before Tune's objects
exist: frozen in a reference cycle, the tuner and its trials would never be freed when
Tune's run ends (trainables.memory.resume_collection)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ray import tune

import hpo.sweep as sweep
import trainables.memory as memory
from tests.hpo.sweep_helpers import tiny_spec


class _TuneStarts(Exception):
    """Raised where Tune's first object would be made: the test ends there."""


@pytest.fixture
def paused(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """The collector as a command's start left it (paused), with freezing a no-op (this
    test process freezes at module boundaries only); yields what was seen at Tune's
    start. Ray, the resources and the plan are stand-ins: what runs before them is real."""
    monkeypatch.setattr(memory, "_PAUSED_AT_START", [True])
    monkeypatch.setattr(gc, "freeze", lambda: None)
    monkeypatch.setattr(sweep, "_join_cluster", lambda *args, **kwargs: None)
    monkeypatch.setattr(sweep, "sweep_resources", lambda *args: None)
    plan = SimpleNamespace(text="plan", log_to=lambda client, run: None)
    monkeypatch.setattr(sweep, "sweep_plan", lambda *args: plan)
    seen: list[bool] = []

    def tune_starts(*args: Any, **kwargs: Any) -> None:
        seen.append(gc.isenabled())
        raise _TuneStarts

    monkeypatch.setattr(sweep, "_watchers", tune_starts)  # run_sweep's first Tune object
    monkeypatch.setattr(tune.Tuner, "restore", tune_starts)  # resume_sweep's
    monkeypatch.setattr(tune.Tuner, "can_restore", lambda uri: True)
    monkeypatch.setattr(sweep, "_trainable", lambda *args: None)
    gc.disable()
    try:
        yield seen
    finally:
        gc.enable()


def test_run_and_resume_collect_again_before_tune(
    paused: list[bool], tmp_path: Path, mlflow_uri: str
) -> None:
    spec = tiny_spec(tmp_path, mlflow_uri, name="collects")
    with pytest.raises(_TuneStarts):
        sweep.run_sweep(spec)
    assert paused == [True]

    gc.disable()  # a resume's own command start
    memory._PAUSED_AT_START[0] = True
    with pytest.raises(_TuneStarts):
        sweep.resume_sweep(tmp_path / "results" / "collects")
    assert paused == [True, True]
