"""Group trials: K trials of one shape trained as one fused model.

    group = TrainerGroup([config.replace(seed=s) for s in (0, 1, 2)])
    group.fit()  # every member's history; member k's checkpoint: group.members[k].save(dir)

A group's members are trials that share every setting that shapes a training step
(family, model settings, precision, data, lookback, batch size, steps, clipping, epochs)
and may differ in :func:`member_settings` (seed, lr, weight decay, the family's own: the
position scale, dropout rates, loss weights, which the step reads per member). Each
member is a whole :class:`~trainables.trainer.Trainer` (its folds, history, evaluation,
checkpoint); one :class:`~trainables.fusion.Fusion` trains all members' folds as one
vmapped model, with lr and weight decay per member in the fused optimizer. A member's
checkpoint is an ordinary trial checkpoint (``hpo train --resume`` continues it alone;
:class:`TrainerGroup` takes the members' checkpoints to continue the group).

Member k ends where its trial alone ends up to float rounding (the tolerance of fused
folds) where training draws no random numbers. Dropout masks and diffusion noise come
from one stream the members share (member 0's seed; a member's own seed sets its initial
weights and minibatch order), drawn per member under vmap: equal in distribution to its
trial alone, not in value. The members split the training time evenly
(``epoch_time_s``: the group's training seconds / K plus the member's own validation),
so costs summed over members are the group's; ``steps_per_s`` is a member's steps over
its share, the rate it trains at as if alone. A bf16 member that falls back to f32 leaves
the group and trains on alone; one that diverges is out; the others stay fused.
Reinforcement-learning families do not group (their environments and replay have no
member dimension). Why and what it costs: docs/precision.md, "Fused members".
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import torch

from models import get_family
from models.base import Family
from trainables.checkpoint import Checkpoint
from trainables.config import TrainConfig
from trainables.fold_run import TrialDiverged
from trainables.fusion import Fusion
from trainables.rng_state import restore_default_rng
from trainables.trainer import Trainer
from trainables.trial_keys import MEMBER_SETTINGS


def member_settings(family: Family) -> frozenset[str]:
    """The settings a group's members may differ in: :data:`MEMBER_SETTINGS` (seed, and lr
    and weight decay, per member in the fused optimizer) and the family's
    ``member_settings`` (the fused step never reads them, as the position scale, or reads
    them per member, as dropout rates and loss weights)."""
    return frozenset(MEMBER_SETTINGS) | family.member_settings


def _shared_settings(config: TrainConfig, family: Family) -> dict[str, Any]:
    """``config``'s settings that a group's members share, model settings one by one
    (``model_config.<name>``, defaults filled in)."""
    values = {
        k: v
        for k, v in config.to_dict().items()
        if k not in MEMBER_SETTINGS and k != "model_config"
    }
    model = dataclasses.asdict(family.make_config(config.model_config))
    values.update(
        {f"model_config.{k}": v for k, v in model.items() if k not in family.member_settings}
    )
    return values


def group_problems(configs: Sequence[TrainConfig]) -> list[str]:
    """Why ``configs`` cannot train as one group (empty when they can)."""
    if not configs:
        return ["a group needs at least one member"]
    family = get_family(configs[0].family)
    problems = []
    if family.kind == "rl":
        problems.append(
            f"{family.name} is a reinforcement-learning family: its environments and replay "
            "have no member dimension, so its trials run ungrouped"
        )
    elif not family.fuses:
        problems.append(f"{family.name} does not fuse (Family.fusable is False)")
    shared = _shared_settings(configs[0], family)
    varying = ", ".join(sorted(member_settings(family)))
    for i, config in enumerate(configs[1:], start=1):
        values = _shared_settings(config, family)
        for key, first in shared.items():
            if values[key] != first:
                problems.append(
                    f"member {i}: {key} = {values[key]!r} differs from member 0's {first!r} "
                    f"(members share every setting but {varying})"
                )
    return problems


class TrainerGroup:
    """The members' trainers and the fusion that trains them (see the module docstring)."""

    def __init__(
        self,
        configs: Sequence[TrainConfig],
        *,
        checkpoints: Sequence[Checkpoint | None] | None = None,
        device: torch.device | None = None,
    ) -> None:
        problems = group_problems(configs)
        if problems:
            raise ValueError(
                "these trials cannot train as one group:\n  - " + "\n  - ".join(problems)
            )
        checkpoints = list(checkpoints) if checkpoints is not None else [None] * len(configs)
        if len(checkpoints) != len(configs):
            raise ValueError(f"{len(checkpoints)} checkpoints for {len(configs)} members")
        self.members = [
            Trainer(config, checkpoint=ckpt, device=device, fuse=False)
            for config, ckpt in zip(configs, checkpoints, strict=True)
        ]
        # The members' shared dropout / noise stream (each Trainer set it on the way; the
        # last one built won): member 0's seed, or as saved with the members' checkpoints
        # (all saved together; the first member that has one).
        saved = next((ckpt for ckpt in checkpoints if ckpt is not None), None)
        if saved is not None:
            restore_default_rng(saved.meta, self.members[0].device)
        else:
            torch.manual_seed(configs[0].seed)
        # Members resumed at their last epoch are done: they stay out of the fusion. A
        # member resumed after it fell back to f32 trains alone, as it did when it fell
        # back (its weights are f32, the others' bf16): its own folds fuse.
        training = [m for m in self.members if m.epoch < m.config.epochs]
        self.fusion = Fusion([m for m in training if not m.fell_back_to_f32])
        for member in self.fusion.trainers:
            member.fusion = self.fusion
        if self.fusion.trainers:
            self.fusion.fuse()
        for member in training:
            if member.fell_back_to_f32:
                member.fusion.fuse()
        self.ended: dict[int, str] = {}  # members out of training early: index -> why
        self.diverged: dict[int, str] = {}  # those that diverged: index -> the reason

    @property
    def epoch(self) -> int:
        """Epochs every member still training has completed."""
        return min(m.epoch for m in self.training or self.members)

    @property
    def training(self) -> list[Trainer]:
        """The members still training: not diverged, not stopped, not done."""
        return [
            m
            for i, m in enumerate(self.members)
            if i not in self.ended and m.epoch < m.config.epochs
        ]

    def stop(self, index: int, reason: str) -> None:
        """Member ``index`` trains no more (a scheduler stopped it); the others fuse again
        without it."""
        member = self.members[index]
        member.fusion.remove(member)
        self.ended[index] = reason

    def fit(self) -> list[list[dict[str, Any]]]:
        """Train every member to its ``epochs`` (or until it diverges); returns each
        member's history."""
        while self.training:
            self.train_epoch()
        return [member.history for member in self.members]

    def train_epoch(self) -> dict[int, dict[str, Any]]:
        """One epoch of every member still training (fused where they still are): each
        member's metrics by its index. A member that diverges is out from then on, with
        its reason in ``diverged`` (and ``ended``); the others go on."""
        training = self.training
        steps_before = {id(m): m.global_step for m in training}
        # The group's fusion, and the own fusion of each member that left it.
        fusions = list({id(m.fusion): m.fusion for m in training}.values())
        sums: dict[Trainer, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        shares: dict[Trainer, tuple[float, float]] = {}
        for fusion in fusions:
            sharing = len(fusion.trainers)  # a member that diverges takes its share along
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                trained = fusion.train_epoch()
            except TrialDiverged as exc:  # a member training alone (it left the group)
                (alone,) = fusion.trainers
                self._diverged(alone, exc)
                continue
            wall = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
            sums.update(trained)
            for trainer in trained:
                shares[trainer] = (wall / sharing, cpu / sharing)
            for trainer, error in fusion.diverged.items():
                self._diverged(trainer, error)
            fusion.diverged.clear()
        metrics = {}
        for index, member in enumerate(self.members):
            if member not in sums:
                continue
            wall, cpu = shares[member]
            # The member's clocks start its share of the training time before now.
            started, cpu_started = time.perf_counter() - wall, time.process_time() - cpu
            try:
                metrics[index] = member.finish_epoch(
                    sums[member], wall, steps_before[id(member)], started, cpu_started
                )
            except TrialDiverged as exc:  # at the epoch's divergence check or validation
                member.fusion.remove(member)
                self._diverged(member, exc)
        return metrics

    def _diverged(self, member: Trainer, exc: TrialDiverged) -> None:
        index = next(i for i, m in enumerate(self.members) if m is member)
        self.diverged[index] = str(exc)
        self.ended[index] = str(exc)
