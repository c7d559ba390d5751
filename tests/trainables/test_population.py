"""Population-based training in a group trial (trainables/population.py, and the group
trial's loop in trainables/trial.py), without Ray:

* exploits happen exactly at interval boundaries (every ``interval_epochs``-th epoch, never
  after the last), the worst trial copying the best, with a record each, and replay from
  the seed;
* the ranking reads the epoch's validation Sharpe, never the test split's, and leaves out
  trials without a finite one;
* a group trial interrupted and resumed from its checkpoint continues its population as if
  never interrupted: the same exploits, none repeated or lost, and the recipients train on
  with their explored settings (not the ones the sweep gave them).
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainables.helpers import group_config
from trainables.group import TrainerGroup
from trainables.pbt import PbtSettings, Range, choose_exploits, explore
from trainables.population import Population

LRS = (1e-4, 3e-3, 1e-3, 3e-4)  # one per trial: their validation Sharpes differ
MUTATIONS = {"lr": Range(1e-5, 1e-1, log=True), "weight_decay": Range(1e-6, 1e-2, log=True)}


def _settings(interval: int, quantile: float = 0.25) -> PbtSettings:
    return PbtSettings(
        interval_epochs=interval, quantile=quantile, resample_probability=0.25, mutations=MUTATIONS
    )


def test_exploits_happen_exactly_at_interval_boundaries_and_replay_from_the_seed() -> None:
    group = TrainerGroup(
        [group_config(seed=s, lr=lr, epochs=5, n_folds=1) for s, lr in enumerate(LRS)]
    )
    population = Population(group, _settings(interval=2), seed="pbt-test")
    replay = random.Random("pbt-test")
    done_at = []
    for epoch in range(1, 6):
        metrics = group.train_epoch()
        scores = [metrics[i]["val_sharpe"] for i in range(4)]
        settings = [group.mutable_settings(i) for i in range(4)]
        records = population.after_epoch(metrics)
        if records:
            done_at.append(epoch)
        if epoch not in (2, 4):  # off a boundary, and never after the last epoch (5)
            assert records == []
            continue
        # 4 trials at quantile 0.25: the worst copies the best (the top quantile is one).
        (record,) = records
        worst = min(range(4), key=lambda i: (scores[i], -i))
        best = max(range(4), key=lambda i: (scores[i], -i))
        assert (record.epoch, record.recipient, record.donor) == (epoch, worst, best)
        assert record.before == settings[worst]
        # The same draws from a generator of the same seed, in the same order.
        assert choose_exploits(scores, replay, 0.25) == [(worst, best)]
        assert record.after == explore(settings[best], MUTATIONS, replay, 0.25)
        assert group.mutable_settings(worst) == record.after  # what its next epoch uses
        assert group.trials[worst].config.lr == record.after["lr"]
    assert done_at == [2, 4]
    assert len(group.exploits) == 2 and all(t.epoch == 5 for t in group.trials)


def test_the_ranking_reads_validation_sharpe_only_and_skips_trials_without_one() -> None:
    group = TrainerGroup([group_config(seed=s, lr=lr, n_folds=1) for s, lr in enumerate(LRS)])
    group.train_epoch()
    # Validation ranks 0 worst and 3 best; the test split says the opposite.
    metrics: dict[int, dict[str, Any]] = {
        i: {"val_sharpe": float(i), "test_sharpe": float(-i)} for i in range(4)
    }
    population = Population(group, _settings(interval=1), seed=0)
    (record,) = population.after_epoch(metrics)
    assert (record.recipient, record.donor) == (0, 3)

    # Trial 0 has no finite validation Sharpe now, 1 is worst: it copies 3.
    metrics[0]["val_sharpe"] = math.nan
    again = TrainerGroup([group_config(seed=s, lr=lr, n_folds=1) for s, lr in enumerate(LRS)])
    again.train_epoch()
    (record,) = Population(again, _settings(interval=1), seed=0).after_epoch(metrics)
    assert (record.recipient, record.donor) == (1, 3)


class _Interrupted(Exception):
    """The process dying after a report (a preemption)."""


def _population_trial(tmp_path: Path) -> Any:
    from tests.hpo.sweep_helpers import tiny_spec
    from trainables.config import GroupTrialConfig, TrialConfig

    spec = tiny_spec(
        tmp_path,
        families=["kan"],
        precisions=["f32"],
        max_epochs=4,
        search_space={"kan": {"width": 4}},
    )
    base = spec.trial_base()
    trials = tuple(
        TrialConfig(
            family="kan",
            precision="f32",
            seed=0,
            params={"width": 4, "lr": lr},
            base=base,
            config_id=f"kan-f32-c00{i}",
            pair_id=f"kan-f32-c00{i}-s0",
        )
        for i, lr in enumerate(LRS)
    )
    return GroupTrialConfig(trials, pbt=_settings(interval=1))


def _run(
    group: Any,
    trial_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    interrupt_after: int | None = None,
    judge: Any = None,
) -> list[dict[str, Any]]:
    """The group trial's loop (trainables.trial._fit_group) with Tune's report and
    checkpoint played by a folder of checkpoint_<n> copies; raises _Interrupted after
    ``interrupt_after`` reports."""
    from ray import tune

    from trainables import trial as trial_module

    reported: list[dict[str, Any]] = []

    def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
        index = len(sorted(trial_dir.glob("checkpoint_*")))
        shutil.copytree(checkpoint.path, trial_dir / f"checkpoint_{index:06d}")
        reported.append(metrics)
        if len(reported) == interrupt_after:
            raise _Interrupted

    def newest() -> Any:
        found = sorted(trial_dir.glob("checkpoint_*"))
        return tune.Checkpoint(str(found[-1])) if found else None

    monkeypatch.setattr(tune, "report", report)
    monkeypatch.setattr(tune, "get_checkpoint", newest)
    with contextlib.suppress(_Interrupted):
        trial_module._fit_group(group, 0.0, judge, {}, {}, {})
    return reported


def test_a_resumed_group_trial_continues_its_population(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _population_trial(tmp_path)
    slugs = group.slugs()
    whole = _run(group, tmp_path / "whole", monkeypatch)
    assert [r["epoch"] for r in whole] == [1, 2, 3, 4]
    final = whole[-1]["trials"]
    lineage = [(e["epoch"], slug, e["donor"]) for slug in slugs for e in final[slug]["pbt_lineage"]]
    # interval 1, 4 epochs: one exploit after each of epochs 1, 2 and 3, none after 4.
    assert sorted(epoch for epoch, _, _ in lineage) == [1, 2, 3]
    assert sum(final[s]["pbt_exploits"] for s in slugs) == 3
    # The settings each epoch trained with are in its entry: a recipient's change the
    # epoch after its exploit, to what the record says.
    for slug in slugs:
        for entry in final[slug]["pbt_lineage"]:
            after = whole[entry["epoch"]]["trials"][slug]  # the next epoch's entry
            assert after["lr"] == entry["after"]["lr"]
            assert whole[entry["epoch"] - 1]["trials"][slug]["lr"] == entry["before"]["lr"]
            assert entry["donor_key"] == f"kan-f32-c00{slugs.index(entry['donor'])}|f32/0"

    # Interrupted after epoch 2's report (its exploit done and checkpointed), resumed.
    before = _run(group, tmp_path / "cut", monkeypatch, interrupt_after=2)
    after = _run(group, tmp_path / "cut", monkeypatch)
    assert [r["epoch"] for r in before + after] == [1, 2, 3, 4]
    resumed = after[-1]["trials"]
    for slug in slugs:
        # No exploit repeated or lost, the same donors and explored settings.
        assert resumed[slug]["pbt_lineage"] == final[slug]["pbt_lineage"]
        # Epochs 3 and 4 trained with the settings of the uninterrupted run (a recipient
        # of epoch 2 keeps its explored lr), to the same result.
        for epoch in (3, 4):
            ours, theirs = after[epoch - 3]["trials"][slug], whole[epoch - 1]["trials"][slug]
            assert ours["lr"] == theirs["lr"] and ours["weight_decay"] == theirs["weight_decay"]
            assert ours["val_sharpe"] == pytest.approx(theirs["val_sharpe"], rel=1e-5, abs=1e-6)


class _StopAtEpoch:
    """The sweep's rungs as a population sees them (``hpo.rungs.RungJudge.keep``):
    every question recorded, and a stop from ``stop_at`` on."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.asked: list[tuple[str, int, float]] = []

    def keep(self, trial: str, result: dict[str, Any]) -> bool:
        self.asked.append((trial, int(result["epoch"]), float(result["val_sharpe"])))
        return int(result["epoch"]) < self.stop_at


def test_asha_across_populations_stops_the_population_before_it_exploits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``pbt.early_stopping = "asha"`` the group trial asks the rungs once per epoch
    as a population (its identity, its best trial's validation Sharpe), not per trial;
    stopped after epoch 2, every trial ends there flagged ``stopped``, and the exploit
    that epoch's boundary would have made is not made (a trial's last checkpoint holds
    weights it trained, not a donor's copy with settings it never trained with). A
    restart from the stopped epoch's checkpoint trains nothing more."""
    from trainables.trial import population_rung_key
    from trainables.trial_keys import trial_key

    group = _population_trial(tmp_path)
    slugs = group.slugs()
    judge = _StopAtEpoch(2)
    reported = _run(group, tmp_path / "run", monkeypatch, judge=judge)
    assert [r["epoch"] for r in reported] == [1, 2]
    identity = population_rung_key(trial_key(group.trials[0].to_dict()))
    assert judge.asked == [
        (identity, epoch, max(r["trials"][s]["val_sharpe"] for s in slugs))
        for epoch, r in zip((1, 2), reported, strict=True)
    ]
    final = reported[-1]["trials"]
    assert all(final[s]["stopped"] == 1 for s in slugs)
    assert all("stopped" not in reported[0]["trials"][s] for s in slugs)
    # One boundary's exploit (after epoch 1), none after the epoch that stopped it.
    assert sorted(e["epoch"] for s in slugs for e in final[s]["pbt_lineage"]) == [1]
    again = _run(group, tmp_path / "run", monkeypatch, judge=judge)
    assert again == [] and len(judge.asked) == 2


def test_an_integer_range_of_a_float_setting_explores_and_exploits(tmp_path: Path) -> None:
    """A spec that searches kan's position_scale (a float setting) as an Int range gives
    the trials integer values; the spec's mutations and the trials' mutable settings come
    from one function (mutable_setting_names), so the boundary's exploit runs."""
    from tests.hpo.sweep_helpers import tiny_spec
    from tests.models.test_contract import TINY

    spec = tiny_spec(
        tmp_path,
        families=["kan"],
        precisions=["f32"],
        max_epochs=2,
        search_space={"kan": {"position_scale": {"low": 1, "high": 8}}},
    )
    mutations = spec.pbt_mutations("kan")
    assert "position_scale" in mutations
    settings = PbtSettings(
        interval_epochs=1, quantile=0.25, resample_probability=0.25, mutations=mutations
    )
    group = TrainerGroup(
        [
            group_config(
                seed=s, lr=lr, n_folds=1, model_config={**TINY["kan"], "position_scale": 1 + 2 * s}
            )
            for s, lr in enumerate(LRS[:2])
        ]
    )
    metrics = group.train_epoch()
    (record,) = Population(group, settings, seed=0).after_epoch(metrics)
    assert group.mutable_settings(1 - record.recipient)["position_scale"] in (1.0, 3.0)
    assert isinstance(record.after["position_scale"], float)
    assert group.trials[record.recipient].model_config.position_scale == pytest.approx(
        record.after["position_scale"]
    )


def test_a_population_that_does_not_fit_a_whole_gpu_says_how_to_make_it_fit() -> None:
    from trainables.trial import population_oom_verdict

    retry = {"oom_retry_gpu_fraction": 0.4, "failure_reason": "retrying at 0.4"}
    assert population_oom_verdict(retry, 4) == retry
    split = {"oom_split": 1, "oom_retry_gpu_fraction": 0.5, "failure_reason": "split in two"}
    reason = population_oom_verdict(split, 4)["failure_reason"]
    assert "population of 4 trials" in reason and "not split" in reason
    assert "pbt.population_size x seeds" in reason and "[resources]" in reason
    assert "smaller grouping.group_size (the population then spans group trials)" in reason


def test_the_reported_lr_is_the_one_the_optimizer_trained_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each epoch's ``lr`` is read from the trial's optimizer (its fused slots' lr), not
    from its config: were an exploit's restored optimizer state to win over the explored
    lr (ray-project/ray#62173), played here by putting the donor's lr back into the
    recipient's slots, the lineage shows the lr that trained, the donor's."""
    from trainables.group import ExploitRecord

    original = TrainerGroup.exploit_all

    def restored_lr_wins(self: TrainerGroup, exploits: Any) -> list[ExploitRecord]:
        records = original(self, exploits)
        fused = self.fusion.fused
        assert fused is not None
        owners = [t for t in self.fusion.trainers for _ in t.folds]
        lrs = {id(t): t.config.lr for t in owners}
        for record in records:
            lrs[id(self.trials[record.recipient])] = self.trials[record.donor].config.lr
        fused.optimizer.param_groups[0]["lr"] = [lrs[id(t)] for t in owners]
        return records

    group = _population_trial(tmp_path)
    slugs = group.slugs()
    monkeypatch.setattr(TrainerGroup, "exploit_all", restored_lr_wins)
    reported = _run(group, tmp_path / "defect", monkeypatch)
    lineage = [(slug, e) for slug in slugs for e in reported[-1]["trials"][slug]["pbt_lineage"]]
    assert lineage
    for slug, entry in lineage:
        donor_lr = reported[entry["epoch"] - 1]["trials"][entry["donor"]]["lr"]
        trained = reported[entry["epoch"]]["trials"][slug]["lr"]
        assert trained == donor_lr != entry["after"]["lr"]


def _left_out_scored_worst_or_best(
    group: TrainerGroup, metrics: dict[int, Any], index: int
) -> None:
    """Trial ``index``, scored worst and then best, is in no exploit of the population's
    boundary and keeps its weights."""
    from tests.trainables.helpers import trial_weights

    own = trial_weights(group.trials[index]).clone()
    population = Population(group, _settings(interval=1), seed=0)
    for score in (-10.0, 10.0):
        scored = {**metrics, index: {"val_sharpe": score}}
        (record,) = population.after_epoch(scored)
        assert index not in (record.recipient, record.donor)
    assert torch.equal(trial_weights(group.trials[index]), own)


def test_a_trial_that_fell_back_to_f32_neither_copies_nor_is_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trial 1 of a bf16 group falls back to f32 in the first epoch (NaN losses for four
    steps, fallback_after 3): it trains on outside the group's fusion, so the population
    leaves it out of every exploit, scored worst or best, and its weights stay its own."""
    from tests.trainables.helpers import poison_slots

    configs = [
        group_config(policy="bf16", seed=s, lr=lr, fallback_after=3, log_every=3)
        for s, lr in enumerate(LRS)
    ]
    poison_slots(monkeypatch, 8, slice(2, 4), range(2, 6))  # trial 1's two folds
    group = TrainerGroup(configs)
    metrics = group.train_epoch()
    monkeypatch.undo()
    assert [metrics[i]["fell_back_to_f32"] for i in range(4)] == [0, 1, 0, 0]
    assert 1 not in group.diverged and not group.can_exploit(1)
    _left_out_scored_worst_or_best(group, metrics, 1)


def test_a_diverged_trial_neither_copies_nor_is_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial 0 diverges in the first epoch of a real group: scored best or worst, the
    population leaves it out of the ranking (its weights stay as they were)."""
    from tests.trainables.helpers import poison_slots

    configs = [
        group_config(seed=s, lr=lr, fallback_after=3, log_every=3) for s, lr in enumerate(LRS)
    ]
    poison_slots(monkeypatch, 8, slice(0, 2), range(1, 5))  # trial 0's two folds
    group = TrainerGroup(configs)
    metrics = group.train_epoch()
    monkeypatch.undo()
    assert 0 in group.diverged and not group.can_exploit(0)
    _left_out_scored_worst_or_best(group, metrics, 0)
