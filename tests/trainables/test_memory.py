"""A trial's start-up collection frees what earlier trials left behind, and in a Tune
worker it stops walking the whole process at every trial without freezing any trial; a
process's imports run with the collector off."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest
import torch

import trainables.memory as memory
from tests.trainables.helpers import tiny_config
from trainables.memory import TrialMemory, freeze_long_lived_objects
from trainables.trainer import Trainer

CPU = torch.device("cpu")


@pytest.fixture
def fresh_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process in which no trial has started yet; unfrozen again afterwards."""
    gc.unfreeze()
    monkeypatch.setattr(memory, "_FREEZES_LEFT", [2])
    yield
    gc.unfreeze()


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """What a finished trial leaves: objects that reference each other and nothing else."""
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    return weakref.ref(a)


def test_each_trial_start_frees_the_cycles_an_earlier_trial_left(fresh_worker: None) -> None:
    gc.disable()  # no automatic collection may do the work for TrialMemory
    try:
        for _ in range(3):
            left = _cycle()
            assert left() is not None
            TrialMemory(CPU)
            assert left() is None
    finally:
        gc.enable()


def test_a_workers_first_trainer_is_freed_when_its_trial_ends(fresh_worker: None) -> None:
    """The freezes happen where the Tune trainable starts a trial, before its trainer
    exists: a trainer (which holds reference cycles: its steps point back at it) built
    after them is never frozen, so it is freed once its trial is over."""
    trainers = []
    for _ in range(3):  # three trials in one reused worker
        freeze_long_lived_objects()  # the top of run_trial
        trainer = Trainer(tiny_config(epochs=1))
        trainer.fit()
        trainers.append(weakref.ref(trainer))
        del trainer
    TrialMemory(CPU)  # the next trial's start
    assert [ref() for ref in trainers] == [None, None, None]


def test_after_two_trials_a_collection_walks_only_the_trials_own_objects(
    fresh_worker: None,
) -> None:
    alive = len(gc.get_objects())  # the imports, pytest, torch: tens of thousands
    assert alive > 50_000
    for _ in range(2):
        freeze_long_lived_objects()
        Trainer(tiny_config(epochs=1)).fit()
    frozen = gc.get_freeze_count()
    assert frozen >= 0.9 * alive
    freeze_long_lived_objects()  # the third trial: nothing more is frozen
    # Not equal: a frozen object freed by reference counting in between (pytest's or
    # xdist's, in CI: 2 of a million) lowers the count; a third freeze would raise it.
    assert gc.get_freeze_count() <= frozen
    TrialMemory(CPU)
    assert len(gc.get_objects()) < 0.05 * alive  # what each later collection walks


# A process's import-heavy start with the collector paused (trainables.memory): each case
# runs in a fresh interpreter, where the collector's state and the frozen objects are the
# process's own, not the test session's.
PAUSE_AND_RESUME = """
import gc
from trainables.memory import pause_collection, resume_collection

pause_collection()
pause_collection()  # twice: still one pause
assert not gc.isenabled()
frozen = gc.get_freeze_count()
import json, email.parser  # what a command imports meanwhile
resume_collection()
assert gc.isenabled()
assert gc.get_freeze_count() > frozen  # the start's objects are frozen...
frozen = gc.get_freeze_count()
resume_collection()  # ...once
assert gc.get_freeze_count() == frozen

gc.disable()  # a collector the caller turned off stays off
pause_collection()
resume_collection()
assert not gc.isenabled() and gc.get_freeze_count() == frozen
print("ok")
"""

# tune_entry imports the trial loop (torch, Tune, the trainer) with the collector off,
# and runs the trial with it on: a stand-in for trainables.trial records both.
TRIAL_IMPORT = """
import gc, importlib.abc, importlib.util, sys
seen = []

class StandIn(importlib.abc.Loader):
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        seen.append(("import", gc.isenabled()))
        module.run_trial = lambda *args: seen.append(("trial", gc.isenabled()))

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "trainables.trial":
            return importlib.util.spec_from_loader(name, StandIn())
        return None

sys.meta_path.insert(0, Finder())
from trainables.tune_entry import run_trial
run_trial({})
print(seen)
"""


@pytest.mark.parametrize("script", [PAUSE_AND_RESUME, TRIAL_IMPORT], ids=["pause", "trial"])
def test_a_process_start_imports_with_the_collector_off(script: str) -> None:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = "ok" if script is PAUSE_AND_RESUME else "[('import', False), ('trial', True)]"
    assert done.stdout.strip() == expected
