"""Group trials: K trials of one shape trained as one fused model.

    group = TrainerGroup([config.replace(seed=s) for s in (0, 1, 2)])
    group.fit()  # every trial's history; trial k's checkpoint: group.trials[k].save(dir)

A group trial's trials share every setting that shapes a training step (family, model
settings, precision, data, lookback, batch size, steps, clipping, epochs) and may differ
in :func:`per_trial_settings` (seed, lr, weight decay, the family's own: the position
scale, dropout rates, loss weights, which the step reads per slot). Each trial is a whole
:class:`~trainables.trainer.Trainer` (its folds, history, evaluation, checkpoint); one
:class:`~trainables.fusion.Fusion` trains all their folds as one vmapped model, one fold
per slot, with lr and weight decay per slot in the fused optimizer. A trial's checkpoint
is an ordinary trial checkpoint (``hpo train --resume`` continues it alone;
:class:`TrainerGroup` takes the trials' checkpoints to continue the group).

Trial k ends where it ends alone up to float rounding (the tolerance of fused folds)
where training draws no random numbers. Dropout masks and diffusion noise come from one
stream the trials share (trial 0's seed; a trial's own seed sets its initial weights and
minibatch order), drawn per slot under vmap: equal in distribution to the trial alone,
not in value. The trials split the training time evenly (``epoch_time_s``: the group's
training seconds / K plus the trial's own validation), so costs summed over the trials
are the group's; ``steps_per_s`` is a trial's steps over its share, the rate it trains at
as if alone. A bf16 trial that falls back to f32 leaves the group and trains on alone;
one that diverges is out; the others stay fused. Reinforcement-learning families do not
group (their environments and replay have no slot dimension). Why and what it costs:
docs/precision.md, "Fused slots".

Population-based training's exploit is a copy between trials of a group, in memory: in a
fused group, of the donor's slots into the recipient's within the fused tensors
(:meth:`TrainerGroup.exploit`; which trials and what settings: :mod:`trainables.pbt`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from models import get_family
from models.base import Family
from trainables.checkpoint import Checkpoint
from trainables.config import TrainConfig
from trainables.fold_run import TrialDiverged
from trainables.fusion import Fusion
from trainables.pbt import mutable_setting_names
from trainables.rng_state import restore_default_rng
from trainables.trainer import Trainer
from trainables.trial_keys import PER_TRIAL_SETTINGS, per_trial_settings


def _shared_settings(config: TrainConfig, family: Family) -> dict[str, Any]:
    """``config``'s settings that a group trial's trials share, model settings one by one
    (``model_config.<name>``, defaults filled in)."""
    values = {
        k: v
        for k, v in config.to_dict().items()
        if k not in PER_TRIAL_SETTINGS and k != "model_config"
    }
    model = dataclasses.asdict(family.make_config(config.model_config))
    values.update(
        {f"model_config.{k}": v for k, v in model.items() if k not in family.per_trial_settings}
    )
    return values


def group_problems(configs: Sequence[TrainConfig]) -> list[str]:
    """Why ``configs`` cannot train as one group (empty when they can)."""
    if not configs:
        return ["a group needs at least one trial"]
    family = get_family(configs[0].family)
    problems = []
    if family.kind == "rl":
        problems.append(
            f"{family.name} is a reinforcement-learning family: its environments and replay "
            "have no slot dimension, so its trials run ungrouped"
        )
    elif not family.fuses:
        problems.append(f"{family.name} does not fuse (Family.fusable is False)")
    shared = _shared_settings(configs[0], family)
    varying = ", ".join(sorted(per_trial_settings(family)))
    for i, config in enumerate(configs[1:], start=1):
        values = _shared_settings(config, family)
        for key, first in shared.items():
            if values[key] != first:
                problems.append(
                    f"trial {i}: {key} = {values[key]!r} differs from trial 0's {first!r} "
                    f"(a group's trials share every setting but {varying})"
                )
    return problems


@dataclass(frozen=True)
class ExploitRecord:
    """One exploit: at ``epoch`` (epochs both trials had completed) trial ``recipient``
    took trial ``donor``'s training state, and its mutable settings went from ``before``
    to ``after`` (the lineage of a trial)."""

    epoch: int
    recipient: int
    donor: int
    before: dict[str, float]
    after: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class TrainerGroup:
    """The trials' trainers and the fusion that trains them (see the module docstring)."""

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
            raise ValueError(f"{len(checkpoints)} checkpoints for {len(configs)} trials")
        self.trials = [
            Trainer(config, checkpoint=ckpt, device=device, fuse=False)
            for config, ckpt in zip(configs, checkpoints, strict=True)
        ]
        # The trials' shared dropout / noise stream (each Trainer set it on the way; the
        # last one built won): trial 0's seed, or as saved with the trials' checkpoints
        # (all saved together; the first trial that has one).
        saved = next((ckpt for ckpt in checkpoints if ckpt is not None), None)
        if saved is not None:
            restore_default_rng(saved.meta, self.trials[0].device)
        else:
            torch.manual_seed(configs[0].seed)
        # Trials resumed at their last epoch are done: they stay out of the fusion. A
        # trial resumed after it fell back to f32 trains alone, as it did when it fell
        # back (its weights are f32, the others' bf16): its own folds fuse.
        training = [t for t in self.trials if t.epoch < t.config.epochs]
        self.fusion = Fusion([t for t in training if not t.fell_back_to_f32])
        for trial in self.fusion.trainers:
            trial.fusion = self.fusion
        if self.fusion.trainers:
            self.fusion.fuse()
        for trial in training:
            if trial.fell_back_to_f32:
                trial.fusion.fuse()
        self.ended: dict[int, str] = {}  # trials out of training early: index -> why
        self.diverged: dict[int, str] = {}  # those that diverged: index -> the reason
        self.exploits: list[ExploitRecord] = []  # in the order they were done

    @property
    def epoch(self) -> int:
        """Epochs every trial still training has completed."""
        return min(t.epoch for t in self.training or self.trials)

    @property
    def training(self) -> list[Trainer]:
        """The trials still training: not diverged, not stopped, not done."""
        return [
            t
            for i, t in enumerate(self.trials)
            if i not in self.ended and t.epoch < t.config.epochs
        ]

    def stop(self, index: int, reason: str) -> None:
        """Trial ``index`` trains no more (a scheduler stopped it); the others fuse again
        without it."""
        trial = self.trials[index]
        trial.fusion.remove(trial)
        self.ended[index] = reason

    def stop_all(self, reason: str) -> list[int]:
        """Every trial still training trains no more (a population stopped at a rung):
        unlike :meth:`stop` one by one, nothing fuses again, as nothing is left to train.
        Returns their indices."""
        training = self.training
        stopped = [i for i, t in enumerate(self.trials) if t in training]
        for index in stopped:
            self.ended[index] = reason
        return stopped

    def fit(self) -> list[list[dict[str, Any]]]:
        """Train every trial to its ``epochs`` (or until it diverges); returns each
        trial's history."""
        while self.training:
            self.train_epoch()
        return [trial.history for trial in self.trials]

    def train_epoch(self) -> dict[int, dict[str, Any]]:
        """One epoch of every trial still training (fused where they still are): each
        trial's metrics by its index. A trial that diverges is out from then on, with
        its reason in ``diverged`` (and ``ended``); the others go on."""
        training = self.training
        steps_before = {id(t): t.global_step for t in training}
        # The group's fusion, and the own fusion of each trial that left it.
        fusions = list({id(t.fusion): t.fusion for t in training}.values())
        sums: dict[Trainer, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        shares: dict[Trainer, tuple[float, float]] = {}
        for fusion in fusions:
            sharing = len(fusion.trainers)  # a trial that diverges takes its share along
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                trained = fusion.train_epoch()
            except TrialDiverged as exc:  # a trial training alone (it left the group)
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
        for index, trial in enumerate(self.trials):
            if trial not in sums:
                continue
            wall, cpu = shares[trial]
            # The trial's clocks start its share of the training time before now.
            started, cpu_started = time.perf_counter() - wall, time.process_time() - cpu
            try:
                metrics[index] = trial.finish_epoch(
                    sums[trial], wall, steps_before[id(trial)], started, cpu_started
                )
            except TrialDiverged as exc:  # at the epoch's divergence check or validation
                trial.fusion.remove(trial)
                self._diverged(trial, exc)
        return metrics

    # ------------------------------------------------------------------------------------
    # population-based training

    def mutable_settings(self, index: int) -> dict[str, float]:
        """Trial ``index``'s :func:`mutable_settings`."""
        return mutable_settings(self.trials[index])

    def trained_settings(self, index: int) -> dict[str, float]:
        """Trial ``index``'s :func:`trained_settings`."""
        return trained_settings(self.trials[index])

    def exploit(self, recipient: int, donor: int, settings: Mapping[str, float]) -> ExploitRecord:
        """Trial ``recipient`` takes trial ``donor``'s training state and ``settings``:
        one exploit of :meth:`exploit_all`, whose docstring says what moves and what is
        refused."""
        (record,) = self.exploit_all([(recipient, donor, settings)])
        return record

    def exploit_all(
        self, exploits: Sequence[tuple[int, int, Mapping[str, float]]]
    ) -> list[ExploitRecord]:
        """One interval boundary's exploits, in order: in each ``(recipient, donor,
        settings)`` trial ``recipient`` takes trial ``donor``'s training state and
        ``settings`` (every one of :meth:`mutable_settings`, as
        :func:`trainables.pbt.explore` returns them), in memory, between epochs. Returns
        their records (also appended to ``exploits``).

        Every fold's weights and buffers, optimizer moments and step counts, bf16 Kahan
        compensation, guard and loss scale become copies of the donor's
        (:meth:`Trainer.take_training_state`); then the new lr and weight decay are what
        the fused optimizer takes for the recipient's slots at its next step, and the
        new model settings what its modules read (each recipient fold's module is built
        afresh for them and loaded with the donor's state). The recipient keeps its
        identity: its seed, minibatch order, epoch, step count and history (which goes
        on from here).

        Which path runs: where the group trains fused (``fusion.fused``) and every
        recipient fold's new module fits the fused stack (same parameters, shapes and
        dtypes: always, for settings that only change values), the copies are made
        within the fused tensors, the donor's slots into the recipient's, one per fold
        (:meth:`FusedFolds.copy_slot`): nothing is unfused or fused again, nothing is
        written, the other trials' slots are not touched, and no step is tried unless a
        model setting every slot held at one value no longer is (the next step then takes
        a per-slot path this stack has not run: :meth:`Fusion.retry_fused_step`, which
        unfuses the group where it fails, as a fuse would). Otherwise
        (the group's trials step one after another, or a new module would not fit) the
        group unfuses once around all the copies and fuses again (a fused step is tried),
        the path a fallback takes: the other trials' state moves out of the fused
        tensors and back unchanged. Both paths leave the same state bit for bit.

        Raises ValueError, changing nothing, when a trial is not in the group's fusion
        (diverged, stopped, fell back to f32, done), when ``recipient == donor``, when
        they are at different epochs, when ``settings`` are not the mutable ones, or when
        a recipient takes part in another of the exploits (a boundary's recipients copy
        once each, and are nobody's donor, as :func:`trainables.pbt.choose_exploits`
        pairs them)."""
        planned = []
        recipients = [recipient for recipient, _, _ in exploits]
        donors = {donor for _, donor, _ in exploits}
        for recipient, donor, settings in exploits:
            if recipient == donor:
                raise ValueError(f"trial {recipient} cannot exploit itself")
            if recipients.count(recipient) > 1 or recipient in donors:
                raise ValueError(
                    f"trial {recipient} is a recipient and takes part in another exploit of "
                    "the same boundary: a recipient copies once and is nobody's donor"
                )
            for index, role in ((recipient, "recipient"), (donor, "donor")):
                why = self._why_not_exploit(index)
                if why:
                    raise ValueError(f"trial {index} cannot be an exploit's {role}: {why}")
            target, source = self.trials[recipient], self.trials[donor]
            if target.epoch != source.epoch:
                raise ValueError(
                    f"trial {recipient} has completed {target.epoch} epochs, trial {donor} "
                    f"{source.epoch}: an exploit copies between trials at one epoch"
                )
            before = self.mutable_settings(recipient)
            if set(settings) != set(before):
                raise ValueError(
                    f"an exploit sets every mutable setting of trial {recipient} "
                    f"({', '.join(sorted(before))}); got {', '.join(sorted(settings))}"
                )
            after = {name: float(settings[name]) for name in before}
            config = with_settings(target.config, after)  # raises on an invalid value
            planned.append((ExploitRecord(target.epoch, recipient, donor, before, after), config))
        if not planned:
            return []
        built = self._models_in_slots(planned)
        if built is not None:
            stack = self.fusion.fused.model  # type: ignore[union-attr]  # fused: built
            shared = set(stack.shared_settings)
            for (record, config), models in zip(planned, built, strict=True):
                target, source = self.trials[record.recipient], self.trials[record.donor]
                target.take_training_state(source, config, models)
            if stack.shared_settings != shared:  # a path the fused step has not run
                self.fusion.retry_fused_step()
        else:
            self.fusion.unfuse()
            try:
                for record, config in planned:
                    target, source = self.trials[record.recipient], self.trials[record.donor]
                    target.take_training_state(source, config)
            finally:  # fused again whatever happened: the others train on
                self.fusion.fuse_again()
        records = [record for record, _ in planned]
        self.exploits.extend(records)
        return records

    def _models_in_slots(
        self, planned: Sequence[tuple[ExploitRecord, TrainConfig]]
    ) -> list[list[nn.Module]] | None:
        """Each planned exploit's recipient folds' new modules
        (:meth:`Trainer.models_taking`) where the exploits can copy within the fused
        tensors: the group trains fused, every recipient's and donor's fold has a slot,
        and every new module fits the stack. None where they cannot."""
        fused = self.fusion.fused
        if fused is None:
            return None
        slotted = {id(run) for run in fused.runs}
        trials = [self.trials[i] for record, _ in planned for i in (record.recipient, record.donor)]
        if any(id(run) not in slotted for trial in trials for run in trial.folds):
            return None
        built = [
            self.trials[record.recipient].models_taking(self.trials[record.donor], config)
            for record, config in planned
        ]
        if not all(fused.model.fits(model) for models in built for model in models):
            return None
        return built

    def can_exploit(self, index: int) -> bool:
        """Whether trial ``index`` may take part in an exploit now (still training in the
        group's fusion)."""
        return not self._why_not_exploit(index)

    def _why_not_exploit(self, index: int) -> str:
        """Why trial ``index`` cannot take part in an exploit ("" when it can)."""
        if not 0 <= index < len(self.trials):
            return f"the group has trials 0 to {len(self.trials) - 1}"
        trial = self.trials[index]
        if index in self.diverged:
            return f"it diverged ({self.diverged[index]})"
        if index in self.ended:
            return f"it was stopped ({self.ended[index]})"
        if trial.fell_back_to_f32:
            return "it fell back to f32 and trains alone"
        if trial.epoch >= trial.config.epochs:
            return f"it is done (all {trial.config.epochs} epochs)"
        if trial not in self.fusion.trainers:
            return "it is not in the group's fusion"
        return ""

    def _diverged(self, trial: Trainer, exc: TrialDiverged) -> None:
        index = next(i for i, t in enumerate(self.trials) if t is trial)
        self.diverged[index] = str(exc)
        self.ended[index] = str(exc)


def mutable_settings(trial: Trainer) -> dict[str, float]:
    """A trial's settings an exploit may change (:func:`mutable_setting_names`, the same
    names the spec's mutations are checked against), as floats by name (defaults filled
    in; an integer a spec's Int range gave a float setting is cast). The others (the
    seed, integer and string settings) stay the trial's own."""
    return config_settings(trial.config)


def config_settings(config: TrainConfig) -> dict[str, float]:
    """:func:`mutable_settings` of a trial with ``config``."""
    family = get_family(config.family)
    values = {"lr": config.lr, "weight_decay": config.weight_decay}
    model = dataclasses.asdict(family.make_config(config.model_config))
    names = mutable_setting_names(family)
    return {name: float(values[name] if name in values else model[name]) for name in names}


def trained_settings(trial: Trainer) -> dict[str, float]:
    """A trial's :func:`mutable_settings` as its training uses them: lr and weight decay
    read from its optimizer (its fused slots' values where it trains fused), the model
    settings from its model config. What a population reports each epoch, so the lineage
    shows what trained: an exploit whose restored optimizer state won over the explored
    lr (ray-project/ray#62173) would show there."""
    settings = mutable_settings(trial)
    group = trial.folds[0].optimizer.param_groups[0]
    settings.update(lr=float(group["lr"]), weight_decay=float(group["weight_decay"]))
    return settings


def with_settings(config: TrainConfig, settings: Mapping[str, float]) -> TrainConfig:
    """``config`` with ``settings`` (lr, weight decay and model settings by name); the
    model settings are checked by the family's config."""
    model = {k: v for k, v in settings.items() if k not in ("lr", "weight_decay")}
    new = config.replace(
        lr=settings["lr"],
        weight_decay=settings["weight_decay"],
        model_config={**config.model_config, **model},
    )
    get_family(new.family).make_config(new.model_config)
    return new
