"""More work after a result (hpo.search.budget): the fixed and sequential stream budgets on
their own, then inside a SweepSearcher driven by hand as Tune drives it (no Ray): a
sequential compare sweep makes configurations up to each family's next look, stops a
decided family and withdraws its queued work, ends when every family is decided, and a
searcher saved mid-sweep and restored continues with its looks (none repeated, none lost).
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from ray.tune.search import Searcher

from hpo.search.budget import (
    FixedBudget,
    Outcome,
    PolicyEvent,
    SequentialBudget,
    TrialOutcome,
    make_budgets,
)
from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import SweepSpec, parse_spec
from hpo.stats import (
    MIN_FIRST_LOOK,
    holm_adjust,
    sequential_comparison,
    sequential_looks,
    sequential_verdict,
)
from trainables.config import is_group_trial
from trainables.trial_keys import trials_of

MARGIN = 0.1


def _outcome(config_id: str, difference: float | None, seeds: int = 1) -> Outcome:
    """A configuration whose bf16 trials' test Sharpe is the f32 ones' + ``difference``
    (None: the bf16 trials diverged)."""
    trials = []
    for seed in range(seeds):
        base = 0.5 + 0.1 * seed
        trials.append(TrialOutcome("f32", seed, {"val_sharpe": base, "test_sharpe": base}))
        other = None if difference is None else base + difference
        trials.append(TrialOutcome("bf16", seed, {"val_sharpe": other, "test_sharpe": other}))
    return Outcome(config_id, tuple(trials))


def _sequential(plan: tuple[int, ...]) -> SequentialBudget:
    return SequentialBudget("kan", plan, MARGIN, 0.05, "f32", "bf16")


def _feed(budget: SequentialBudget, differences: list[float | None]) -> list[PolicyEvent]:
    """Make and complete one configuration per difference, as long as the budget allows."""
    events: list[PolicyEvent] = []
    for i, d in enumerate(differences):
        if budget.done:
            break
        assert budget.allowance() > 0, (i, budget.record())
        budget.made(f"kan-c{i:03d}")
        events += budget.on_outcome(_outcome(f"kan-c{i:03d}", d))
    return events


def test_a_fixed_budget_makes_samples_whatever_the_results() -> None:
    budget = FixedBudget("kan-f32", 3)
    assert budget.allowance() == 3 and not budget.done
    for i in range(3):
        budget.made(f"c{i}")
        assert budget.on_outcome(_outcome(f"c{i}", 5.0)) == []
    assert budget.allowance() == 0 and budget.done and budget.record() is None
    restored = FixedBudget("kan-f32", 3)
    restored.load_state(json.loads(json.dumps(budget.state())))
    assert restored.done and restored.made_ids == ["c0", "c1", "c2"]
    with pytest.raises(ValueError, match="'fixed' budget's state, expected 'sequential'"):
        _sequential((10, 12)).load_state(budget.state())


def test_a_sequential_budget_asks_up_to_each_look_and_decides_as_the_rule_does() -> None:
    plan = sequential_looks(6, 2, 20)
    assert plan == (6, 8, 10, 12, 14, 16, 18, 20)
    budget = _sequential(plan)
    assert budget.allowance() == 6  # the first look's configurations at once
    for i in range(6):
        budget.made(f"c{i}")
    assert budget.allowance() == 0  # six pending: nothing more until they report
    # Small differences around 0.01: "continue" before MIN_FIRST_LOOK, then equivalent.
    differences = [0.01 * (-1) ** i + 0.002 * i for i in range(20)]
    events = []
    for i in range(6):
        events += budget.on_outcome(_outcome(f"c{i}", differences[i]))
        if i < 5:
            assert budget.allowance() == 0
    assert budget.allowance() == 2  # the next look (8) is 2 away
    events += _feed_more(budget, differences, start=6)
    expected = sequential_verdict(differences, plan, MARGIN)
    assert [look["decision"] for look in budget.record()["looks"]] == expected
    assert expected[:2] == ["continue", "continue"] and expected[-1] == "equivalent"
    assert budget.done and budget.stopped_on == "decision" and budget.allowance() == 0
    # Decided at the first look at or past MIN_FIRST_LOOK (9) on this schedule: 10.
    assert budget.record()["looks"][-1]["configs"] == 10 > MIN_FIRST_LOOK
    # One event per look, each carrying its look; the last says what it stopped on.
    assert [e.look["configs"] for e in events if e.look] == [6, 8, 10]
    assert "look 3 at 10 of up to 20 configurations" in events[-1].line
    assert events[-1].line.endswith("equivalent (stopped on decision)")
    assert "no interval before 9" in events[0].line


def _feed_more(budget: SequentialBudget, differences: list[float], start: int) -> list[PolicyEvent]:
    events: list[PolicyEvent] = []
    i = start
    while budget.allowance() > 0:
        budget.made(f"c{i}")
        events += budget.on_outcome(_outcome(f"c{i}", differences[i]))
        i += 1
    return events


@pytest.mark.parametrize(
    ("shift", "decision", "stopped_on"),
    [(-0.6, "worse", "decision"), (0.6, "better", "decision"), (0.1, "futile", None)],
)
def test_a_sequential_budget_stops_on_each_decision(
    shift: float, decision: str, stopped_on: str | None
) -> None:
    plan = sequential_looks(10, 2, 14)
    # Spread 0.3 around the margin itself (futile: can be neither inside nor beyond it).
    differences = [shift + 0.3 * math.sin(1.7 * i) for i in range(14)]
    budget = _sequential(plan)
    _feed(budget, differences)
    expected = sequential_verdict(differences, plan, MARGIN)
    assert expected[-1] == decision
    assert [look["decision"] for look in budget.record()["looks"]] == expected
    assert budget.decision == decision and budget.done
    if stopped_on is not None:
        assert budget.stopped_on == stopped_on
    else:  # futility before the budget, or the budget's own look
        assert budget.stopped_on in ("futility", "budget")
        assert (budget.note and "futile" in budget.note) or "budget spent" in (budget.note or "")


def test_a_configuration_without_a_finite_difference_is_replaced_not_counted() -> None:
    budget = _sequential(sequential_looks(10, 2, 12))
    # Every third configuration diverges in bf16: 14 made for the 10 that count.
    differences = [None if i % 3 == 2 else 0.01 * math.cos(i) for i in range(30)]
    _feed(budget, differences)
    record = budget.record()
    assert record["looks"][0]["configs"] == 10
    assert len(record["order"]) == 14 and sum(o["difference"] is None for o in record["order"]) == 4
    assert budget.decision == "equivalent"


def test_a_family_whose_trials_all_fail_ends_saying_so() -> None:
    budget = _sequential(sequential_looks(10, 2, 12))
    events = _feed(budget, [None] * 40)
    assert budget.done and budget.stopped_on == "failures" and budget.looks == []
    assert budget.failed == 12  # as many as its budget
    assert "12 of 12 configurations left no finite difference" in events[-1].line


def test_a_sequential_budget_restored_repeats_no_look() -> None:
    plan = sequential_looks(6, 2, 20)
    differences = [0.04 * math.sin(i) for i in range(20)]
    budget = _sequential(plan)
    events = _feed(budget, differences[:9])  # looks at 6 and 8 applied, one pending
    budget.made("kan-c009")
    assert len(budget.looks) == 2 and budget.pending == 1
    restored = _sequential(plan)
    restored.load_state(json.loads(json.dumps(budget.state())))
    assert restored.record() == budget.record() and restored.pending == 1
    more = restored.on_outcome(_outcome("kan-c009", differences[9]))
    assert [e.look["configs"] for e in events + more if e.look] == [6, 8, 10]
    assert [look.configs for look in restored.looks] == [6, 8, 10]
    with pytest.raises(ValueError, match="differ from the spec's"):
        _sequential(sequential_looks(6, 3, 20)).load_state(budget.state())


# -- inside the searcher -------------------------------------------------------------------


def _spec(**overrides: Any) -> SweepSpec:
    payload: dict[str, Any] = {
        "name": "budget-unit",
        "families": ["kan", "liquid"],
        "precisions": ["f32", "bf16"],
        "samples": 6,
        "search": "random",
        "scheduler": "fifo",
        "compare": True,
        "comparison": {"sequential": True, "max_configs": 20, "look_every": 2},
        "grouping": {"group_size": 1},
        "search_space": {
            "kan": {"n_layers": 1, "spline_order": 3},
            "liquid": {"backbone_layers": 1},
        },
    }
    payload.update(overrides)
    return parse_spec(payload)


Difference = Callable[[str, int], float | None]
"""The bf16 - f32 test Sharpe of a family's n-th configuration (by its id)."""


def _index(config_id: str) -> int:
    return int(config_id.rsplit("-c", 1)[1])


def _differences(family: str, n: int) -> float | None:
    if family == "kan":  # equivalent: within a hundredth of 0
        return 0.01 * math.sin(n)
    return -0.6 + 0.05 * math.cos(n)  # liquid: bf16 worse by more than the margin


class Driver:
    """Tune's calls on ``searcher``: ``suggest`` while it hands out trials (at most
    ``concurrent`` running), then ``on_trial_complete`` of the oldest running."""

    def __init__(self, searcher: SweepSearcher, difference: Difference = _differences) -> None:
        self.searcher = searcher
        self.difference = difference
        self.running: list[tuple[str, dict[str, Any]]] = []
        self.count = 0
        self.completed: list[str] = []
        self.finished = False

    def result(self, trial_id: str, config: dict[str, Any]) -> dict[str, Any]:
        def metrics(unit: dict[str, Any]) -> dict[str, Any]:
            config_id = unit["config_id"]
            family = config_id.rsplit("-c", 1)[0]
            base = 0.3 + 0.01 * _index(config_id)
            if unit["precision"] == "f32":
                return {"val_sharpe": base, "test_sharpe": base}
            d = self.difference(family, _index(config_id))
            value = math.nan if d is None else base + d
            return {"val_sharpe": value, "test_sharpe": value}

        if not is_group_trial(config):
            return metrics(config)
        return {
            "val_sharpe": 0.0,
            "trials": {slug: metrics(unit) for _, unit, slug in trials_of(trial_id, config)},
        }

    def fill(self, concurrent: int) -> None:
        while len(self.running) < concurrent:
            trial_id = f"t{self.count:04d}"
            config = self.searcher.suggest(trial_id)
            if config == Searcher.FINISHED:
                self.finished = True
                return
            if config is None:
                return
            assert isinstance(config, dict)
            self.count += 1
            self.running.append((trial_id, config))

    def step(self, concurrent: int = 4) -> bool:
        """Fill, then complete the oldest running trial; False once nothing runs."""
        self.fill(concurrent)
        if not self.running:
            return False
        trial_id, config = self.running.pop(0)
        self.searcher.on_trial_complete(trial_id, self.result(trial_id, config))
        self.completed.append(trial_id)
        return True


def _run(driver: Driver, concurrent: int = 4, steps: int | None = None) -> None:
    done = 0
    while (steps is None or done < steps) and driver.step(concurrent):
        done += 1


def test_budgets_come_from_the_spec() -> None:
    spec = _spec()
    fixed = make_budgets(_spec(comparison={}), ["kan", "liquid"])
    assert all(isinstance(b, FixedBudget) and b.samples == 6 for b in fixed)
    (kan, liquid) = make_budgets(spec, ["kan", "liquid"])
    assert isinstance(kan, SequentialBudget) and isinstance(liquid, SequentialBudget)
    assert kan.plan == sequential_looks(6, 2, 20) and (kan.reference, kan.other) == ("f32", "bf16")
    assert spec.n_trials == 2 * 20 * 2  # the most a sweep may run


def test_a_sequential_sweep_stops_each_family_when_decided() -> None:
    searcher = SweepSearcher(_spec())
    lines: list[str] = []
    searcher.listeners = [lambda event: lines.append(event.line)]
    driver = Driver(searcher)
    _run(driver)
    driver.fill(4)
    assert driver.finished and searcher.complete
    records = searcher.records()
    expected = {
        family: sequential_comparison(
            [_differences(family, i) or 0.0 for i in range(20)],
            sequential_looks(6, 2, 20),
            MARGIN,
            directional_alpha=0.05 / 4,  # two families, two claims each
        ).verdicts
        for family in ("kan", "liquid")
    }
    for family in ("kan", "liquid"):
        looks = [look["decision"] for look in records[family]["looks"]]
        assert looks == expected[family], family
    assert records["kan"]["decision"] == "equivalent" and records["liquid"]["decision"] == "worse"
    # Decided at the first deciding look (10, the first at or past MIN_FIRST_LOOK on
    # looks every 2 from 6): nothing made beyond what was running.
    for family in ("kan", "liquid"):
        assert records[family]["looks"][-1]["configs"] == 10
        assert 10 <= records[family]["configs_made"] <= 12
    assert searcher.planned_trials == sum(r["configs_made"] for r in records.values()) * 2
    assert len(driver.completed) == searcher.planned_trials
    assert sum("look" in line for line in lines) == 6  # 6, 8, 10 per family


def _grouped_spec() -> SweepSpec:
    """Configurations of one shape per family, two trials per group trial, first look 10."""
    return _spec(
        grouping={"group_size": 2},
        search_space={
            "kan": {"n_layers": 1, "spline_order": 3, "width": 4, "window": 2, "grid_size": 5},
            "liquid": {
                "hidden": 16,
                "backbone_units": 16,
                "backbone_layers": 1,
                "mode": "gated",
                "backbone_activation": "tanh",
            },
        },
        comparison={"sequential": True, "max_configs": 20, "look_every": 4},
        samples=10,
    )


def test_group_trials_count_a_configuration_once_all_its_trials_reported() -> None:
    spec = _grouped_spec()
    assert spec.configs_per_ask("kan") == spec.configs_per_ask("liquid") == 2
    searcher = SweepSearcher(spec)
    driver = Driver(searcher)
    driver.fill(2)
    assert all(is_group_trial(config) for _, config in driver.running)
    _run(driver, concurrent=2)
    records = searcher.records()
    assert records["liquid"]["decision"] == "worse" and records["kan"]["decision"] == "equivalent"
    for family in ("kan", "liquid"):
        assert [look["configs"] for look in records[family]["looks"]] == [10]
    # kan decides first; liquid takes its share of the slots (4 in flight), so the one
    # ask it makes in kan's freed slot runs past its own decision, recorded, never read.
    assert (records["kan"]["configs_made"], records["liquid"]["configs_made"]) == (10, 12)
    assert not searcher.queue and searcher.complete


def test_the_plan_sizes_a_group_for_the_configurations_in_flight() -> None:
    """The plan profiles a group share for the largest group the searcher forms: with
    more configurations in flight than the first look's, the first ask is in_flight's."""
    spec = _spec(
        grouping={"group_size": 8},
        search_space=_grouped_spec().search_space,
        samples=2,
        comparison={"sequential": True, "max_configs": 20, "look_every": 1, "in_flight": 4},
    )
    searcher = SweepSearcher(spec)
    formed = []
    while isinstance(config := searcher.suggest(f"t{len(formed)}"), dict):
        formed.append(len(trials_of(f"t{len(formed)}", config)))
    assert formed == [4, 4, 4, 4]  # kan and liquid, f32 and bf16: 4 configurations x 1 seed
    # Once one family decides, the other takes its share: up to 8 at once.
    assert spec.trials_per_group("kan") == spec.trials_per_group("liquid") == 8


class _StopAfterFirst(FixedBudget):
    """A policy that ends its stream at its first outcome (as PBT's would end a trial)."""

    kind = "stop-after-first"

    def on_outcome(self, outcome: Outcome) -> list[PolicyEvent]:
        self.samples = 0
        return [PolicyEvent(self.stream, f"{self.stream}: stopped at {outcome.config_id}", {})]

    @property
    def done(self) -> bool:
        return self.samples == 0 or super().done


def test_a_stream_that_ended_has_its_queued_work_withdrawn() -> None:
    searcher = SweepSearcher(_grouped_spec())
    searcher.budgets[1] = _StopAfterFirst("liquid", 10)
    lines: list[str] = []
    searcher.listeners = [lambda event: lines.append(event.line)]
    driver = Driver(searcher)
    _run(driver, concurrent=2)
    driver.fill(2)
    assert driver.finished and searcher.complete
    liquid = sorted(c for c in searcher.configs if c.startswith("liquid"))
    # Ended after its first configuration's trials reported: what had started finished,
    # the rest of the ten it had queued was withdrawn and never handed to Tune.
    started = {
        unit["config_id"]
        for trial_id, config in [(t, searcher.trial_config[t]) for t in driver.completed]
        for _, unit, _ in trials_of(trial_id, config)
    }
    assert set(liquid) == {c for c in started if c.startswith("liquid")}
    assert 1 <= len(liquid) < 10 and searcher.budgets[1].made_ids == liquid
    assert "liquid: stopped at liquid-c000" in lines
    assert all(not c.startswith("liquid") or c in liquid for c in started)
    assert searcher.planned_trials == 2 * (len(liquid) + searcher.records()["kan"]["configs_made"])


def _resume_at(steps: int, via: str) -> tuple[SweepSearcher, Driver]:
    """Run ``steps`` completions, then restore the searcher into a fresh one (through its
    JSON file or pickle) and hand the running trials over to a driver of the restored."""
    spec = _spec()
    first = SweepSearcher(spec)
    driver = Driver(first)
    _run(driver, steps=steps)
    if via == "pickle":
        restored = pickle.loads(pickle.dumps(first))
    else:
        restored = SweepSearcher(spec)
        restored.set_state(json.loads(json.dumps(first.get_state())))
    resumed = Driver(restored)
    resumed.running, resumed.count = list(driver.running), driver.count
    return restored, resumed


@pytest.mark.parametrize("via", ["json", "pickle"])
@pytest.mark.parametrize("steps", [7, 20, 26])
def test_a_restored_sequential_sweep_repeats_no_look_and_loses_none(steps: int, via: str) -> None:
    uninterrupted = SweepSearcher(_spec())
    _run(Driver(uninterrupted))
    restored, driver = _resume_at(steps, via)
    before = {f: len(r["looks"]) for f, r in restored.records().items()}
    events: list[PolicyEvent] = []
    restored.listeners = [events.append]
    _run(driver)
    driver.fill(4)
    assert driver.finished
    assert restored.records() == uninterrupted.records()
    # Only the looks still to come were announced after the restore, each once.
    announced = [(e.stream, e.look["configs"]) for e in events if e.look]
    expected = [
        (f, look["configs"])
        for f, r in uninterrupted.records().items()
        for look in r["looks"][before[f] :]
    ]
    assert sorted(announced) == sorted(expected) and len(set(announced)) == len(announced)


def test_a_family_stopped_on_a_claim_keeps_it_after_holm_across_families() -> None:
    # hpo compare adjusts every family's two one-sided claims by Holm: a family that
    # stopped on "worse" at the unadjusted alpha, with nothing more to make, could end
    # "inconclusive" for good (two families, bf16 worse by twice the margin: most did).
    # Stops at the Bonferroni share of alpha always pass Holm.
    spec = _spec()
    rng = np.random.default_rng(11)
    stopped = 0
    for _ in range(30):
        budgets = make_budgets(spec, ["kan", "liquid"])
        shifts = {"kan": 0.0, "liquid": -2 * MARGIN}
        for budget in budgets:
            assert isinstance(budget, SequentialBudget)
            assert budget.directional_alpha == pytest.approx(0.05 / 4)
            _feed(budget, (shifts[budget.stream] + rng.normal(0, 0.15, 20)).tolist())
        results = [
            sequential_comparison(
                b.differences[: b.looks[-1].configs],
                b.plan,
                b.margin,
                b.alpha,
                directional_alpha=b.directional_alpha,
            )
            for b in budgets
            if isinstance(b, SequentialBudget)
        ]
        holm = holm_adjust([p for r in results for p in (r.p_worse, r.p_better)])
        liquid = budgets[1]
        if liquid.decision == "worse":
            stopped += 1
            assert holm[2] <= 0.05, (liquid.differences, holm)
    assert stopped >= 20  # the claim is reached, at the stricter level, in most runs


def test_a_trial_restarted_after_its_configuration_was_told_is_not_counted_again() -> None:
    # `hpo resume` restarts errored trials; Tune had already reported the error, so the
    # configuration's outcome (no difference) went to the budget, which made another.
    # The restarted trial's result must not add a second outcome for it.
    searcher = SweepSearcher(_spec())
    driver = Driver(searcher)
    driver.fill(2)  # kan-c000's two trials (f32 and bf16, seed 0)
    (f32_id, f32), (bf16_id, bf16) = driver.running
    assert f32["config_id"] == bf16["config_id"] == "kan-c000"
    searcher.on_trial_complete(f32_id, driver.result(f32_id, f32))
    searcher.on_trial_complete(bf16_id, None, error=True)
    budget = searcher.budgets[0]
    assert isinstance(budget, SequentialBudget)
    assert budget.order == [("kan-c000", None)]
    searcher.on_trial_complete(bf16_id, driver.result(bf16_id, bf16))  # the restart's
    assert budget.order == [("kan-c000", None)] and budget.pending >= 0


def test_looks_after_every_configuration_keep_in_flight_configurations_running() -> None:
    """Looks after every configuration (the default) decide as early as the rule can, and
    ``in_flight`` keeps that many of a family's configurations running between them, so a
    host with many slots is not left with one per family. A configuration that completes
    after the family decided is recorded, never read; none is made past the budget."""
    plan = sequential_looks(9, 1, 12)
    assert plan == (9, 10, 11, 12)
    budget = SequentialBudget("kan", plan, MARGIN, 0.05, "f32", "bf16", in_flight=3)
    assert budget.allowance() == 9  # the first look's configurations at once
    for i in range(9):
        budget.made(f"c{i}")
    assert budget.allowance() == 0  # nine pending
    differences = [0.001 * (-1) ** i for i in range(12)]
    for i in range(8):
        budget.on_outcome(_outcome(f"c{i}", differences[i]))
    # Eight read, one pending: the next look (9) is one away, yet three may run.
    assert budget.allowance() == 2
    budget.made("c9")
    budget.made("c10")
    assert budget.allowance() == 0
    budget.on_outcome(_outcome("c8", differences[8]))  # the first look: equivalent
    assert budget.done and [look["configs"] for look in budget.record()["looks"]] == [9]
    assert budget.allowance() == 0
    budget.on_outcome(_outcome("c10", 5.0))  # in flight at the decision: not read
    assert [look["configs"] for look in budget.record()["looks"]] == [9]
    assert budget.record()["decision"] == "equivalent"
    # Near the budget, in_flight never makes more than the budget.
    near = SequentialBudget("kan", plan, MARGIN, 0.05, "f32", "bf16", in_flight=8)
    for i in range(9):
        near.made(f"c{i}")
    for i in range(8):  # before the first look: nothing decided
        near.on_outcome(_outcome(f"c{i}", differences[i]))
    assert not near.done and near.allowance() == 3  # 12 - 8 read - 1 running, not 8 - 1


def test_a_decided_familys_slots_go_to_the_families_still_deciding() -> None:
    spec = _spec(samples=9, comparison={"sequential": True, "max_configs": 20, "look_every": 1})
    kan, liquid = make_budgets(spec, ["kan", "liquid"])
    assert isinstance(kan, SequentialBudget) and isinstance(liquid, SequentialBudget)
    for budget in (kan, liquid):
        for i in range(9):
            budget.made(f"{budget.stream}-c{i}")
        for i in range(8):
            difference = 0.001 * (-1) ** i if budget is kan else 0.3 * (-1) ** i
            budget.on_outcome(_outcome(f"{budget.stream}-c{i}", difference))
    # Both deciding: two in flight each (one pending, so one more each).
    assert (kan.in_flight_now, liquid.in_flight_now) == (2, 2)
    assert liquid.allowance() == 1
    kan.on_outcome(_outcome("kan-c8", 0.001))  # kan's first look: equivalent
    assert kan.done and kan.allowance() == 0
    # liquid alone: both families' share, 4 in flight (one pending, three more).
    assert liquid.in_flight_now == 4 and liquid.allowance() == 3
    # Where the sweep runs two trials at once (one configuration: f32 and bf16), a slot a
    # decided family leaves is no idle slot: the share stays in_flight.
    bounded = make_budgets(spec.model_copy(update={"max_concurrent": 2}), ["kan", "liquid"])
    assert all(isinstance(b, SequentialBudget) and b.slots == 1 for b in bounded)
    bounded[0].stopped_on = "equivalent"
    assert isinstance(bounded[1], SequentialBudget) and bounded[1].in_flight_now == 2


def test_a_spec_sets_in_flight_and_the_default_keeps_two() -> None:
    from hpo.spec import SweepSpec

    base = {
        "name": "s",
        "families": ["kan"],
        "compare": True,
        "search": "random",
        "samples": 9,
        "comparison": {"sequential": True, "max_configs": 20},
    }
    (default,) = make_budgets(SweepSpec.model_validate(base), ["kan"])
    assert isinstance(default, SequentialBudget) and default.in_flight == 2
    wide = {**base, "comparison": {**base["comparison"], "in_flight": 6}}  # type: ignore[dict-item]
    (budget,) = make_budgets(SweepSpec.model_validate(wide), ["kan"])
    assert isinstance(budget, SequentialBudget) and budget.in_flight == 6
    with pytest.raises(ValueError, match=r"comparison\.in_flight: only for a sequential"):
        SweepSpec.model_validate(
            {**base, "comparison": {"in_flight": 3}, "samples": 4}  # not sequential
        )
