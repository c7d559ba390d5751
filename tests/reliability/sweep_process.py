"""Run `hpo` sweeps in child processes and poke at them from outside (faults are injected
there): start one, find its trials' worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from tests.hpo.sweep_helpers import ONE_TFT, write_tiny_spec
from tests.processes import GONE, family

HPO = [sys.executable, "-m", "hpo.cli"]
# Tune snapshots the experiment every second (and copies the trials' result rows to the
# storage path with each snapshot), so tests see a sweep's records within a second.
SWEEP_ENV = {"TUNE_GLOBAL_CHECKPOINT_S": "1", "PYTHONUNBUFFERED": "1"}


def write_spec(tmp_path: Path, name: str, **overrides: Any) -> Path:
    """The reliability tests' sweep: two tft trials of 5 epochs (one group trial of two
    configurations, unless ``fusion`` says otherwise), two Tune trials at a time."""
    trainer = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 15}
    defaults = {**ONE_TFT, "samples": 2, "max_epochs": 5, "trainer": trainer}
    return write_tiny_spec(tmp_path, name, **{**defaults, **overrides})


def start(args: list[str], tmp_path: Path, log_name: str) -> subprocess.Popen:
    log = open(tmp_path / log_name, "w")  # noqa: SIM115 - handed to the child process
    return subprocess.Popen(
        [*HPO, *args],
        cwd=tmp_path,
        env={**os.environ, **SWEEP_ENV},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def trial_workers(driver_pid: int) -> list[psutil.Process]:
    """The Ray workers that run the sweep's trials: the driver's descendants that Ray titles
    ``ray::ImplicitFunc...`` (Tune's actor for a function trainable)."""
    workers = []
    for process in family(driver_pid)[1:]:
        try:
            if " ".join(process.cmdline()).startswith("ray::ImplicitFunc"):
                workers.append(process)
        except (*GONE, psutil.AccessDenied):
            continue
    return workers
