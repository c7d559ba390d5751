"""Kill a sweep's driver mid-way, `hpo resume` it: the planned trials all finish, finished
trials are not re-run, interrupted ones continue from their checkpoint epoch, and MLflow
holds exactly one child run per trial with one metric point per epoch."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from hpo.tracking import TAG_ROLE
from tests.reliability.sweep_process import results

pytestmark = [pytest.mark.ray, pytest.mark.slow]
HPO = [sys.executable, "-m", "hpo.cli"]
EPOCHS = 5


def _spec(tmp_path: Path) -> Path:
    spec = {
        "name": "killme",
        "models": ["tft", "dqn"],
        "precisions": ["f32", "bf16"],
        "samples": 1,
        "search": "random",
        "scheduler": "fifo",
        "max_epochs": EPOCHS,
        "max_concurrent": 2,
        "storage": str(tmp_path / "results"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "data": {"n_assets": 2, "n_bars": 600},
        "walk_forward": {"n_folds": 1},
        "trainer": {
            "lookback": 16,
            "batch_size": 32,
            "max_steps_per_epoch": 15,
            "rl_iterations": 25,
        },
        "search_space": {
            "tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1},
            "dqn": {"hidden": 32, "learning_starts": 64},
        },
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _children(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("killme")
    if experiment is None:
        return []
    runs = client.search_runs([experiment.experiment_id])
    return [r for r in runs if r.data.tags.get(TAG_ROLE) == "trial"]


def _epochs(trial_dir: Path) -> list[int]:
    return [row["epoch"] for row in results(trial_dir)]


def _kill_tree(proc: subprocess.Popen) -> None:
    parent = psutil.Process(proc.pid)
    family = [*parent.children(recursive=True), parent]
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    psutil.wait_procs(family, timeout=30)


def test_killed_driver_then_resume_completes_without_duplicates(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1", "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "sweep.log", "w")  # noqa: SIM115 - handed to the child process
    driver = subprocess.Popen(
        [*HPO, "sweep", str(spec)], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep_dir = tmp_path / "results" / "killme"
    deadline = time.monotonic() + 400
    finished_before: dict[str, int] = {}
    try:
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert driver.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
            children = _children(client) if (tmp_path / "mlflow.db").exists() else []
            done = [r for r in children if r.info.status == "FINISHED"]
            midway = [
                r
                for r in children
                if r.info.status == "RUNNING"
                and 1 <= len(client.get_metric_history(r.info.run_id, "val_sharpe")) < EPOCHS - 1
            ]
            if done and midway:
                finished_before = {
                    r.data.tags["trial_id"]: len(
                        client.get_metric_history(r.info.run_id, "val_sharpe")
                    )
                    for r in done
                }
                break
        else:
            pytest.fail("the sweep never reached a state with one finished and one half-done trial")
        time.sleep(1.5)  # let Tune write an experiment checkpoint after the newest result
    finally:
        _kill_tree(driver)
    trial_dirs = {p.name.rsplit("-", 1)[-1]: p for p in sweep_dir.iterdir() if p.is_dir()}
    lines_before = {tid: len(_epochs(trial_dirs[tid])) for tid in finished_before}

    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "4/4 trials finished" in resumed.stdout

    children = _children(client)
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
    trial_dirs = {
        p.name.rsplit("-", 1)[-1]: p
        for p in sweep_dir.iterdir()
        if p.is_dir() and p.name.rsplit("-", 1)[-1] in sweep_trials
    }
    assert set(trial_dirs) == sweep_trials
    for tid, before in lines_before.items():
        assert len(_epochs(trial_dirs[tid])) == before  # finished trials were not re-run
    for tid, path in trial_dirs.items():
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
