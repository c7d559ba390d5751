"""A trial's search space: the family's adapter, the trainer's own dimensions, and the
spec's per-family overrides, merged in one place.

Overrides replace a dimension's range (``{low, high, log}`` or ``{choices = [...]}``) or
fix a key to a constant (a plain value), and may add keys the family does not search but
that exist as settings. Fixed keys pass through to every trial unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models import get_family
from models.family import Choice, Dim, Float, Int
from trainables.config import DATA_KEYS, TRAIN_KEYS

# Trainer settings searched for every family unless a spec fixes or overrides them.
TRAINER_SPACE: dict[str, Dim] = {
    "lr": Float(1e-4, 1e-2, log=True),
    "weight_decay": Float(1e-6, 1e-2, log=True),
}


@dataclass(frozen=True)
class TrialSpace:
    """What a searcher samples (``dims``) and what every trial gets as is (``fixed``)."""

    dims: dict[str, Dim]
    fixed: dict[str, Any]


def dim_from_override(where: str, value: Any) -> Dim | None:
    """A dimension from a spec override table, or None when ``value`` is a constant."""
    if not isinstance(value, Mapping):
        return None
    keys = set(value)
    if keys == {"choices"}:
        choices = value["choices"]
        if not isinstance(choices, list | tuple) or not choices:
            raise ValueError(f"{where}.choices must be a non-empty list, got {choices!r}")
        return Choice(tuple(choices))
    if {"low", "high"} <= keys <= {"low", "high", "log"}:
        low, high, log = value["low"], value["high"], bool(value.get("log", False))
        try:
            if isinstance(low, int) and isinstance(high, int) and not isinstance(low, bool):
                return Int(low, high, log=log)
            return Float(float(low), float(high), log=log)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    raise ValueError(
        f"{where} must be a constant, {{low, high[, log]}} or {{choices = [...]}}; got keys {sorted(keys)}"
    )


def trial_space(
    name: str, overrides: Mapping[str, Any] | None = None, where: str = "search_space"
) -> TrialSpace:
    """Merge the family's space, the trainer's space and the spec's overrides for family ``name``."""
    family = get_family(name)
    dims: dict[str, Dim] = {**TRAINER_SPACE, **family.search_space}
    fixed: dict[str, Any] = {}
    settable = set(family.config_fields()) | TRAIN_KEYS | {f"data.{k}" for k in DATA_KEYS}
    for key, value in (overrides or {}).items():
        if key not in settable:
            raise ValueError(
                f"{where}.{name}.{key}: unknown setting for {name}; searchable: {sorted(dims)}; "
                f"other settings: {sorted(settable - set(dims))}"
            )
        dim = dim_from_override(f"{where}.{name}.{key}", value)
        if dim is None:
            dims.pop(key, None)
            fixed[key] = value
        else:
            dims[key] = dim
    return TrialSpace(dims=dims, fixed=fixed)
