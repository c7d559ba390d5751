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

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.reliability.sweep_process import (
    children,
    kill_tree,
    results,
    start,
    trial_dirs,
    wait_for,
    write_spec,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EPOCHS = 12  # a window of epochs 2..8 in which both trials are frozen together


def test_killed_worker_and_corrupt_checkpoint_are_survived(tmp_path: Path) -> None:
    # Epochs long enough (~1 s) that both trials are seen together between epoch 2 and
    # their last epochs; they are frozen the moment they are. (40 steps stopped being
    # enough when the multi-tensor optimizer made a step cheaper: both trials finished
    # before the poll saw them in that window.)
    trainer = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 120}
    spec = write_spec(tmp_path, "faults", max_epochs=EPOCHS, trainer=trainer)
    sweep_dir = tmp_path / "results" / "faults"
    driver = start(["sweep", str(spec)], tmp_path, "sweep.log")
    try:
        # Both trials running, each past epoch 2 (so each has two checkpoints).
        running = wait_for(
            lambda: (
                [d for d in trial_dirs(sweep_dir) if 2 <= len(results(d)) < EPOCHS - 3][:2]
                if len([d for d in trial_dirs(sweep_dir) if 2 <= len(results(d)) < EPOCHS - 3]) >= 2
                else None
            ),
            timeout=300,
            what="two trials past epoch 2",
            proc=driver,
        )
        plain, corrupt = running
        # Freeze both workers first, so that what the driver has recorded (result rows and
        # the checkpoint each row names) stops changing while the faults are set up.
        pids = {d.name: results(d)[-1]["pid"] for d in (plain, corrupt)}
        for pid in pids.values():
            psutil.Process(pid).send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # a result already on the wire reaches the driver
        victims = {}
        for trial_dir in (plain, corrupt):
            last = results(trial_dir)[-1]
            victims[trial_dir.name] = (last["pid"], last["epoch"], last["checkpoint_dir_name"])
        # The checkpoint the driver would restore from, i.e. the newest one it knows of.
        weights = corrupt / victims[corrupt.name][2] / "state" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
        for pid in pids.values():
            psutil.Process(pid).send_signal(signal.SIGKILL)
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
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = children(f"sqlite:///{tmp_path / 'mlflow.db'}", "faults")
    assert len(runs) == 2 and len({r.data.tags["trial_id"] for r in runs}) == 2
    for run in runs:
        assert run.info.status == "FINISHED"
        assert sorted(
            m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")
        ) == list(range(1, EPOCHS + 1))
