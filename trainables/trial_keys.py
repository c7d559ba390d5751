"""Keys of a Tune trial's config that readers need without the trainer (no torch import):
which configs are group trials, which settings a group trial's trials may differ in, and
a trial's name as a path and id part. The codec of the configs themselves is
:mod:`trainables.config`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.family import Family

PER_TRIAL_SETTINGS = ("seed", "lr", "weight_decay")
"""The trainer settings a group trial's trials may differ in (per-slot values in the fused
optimizer). A family adds model settings its fused step never reads or reads per slot
(``Family.per_trial_settings``: the position scale, dropout rates, loss weights;
:func:`per_trial_settings` has both); the trials share every other setting."""

GROUP_KEY = "group"
"""Trial-dict key of a group trial's trials (:class:`trainables.config.GroupTrialConfig`)."""


def per_trial_settings(family: Family) -> frozenset[str]:
    """The settings a group trial's trials may differ in: :data:`PER_TRIAL_SETTINGS` (seed,
    and lr and weight decay, per slot in the fused optimizer) and the family's
    ``per_trial_settings`` (the fused step never reads them, as the position scale, or
    reads them per slot, as dropout rates and loss weights)."""
    return frozenset(PER_TRIAL_SETTINGS) | family.per_trial_settings


def is_group_trial(config: Mapping[str, Any]) -> bool:
    """Whether a Tune trial's config is a group trial's."""
    return GROUP_KEY in config


def trial_slug(precision: str, seed: int | str) -> str:
    """A trial's precision and seed in its configuration as a path and id part:
    ``bf16-s3``."""
    return f"{precision}-s{seed}"


def precision_seed(config: Mapping[str, Any]) -> str:
    """A trial's place among the trials of its configuration (a trial dict's precision
    and seed): ``bf16/3``."""
    return f"{config.get('precision', '')}/{config.get('seed', '')}"


def trial_key(config: Mapping[str, Any]) -> str:
    """A trial's identity in its sweep, ``config_id|precision/seed``: the same for every
    attempt at it (an OOM retry is a new Tune trial) and whatever group it ran in."""
    return f"{config.get('config_id', '')}|{precision_seed(config)}"


def trial_slugs(trials: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each trial's name in a group trial as a path and id part (``trials`` are trial
    dicts): its :func:`trial_slug`, led by its configuration's number (``c003-bf16-s3``,
    the end of its ``config_id``) where the group holds several configurations."""
    configs = {str(t.get("config_id", "")) for t in trials}
    slugs = []
    for trial in trials:
        slug = trial_slug(str(trial.get("precision", "")), str(trial.get("seed", "")))
        if len(configs) > 1:
            slug = f"{str(trial.get('config_id', '')).rsplit('-', 1)[-1]}-{slug}"
        slugs.append(slug)
    return slugs


def trials_of(trial_id: str, config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """(trial id, config, slug) of each trial a Tune trial holds: itself (slug ""), or
    each trial of a group trial, whose id is ``<Tune trial id>-<slug>`` (the id MLflow,
    ``hpo status`` and the comparison know it by)."""
    if not is_group_trial(config):
        return [(trial_id, config, "")]
    trials = config[GROUP_KEY]
    return [
        (f"{trial_id}-{slug}", trial, slug)
        for trial, slug in zip(trials, trial_slugs(trials), strict=True)
    ]
