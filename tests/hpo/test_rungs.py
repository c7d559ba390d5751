"""ASHA per member (hpo.rungs): the same decisions as Ray Tune's ASHAScheduler bracket, each
remembered across a resume, and the board kept in the sweep's directory."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler
from ray.tune.schedulers.async_hyperband import _Bracket

from hpo.rungs import RUNGS_FILE, AshaRungs, RungBoard


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize(("grace", "max_t"), [(1, 3), (1, 8), (2, 9)])
def test_decisions_equal_ray_tunes_asha_bracket(grace: int, max_t: int) -> None:
    # Ray's _Bracket is what ASHAScheduler(brackets=1, reduction_factor=2) decides with.
    rng = random.Random(grace * 100 + max_t)
    ours = AshaRungs(grace, max_t, reduction_factor=2)
    theirs = _Bracket(grace, max_t, 2, s=0)
    assert sorted(ours.milestones, reverse=True) == [int(m) for m, _ in theirs._rungs]
    alive = {f"m{i}": 0 for i in range(24)}
    stops = 0
    while alive:
        # Members report asynchronously: a random one advances an epoch at a time.
        member = rng.choice(sorted(alive))
        alive[member] += 1
        epoch = alive[member]
        value = math.nan if rng.random() < 0.05 else rng.gauss(0.0, 1.0)
        if epoch >= max_t:
            del alive[member]
            continue
        expected = theirs.on_result(SimpleNamespace(trial_id=member), epoch, value)
        keep = ours.keep(member, epoch, value)
        assert keep == (expected == TrialScheduler.CONTINUE), (member, epoch, value)
        if not keep:
            stops += 1
            del alive[member]
    assert stops >= 6  # the comparison saw stops, not only continues


def test_a_decision_is_remembered_and_survives_a_restart(tmp_path: Path) -> None:
    board = RungBoard(str(tmp_path), grace=1, max_t=4, reduction_factor=2)
    assert board.keep("a", 1, 2.0) and board.keep("b", 1, 3.0)
    assert not board.keep("c", 1, 0.0)  # below the rung's median
    assert json.loads((tmp_path / RUNGS_FILE).read_text())["decisions"]["1"]["c"] is False
    # A new board (the resumed sweep's) answers an epoch re-run as the first time, even
    # though the value differs now (a re-run after a restore need not be bit-identical).
    again = RungBoard(str(tmp_path), grace=1, max_t=4, reduction_factor=2)
    assert not again.keep("c", 1, 9.0) and again.keep("a", 1, -9.0)
    assert again.keep("d", 1, 5.0)  # new members are judged against all recorded values
    # The last epoch always ends a member (Tune's ASHA stops a trial at max_t).
    assert not again.keep("a", 4, 10.0)


def test_rungs_of_another_shape_are_refused(tmp_path: Path) -> None:
    RungBoard(str(tmp_path), grace=1, max_t=4, reduction_factor=2).keep("a", 1, 1.0)
    with pytest.raises(ValueError, match="max_epochs or grace_epochs changed"):
        RungBoard(str(tmp_path), grace=1, max_t=16, reduction_factor=2)
