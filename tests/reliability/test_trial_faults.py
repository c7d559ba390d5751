"""Faults inside a running sweep, injected from outside the driver:

* a trial's worker process is SIGKILLed mid-epoch: the trial is retried from its newest
  checkpoint, no completed epoch is redone, its MLflow child run continues;
* another trial's newest checkpoint is truncated before its worker is killed: the retry
  names the bad file and resumes from the previous good checkpoint;
the sweep ends with the planned number of trials, one child run each, one point per epoch.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.hpo.sweep_helpers import (
    last_result,
    newest_checkpoint,
    results,
    trial_dirs,
    trial_runs,
)
from tests.processes import kill_tree, log_tail, signal_all, wait_for
from tests.reliability.sweep_process import start, write_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EPOCHS = 12  # a window of epochs 2..8 in which both trials are frozen together
SETTLE_S = 5.0  # a few of Tune's 1 s snapshots, which bring the driver's rows to storage


def _two_trials_past_epoch_two(sweep_dir: Path) -> list[Path] | None:
    running = [d for d in trial_dirs(sweep_dir) if 2 <= len(results(d)) < EPOCHS - 3]
    return running[:2] if len(running) >= 2 else None


def _frozen_at_a_recorded_checkpoint(trials: list[Path]) -> dict[str, tuple] | None:
    """Freeze the trials' workers, then wait for the driver's result rows to name each
    worker's newest checkpoint on disk. A worker reports an epoch only after writing its
    checkpoint, so then no result is on its way to the driver and the newest checkpoint the
    driver knows of is the row's. A worker frozen between the two never gets there: it is
    let go, to be frozen again at another epoch (None). Returns {trial folder: (pid, last
    epoch, its checkpoint)} as recorded."""
    first = [last_result(d) for d in trials]
    if any(row is None for row in first):
        return None  # a result.json caught mid-copy: look again
    pids = [row["pid"] for row in first if row is not None]
    signal_all(pids, signal.SIGSTOP)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        last = {d.name: last_result(d) for d in trials}
        if all(
            row is not None and row["checkpoint_dir_name"] == newest_checkpoint(d)
            for d, row in zip(trials, last.values(), strict=True)
        ):
            return {
                name: (row["pid"], row["epoch"], row["checkpoint_dir_name"])
                for name, row in last.items()
                if row is not None
            }
        time.sleep(0.2)
    signal_all(pids, signal.SIGCONT)
    return None


def test_killed_worker_and_corrupt_checkpoint_are_survived(tmp_path: Path) -> None:
    # Epochs long enough (~1 s) that both trials are seen together between epoch 2 and
    # their last epochs; they are frozen the moment they are. (40 steps stopped being
    # enough when the multi-tensor optimizer made a step cheaper: both trials finished
    # before the poll saw them in that window.)
    trainer = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 120}
    # Two trials alone (a group's faults: tests/trainables/test_group_trial.py).
    spec = write_spec(
        tmp_path, "faults", max_epochs=EPOCHS, trainer=trainer, fusion={"group_size": 1}
    )
    sweep_dir = tmp_path / "results" / "faults"
    driver = start(["sweep", str(spec)], tmp_path, "sweep.log")
    try:
        plain, corrupt = wait_for(
            lambda: _two_trials_past_epoch_two(sweep_dir),
            timeout=300,
            what="two trials past epoch 2",
            proc=driver,
            detail=log_tail(tmp_path / "sweep.log"),
        )
        # Both workers frozen first, so that what the driver has recorded (result rows and
        # the checkpoint each row names) stops changing while the faults are set up.
        victims = wait_for(
            lambda: _frozen_at_a_recorded_checkpoint([plain, corrupt]),
            timeout=300,
            what="both trials frozen with their newest checkpoint recorded by the driver",
            proc=driver,
            detail=log_tail(tmp_path / "sweep.log"),
        )
        # The checkpoint the driver would restore from, i.e. the newest one it knows of.
        weights = corrupt / victims[corrupt.name][2] / "state" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
        signal_all([pid for pid, _, _ in victims.values()], signal.SIGKILL)
        driver.wait(timeout=600)
    finally:
        kill_tree(driver)
    log = (tmp_path / "sweep.log").read_text()
    assert driver.returncode == 0, log[-4000:]
    assert "2/2 trials finished" in log

    for trial_dir in (plain, corrupt):
        rows = results(trial_dir)
        old_pid, killed_after, _ = victims[trial_dir.name]
        assert {r["pid"] for r in rows if r["epoch"] > killed_after} - {old_pid}, (
            "the trial was not retried"
        )
        epochs = [r["epoch"] for r in rows]
        if trial_dir == plain:
            assert epochs == list(range(1, EPOCHS + 1))  # nothing redone
        else:
            # The newest checkpoint (epoch k) was unreadable: epoch k is trained once more
            # from the checkpoint of epoch k-1, and every later epoch exactly once.
            assert epochs == [
                *range(1, killed_after + 1),
                killed_after,
                *range(killed_after + 1, EPOCHS + 1),
            ]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = trial_runs(uri, "faults")
    assert len(runs) == 2 and len({r.data.tags["trial_id"] for r in runs}) == 2
    for run in runs:
        assert run.info.status == "FINISHED"
        assert sorted(
            m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")
        ) == list(range(1, EPOCHS + 1))
