"""Keys of a Tune trial's config that readers need without the trainer (no torch import):
which configs are group trials, which settings a group's members may differ in, and a
member's name as a path and id part. The codec of the configs themselves is
:mod:`trainables.config`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MEMBER_SETTINGS = ("seed", "lr", "weight_decay")
"""The trainer settings a group's members may differ in (per-member values in the fused
optimizer). A family adds model settings its fused step never reads or reads per member
(``Family.member_settings``: the position scale, dropout rates, loss weights;
``trainables.group.member_settings`` has both); members share every other setting."""

GROUP_KEY = "group"
"""Trial-dict key of a group trial's members (:class:`trainables.config.GroupTrialConfig`)."""


def is_group_trial(config: Mapping[str, Any]) -> bool:
    """Whether a Tune trial's config is a group trial's."""
    return GROUP_KEY in config


def member_slug(member: str) -> str:
    """A member's name (``precision/seed``) as a path and id part: ``bf16-s3``."""
    precision, _, seed = member.partition("/")
    return f"{precision}-s{seed}" if seed else precision


def member_key(config: Mapping[str, Any]) -> str:
    """A member trial's identity in its sweep, ``config_id|precision/seed``: the same for
    every attempt at it (an OOM retry is a new Tune trial) and whatever group it ran in."""
    return f"{config.get('config_id', '')}|{config.get('member', '')}"


def member_slugs(members: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each group member's name as a path and id part (members are trial dicts): its
    :func:`member_slug`, led by its configuration's number (``g003-bf16-s3``, the end of
    its ``config_id``) where the group holds several configurations."""
    configs = {str(m.get("config_id", "")) for m in members}
    slugs = []
    for member in members:
        slug = member_slug(str(member.get("member", "")))
        if len(configs) > 1:
            slug = f"{str(member.get('config_id', '')).rsplit('-', 1)[-1]}-{slug}"
        slugs.append(slug)
    return slugs


def trial_units(
    trial_id: str, config: Mapping[str, Any]
) -> list[tuple[str, Mapping[str, Any], str]]:
    """(trial id, config, member slug) of each trial a Tune trial holds: itself (slug
    ""), or each member of a group trial, whose id is ``<Tune trial id>-<slug>`` (the id
    MLflow, ``hpo status`` and the comparison know it by)."""
    if not is_group_trial(config):
        return [(trial_id, config, "")]
    members = config[GROUP_KEY]
    return [
        (f"{trial_id}-{slug}", member, slug)
        for member, slug in zip(members, member_slugs(members), strict=True)
    ]
