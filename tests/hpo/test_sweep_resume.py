"""Kill a sweep's driver mid-way, `hpo resume` it: the planned trials all finish, finished
trials are not re-run, interrupted ones continue from their checkpoint epoch, and MLflow
holds exactly one child run per trial with one metric point per epoch."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.hpo.sweep_helpers import (
    checkpointed_epochs,
    results,
    snapshot,
    trial_dirs,
    trial_id,
    trial_runs,
    write_tiny_spec,
)
from tests.processes import kill_tree, log_tail, signal_all, wait_for
from tests.reliability.sweep_process import HPO, SWEEP_ENV, start, trial_workers

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EPOCHS = 5
TRAINER = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 15, "rl_iterations": 25}


def _epochs(trial_dir: Path) -> list[int]:
    return [row["epoch"] for row in results(trial_dir)]


def _finished_and_half_done(client: MlflowClient, uri: str, sweep_dir: Path) -> bool:
    """A trial finished (its MLflow run closed) while another is half done (its worker has
    checkpointed at least one epoch and two or more are still to come)."""
    finished = [r for r in trial_runs(uri, "killme") if r.info.status == "FINISHED"]
    half_done = [d for d in trial_dirs(sweep_dir) if 1 <= checkpointed_epochs(d) < EPOCHS - 1]
    return bool(finished and half_done)


def _kill_at_a_full_snapshot(
    driver: subprocess.Popen, client: MlflowClient, uri: str, sweep_dir: Path, frozen: set[int]
) -> dict[str, Any] | None:
    """SIGKILL the driver's process tree at a state that makes the resume deterministic:
    Tune's snapshot in the storage path holds a finished trial and a half-done one, every
    trial's result rows and MLflow points reach exactly the epoch the snapshot holds, and no
    file of the snapshot is half copied. The trials' workers are frozen first (each as it
    appears), so the records stop moving and the driver cannot finish; the driver itself is
    stopped while the files are read, so nothing changes between the look and the kill.
    Returns what was recorded at the kill, or None (driver let go) to look again."""
    workers = trial_workers(driver.pid)
    signal_all(workers, signal.SIGSTOP)
    frozen.update(w.pid for w in workers)
    assert frozen, "no trial worker (ray::ImplicitFunc) among the driver's processes"
    runs = {r.data.tags["trial_id"]: r for r in trial_runs(uri, "killme")}
    points = {
        tid: len(client.get_metric_history(r.info.run_id, "val_sharpe")) for tid, r in runs.items()
    }
    driver.send_signal(signal.SIGSTOP)
    try:
        snap = snapshot(sweep_dir) or {}
        rows = {trial_id(d): _epochs(d) for d in trial_dirs(sweep_dir)}
        finished = [
            tid
            for tid, t in snap.items()
            if t["status"] == "TERMINATED" and runs.get(tid) and runs[tid].info.status == "FINISHED"
        ]
        half_done = [
            tid for tid, t in snap.items() if t["status"] == "RUNNING" and 1 <= t["epoch"] < EPOCHS
        ]
        recorded = all(
            tid in snap and snap[tid]["epoch"] == (epochs or [0])[-1] == points.get(tid, 0)
            for tid, epochs in rows.items()
        )
    except BaseException:
        driver.send_signal(signal.SIGCONT)
        raise
    if not (finished and half_done and recorded):
        driver.send_signal(signal.SIGCONT)
        return None
    kill_tree(driver)
    return {"finished": finished, "half_done": half_done, "rows": rows}


def test_killed_driver_then_resume_completes_without_duplicates(tmp_path: Path) -> None:
    spec = write_tiny_spec(tmp_path, "killme", max_epochs=EPOCHS, trainer=TRAINER)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    sweep_dir = tmp_path / "results" / "killme"
    driver = start(["sweep", str(spec)], tmp_path, "sweep.log")
    frozen: set[int] = set()
    try:
        wait_for(
            lambda: (
                (tmp_path / "mlflow.db").exists()
                and _finished_and_half_done(client, uri, sweep_dir)
            ),
            timeout=400,
            what="a finished trial beside a half-done one",
            proc=driver,
            detail=log_tail(tmp_path / "sweep.log"),
        )
        killed = wait_for(
            lambda: _kill_at_a_full_snapshot(driver, client, uri, sweep_dir, frozen),
            timeout=120,
            what="a snapshot holding a finished and a half-done trial, with every epoch it "
            "holds in the result rows and in MLflow",
            proc=driver,
            detail=log_tail(tmp_path / "sweep.log"),
            interval=0.1,
        )
    finally:
        kill_tree(driver)
    # The kill left a finished trial and a half-done one in the saved state; the finished
    # trials' result rows as they were then.
    lines_before = {tid: len(killed["rows"][tid]) for tid in killed["finished"]}

    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)],
        cwd=tmp_path,
        env={**os.environ, **SWEEP_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "4/4 trials finished" in resumed.stdout

    children = trial_runs(uri, "killme")
    assert len(children) == 4
    assert len({r.data.tags["trial_id"] for r in children}) == 4  # no duplicate child runs
    for run in children:
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")]
        assert sorted(steps) == list(range(1, EPOCHS + 1)), steps  # every epoch once
    # The sweep's trials are those in its saved state, one MLflow run each. A trial the
    # driver started after its last snapshot left a directory (and a run, now deleted)
    # behind; its configuration ran again under a new id.
    sweep_trials = {r.data.tags["trial_id"] for r in children}
    dirs = {trial_id(d): d for d in trial_dirs(sweep_dir) if trial_id(d) in sweep_trials}
    assert set(dirs) == sweep_trials
    for tid, before in lines_before.items():
        assert len(_epochs(dirs[tid])) == before  # finished trials were not re-run
    for tid, path in dirs.items():
        epochs = _epochs(path)
        assert sorted(set(epochs)) == list(range(1, EPOCHS + 1)), (tid, epochs)
        restarts = [i for i in range(1, len(epochs)) if epochs[i] <= epochs[i - 1]]
        if restarts:
            # A SIGKILLed driver saves nothing more: an interrupted trial continues from the
            # newest checkpoint in the last experiment snapshot (taken every second here), so
            # only the epochs reported after that snapshot are trained again; never epoch 1.
            (i,) = restarts
            assert epochs[i] >= 2, (tid, epochs)
            assert epochs[i - 1] - epochs[i] + 1 <= 2, (tid, epochs)
            assert epochs[i:] == list(range(epochs[i], EPOCHS + 1)), (tid, epochs)
