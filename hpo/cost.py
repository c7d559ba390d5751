"""What each precision costs, and what the move to another saves: GPU-hours (CPU-hours on
a CPU-only sweep), trials per GPU, step speed and peak memory, per precision and paired by
configuration.

A trial reports running totals each epoch (:mod:`trainables.trial`): ``time_s_total``
(seconds of its epochs), ``cpu_s_total`` (process CPU seconds) and ``gpu_s_total`` (its
GPU share times those seconds, on CUDA only), with ``gpu_fraction``. Totals per precision
count every trial that reported, finished or not (that time was spent). The ratio of
``other`` to the reference is taken per configuration that completed in both (the mean
over its seeds on each side), and summarised by the geometric mean of the ratios with a
t-interval on their logarithms: ratios multiply, so the log scale is where they average.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
from scipy import stats

Basis = Literal["gpu", "cpu"]


class CostedTrial(Protocol):
    """What a trial record needs for its cost (``hpo.compare.TrialRecord`` has it)."""

    @property
    def config_id(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def time_s(self) -> float: ...
    @property
    def cpu_s(self) -> float: ...
    @property
    def gpu_s(self) -> float: ...
    @property
    def gpu_fraction(self) -> float: ...
    @property
    def steps_per_s(self) -> float: ...
    @property
    def peak_mem_mb(self) -> float: ...


@dataclass
class PrecisionCost:
    """One precision's spending in a scope."""

    precision: str
    trials: int
    """Trials that reported their cost (any state)."""
    gpu_hours: float
    cpu_hours: float
    train_hours: float
    """Wall-clock hours of the trials' epochs, summed over trials."""
    gpu_fraction: float
    """Median GPU share of its trials that ran on a GPU; NaN when none did."""
    steps_per_s: float
    peak_mem_mb: float


@dataclass
class CostRatio:
    """``other`` against the reference, per configuration, then its geometric mean."""

    other: str
    reference: str
    basis: Basis
    configs: int
    """Configurations completed in both precisions with a recorded cost."""
    confidence: float
    hours_ratio: float = math.nan
    """Geometric mean over configurations of other's hours / the reference's."""
    ci_low: float = math.nan
    ci_high: float = math.nan
    trials_per_gpu: float = math.nan
    """How many more trials of ``other`` a GPU holds: the reference's median share over
    other's (1.9 = 1.9x as many); NaN off GPU."""
    step_speedup: float = math.nan
    """Geometric mean of other's steps/s over the reference's, per configuration."""
    memory_ratio: float = math.nan
    """Geometric mean of other's peak memory over the reference's, per configuration."""

    def sentence(self) -> str:
        """The line the headline prints, e.g. "bf16 used 0.48x the GPU-hours of f32 per
        configuration (95% CI 0.41-0.55, 12 configurations), 1.9x trials per GPU, steps
        1.7x as fast"."""
        unit = "GPU-hours" if self.basis == "gpu" else "CPU-hours"
        if not math.isfinite(self.hours_ratio):
            return (
                f"{self.other} vs {self.reference} cost: no configuration completed in both "
                "with its cost recorded"
            )
        ci = (
            f"{self.confidence:.0%} CI {self.ci_low:.2f}-{self.ci_high:.2f}, "
            if math.isfinite(self.ci_low)
            else ""
        )
        parts = [
            f"{self.other} used {self.hours_ratio:.2f}x the {unit} of {self.reference} per "
            f"configuration ({ci}{self.configs} configuration{'s' * (self.configs != 1)})"
        ]
        if math.isfinite(self.trials_per_gpu):
            parts.append(f"{self.trials_per_gpu:.1f}x trials per GPU")
        if math.isfinite(self.step_speedup):
            parts.append(f"steps {self.step_speedup:.2f}x as fast")
        if math.isfinite(self.memory_ratio):
            parts.append(f"peak memory {self.memory_ratio:.2f}x")
        return ", ".join(parts)


@dataclass
class CostSummary:
    basis: Basis
    """"gpu" when every costed trial ran on a GPU; else CPU-hours are compared."""
    by_precision: dict[str, PrecisionCost]
    ratios: dict[str, CostRatio]
    """other precision -> its ratio to the reference."""
    notes: list[str] = field(default_factory=list)


def summarise_cost(
    trials: Sequence[CostedTrial], precisions: Sequence[str], confidence: float = 0.95
) -> CostSummary:
    """The cost of each of ``precisions`` (reference first) over ``trials``."""
    costed = [t for t in trials if math.isfinite(t.time_s) and t.time_s > 0]
    on_gpu = [t.gpu_s > 0 for t in costed]
    basis: Basis = "gpu" if on_gpu and all(on_gpu) else "cpu"
    notes: list[str] = []
    if not costed:
        notes.append("no trial recorded its cost (time_s_total, logged at the end of each epoch)")
    elif basis == "cpu":
        notes.append(
            "GPU-hours need a GPU run: not every trial ran on a GPU, so CPU-hours are "
            "compared (on an emulating CPU they say nothing of a GPU's bf16 speed)"
            if any(on_gpu)
            else "no trial ran on a GPU: CPU-hours are compared, and GPU-hours need a GPU "
            "run (on an emulating CPU they say nothing of a GPU's bf16 speed)"
        )
    by_precision = {
        p: _precision_cost(p, [t for t in costed if t.precision == p]) for p in precisions
    }
    reference = precisions[0]
    ratios = {
        other: _ratio(costed, reference, other, basis, confidence) for other in precisions[1:]
    }
    return CostSummary(basis=basis, by_precision=by_precision, ratios=ratios, notes=notes)


def _precision_cost(precision: str, trials: list[CostedTrial]) -> PrecisionCost:
    shares = [t.gpu_fraction for t in trials if t.gpu_s > 0 and t.gpu_fraction > 0]
    return PrecisionCost(
        precision=precision,
        trials=len(trials),
        gpu_hours=sum(t.gpu_s for t in trials if math.isfinite(t.gpu_s)) / 3600.0,
        cpu_hours=sum(t.cpu_s for t in trials if math.isfinite(t.cpu_s)) / 3600.0,
        train_hours=sum(t.time_s for t in trials) / 3600.0,
        gpu_fraction=float(np.median(shares)) if shares else math.nan,
        steps_per_s=_median([t.steps_per_s for t in trials]),
        peak_mem_mb=_median([t.peak_mem_mb for t in trials]),
    )


def _ratio(
    trials: list[CostedTrial], reference: str, other: str, basis: Basis, confidence: float
) -> CostRatio:
    def hours(t: CostedTrial) -> float:
        return t.gpu_s if basis == "gpu" else t.cpu_s

    by_config: dict[str, dict[str, list[CostedTrial]]] = {}
    for t in trials:
        if t.state == "completed" and t.precision in (reference, other):
            by_config.setdefault(t.config_id, {}).setdefault(t.precision, []).append(t)
    paired = [sides for sides in by_config.values() if reference in sides and other in sides]

    def log_ratios(value: Callable[[CostedTrial], float]) -> list[float]:
        out = []
        for sides in paired:
            ref = _mean([value(t) for t in sides[reference]])
            oth = _mean([value(t) for t in sides[other]])
            if ref > 0 and oth > 0:
                out.append(math.log(oth / ref))
        return out

    logs = log_ratios(hours)
    result = CostRatio(other, reference, basis, configs=len(logs), confidence=confidence)
    if logs:
        mean = float(np.mean(logs))
        result.hours_ratio = math.exp(mean)
        if len(logs) > 1:
            half = float(stats.t.ppf((1 + confidence) / 2, len(logs) - 1)) * float(
                np.std(logs, ddof=1) / math.sqrt(len(logs))
            )
            result.ci_low, result.ci_high = math.exp(mean - half), math.exp(mean + half)
    speed = log_ratios(lambda t: t.steps_per_s)
    memory = log_ratios(lambda t: t.peak_mem_mb)
    result.step_speedup = math.exp(float(np.mean(speed))) if speed else math.nan
    result.memory_ratio = math.exp(float(np.mean(memory))) if memory else math.nan
    if basis == "gpu":
        shares = {
            p: _median([t.gpu_fraction for sides in paired for t in sides[p]])
            for p in (reference, other)
        }
        if shares[reference] > 0 and shares[other] > 0:
            result.trials_per_gpu = shares[reference] / shares[other]
    return result


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _median(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return float(np.median(finite)) if finite else math.nan
