"""FinalTrials hands the sweep's summary Tune's trials only when every trial ended: an
interrupted experiment also calls ``on_experiment_end``, after Tune marked its running
trials TERMINATED without completing them, and those rows would read as finished (a
SIGTERMed sweep exited 0 with "4/4 trials finished" instead of 3, resumable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import hpo.final_trials as final_trials
from cluster.storage import SweepLocation
from hpo.final_trials import FinalTrials


@dataclass
class FakeTrial:
    trial_id: str
    status: str = "RUNNING"

    def is_finished(self) -> bool:
        return self.status in ("TERMINATED", "ERROR")


@pytest.fixture
def rows_of(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """The trials FinalTrials made rows of (one list per call)."""
    calls: list[list[Any]] = []

    def rows_of_trials(trials: list[Any], sweep_dir: SweepLocation, **_: Any) -> list[str]:
        calls.append(list(trials))
        return [t.trial_id for t in trials]

    monkeypatch.setattr(final_trials, "rows_of_trials", rows_of_trials)
    return calls


def test_rows_when_every_trial_completed_or_errored(tmp_path, rows_of) -> None:
    trials = [FakeTrial("a"), FakeTrial("b"), FakeTrial("c")]
    final = FinalTrials(SweepLocation.parse(str(tmp_path)))
    final.on_step_begin(0, trials)
    for trial, status in zip(trials, ("TERMINATED", "ERROR", "TERMINATED"), strict=True):
        trial.status = status
        hook = final.on_trial_error if status == "ERROR" else final.on_trial_complete
        hook(1, trials, trial)
    final.on_experiment_end(trials)
    assert final.rows == ["a", "b", "c"]


def test_no_rows_when_tune_terminated_running_trials_at_an_interrupt(tmp_path, rows_of) -> None:
    trials = [FakeTrial("a"), FakeTrial("b")]
    final = FinalTrials(SweepLocation.parse(str(tmp_path)))
    final.on_step_begin(0, trials)
    trials[0].status = "TERMINATED"
    final.on_trial_complete(1, trials, trials[0])
    trials[1].status = "TERMINATED"  # Tune's cleanup after SIGTERM: no on_trial_complete
    final.on_experiment_end(trials)
    assert final.rows is None and rows_of == []


def test_a_resume_counts_the_trials_that_ended_before_it(tmp_path, rows_of) -> None:
    trials = [FakeTrial("a", "TERMINATED"), FakeTrial("b")]
    final = FinalTrials(SweepLocation.parse(str(tmp_path)))
    final.on_step_begin(0, trials)
    trials[1].status = "TERMINATED"
    final.on_trial_complete(1, trials, trials[1])
    final.on_experiment_end(trials)
    assert final.rows == ["a", "b"]
