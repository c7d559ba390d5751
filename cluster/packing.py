"""Fractional-GPU packing from measured trial memory.

A trial's GPU share is

    fraction = (peak * (1 + headroom) + context) / device_total

rounded UP at Ray's resolution (``RAY_GPU_STEPS = 10_000`` steps per GPU) and capped at
1.0, where ``peak`` and ``context`` come from the trial shape's
:class:`~cluster.profiler.MemoryProfile` (measured on CUDA, estimated from tensor bytes
without; cached in :mod:`cluster.vram_table`); the headroom multiplies the peak only.
``device_total`` is the profiled GPU's (measured, or declared by its node:
:mod:`cluster.gpu_types`), else ``HPO_GPU_TOTAL_GB`` (GiB), else
``DEFAULT_DEVICE_TOTAL_BYTES`` = 80 GiB (an H100 80GB). ``HPO_VRAM_MODE``: ``auto``
measures when this process has CUDA and estimates otherwise, ``measure`` insists on CUDA,
``estimate`` never touches a GPU (a sweep on Ray profiles on its GPU nodes instead:
:mod:`cluster.packing_plan`).

Every trial caps its own allocator with :func:`apply_memory_cap` (Ray does not enforce
fractions). After an OOM, :func:`retry_fraction_after_oom` marks the shape's profile as too
small, re-measures and returns a larger fraction (headroom doubled per OOM of that shape,
at least ``1 + headroom`` times the share that ran out); the retried trial carries it as
:attr:`trainables.config.TrialConfig.gpu_fraction_floor`, and :func:`gpu_fraction_for_trial`
never returns less. Every function takes a :class:`~trainables.config.TrainConfig` (decode
a Tune trial dict with ``TrialConfig.from_dict``). Why: docs/packing.md#fractional-shares
"""

from __future__ import annotations

import gc
import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from cluster.gpu_types import GpuType
from cluster.profiler import (
    ESTIMATE_DEVICE_NAME,
    GiB,
    MemoryProfile,
    context_allowance,
    cuda_device,
    profile_trial,
)
from cluster.vram_table import SharedVramCache, VramTable, profile_key, table_at, type_key
from trainables.config import TrainConfig

log = logging.getLogger("cluster.packing")

RAY_GPU_STEPS = 10_000  # Ray keeps resource quantities as fixed point with 4 decimals
DEFAULT_HEADROOM = 0.15  # the sweep spec's default ([resources] headroom)
DEFAULT_DEVICE_TOTAL_BYTES = 80 * GiB  # H100 80GB, when no GPU is visible to ask
GPU_TOTAL_ENV = "HPO_GPU_TOTAL_GB"
MODE_ENV = "HPO_VRAM_MODE"
MODES = ("auto", "measure", "estimate")
_EPS = 1e-9

_applied_cap: float | None = None  # this process's allocator cap, restored after a re-measure


class TrialDoesNotFit(RuntimeError):
    """A trial shape needs more than one whole GPU (or ran out of memory on one)."""


# ----------------------------------------------------------------------------------------
# the arithmetic


def gpu_fraction(
    peak_bytes: int,
    context_bytes: int,
    device_total_bytes: int,
    headroom: float = DEFAULT_HEADROOM,
    steps: int = RAY_GPU_STEPS,
) -> float:
    """(peak * (1 + headroom) + context) / total at a resolution of 1/steps (Ray's by
    default), in [1/steps, 1.0].

    Rounded up, except in one case: where the share one step lower lets exactly the
    memory-alone count n fit on a GPU (the exact share lies within a step above 1/n, and
    the lower one packs n, not more) and gives up at most half the headroom, that one is
    taken. Without it a share of 0.0714023 (14.005 per GPU by
    memory) would be asked as 0.0715 and pack 13.
    """
    if device_total_bytes <= 0:
        raise ValueError(f"device_total_bytes must be > 0, got {device_total_bytes}")
    if steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps}")
    if headroom < 0:
        raise ValueError(f"headroom must be >= 0, got {headroom}")
    raw = (peak_bytes * (1.0 + headroom) + context_bytes) / device_total_bytes
    # the epsilon: float products land a hair above an exact step (0.15 * 20 = 3.0000000000000004)
    up = max(1, math.ceil(raw * steps - _EPS * steps))
    if up >= steps:
        return 1.0
    by_memory = math.floor(1.0 / raw + _EPS)
    if math.floor(steps / up) < by_memory:
        down = steps // by_memory  # the largest share that lets by_memory trials fit
        # ... and no more than those: a smaller share would pack trials beyond the bound
        exact = down >= 1 and steps // down == by_memory
        if exact and raw - down / steps <= 0.5 * headroom * peak_bytes / device_total_bytes:
            return round(down / steps, 9)
    return round(up / steps, 9)


def trials_per_gpu(fraction: float) -> int:
    """Trials of this fraction one GPU holds."""
    return math.floor(1.0 / fraction + _EPS) if fraction > 0 else 0


def device_total_bytes(profile: MemoryProfile | None = None) -> int:
    """The GPU size a fraction is taken of: the profiled device's when measured, else
    ``HPO_GPU_TOTAL_GB`` GiB, else 80 GiB (H100)."""
    if profile is not None and profile.device_total_bytes:
        return int(profile.device_total_bytes)
    raw = os.environ.get(GPU_TOTAL_ENV)
    if raw:
        try:
            return int(float(raw) * GiB)
        except ValueError:
            raise ValueError(f"{GPU_TOTAL_ENV} must be a number of GiB, got {raw!r}") from None
    return DEFAULT_DEVICE_TOTAL_BYTES


@dataclass(frozen=True)
class Packing:
    """What a profile implies for one GPU."""

    fraction: float  # what Ray is asked for: rounded up at 1/grid
    raw_fraction: float  # before rounding and capping
    trials_per_gpu: int  # at ``fraction``
    trials_per_gpu_unrounded: int  # what memory alone would allow (no rounding)
    device_total_bytes: int
    headroom: float
    grid: int  # steps per GPU the fraction is rounded at (Ray's resolution: 10_000)

    @property
    def fits(self) -> bool:
        return self.raw_fraction <= 1.0 + _EPS

    @property
    def of_memory_bound(self) -> float:
        """Trials per GPU at ``fraction`` over what memory alone allows (1.0: no loss)."""
        bound = self.trials_per_gpu_unrounded
        return self.trials_per_gpu / bound if bound else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits, "of_memory_bound": self.of_memory_bound}


def plan(
    profile: MemoryProfile,
    headroom: float = DEFAULT_HEADROOM,
    grid: int = RAY_GPU_STEPS,
    device_total: int | None = None,
) -> Packing:
    total = device_total or device_total_bytes(profile)
    need = profile.peak_bytes * (1.0 + headroom) + profile.context_bytes
    fraction = gpu_fraction(profile.peak_bytes, profile.context_bytes, total, headroom, grid)
    return Packing(
        fraction=fraction,
        raw_fraction=need / total,
        trials_per_gpu=trials_per_gpu(fraction),
        trials_per_gpu_unrounded=math.floor(total / need + _EPS),
        device_total_bytes=total,
        headroom=headroom,
        grid=grid,
    )


# ----------------------------------------------------------------------------------------
# profiles of trial configs


def _mode(mode: str | None) -> str:
    mode = mode or os.environ.get(MODE_ENV, "auto")
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {list(MODES)}, got {mode!r}")
    return mode


def _target(mode: str | None) -> tuple[torch.device, str]:
    """Where this process profiles (CUDA measures; CPU estimates) and that device's name."""
    mode = _mode(mode)
    if mode != "estimate" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        return device, cuda_device(device).name
    if mode == "measure":
        raise RuntimeError(f"{MODE_ENV}=measure but this process sees no CUDA device")
    return torch.device("cpu"), ESTIMATE_DEVICE_NAME


def profile_for_config(
    config: TrainConfig,
    *,
    table: VramTable | None = None,
    mode: str | None = None,
    refresh: bool = False,
    group_size: int = 1,
) -> tuple[dict[str, Any], MemoryProfile]:
    """(shape key, profile) of ``config`` (a group trial of ``group_size`` such trials when
    over 1): from the table, else profiled and stored."""
    table = table if table is not None else table_at()
    device, name = _target(mode)
    key = profile_key(config, device, name, group_size)

    def measure() -> MemoryProfile:
        return profile_trial(
            config, device=device, measure=device.type == "cuda", group_size=group_size
        )

    if refresh:
        profile = measure()
        table.measurements += 1
        table.put(key, profile)
        return key, profile
    return key, table.get_or_measure(key, measure)


def _boosted(headroom: float, oom_count: int) -> float:
    if oom_count <= 0:
        return headroom
    return (headroom if headroom > 0 else DEFAULT_HEADROOM) * 2**oom_count


def gpu_fraction_for_trial(
    config: TrainConfig,
    headroom: float = DEFAULT_HEADROOM,
    *,
    floor: float = 0.0,
    grid: int = RAY_GPU_STEPS,
    table: VramTable | None = None,
    mode: str | None = None,
    group_size: int = 1,
) -> float:
    """The GPU fraction of a trial (a group trial of ``group_size`` such trials when over 1):
    its shape's profile through the table, the headroom doubled for each OOM recorded
    against the shape, and never below ``floor`` (the trial's
    :attr:`~trainables.config.TrialConfig.gpu_fraction_floor` after an OOM).
    """
    table = table if table is not None else table_at()
    key, profile = profile_for_config(config, table=table, mode=mode, group_size=group_size)
    packing = plan(profile, _boosted(headroom, table.oom_count(key)), grid)
    if not packing.fits:
        log.warning(
            "%s/%s needs %.2f of a %.0f GiB GPU; asking for the whole GPU (it may not fit)",
            profile.family,
            profile.precision,
            packing.raw_fraction,
            packing.device_total_bytes / GiB,
        )
    return max(packing.fraction, min(1.0, floor))


# ----------------------------------------------------------------------------------------
# inside the trial


def caps_memory(fraction: float | None) -> bool:
    """Whether a trial with GPU share ``fraction`` caps its allocator: a part of a GPU,
    on CUDA (0, None and whole GPUs are not capped)."""
    return fraction is not None and 0 < fraction < 1.0 and torch.cuda.is_available()


def apply_memory_cap(fraction: float | None, *, context_bytes: int | None = None) -> float | None:
    """Cap this process's CUDA allocator to its share of the GPU; returns the cap set.

    ``fraction`` is the trial's GPU resource (Ray's ``required_resources["GPU"]``). The
    share covers the CUDA context too, which lives outside the allocator, so the cap is
    ``fraction - context / total`` (never below half the share). No-op (None) without
    CUDA, for 0 / no GPU, and for whole GPUs.
    """
    global _applied_cap
    if fraction is None or not caps_memory(fraction):
        return None
    device = torch.cuda.current_device()  # Ray's CUDA_VISIBLE_DEVICES makes it the trial's GPU
    total = torch.cuda.get_device_properties(device).total_memory
    context = context_allowance() if context_bytes is None else context_bytes
    cap = min(1.0, max(fraction - context / total, fraction / 2))
    torch.cuda.set_per_process_memory_fraction(cap, device)
    _applied_cap = cap
    return cap


def retry_fraction_after_oom(
    config: TrainConfig,
    previous_fraction: float,
    headroom: float = DEFAULT_HEADROOM,
    *,
    grid: int = RAY_GPU_STEPS,
    table: VramTable | None = None,
    mode: str | None = None,
    shared: SharedVramCache | None = None,
    gpu_type: GpuType | None = None,
    group_size: int = 1,
) -> float:
    """After a CUDA OOM at ``previous_fraction``: a larger fraction to retry the trial (a
    group trial of ``group_size`` such trials when over 1) with.

    Records the OOM against the trial's shape -- in the sweep's shared cache under this
    node's GPU type when ``shared`` and ``gpu_type`` are given (the driver reads it there,
    so later trials of the shape get the doubled headroom), else in the process's
    ``table`` -- re-measures the shape here with the allocator cap lifted (falling back to
    the estimate when the crowded GPU cannot hold even the measurement), and returns
    ``max(fraction at headroom x 2**ooms, previous x (1 + headroom))`` capped at 1.0.
    Raises :class:`TrialDoesNotFit` when ``previous_fraction`` was already a whole GPU.
    The caller must have dropped the failed trainer and the exception first: their frames
    hold every tensor of the failed step.
    """
    if previous_fraction >= 1.0 - _EPS:
        what = f"a group of {group_size} " if group_size > 1 else ""
        raise TrialDoesNotFit(
            f"{what}{config.family}/{config.precision} ran out of memory on a whole GPU; "
            "shrink it (batch size, model size, replay capacity, group size) or use a "
            "larger GPU"
        )
    device, name = _target(mode)
    if shared is not None and gpu_type is not None:
        from cluster.remote_profile import profile_on_node

        key = type_key(config, gpu_type, group_size)
        ooms = shared.record_oom(key)
        profile = _remeasure(
            config,
            device,
            lambda: profile_on_node(config, gpu_type, _mode(mode), group_size=group_size),
            group_size,
        )
        if profile.method == "measured" or device.type != "cuda":
            shared.put(key, profile)
        declared = gpu_type.memory_bytes if profile.method == "estimated" else None
        total = declared or profile.device_total_bytes or device_total_bytes()
    else:
        table = table if table is not None else table_at()
        key = profile_key(config, device, name, group_size)
        ooms = table.record_oom(key)
        profile = _remeasure(
            config,
            device,
            lambda: profile_trial(
                config, device=device, measure=device.type == "cuda", group_size=group_size
            ),
            group_size,
        )
        if profile.device_name == name:  # a fallback estimate is not stored under a GPU's key
            table.put(key, profile)
        total = device_total_bytes(profile)
    boosted = _boosted(headroom, ooms)
    fraction = plan(profile, boosted, grid, device_total=total).fraction
    grown = math.ceil(previous_fraction * (1.0 + max(headroom, DEFAULT_HEADROOM)) * grid) / grid
    new = round(min(1.0, max(fraction, grown)), 9)
    log.warning(
        "%s%s/%s ran out of memory at GPU fraction %.4f (OOM %d of this shape); retry at %.4f",
        f"a group of {group_size} " if group_size > 1 else "",
        config.family,
        config.precision,
        previous_fraction,
        ooms,
        new,
    )
    return new


def _remeasure(
    config: TrainConfig,
    device: torch.device,
    measure: Callable[[], MemoryProfile],
    group_size: int = 1,
) -> MemoryProfile:
    gc.collect()
    if device.type != "cuda":
        return measure()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    try:
        return measure()
    except torch.cuda.OutOfMemoryError:
        log.warning("re-measuring after an OOM ran out of memory too; using the estimate")
        gc.collect()
        torch.cuda.empty_cache()
        return profile_trial(
            config, device=torch.device("cpu"), measure=False, group_size=group_size
        )
    finally:
        if _applied_cap is not None:
            torch.cuda.set_per_process_memory_fraction(_applied_cap, device)


def trial_memory_metrics(
    config: TrainConfig,
    fraction: float,
    *,
    table: VramTable | None = None,
    mode: str | None = None,
    group_size: int = 1,
) -> dict[str, float]:
    """Numbers a trial reports (and so logs to its MLflow run): its GPU fraction and its
    shape's predicted peak from the table (a group trial's: the group's, of ``group_size``).
    Looks up only: never profiles. The measured peak on CUDA is the trainer's own
    ``peak_mem_mb``."""
    metrics: dict[str, float] = {"vram_gpu_fraction": float(fraction)}
    table = table if table is not None else table_at()
    try:
        device, name = _target(mode)
        profile = table.get(profile_key(config, device, name, group_size))
        if profile is None and name != ESTIMATE_DEVICE_NAME:
            cpu = torch.device("cpu")
            profile = table.get(profile_key(config, cpu, ESTIMATE_DEVICE_NAME, group_size))
    except (RuntimeError, ValueError, KeyError):
        profile = None
    if profile is not None:
        metrics.update(
            vram_predicted_peak_mb=profile.peak_bytes / 2**20,
            vram_predicted_total_mb=profile.total_bytes / 2**20,
            vram_profile_measured=float(profile.method == "measured"),
        )
    return metrics


__all__ = [
    "DEFAULT_DEVICE_TOTAL_BYTES",
    "DEFAULT_HEADROOM",
    "GPU_TOTAL_ENV",
    "MODE_ENV",
    "RAY_GPU_STEPS",
    "Packing",
    "TrialDoesNotFit",
    "apply_memory_cap",
    "caps_memory",
    "device_total_bytes",
    "gpu_fraction",
    "gpu_fraction_for_trial",
    "plan",
    "profile_for_config",
    "retry_fraction_after_oom",
    "trial_memory_metrics",
    "trials_per_gpu",
]
