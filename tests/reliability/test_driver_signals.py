"""SIGTERM (or SIGINT) to the sweep driver: trials stop cleanly, state is saved, the
`hpo resume` command is printed, the driver exits 3, and that resume completes the sweep
with one child run and one metric point per epoch for every trial."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.hpo.sweep_helpers import (
    checkpointed_epochs,
    results,
    rung_decisions,
    trial_dirs,
    trial_runs,
)
from tests.reliability.sweep_process import HPO, sweep_then_sigterm, write_spec
from trainables.trial_keys import trial_key

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EPOCHS = 4


def _sweep_then_sigterm(
    tmp_path: Path, spec: Path, sweep_dir: Path, epochs: int, workers: int
) -> str:
    """The sweep SIGTERMed once a trial has checkpointed ``epochs`` epochs; its log."""
    return sweep_then_sigterm(
        tmp_path,
        spec,
        sweep_dir,
        workers,
        lambda: any(checkpointed_epochs(d) >= epochs for d in trial_dirs(sweep_dir)),
    )


def test_sigterm_saves_state_and_resume_completes(tmp_path: Path) -> None:
    # Three trials alone (a grouped sweep's resume: the test below).
    spec = write_spec(tmp_path, "sigterm", max_epochs=EPOCHS, samples=3, grouping={"group_size": 1})
    sweep_dir = tmp_path / "results" / "sigterm"
    log = _sweep_then_sigterm(tmp_path, spec, sweep_dir, epochs=1, workers=2)
    assert f"hpo resume {sweep_dir}" in log.replace("\n", "")
    assert (sweep_dir / "hpo-summary.json").exists()

    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "3/3 trials finished" in resumed.stdout
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    runs = trial_runs(uri, "sigterm")
    assert len(runs) == 3 and len({r.data.tags["trial_id"] for r in runs}) == 3
    client = MlflowClient(uri)
    for run in runs:
        assert run.info.status == "FINISHED"
        assert sorted(
            m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")
        ) == list(range(1, EPOCHS + 1))
    for trial_dir in trial_dirs(sweep_dir):
        assert [r["epoch"] for r in results(trial_dir)] == list(range(1, EPOCHS + 1))


def test_a_grouped_asha_sweep_resumes_every_trial_once(tmp_path: Path) -> None:
    # Four tft configurations of one shape: one group trial (the default group size), ASHA
    # per trial at epochs 1, 2 and 4. SIGTERM after the group's second epoch is checkpointed,
    # when the first rung has judged every trial; the resume continues the trials still
    # training from that checkpoint and leaves the stopped ones stopped.
    epochs = 6  # rungs at 1, 2 and 4; four epochs still to go at the signal
    spec = write_spec(
        tmp_path, "grouped", max_epochs=epochs, samples=4, scheduler="asha", grace_epochs=1
    )
    sweep_dir = tmp_path / "results" / "grouped"
    _sweep_then_sigterm(tmp_path, spec, sweep_dir, epochs=2, workers=1)
    (group_dir,) = trial_dirs(sweep_dir)
    before = [r["epoch"] for r in results(group_dir)]
    assert before and before[-1] < epochs, before  # interrupted mid-way

    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "4/4 trials finished" in resumed.stdout
    decisions = rung_decisions(sweep_dir)
    assert len(decisions[1]) == 4

    def last_epoch(key: str) -> int:
        stops = [rung for rung, d in decisions.items() if d.get(key) is False]
        return min(stops) if stops else epochs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = trial_runs(uri, "grouped")
    assert len(runs) == 4 and len({r.data.tags["trial_id"] for r in runs}) == 4
    for run in runs:
        key = trial_key(run.data.tags)
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")]
        assert run.info.status == "FINISHED"
        assert sorted(steps) == list(range(1, last_epoch(key) + 1)), (key, steps)
    # The group trial went on from its checkpoint: each epoch's row once.
    assert [r["epoch"] for r in results(group_dir)] == list(
        range(
            1,
            max(last_epoch(trial_key(r.data.tags)) for r in runs) + 1,
        )
    )
