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
