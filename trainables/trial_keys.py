"""Keys of a Tune trial's config that readers need without the trainer (no torch import):
which configs are group trials, and a member's name as a path and id part. The codec of
the configs themselves is :mod:`trainables.config`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP_KEY = "group"
"""Trial-dict key of a group trial's members (:class:`trainables.config.GroupTrialConfig`)."""


def is_group_trial(config: Mapping[str, Any]) -> bool:
    """Whether a Tune trial's config is a group trial's."""
    return GROUP_KEY in config


def member_slug(member: str) -> str:
    """A member's name (``precision/seed``) as a path and id part: ``bf16-s3``."""
    precision, _, seed = member.partition("/")
    return f"{precision}-s{seed}" if seed else precision


def trial_units(
    trial_id: str, config: Mapping[str, Any]
) -> list[tuple[str, Mapping[str, Any], str]]:
    """(trial id, config, member slug) of each trial a Tune trial holds: itself (slug
    ""), or each member of a group trial, whose id is ``<Tune trial id>-<slug>`` (the id
    MLflow, ``hpo status`` and the comparison know it by)."""
    if not is_group_trial(config):
        return [(trial_id, config, "")]
    units = []
    for member in config[GROUP_KEY]:
        slug = member_slug(str(member.get("member", "")))
        units.append((f"{trial_id}-{slug}", member, slug))
    return units
