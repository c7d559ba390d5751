"""Run `hpo` sweeps in child processes and poke at them from outside (faults are injected
there): start one, find its trials' worker processes, freeze them as they appear and step
one a checkpoint at a time (so a test's state does not depend on how long an epoch lasts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tests.hpo.sweep_helpers import ONE_TFT, checkpointed_epochs, trial_dirs, write_tiny_spec
from tests.processes import GONE, family, kill_tree, log_tail, signal_all, wait_for

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


def freeze_on_arrival(driver_pid: int, frozen: list[int], count: int) -> list[int] | None:
    """SIGSTOP each trial worker the moment it is seen (``frozen`` keeps them across
    polls); the frozen pids once ``count`` were seen, else None (poll again)."""
    for worker in trial_workers(driver_pid):
        if worker.pid not in frozen:
            signal_all([worker], signal.SIGSTOP)
            frozen.append(worker.pid)
    return frozen if len(frozen) >= count else None


def advance(pid: int, sweep_dir: Path, driver: subprocess.Popen) -> Path:
    """Let the frozen worker ``pid`` run until one more checkpoint is written, then freeze
    it again; the trial folder that grew (the only one: the other workers are frozen)."""
    before = {d: checkpointed_epochs(d) for d in trial_dirs(sweep_dir)}
    signal_all([pid], signal.SIGCONT)
    try:
        return wait_for(
            lambda: next(
                (d for d in trial_dirs(sweep_dir) if checkpointed_epochs(d) > before.get(d, 0)),
                None,
            ),
            timeout=300,
            what=f"worker {pid}'s next checkpoint",
            proc=driver,
            interval=0.02,
        )
    finally:
        signal_all([pid], signal.SIGSTOP)


Step = Callable[[list[int], Callable[[int], Path]], object]
"""Which frozen worker goes next: called with the frozen pids and ``go``, which lets one
run to its next checkpoint and returns the trial folder that grew."""


def sweep_then_sigterm(
    tmp_path: Path,
    spec: Path,
    sweep_dir: Path,
    workers: int,
    reached: Callable[[], bool],
    step: Step = lambda frozen, go: go(frozen[-1]),
) -> str:
    """Start ``hpo sweep spec``, SIGTERM its driver once ``reached()`` holds, wait for it
    to stop; returns its log and asserts the resumable exit (3). The sweep's first
    ``workers`` trial workers are frozen as they appear (and any later one, as it
    appears) and one is stepped a checkpoint at a time (by ``step``: the newest unless
    told otherwise), so the signal lands mid-sweep however fast an epoch is (a sleep or a
    poll after a checkpoint could let a fast sweep finish first)."""
    log = tmp_path / "sweep.log"
    driver = start(["sweep", str(spec)], tmp_path, log.name)
    frozen: list[int] = []
    try:
        wait_for(
            lambda: freeze_on_arrival(driver.pid, frozen, count=workers),
            timeout=300,
            what=f"{workers} trial worker(s)",
            proc=driver,
            detail=log_tail(log),
            interval=0.02,
        )
        while not reached():
            freeze_on_arrival(driver.pid, frozen, count=1)  # a new actor: frozen too
            step(frozen, lambda pid: advance(pid, sweep_dir, driver))
        driver.send_signal(signal.SIGTERM)
        signal_all(frozen, signal.SIGCONT)
        driver.wait(timeout=180)
    finally:
        signal_all(frozen, signal.SIGCONT)
        kill_tree(driver)
    text = log.read_text()
    assert driver.returncode == 3, text[-4000:]
    return text
