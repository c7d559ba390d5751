"""Population-based training inside a group trial (the group's trials are the population,
and an exploit is an in-memory copy of one trial's fused slots into another's), and one
trial of a population spanning Tune trials (:class:`PopulationTrial`, at the end:
exploiting through the donor's boundary checkpoint and the sweep's board).

    population = Population(group, settings, seed="kan-f32-c000|f32/0")
    while group.training:
        metrics = group.train_epoch()
        population.after_epoch(metrics)  # at an interval boundary: rank, exploit, explore

At every ``interval_epochs``-th epoch but the last (:meth:`PbtSettings.is_boundary`), the
trials still in the group's fusion rank on that epoch's validation Sharpe (the joined
walk-forward validation returns; the held-out test split is never read), the bottom
quantile each copy a trial drawn from the top (:func:`~trainables.pbt.choose_exploits`),
and take settings explored from the donor's (:func:`~trainables.pbt.explore`), which
their next epoch trains with (:meth:`TrainerGroup.exploit_all`, all of a boundary's
exploits inside one unfuse and fuse). Every draw comes from one
``random.Random`` seeded from the group trial's identity, so the same population makes
the same decisions.

Resume: :meth:`Population.state` (the exploit records and the generator's state, JSON)
is saved with the trials' checkpoints of the same epoch; a group rebuilt from both
(:func:`settings_after` gives each recipient the settings its last exploit left it, as
its checkpoint's weights are the donor's copy trained on with them) continues the
population with no exploit done twice or lost.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from trainables.checkpoint import Checkpoint, load_checkpoint
from trainables.config import TrainConfig
from trainables.group import (
    ExploitRecord,
    TrainerGroup,
    config_settings,
    trained_settings,
    with_settings,
)
from trainables.pbt import PbtSettings, choose_exploits, explore, rng_from_json, rng_to_json
from trainables.trainer import Trainer

RANK_METRIC = "val_sharpe"
"""What a population ranks on: the epoch's validation Sharpe (never the test split's)."""


class Population:
    """A :class:`TrainerGroup`'s trials as one population (see the module docstring)."""

    def __init__(
        self,
        group: TrainerGroup,
        settings: PbtSettings,
        seed: str | int,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        self.group = group
        self.settings = settings
        self.rng = random.Random(seed)
        if state is not None:
            self._load_state(state)

    def after_epoch(self, metrics: Mapping[int, Mapping[str, Any]]) -> list[ExploitRecord]:
        """The exploits after the epoch whose metrics (by trial index, as
        :meth:`TrainerGroup.train_epoch` returns them) are ``metrics``: none off an
        interval boundary. A trial outside the population (diverged, stopped, fell back
        to f32, done) or without a finite validation Sharpe neither copies nor is copied."""
        eligible = [i for i in range(len(self.group.trials)) if self.group.can_exploit(i)]
        if not eligible:
            return []
        trial = self.group.trials[eligible[0]]
        if not self.settings.is_boundary(trial.epoch, trial.config.epochs):
            return []
        scores = [
            _score(metrics.get(i)) if i in eligible else None for i in range(len(self.group.trials))
        ]
        exploits = [
            (
                recipient,
                donor,
                explore(
                    self.group.mutable_settings(donor),
                    self.settings.mutations,
                    self.rng,
                    self.settings.resample_probability,
                ),
            )
            for recipient, donor in choose_exploits(scores, self.rng, self.settings.quantile)
        ]
        return self.group.exploit_all(exploits)

    def state(self) -> dict[str, Any]:
        """What a resumed population needs, as JSON: the group's exploit records so far and
        the random generator's state."""
        return {
            "exploits": [r.to_dict() for r in self.group.exploits],
            "rng": rng_to_json(self.rng),
        }

    def _load_state(self, state: Mapping[str, Any]) -> None:
        self.rng = rng_from_json(state["rng"])
        self.group.exploits = exploit_records(state)


def exploit_records(state: Mapping[str, Any]) -> list[ExploitRecord]:
    """The exploit records of a saved :meth:`Population.state`."""
    return [ExploitRecord(**record) for record in state.get("exploits", [])]


def settings_after(
    configs: Sequence[TrainConfig], exploits: Sequence[ExploitRecord]
) -> list[TrainConfig]:
    """``configs`` (a group trial's, as the sweep made them) with each recipient's settings
    as its last exploit left them: what a resumed population's trials train with (a
    trial's config in the sweep never changes; its checkpoint's weights are the donor's,
    trained on with the explored settings)."""
    latest: dict[int, Mapping[str, float]] = {}
    for record in exploits:
        latest[record.recipient] = record.after
    return [
        with_settings(config, latest[i]) if i in latest else config
        for i, config in enumerate(configs)
    ]


def _score(metrics: Mapping[str, Any] | None) -> float | None:
    value = (metrics or {}).get(RANK_METRIC)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


# ----------------------------------------------------------------------------------------
# a population spanning Tune trials: each of its trials on the board


class Exchange(Protocol):
    """Where a trial of a population spanning Tune trials saves its boundary checkpoints
    and learns whom it copies: the sweep's board
    (:class:`hpo.population_board.PopulationExchange`)."""

    def save_boundary_checkpoint(
        self, population: str, trial: str, epoch: int, save: Callable[[Path], object]
    ) -> str:
        """Where trial ``trial``'s state at ``epoch`` is, written with ``save(directory)``."""
        ...

    def at_boundary(
        self, population: str, pbt: Mapping[str, Any], **report: Any
    ) -> dict[str, Any] | None:
        """The trial's exploit at this boundary, or None (``report``: trial, trial_id,
        epoch, score, settings, checkpoint)."""
        ...

    def open_boundary_checkpoint(self, where: str) -> AbstractContextManager[Path]:
        """A donor's boundary checkpoint as a local directory."""
        ...


LINEAGE_META = "pbt_lineage"
"""Checkpoint meta key of a population trial's lineage: a resumed one carries it on."""


class PopulationTrial:
    """One trial of a population spanning Tune trials (in a Tune trial of its own, or in
    a group trial that holds part of the population): at each interval boundary it
    saves a boundary checkpoint, posts its validation Sharpe to the board and, where the
    board says so, takes the donor's boundary checkpoint and the explored settings
    (:meth:`Trainer.take_checkpoint_state`) before its next epoch.

        trial = PopulationTrial(exchange, pbt, population, key, trial_id, lineage)
        metrics = trainer.train_epoch()
        entry = trial.after_epoch(trainer, metrics)  # settings trained, lineage
    """

    def __init__(
        self,
        exchange: Exchange,
        settings: PbtSettings,
        population: str,
        key: str,
        trial_id: str,
        lineage: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.exchange = exchange
        self.settings = settings
        self.population = population
        self.key = key  # its trial key, what the board knows it by
        self.trial_id = trial_id  # the id its MLflow run knows it by
        self.lineage: list[dict[str, Any]] = [dict(e) for e in lineage]

    def after_epoch(self, trainer: Trainer, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """What the epoch's report adds: the settings it trained with (``lr``,
        ``weight_decay``, ... by name), ``pbt_exploits`` and ``pbt_lineage``; at an
        interval boundary, after the exploit the board decided, if any. A trial that fell
        back to f32 posts no score: it neither copies nor is copied."""
        trained = trained_settings(trainer)
        if self.settings.is_boundary(trainer.epoch, trainer.config.epochs):
            started, cpu_started = time.perf_counter(), time.process_time()
            self._at_boundary(trainer, metrics, trained)
            charge_to_epoch(
                trainer, time.perf_counter() - started, time.process_time() - cpu_started
            )
        return self.reported(trained)

    def _at_boundary(
        self, trainer: Trainer, metrics: Mapping[str, Any], trained: Mapping[str, float]
    ) -> None:
        """Save the boundary checkpoint, post, and exploit where the board says so."""
        score = None if trainer.fell_back_to_f32 else _score(metrics)
        checkpoint = self.exchange.save_boundary_checkpoint(
            self.population, self.key, trainer.epoch, lambda d: trainer.save(d)
        )
        decision = self.exchange.at_boundary(
            self.population,
            self.settings.to_dict(),
            trial=self.key,
            trial_id=self.trial_id,
            epoch=trainer.epoch,
            score=score,
            settings=trained,
            checkpoint=checkpoint,
        )
        if decision is not None:
            self._exploit(trainer, decision)

    def reported(self, settings: Mapping[str, float]) -> dict[str, Any]:
        """What every report of this trial carries: ``settings`` (those its latest epoch
        trained with), its exploits so far and its lineage (also in a final report: a
        trial that diverged or ran out of memory keeps them in ``hpo status``)."""
        return {
            **settings,
            "pbt_exploits": len(self.lineage),
            "pbt_lineage": [dict(e) for e in self.lineage],
        }

    def _exploit(self, trainer: Trainer, decision: Mapping[str, Any]) -> None:
        config = with_settings(trainer.config, decision["after"])
        with self.exchange.open_boundary_checkpoint(str(decision["checkpoint"])) as directory:
            donor = load_checkpoint(directory)
            if int(donor.meta["epoch"]) != trainer.epoch:
                raise ValueError(
                    f"the donor's boundary checkpoint {decision['checkpoint']} is of epoch "
                    f"{donor.meta['epoch']}, this trial completed {trainer.epoch}"
                )
            trainer.take_checkpoint_state(donor, config)
        self.lineage.append(
            {
                "epoch": int(decision["epoch"]),
                "donor": str(decision["donor"]),
                "donor_trial_id": str(decision["donor"]),  # its run's id, in any Tune trial
                "donor_key": str(decision["donor_key"]),
                "before": dict(decision["before"]),
                "after": dict(decision["after"]),
            }
        )

    def checkpoint_meta(self) -> dict[str, Any]:
        """What the trial's checkpoint carries for a resume (its lineage)."""
        return {LINEAGE_META: self.lineage}


def charge_to_epoch(trainer: Trainer, seconds: float, cpu_seconds: float) -> None:
    """Count ``seconds`` (wall) and ``cpu_seconds`` of work after an epoch (a boundary's
    checkpoint, post and exploit) in that epoch's time and the trial's totals: its latest
    history entry (the metrics :meth:`Trainer.train_epoch` returned, the same dict), so
    what the trial reports and every later total include them (hpo status's hours, the
    GPU share's seconds: :func:`trainables.trial.gpu_cost` reads ``epoch_time_s``)."""
    latest = trainer.history[-1]
    for key, extra in (
        ("epoch_time_s", seconds),
        ("time_s_total", seconds),
        ("epoch_cpu_s", cpu_seconds),
        ("cpu_s_total", cpu_seconds),
    ):
        latest[key] = float(latest.get(key, 0.0)) + extra


def resumed_population_config(config: TrainConfig, checkpoint: Checkpoint | None) -> TrainConfig:
    """``config`` with the settings a resumed population trial last trained with: those in its
    checkpoint's config (its exploits explored them; the sweep's config never changes)."""
    if checkpoint is None:
        return config
    return with_settings(config, config_settings(TrainConfig.from_dict(checkpoint.meta["config"])))
