"""ASHA per trial of a group trial (hpo.rungs): the same decisions as Ray Tune's
ASHAScheduler, each remembered across a resume, the rungs saved and restored with the
searcher's state. The search efficiency benchmark (bench/search_efficiency.py) runs the
same rungs."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from hpo.rungs import AshaRungs


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # Ray's all-NaN rung
@pytest.mark.parametrize("case", range(12))
def test_decisions_equal_ray_tunes_asha_scheduler(case: int) -> None:
    """Random interleavings of results (NaNs and ties included), several trials at once:
    the same CONTINUE/STOP decisions as Tune's ASHAScheduler (one bracket)."""
    rng = random.Random(case)
    max_t = rng.choice([2, 4, 8, 9, 16])
    grace = rng.choice([1, 1, 2]) if max_t > 2 else 1
    rf = rng.choice([2, 2, 3])
    ours = AshaRungs(grace, max_t, reduction_factor=rf)
    ray = ASHAScheduler(
        time_attr="epoch",
        metric="val_sharpe",
        mode="max",
        max_t=max_t,
        grace_period=grace,
        reduction_factor=rf,
    )
    assert sorted(ours.milestones, reverse=True) == [int(m) for m, _ in ray._brackets[0]._rungs]
    quality = {}
    running: dict[str, SimpleNamespace] = {}
    started = decisions = stops = 0
    while started < 40 or running:
        while started < 40 and len(running) < rng.choice([1, 2, 4]):
            trial = SimpleNamespace(trial_id=f"t{started}", epoch=0)
            ray.on_trial_add(None, trial)
            running[trial.trial_id] = trial
            quality[trial.trial_id] = rng.gauss(0, 1)
            started += 1
        trial = running[rng.choice(sorted(running))]
        trial.epoch += 1
        if rng.random() < 0.05:
            value = math.nan
        else:
            value = round(quality[trial.trial_id] + 0.3 * trial.epoch + rng.gauss(0, 0.5), 1)
        result = {"epoch": trial.epoch, "val_sharpe": value}
        keep = ours.keep(trial.trial_id, trial.epoch, value)
        theirs = ray.on_trial_result(None, trial, result)
        assert keep == (theirs == TrialScheduler.CONTINUE), (case, trial.trial_id, trial.epoch)
        decisions += 1
        stops += not keep and trial.epoch < max_t
        if not keep or math.isnan(value):
            ray.on_trial_complete(None, trial, result)
            del running[trial.trial_id]
    assert decisions > 40 and stops > 0  # early stops happened, not only max_t ends


def test_a_decision_is_remembered_and_survives_a_restart() -> None:
    rungs = AshaRungs(grace=1, max_t=4)
    assert rungs.keep("a", 1, 2.0) and rungs.keep("b", 1, 3.0)
    assert not rungs.keep("c", 1, 0.0)  # below the rung's median
    # The state as the searcher saves it (JSON), loaded into a resumed sweep's rungs: an
    # epoch re-run gets the answer it got the first time, even with another value now (a
    # re-run after a restore need not be bit-identical).
    again = AshaRungs(grace=1, max_t=4)
    again.load_state(json.loads(json.dumps(rungs.state())))
    assert not again.keep("c", 1, 9.0) and again.keep("a", 1, -9.0)
    assert again.keep("d", 1, 5.0)  # new trials are judged against all recorded values
    assert not again.keep("e", 1, 1.0)  # median of 2, 3, 0 and 5 is 2.5
    # The last epoch always ends a trial (Tune's ASHA stops a trial at max_t).
    assert not again.keep("a", 4, 10.0)


def test_rungs_of_another_shape_are_refused() -> None:
    saved = AshaRungs(grace=1, max_t=4).state()
    with pytest.raises(ValueError, match="max_epochs or grace_epochs changed"):
        AshaRungs(grace=1, max_t=16).load_state(saved)


def test_the_searcher_saves_and_restores_the_rungs_with_its_state() -> None:
    # Without a running board (no Ray here) the searcher keeps the rungs it restored, so
    # a snapshot taken before the board is back loses nothing.
    from hpo.search.sweep_searcher import SweepSearcher
    from hpo.spec import parse_spec

    spec = parse_spec(
        {"name": "r", "families": ["kan"], "precisions": ["f32"], "samples": 4, "search": "random"}
    )
    assert spec.asha_per_trial  # ASHA by default, four configurations in one group
    rungs = AshaRungs(grace=spec.grace_epochs, max_t=spec.max_epochs)
    rungs.keep("kan-f32-c000|f32/0", 1, 1.0)
    searcher = SweepSearcher(spec)
    state = searcher.get_state()
    assert state["rungs"] is None  # nothing saved yet, no board
    restored = SweepSearcher(spec)
    restored.set_state({**state, "rungs": rungs.state()})
    assert restored.get_state()["rungs"] == rungs.state()
