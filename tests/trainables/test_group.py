"""Group trials (trainables/group.py): K trials of one shape trained as one fused model,
each trial exactly the trial it would be alone, up to float rounding.

* trials that differ in seed, lr and weight decay each end where their own ungrouped
  trial ends (weights, step counts, validation Sharpe);
* settings a step reads must match, and the error names the trial and the setting;
  reinforcement-learning families do not group;
* a bf16 trial that falls back to f32 leaves the group and trains on alone; one that
  diverges, or that a scheduler stops, is out; the others stay fused and unaffected;
* a trial's checkpoint is an ordinary trial checkpoint, and a group resumes from its
  trials' checkpoints.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from models import family_names, get_family
from models.base import Batch, Choice
from tests.models.test_contract import TINY
from tests.trainables.helpers import (
    group_config,
    poison_slots,
    relative_difference,
    tiny_config,
    trial_weights,
)
from trainables.checkpoint import load_checkpoint
from trainables.config import TrainConfig
from trainables.fold_run import TrialDiverged
from trainables.group import TrainerGroup, group_problems
from trainables.precision import F32
from trainables.stacked import StackedModules
from trainables.trainer import Trainer

TRIALS = [
    {"seed": 0},
    {"seed": 1},
    {"seed": 2, "lr": 3e-3},
    {"seed": 3, "weight_decay": 0.05},
]


@pytest.mark.parametrize("family", ["kan", "liquid"])
def test_each_trial_trains_as_its_own_trial_alone(family: str) -> None:
    configs = [group_config(family, **trial) for trial in TRIALS]
    group = TrainerGroup(configs)
    assert group.fusion.fused is not None and group.fusion.fused.k == 8  # 4 trials x 2 folds
    histories = group.fit()
    for config, trial, history in zip(configs, group.trials, histories, strict=True):
        alone = Trainer(config.replace(fuse="off"))
        alone_history = alone.fit()
        assert trial.global_step == alone.global_step == 24  # 2 folds x 6 steps x 2 epochs
        assert relative_difference(trial_weights(alone), trial_weights(trial)) < 1e-5, config.seed
        assert [h["fused_folds"] for h in history] == [8, 8]
        for fold in range(2):
            key = f"val_sharpe_fold{fold}"
            assert history[-1][key] == pytest.approx(alone_history[-1][key], abs=0.01)
    # Different lr and weight decay reached the fused optimizer per slot (trial-major).
    group_lr = group.fusion.fused.optimizer.param_groups[0]["lr"]
    assert group_lr == [1e-3, 1e-3, 1e-3, 1e-3, 3e-3, 3e-3, 1e-3, 1e-3]


FORECAST = [name for name in family_names() if get_family(name).fuses]


@pytest.mark.parametrize("family", FORECAST)
def test_trials_that_differ_in_per_trial_settings_train_as_they_would_alone(family: str) -> None:
    """Family.per_trial_settings: two trials that differ in every one of them (at their
    search range's ends) train fused to the weights each reaches alone, and each keeps its
    own values to evaluate with. Settings the step never reads stay out of it; the ones it
    reads (KAN's regularization weights, tggn's beta, the diffusion's schedule) reach it
    per trial. No dropout: its masks are drawn per trial from the group's stream (the
    next test). The diffusion draws its noise the same way, so trial k is compared with
    trial k of a group whose trials both have trial k's settings."""
    spec = get_family(family)
    assert spec.per_trial_settings, f"{family}: a forecast family's positions take a scale"
    ends: list[dict[str, Any]] = [{}, {}]
    for name in spec.per_trial_settings - _dropout_settings(family):
        dim = spec.search_space[name]
        if isinstance(dim, Choice):
            ends[0][name], ends[1][name] = dim.options[0], dim.options[-1]
        else:
            ends[0][name], ends[1][name] = dim.low, dim.high  # type: ignore[attr-defined]
    if family == "mamba2":  # dt_min < dt_max whatever the ends
        ends[1]["dt_min"], ends[0]["dt_max"] = 5e-3, 0.2
    no_dropout = {name: 0.0 for name in spec.config_fields() if name.endswith("dropout")}

    def configs_of(values: list[dict[str, Any]]) -> list[TrainConfig]:
        return [
            group_config(family, seed=i, epochs=1, n_folds=1, max_steps_per_epoch=3, fuse="on",
                    model_config={**TINY[family], **no_dropout, **v})
            for i, v in enumerate(values)
        ]  # fmt: skip

    configs = configs_of(ends)
    assert group_problems(configs) == []
    group = TrainerGroup(configs)
    assert group.fusion.fused is not None and group.fusion.fused.k == 2
    group.fit()
    if family == "diffusion":
        references = []
        for k in range(2):
            alike = TrainerGroup(configs_of([ends[k], ends[k]]))
            alike.fit()
            references.append(alike.trials[k])
    else:
        references = [Trainer(config.replace(fuse="off")) for config in configs]
        for alone in references:
            alone.fit()
    for config, trial, reference in zip(configs, group.trials, references, strict=True):
        assert relative_difference(trial_weights(reference), trial_weights(trial)) < 1e-4, (
            config.model_config
        )
        assert trial.model_config == Trainer(config).model_config  # its own, to evaluate with
        assert trial.history[-1]["val_sharpe"] == pytest.approx(
            reference.history[-1]["val_sharpe"], abs=0.01
        )
    assert group.trials[1].model_config.position_scale == ends[1]["position_scale"]


def _dropout_settings(family: str) -> set[str]:
    return {name for name in get_family(family).per_trial_settings if name.endswith("dropout")}


@pytest.mark.parametrize("family", [f for f in FORECAST if _dropout_settings(f)])
def test_trials_that_differ_in_dropout_each_drop_at_their_own_rate(family: str) -> None:
    """Trial 0 drops at its range's top rate, trial 1 at none: trial 1 trains to the
    weights it reaches alone without dropout (its own rate reached the fused step, not
    trial 0's), and trial 0 does not (its rate did)."""
    (name,) = _dropout_settings(family)
    top = get_family(family).search_space[name].high  # type: ignore[attr-defined]
    configs = [
        group_config(family, seed=i, epochs=1, n_folds=1, max_steps_per_epoch=3, fuse="on",
                model_config={**TINY[family], name: rate})
        for i, rate in enumerate((top, 0.0))
    ]  # fmt: skip
    assert group_problems(configs) == []
    group = TrainerGroup(configs)
    assert group.fusion.fused is not None and group.fusion.fused.k == 2
    fused = group.fusion.fused.model
    rates = {n for n in fused.buffer_names if n.endswith(".rate")}
    assert rates - fused.shared_settings, "the rates go into the step per slot"
    group.fit()
    without = [
        Trainer(c.replace(fuse="off", model_config={**TINY[family], name: 0.0})) for c in configs
    ]
    for alone in without:
        alone.fit()
    assert relative_difference(trial_weights(without[1]), trial_weights(group.trials[1])) < 1e-4
    assert relative_difference(trial_weights(without[0]), trial_weights(group.trials[0])) > 1e-3
    assert getattr(group.trials[0].model_config, name) == top


def test_trials_split_the_groups_training_time() -> None:
    """Each trial's epoch_time_s is a third of the fused training plus its own
    validation, so the trials' times add up to the group's epoch, not three times it."""
    group = TrainerGroup([group_config(seed=s, epochs=1) for s in range(3)])
    started = time.perf_counter()
    metrics = group.train_epoch()
    wall = time.perf_counter() - started
    times = [m["epoch_time_s"] for m in metrics.values()]
    assert len(times) == 3 and all(t > 0 for t in times)
    assert sum(times) <= wall * 1.02


KAN_VARYING = (
    "grid_eps, grid_update_epochs, lr, position_scale, reg_entropy, reg_lambda, seed, weight_decay"
)


def test_settings_a_step_reads_must_match_and_rl_does_not_group() -> None:
    base = group_config()
    problems = group_problems([base, base.replace(seed=1, batch_size=16)])
    assert problems == [
        "trial 1: batch_size = 16 differs from trial 0's 32 (a group's trials share every setting "
        f"but {KAN_VARYING})"
    ]
    other_width = base.replace(model_config={**TINY["kan"], "width": 7})
    assert group_problems([base, other_width]) == [
        "trial 1: model_config.width = 7 differs from trial 0's 8 (a group's trials share every "
        f"setting but {KAN_VARYING})"
    ]
    scaled = base.replace(seed=1, model_config={**TINY["kan"], "position_scale": 16.0})
    assert group_problems([base, scaled]) == []  # the fused step never reads it
    with pytest.raises(ValueError, match="trial 1: precision = 'bf16' differs"):
        TrainerGroup([base, base.replace(precision="bf16")])
    dqn = tiny_config("dqn")
    assert group_problems([dqn, dqn.replace(seed=1)])[0].startswith(
        "dqn is a reinforcement-learning family"
    )


def test_a_bf16_trial_that_falls_back_leaves_the_group_and_the_others_stay_fused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trial 1's losses are NaN for its first steps: its streak reaches fallback_after,
    it falls back to f32 and trains on alone; trials 0 and 2 stay fused and end where
    they would without trial 1 (a group of two)."""
    configs = [group_config("kan", "bf16", seed=s, fallback_after=3, log_every=3) for s in range(3)]
    original = StackedModules.loss
    calls = []

    def poisoned(self: StackedModules, batch: Batch, slots: Any = None) -> torch.Tensor:
        value = original(self, batch, slots)
        if self.k == 6:  # the group of three (2 folds each): poison trial 1's folds
            calls.append(1)
            if 2 <= len(calls) <= 5:
                mask = torch.ones_like(value)
                mask[2:4] = float("nan")
                return value * mask
        return value

    monkeypatch.setattr(StackedModules, "loss", poisoned)
    group = TrainerGroup(configs)
    first = group.fusion.fused
    metrics = group.train_epoch()
    fallen = group.trials[1]
    assert [metrics[i]["fell_back_to_f32"] for i in range(3)] == [0, 1, 0]
    assert fallen.fusion is not group.fusion and group.fusion.trainers == [
        group.trials[0],
        group.trials[2],
    ]
    assert group.fusion.fused is not None and group.fusion.fused is not first
    assert group.fusion.fused.k == 4
    assert {p.dtype for run in fallen.folds for p in run.model.parameters()} == {F32}
    group.train_epoch()  # the fallen trial fuses its own folds, in f32
    assert fallen.fused is not None and fallen.fused.k == 2
    assert all(m.epoch == 2 for m in group.trials)

    monkeypatch.setattr(StackedModules, "loss", original)
    pair = TrainerGroup([configs[0], configs[2]])
    pair.fit()
    for grouped, paired in zip((group.trials[0], group.trials[2]), pair.trials, strict=True):
        assert (
            relative_difference(trial_weights(paired), trial_weights(grouped)) < 1e-2
        )  # a few bf16 ulps
        assert grouped.global_step == paired.global_step


def test_a_diverged_trial_is_out_and_the_others_train_as_a_group_without_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """f32 has no fallback: trial 0's NaN steps reach fallback_after, it diverges with
    the trainer's reason, and trials 1 and 2 end as a group of the two would."""
    configs = [group_config(seed=s, fallback_after=3, log_every=3) for s in range(3)]
    poison_slots(monkeypatch, 6, slice(0, 2), range(1, 5))
    group = TrainerGroup(configs)
    group.fit()
    assert list(group.diverged) == [0]
    assert group.diverged[0].startswith("kan diverged under f32: 3 consecutive non-finite steps")
    assert group.trials[0].epoch == 0 and group.trials[0].history == []
    assert group.fusion.trainers == group.trials[1:] and group.fusion.fused is not None
    monkeypatch.undo()
    pair = TrainerGroup(configs[1:])
    pair.fit()
    for grouped, paired in zip(group.trials[1:], pair.trials, strict=True):
        assert relative_difference(trial_weights(paired), trial_weights(grouped)) < 1e-5
        assert grouped.history[-1]["val_sharpe"] == pytest.approx(
            paired.history[-1]["val_sharpe"], abs=0.01
        )


def test_a_trial_that_diverges_after_another_validated_leaves_a_group_that_fuses_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Trial 1 diverges at its epoch's divergence check, after trial 0 validated (its
    modules in eval mode) and before trial 2 did (still in training mode): the two fuse
    again without it (a stack of modules in mixed modes used to fail to fuse, ending the
    whole group) and train on."""
    # log_every past the epoch's steps: the streak is read at the epoch's end only.
    configs = [group_config(seed=s, fallback_after=3, log_every=50) for s in range(3)]
    poison_slots(monkeypatch, 6, slice(2, 4), range(1, 5))
    group = TrainerGroup(configs)
    metrics = group.train_epoch()
    assert sorted(metrics) == [0, 2] and list(group.diverged) == [1]
    assert group.fusion.trainers == [group.trials[0], group.trials[2]]
    assert group.fusion.fused is not None and group.fusion.fused.k == 4
    group.fit()
    assert [t.epoch for t in group.trials] == [2, 0, 2]


def test_a_stopped_trial_leaves_the_fused_step_and_keeps_its_weights() -> None:
    group = TrainerGroup([group_config(seed=s, epochs=3) for s in range(3)])
    group.train_epoch()
    stopped = trial_weights(group.trials[1]).clone()
    group.stop(1, "asha: below the rung's cut")
    assert group.fusion.fused is not None and group.fusion.fused.k == 4
    group.fit()
    assert [m.epoch for m in group.trials] == [3, 1, 3]
    assert torch.equal(trial_weights(group.trials[1]), stopped)
    assert group.ended == {1: "asha: below the rung's cut"} and group.diverged == {}


def test_a_trials_checkpoint_resumes_alone_and_the_group_resumes_from_them(
    tmp_path: Path,
) -> None:
    configs = [group_config(seed=s, lr=lr) for s, lr in ((0, 1e-3), (1, 2e-3))]
    group = TrainerGroup(configs)
    group.train_epoch()
    paths = [m.save(tmp_path / f"trial{i}") for i, m in enumerate(group.trials)]
    group.train_epoch()
    # Trial 1 continued alone from its checkpoint ends where it ended in the group.
    alone = Trainer(configs[1].replace(fuse="off"), checkpoint=load_checkpoint(paths[1]))
    assert alone.epoch == 1 and alone.folds[0].optimizer.param_groups[0]["lr"] == 2e-3
    alone.fit()
    assert relative_difference(trial_weights(alone), trial_weights(group.trials[1])) < 1e-5
    # The group resumed from both checkpoints ends where the uninterrupted group did.
    resumed = TrainerGroup(configs, checkpoints=[load_checkpoint(p) for p in paths])
    assert resumed.fusion.fused is not None and resumed.epoch == 1
    resumed.fit()
    for a, b in zip(group.trials, resumed.trials, strict=True):
        assert torch.equal(trial_weights(a), trial_weights(b))
        assert a.history[-1]["val_sharpe"] == b.history[-1]["val_sharpe"]


def test_a_trial_resumed_at_its_last_epoch_trains_no_further(tmp_path: Path) -> None:
    configs = [group_config(seed=s) for s in range(2)]
    group = TrainerGroup(configs)
    group.train_epoch()
    behind = group.trials[1].save(tmp_path / "behind")
    group.train_epoch()
    done = group.trials[0].save(tmp_path / "done")
    finished = trial_weights(group.trials[0]).clone()
    resumed = TrainerGroup(configs, checkpoints=[load_checkpoint(done), load_checkpoint(behind)])
    assert resumed.fusion.trainers == [resumed.trials[1]]
    resumed.fit()
    assert [m.epoch for m in resumed.trials] == [2, 2]
    assert len(resumed.trials[0].history) == 2 and torch.equal(
        trial_weights(resumed.trials[0]), finished
    )


def test_a_fused_trial_alone_still_raises_its_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a group nothing goes on without the diverged fold: the trial fails."""
    poison_slots(monkeypatch, 2, slice(0, 1), range(1, 9))
    trainer = Trainer(group_config(fallback_after=3, log_every=2))
    assert trainer.fused is not None and trainer.fused.k == 2
    with pytest.raises(TrialDiverged, match="kan diverged under f32: 3 consecutive"):
        trainer.train_epoch()


def test_a_group_resumed_after_a_fallback_keeps_the_fallen_trial_out_of_its_fusion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Checkpoints taken after trial 1 fell back to f32 (a Tune retry, ``hpo resume``):
    the resumed trial 1 is f32 again and trains alone, the bf16 trials fuse without it,
    and all three end where the group that never stopped ends."""
    configs = [
        group_config("kan", "bf16", seed=s, fallback_after=3, log_every=3, epochs=2)
        for s in range(3)
    ]
    poison_slots(monkeypatch, k=6, rows=slice(2, 4), steps=range(2, 6))
    group = TrainerGroup(configs)
    group.train_epoch()
    assert group.trials[1].fell_back_to_f32
    for i, trial in enumerate(group.trials):
        trial.save(tmp_path / f"m{i}")
    checkpoints = [load_checkpoint(tmp_path / f"m{i}") for i in range(3)]
    group.train_epoch()

    resumed = TrainerGroup(configs, checkpoints=checkpoints)
    fallen = resumed.trials[1]
    assert fallen.fell_back_to_f32 and fallen.policy.name == "f32"
    assert fallen.fusion is not resumed.fusion
    assert resumed.fusion.trainers == [resumed.trials[0], resumed.trials[2]]
    assert {p.dtype for run in fallen.folds for p in run.model.parameters()} == {F32}
    metrics = resumed.train_epoch()
    assert [metrics[i]["epoch"] for i in range(3)] == [2, 2, 2]
    assert metrics[1]["fell_back_to_f32"] == 1
    for before, after in zip(group.trials, resumed.trials, strict=True):
        assert (
            relative_difference(trial_weights(before), trial_weights(after)) < 1e-2
        )  # a few bf16 ulps
