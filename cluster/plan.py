"""GPU memory plans of trial shapes: a shape's profile and the packing it implies, alone
(``hpo profile --model``) or for every family in f32 and bf16 with the bf16/f32 ratios
(``hpo profile --all``). Built from :mod:`cluster.packing`'s public functions; the CLI
only formats what this returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.packing import DEFAULT_HEADROOM, Packing, plan, profile_for_config
from cluster.profiler import MemoryProfile


@dataclass(frozen=True)
class ShapeRequest:
    """What to profile besides the model and precision: the ``--set`` overrides, the
    batch size (None: the trainer's), the headroom, and where profiles come from."""

    overrides: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    headroom: float = DEFAULT_HEADROOM
    mode: str | None = None  # cluster.packing's HPO_VRAM_MODE values; None: the env's
    refresh: bool = False


def shape_plan(model: str, precision: str, request: ShapeRequest) -> tuple[MemoryProfile, Packing]:
    """The (model, precision) trial's profile (from the VRAM table, or profiled now) and
    its packing."""
    from trainables.config import build_train_config

    base: dict[str, Any] = {} if request.batch_size is None else {"batch_size": request.batch_size}
    config = build_train_config(model, dict(request.overrides), precision=precision, **base)
    _, profile = profile_for_config(config, mode=request.mode, refresh=request.refresh)
    return profile, plan(profile, request.headroom)


@dataclass(frozen=True)
class FamilyPlans:
    """One row per family that profiled, plus a line per family that did not."""

    rows: list[dict[str, Any]]
    skipped: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": self.skipped}


def family_plans(request: ShapeRequest) -> FamilyPlans:
    """Every registered family in f32 and bf16. A row holds each precision's profile and
    packing (as dicts) and ``bf16_over_f32_peak`` / ``bf16_over_f32_trials``. A family
    that cannot be imported (a module being written) or profiled is skipped with the
    reason, so one broken family does not hide the others."""
    from models import family_names, get_family

    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in family_names():
        try:
            get_family(name)
        except Exception as exc:
            skipped.append(f"{name}: cannot import ({type(exc).__name__}: {exc})")
            continue
        row: dict[str, Any] = {"model": name}
        try:
            for precision in ("f32", "bf16"):
                profile, packing = shape_plan(name, precision, request)
                row[precision] = {"profile": profile.to_dict(), "packing": packing.to_dict()}
        except Exception as exc:
            skipped.append(f"{name}: profiling failed ({type(exc).__name__}: {exc})")
            continue
        reference, other = row["f32"], row["bf16"]
        row["bf16_over_f32_peak"] = (
            other["profile"]["peak_bytes"] / reference["profile"]["peak_bytes"]
        )
        row["bf16_over_f32_trials"] = (
            other["packing"]["trials_per_gpu"] / reference["packing"]["trials_per_gpu"]
        )
        rows.append(row)
    return FamilyPlans(rows=rows, skipped=skipped)
