"""Child processes in tests: wait for a state, signal, kill. Every helper here tolerates a
process that has already exited (a sweep may finish, a worker may end, between the look and
the signal); a test that needs the process alive says so with ``wait_for(..., proc=...)``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")
GONE = (psutil.NoSuchProcess, ProcessLookupError)  # psutil.ZombieProcess is a NoSuchProcess


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    proc: subprocess.Popen | None = None,
    interval: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that. Fails naming
    ``what`` after ``timeout`` seconds, or as soon as ``proc`` exits (the state can no
    longer be reached in a process that ended), with ``detail()`` (a log's tail) after."""

    def fail(why: str) -> AssertionError:
        return AssertionError(f"{why} waiting for {what}" + (f"\n{detail()}" if detail else ""))

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise fail(f"process exited ({proc.returncode}) while")
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise fail(f"timed out after {timeout:.0f} s")
        time.sleep(interval)


def log_tail(path: Path, chars: int = 3000) -> Callable[[], str]:
    """For ``wait_for(detail=...)``: the end of a child's log, read when a wait fails."""
    return lambda: path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def signal_all(processes: Iterable[int | psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process (a pid or a psutil.Process) still running."""
    for process in processes:
        with contextlib.suppress(*GONE):
            if isinstance(process, psutil.Process):
                process.send_signal(sig)  # checks the pid was not reused
            else:
                os.kill(process, sig)


def family(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants, the process first; [] if it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except GONE:
        return []


def kill_tree(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGKILL ``proc`` and every descendant, ``proc`` first (so it records nothing more
    once its children go), then reap ``proc`` and wait for the rest. A no-op when ``proc``
    has already exited: its children were re-parented when it did, and once reaped its pid
    may belong to another process. Until ``proc`` is reaped its pid stays its own."""
    if proc.poll() is not None:
        return
    members = family(proc.pid)  # listed before any signal: re-parented once proc dies
    signal_all(members, signal.SIGKILL)
    proc.wait(timeout=timeout)
    psutil.wait_procs(members[1:], timeout=timeout)
