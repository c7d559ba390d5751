"""Faults inside a running sweep, injected from outside the driver:

* a trial's worker process is SIGKILLed mid-epoch: the trial is retried from its newest
  checkpoint, no completed epoch is redone, its MLflow child run continues;
* another trial's newest checkpoint is truncated before its worker is killed: the retry
  names the bad file and resumes from the previous good checkpoint;
the sweep ends with the planned number of trials, one child run each, one point per epoch.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.hpo.sweep_helpers import (
    checkpointed_epochs,
    last_result,
    newest_checkpoint,
    results,
    trial_runs,
)
from tests.processes import kill_tree, log_tail, signal_all, wait_for
from tests.reliability.sweep_process import advance, freeze_on_arrival, start, write_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EPOCHS = 10
RECORDED_S = 5.0  # a few of Tune's 1 s snapshots, which bring the driver's rows to storage


def _recorded(trial_dir: Path) -> tuple[int, str] | None:
    """(epoch, checkpoint) of the driver's newest row, if it names the trial's newest
    checkpoint on disk: then no result is on its way to the driver."""
    row = last_result(trial_dir)
    if row is None or row["checkpoint_dir_name"] != newest_checkpoint(trial_dir):
        return None
    return row["epoch"], row["checkpoint_dir_name"]


def _frozen_at_a_recorded_checkpoint(
    pid: int, sweep_dir: Path, driver: subprocess.Popen
) -> tuple[Path, int, str]:
    """Step the frozen worker ``pid`` one checkpoint at a time until it has checkpointed
    epoch 2 and the driver's rows name its newest checkpoint. A worker reports an epoch
    only after writing its checkpoint; one frozen between the two never gets recorded,
    so it takes another step. Returns (trial folder, last epoch, its checkpoint)."""
    while True:
        trial_dir = advance(pid, sweep_dir, driver)
        if checkpointed_epochs(trial_dir) < 2:
            continue
        deadline = time.monotonic() + RECORDED_S
        while time.monotonic() < deadline:
            recorded = _recorded(trial_dir)
            if recorded is not None:
                return trial_dir, *recorded
            time.sleep(0.2)
        assert checkpointed_epochs(trial_dir) < EPOCHS - 1, "the trial ran to its end"


def test_killed_worker_and_corrupt_checkpoint_are_survived(tmp_path: Path) -> None:
    # Two trials alone (a group's faults: tests/trainables/test_group_trial.py). Their
    # workers are frozen as they start and stepped one checkpoint at a time, so how long
    # an epoch lasts does not matter.
    spec = write_spec(tmp_path, "faults", max_epochs=EPOCHS, grouping={"group_size": 1})
    sweep_dir = tmp_path / "results" / "faults"
    driver = start(["sweep", str(spec)], tmp_path, "sweep.log")
    try:
        frozen: list[int] = []
        workers = wait_for(
            lambda: freeze_on_arrival(driver.pid, frozen, count=2),
            timeout=300,
            what="both trials' workers",
            proc=driver,
            interval=0.02,
            detail=log_tail(tmp_path / "sweep.log"),
        )
        victims: dict[str, tuple[int, int, str]] = {}
        for pid in workers:
            trial_dir, epoch, checkpoint = _frozen_at_a_recorded_checkpoint(pid, sweep_dir, driver)
            victims[trial_dir.name] = (pid, epoch, checkpoint)
        plain, corrupt = (sweep_dir / name for name in victims)
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
