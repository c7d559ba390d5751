"""The shared process helpers of the tests: killing a tree whose root already exited is a
no-op that keeps the root's exit status (a sweep that finished before the kill once raised
psutil.NoSuchProcess there), and a live tree dies whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.processes import kill_tree, signal_all, wait_for

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_kill_tree_of_an_exited_unreaped_process_keeps_its_exit_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
    kill_tree(proc)
    assert proc.returncode == 7


def test_kill_tree_of_a_reaped_process_is_a_no_op() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert proc.wait(timeout=60) == 0
    kill_tree(proc)
    assert proc.returncode == 0


def test_kill_tree_kills_the_process_and_its_descendants() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = psutil.Process(int(proc.stdout.readline()))
    kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    assert not child.is_running()


def test_signal_all_skips_processes_that_are_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = psutil.Process(proc.pid)
    proc.wait(timeout=60)
    signal_all([gone], signal.SIGTERM)  # no psutil.NoSuchProcess


def test_wait_for_fails_naming_the_state_when_the_process_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(AssertionError, match=r"process exited \(3\) while waiting for the moon"):
        wait_for(lambda: False, timeout=60, what="the moon", proc=proc, detail=lambda: "log")
