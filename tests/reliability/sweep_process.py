"""Run `hpo` sweeps in child processes and poke at them (faults are injected from outside)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml
from mlflow.tracking import MlflowClient

from hpo.tracking import TAG_ROLE

HPO = [sys.executable, "-m", "hpo.cli"]


def write_spec(tmp_path: Path, name: str, **overrides: Any) -> Path:
    spec: dict[str, Any] = {
        "name": name,
        "models": ["tft"],
        "precisions": ["f32"],
        "samples": 2,
        "search": "random",
        "scheduler": "fifo",
        "max_epochs": 5,
        "max_concurrent": 2,
        "storage": str(tmp_path / "results"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "data": {"n_assets": 2, "n_bars": 600},
        "walk_forward": {"n_folds": 1},
        "trainer": {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 15},
        "search_space": {"tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1}},
    }
    spec.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(args: list[str], tmp_path: Path, log_name: str) -> subprocess.Popen:
    env = {**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1", "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / log_name, "w")  # noqa: SIM115 - handed to the child process
    return subprocess.Popen(
        [*HPO, *args], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )


def children(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    return [
        r for r in client.search_runs([found.experiment_id]) if r.data.tags.get(TAG_ROLE) == "trial"
    ]


def results(trial_dir: Path) -> list[dict[str, Any]]:
    path = trial_dir / "result.json"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the driver is still appending this line
    return rows


def trial_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir()) if sweep_dir.is_dir() else []


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def kill_tree(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        parent = psutil.Process(proc.pid)
    except psutil.NoSuchProcess:
        return
    family = [*parent.children(recursive=True), parent]
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)
    psutil.wait_procs(family, timeout=30)
    proc.wait(timeout=30)
