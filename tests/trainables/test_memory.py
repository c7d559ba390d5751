"""A trial's start-up collection frees what earlier trials in the worker left behind
without walking the whole process again at every trial."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

from trainables.memory import TrialMemory

CPU = torch.device("cpu")


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """A process in which no trial has started yet."""
    gc.unfreeze()
    yield


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """What a finished trial leaves: objects that reference each other and nothing else."""
    a, b = _Node(), _Node()
    a.peer, b.peer = b, a
    return weakref.ref(a)


def test_each_trial_start_frees_the_cycles_an_earlier_trial_left(unfrozen: None) -> None:
    TrialMemory(CPU)  # the first trial in this worker
    gc.disable()  # no automatic collection may do the work for TrialMemory
    try:
        for _ in range(3):
            left = _cycle()
            assert left() is not None
            TrialMemory(CPU)
            assert left() is None
    finally:
        gc.enable()


def test_the_objects_alive_at_the_first_trial_are_not_walked_again(unfrozen: None) -> None:
    alive = len(gc.get_objects())  # the imports, pytest, torch: tens of thousands
    assert alive > 50_000
    TrialMemory(CPU)
    assert gc.get_freeze_count() >= 0.9 * alive
    assert len(gc.get_objects()) < 0.05 * alive  # what a later collection walks
    TrialMemory(CPU)
    assert len(gc.get_objects()) < 0.05 * alive
