"""Search efficiency: trial-epochs that random, TPE, TPE+ASHA and PSO need to reach a target
validation Sharpe on the synthetic task, side by side in one run.

    .venv/bin/python bench/search_efficiency.py           # full: 40 seeds, ~30 min on 2 cores
    .venv/bin/python bench/search_efficiency.py --smoke   # tiny task and budget, < 60 s
    .venv/bin/python bench/search_efficiency.py --cache /tmp/se.json  # keep learning curves:
                                                          # a rerun takes ~6 min
    options: --seeds N --budget EPOCHS --concurrency C --target-fraction F
             --also-fractions F,F --searchers random,tpe,tpe+asha,pso,random+asha

Results, settings and machine notes: bench/README.md, "Search efficiency".

Every searcher is hpo's own :class:`~hpo.search.sweep_searcher.SweepSearcher`, driven
in-process the way Tune drives it, ``concurrency`` trials at once; every trial is the real
:class:`~trainables.trainer.Trainer` on a KAN over the synthetic bars (``signal = 0.3``),
metric ``val_sharpe``. Sampled parameters are snapped to a grid (log floats to 1/4 decade,
linear floats to 1/8 of their range, log ints to powers of two; other ints and choices as
they are) and each snapped configuration's learning curve is computed once, lazily; cost
counts trial-epochs as if every trial ran. ASHA is the product's rungs, run in-process
(:class:`hpo.rungs.AshaRungs`, Ray's rule). A run reaches the target (``target_fraction``
x the best value any run found) at the first trial completion at or above it. Per searcher: median trial-epochs to target,
its ratio to random search's with a 95% bootstrap interval, and the share of runs that
reached the target. Method in full: docs/search.md#the-search-efficiency-benchmark

Population-based training is not a searcher here: an exploit changes a trial's weights
mid-training, so it cannot read memoized curves. ``bench/pbt_search.py`` runs it on this
task and space (:class:`Task`) against ASHA and random search at equal member-epochs,
every trial trained for real (bench/README.md, "PBT against ASHA and random").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from hpo.rungs import AshaRungs
from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import SweepSpec, parse_spec
from models.base import Choice, Dim, Float
from trainables.config import TrialConfig

SEARCHERS: dict[str, tuple[str, bool]] = {  # label -> (spec search, ASHA)
    "random": ("random", False),
    "tpe": ("tpe", False),
    "tpe+asha": ("tpe", True),
    "pso": ("pso", False),
    "random+asha": ("random", True),
}
DEFAULT_SEARCHERS = ("random", "tpe", "tpe+asha", "pso", "random+asha")
SMOKE_SEARCHERS = ("random", "tpe", "tpe+asha", "pso")


@dataclass(frozen=True)
class Task:
    """The synthetic task: data, walk-forward split, trainer settings and search space."""

    n_assets: int = 4
    n_bars: int = 1200
    signal: float = 0.3
    val_fraction: float = 0.3
    test_fraction: float = 0.1
    lookback: int = 8
    batch_size: int = 64
    max_steps_per_epoch: int = 12
    max_epochs: int = 8
    window: int | None = None
    """None: the adapter's window range; a number fixes it."""
    per_decade: int = 4
    """Grid points per decade that log-scaled floats snap to."""

    def spec(self, search: str, asha: bool, seed: int, samples: int) -> SweepSpec:
        return parse_spec(
            self.spec_table(search, asha, seed, samples), source="bench/search_efficiency.py"
        )

    def spec_table(self, search: str, asha: bool, seed: int, samples: int) -> dict[str, Any]:
        """The sweep spec of :meth:`spec`, unparsed (bench/pbt_search.py changes its
        scheduler and grouping)."""
        return {
            "name": "search-efficiency",
            "families": ["kan"],
            "precisions": ["f32"],
            "seeds": [0],
            "samples": samples,
            # One configuration per trial: the searchers' efficiency per configuration
            # (group trials ask several of one shape at a time, a different search).
            "grouping": {"group_size": 1},
            "search": search,
            "search_seed": seed,
            "scheduler": "asha" if asha else "fifo",
            "max_epochs": self.max_epochs,
            "grace_epochs": 1,
            "data": {
                "n_assets": self.n_assets,
                "n_bars": self.n_bars,
                "signal": self.signal,
                "seed": 0,
            },
            "walk_forward": {
                "n_folds": 1,
                "val_fraction": self.val_fraction,
                "test_fraction": self.test_fraction,
            },
            "trainer": {
                "lookback": self.lookback,
                "batch_size": self.batch_size,
                "max_steps_per_epoch": self.max_steps_per_epoch,
            },
            "search_space": {
                "kan": {
                    "lr": {"low": 1e-5, "high": 1.0, "log": True},
                    "weight_decay": 0.0,
                    # width and window: the adapter's own ranges
                    **({} if self.window is None else {"window": self.window}),
                    "n_layers": 1,
                    "grid_size": 5,
                    "spline_order": 3,
                    "grid_eps": 0.02,
                    "grid_update_epochs": 3,
                    "reg_lambda": 1e-4,
                    "reg_entropy": 1.0,
                    "position_scale": 4.0,
                }
            },
        }


FULL = Task()
SMOKE = Task(
    n_assets=2,
    n_bars=500,
    batch_size=16,
    max_steps_per_epoch=4,
    max_epochs=2,
    window=1,
    per_decade=1,
)


# -- ASHA ---------------------------------------------------------------------------------------

# -- the objective: the real trainer, memoized per snapped configuration -------------------------


def snap(dim: Dim, value: Any, per_decade: int = 4) -> Any:
    """The grid point a sampled value trains at (see the module docstring)."""
    if isinstance(dim, Choice):
        return value
    if isinstance(dim, Float):
        if dim.log:
            x = 10 ** (round(per_decade * math.log10(value)) / per_decade)
        else:
            step = (dim.high - dim.low) / 8
            x = dim.low + round((value - dim.low) / step) * step
        return float(min(max(x, dim.low), dim.high))
    if dim.log:
        return int(min(max(2 ** round(math.log2(value)), dim.low), dim.high))
    return int(value)


@dataclass
class _Live:
    trainer: Any
    rng: torch.Tensor


class Landscape:
    """``value(config, epoch)``: the trial's ``val_sharpe`` after ``epoch`` epochs."""

    def __init__(
        self, dims: dict[str, Dim], max_epochs: int, per_decade: int = 4, keep_live: int = 512
    ) -> None:
        self.dims = dims
        self.max_epochs = max_epochs
        self.per_decade = per_decade
        self.keep_live = keep_live
        self.curves: dict[str, list[float]] = {}
        self.live: OrderedDict[str, _Live] = OrderedDict()
        self.epochs_trained = 0
        self.train_seconds = 0.0

    def key(self, config: dict[str, Any]) -> tuple[str, TrialConfig]:
        """The snapped configuration's cache key, and the trial it trains as."""
        trial = TrialConfig.from_dict(config)
        params = dict(trial.params)
        for name, dim in self.dims.items():
            params[name] = snap(dim, params[name], self.per_decade)
        return json.dumps(params, sort_keys=True), dataclasses.replace(trial, params=params)

    def value(self, config: dict[str, Any], epoch: int) -> float:
        key, trial = self.key(config)
        curve = self.curves.setdefault(key, [])
        if len(curve) < epoch:
            self._extend(key, trial, curve, epoch)
        return curve[epoch - 1]

    def _extend(self, key: str, trial: TrialConfig, curve: list[float], epoch: int) -> None:
        from trainables.fold_run import TrialDiverged
        from trainables.trainer import Trainer

        started = time.perf_counter()
        live = self.live.pop(key, None)
        if live is None or live.trainer.epoch != len(curve):
            torch.manual_seed(0)
            trainer = Trainer(trial.train_config())
            live = _Live(trainer, torch.get_rng_state())
            replay = len(curve)  # evicted earlier: retrain the known prefix, check it agrees
        else:
            replay = 0
        torch.set_rng_state(live.rng)  # each trial draws from its own global stream
        trainer = live.trainer
        while trainer.epoch < epoch:
            try:
                sharpe = float(trainer.train_epoch()["val_sharpe"])
            except TrialDiverged:  # the trainable reports NaN and ends the trial
                sharpe = math.nan
            self.epochs_trained += 1
            if trainer.epoch <= replay:
                known = curve[trainer.epoch - 1]
                assert known == sharpe or (math.isnan(known) and math.isnan(sharpe)), key
            else:
                curve.append(sharpe)
            if math.isnan(sharpe):
                curve.extend([math.nan] * (self.max_epochs - len(curve)))
                break
        live.rng = torch.get_rng_state()
        if len(curve) < self.max_epochs:
            self.live[key] = live
            while len(self.live) > self.keep_live:
                self.live.popitem(last=False)
        self.train_seconds += time.perf_counter() - started

    # -- disk cache (curves only) --------------------------------------------------------------
    def load(self, path: Path, fingerprint: str) -> None:
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("task") == fingerprint:
                self.curves = {
                    k: [math.nan if v is None else v for v in c] for k, c in saved["curves"].items()
                }

    def save(self, path: Path, fingerprint: str) -> None:
        curves = {
            k: [None if math.isnan(v) else v for v in c]
            for k, c in self.curves.items()
            if len(c) == self.max_epochs  # partial curves would need their live trainer
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps({"task": fingerprint, "curves": curves}))
        tmp.replace(path)


# -- one search run ------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    seed: int
    completions: list[tuple[int, float]] = field(default_factory=list)  # (epochs spent, value)
    trials: int = 0
    epochs: int = 0

    def epochs_to(self, target: float) -> float:
        for spent, value in self.completions:
            if value >= target:
                return spent
        return math.inf

    def best(self) -> float:
        finite = [v for _, v in self.completions if math.isfinite(v)]
        return max(finite) if finite else math.nan


@dataclass
class _Running:
    trial_id: str
    config: dict[str, Any]
    epoch: int = 0


def run_search(
    label: str, seed: int, task: Task, landscape: Landscape, budget: int, concurrency: int
) -> Run:
    search, asha = SEARCHERS[label]
    spec = task.spec(search, asha, seed, samples=budget + concurrency)
    searcher = SweepSearcher(spec)
    scheduler = AshaRungs(grace=1, max_t=task.max_epochs, reduction_factor=2) if asha else None
    run = Run(label, seed)
    slots: list[_Running | None] = [None] * concurrency
    while run.epochs < budget:
        for i, slot in enumerate(slots):  # free slots take the next suggestion at once
            if slot is None:
                trial_id = f"{label}-{seed}-{run.trials:04d}"
                config = searcher.suggest(trial_id)
                if not isinstance(config, dict):
                    continue
                slots[i] = _Running(trial_id, config)
                run.trials += 1
        if all(slot is None for slot in slots):
            break
        for i, trial in enumerate(slots):  # one epoch of every running trial
            if trial is None or run.epochs >= budget:
                continue
            trial.epoch += 1
            run.epochs += 1
            value = landscape.value(trial.config, trial.epoch)
            done = math.isnan(value) or trial.epoch >= task.max_epochs
            if scheduler is not None:
                done = not scheduler.keep(trial.trial_id, trial.epoch, value) or done
            if done:
                searcher.on_trial_complete(
                    trial.trial_id, {"val_sharpe": value, "epoch": trial.epoch}
                )
                run.completions.append((run.epochs, value))
                slots[i] = None
    return run


# -- report --------------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    ordered = sorted(values)  # +inf (missed) sorts last
    n = len(ordered)
    mid = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return float(mid)


def _fmt(x: float, digits: int = 0) -> str:
    if math.isinf(x):
        return "inf"
    if math.isnan(x):
        return "n/a"
    return f"{x:.{digits}f}"


def _ratio(mine: float, base: float, budget: int) -> str:
    """``mine / base``; when random's median is censored (> budget) only a bound is known."""
    if math.isinf(base):
        return "n/a" if math.isinf(mine) else f"<{mine / budget:.2f}"
    return _fmt(mine / base, 2)


def _ratio_ci(mine: list[float], base: list[float], n_boot: int = 2000) -> str:
    """95% percentile-bootstrap interval of the ratio of medians (runs resampled per searcher)."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(mine), np.asarray(base)
    ratios = []
    for _ in range(n_boot):
        num = np.median(rng.choice(a, a.size))
        den = np.median(rng.choice(b, b.size))
        ratios.append(num / den if math.isfinite(den) else math.nan)
    ratios_arr = np.asarray(ratios)
    if np.isnan(ratios_arr).mean() > 0.025:
        return "n/a"
    low, high = np.nanpercentile(ratios_arr, [2.5, 97.5])
    return f"[{_fmt(float(low), 2)}, {_fmt(float(high), 2)}]"


def report(
    runs: list[Run],
    labels: list[str],
    target_fraction: float,
    budget: int,
    also: tuple[float, ...] = (),
) -> list[str]:
    best = max(r.best() for r in runs if math.isfinite(r.best()))

    def medians(target: float) -> dict[str, float]:
        return {
            label: _median([r.epochs_to(target) for r in runs if r.label == label])
            for label in labels
        }

    def reached(label: str, target: float) -> tuple[int, int]:
        mine = [r for r in runs if r.label == label]
        return sum(math.isfinite(r.epochs_to(target)) for r in mine), len(mine)

    target = target_fraction * best
    med = medians(target)
    base = med.get("random", math.nan)  # no random row: ratios are n/a
    lines = [
        f"target val_sharpe = {target_fraction:g} x best found across all runs "
        f"({best:.3f}) = {target:.3f}; budget {budget} trial-epochs per run",
        "",
        "| searcher | runs | reached target | median trial-epochs to target "
        "| ratio to random | 95% CI of ratio | median trials run | median best val_sharpe |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    random_epochs = [r.epochs_to(target) for r in runs if r.label == "random"]
    for label in labels:
        mine = [r for r in runs if r.label == label]
        hit, n = reached(label, target)
        ci = _ratio_ci([r.epochs_to(target) for r in mine], random_epochs) if random_epochs else ""
        lines.append(
            f"| {label} | {n} | {hit}/{n} ({hit / n:.0%}) | {_fmt(med[label], 0)} "
            f"| {_ratio(med[label], base, budget)} | {ci} "
            f"| {statistics.median(r.trials for r in mine):.0f} "
            f"| {statistics.median(r.best() for r in mine):.3f} |"
        )
    lines.append("")
    lines.append("trial-epochs to target per run (seed order; inf = missed):")
    for label in labels:
        per_seed = [_fmt(r.epochs_to(target)) for r in runs if r.label == label]
        lines.append(f"  {label:<12} {' '.join(per_seed)}")
    if also:
        fractions = sorted({*also, target_fraction})
        lines += [
            "",
            "other targets: median trial-epochs to target (ratio to random; runs that reached it)",
            "",
            "| searcher | "
            + " | ".join(f"{f:g} x best = {f * best:.2f}" for f in fractions)
            + " |",
            "|---|" + "---:|" * len(fractions),
        ]
        by_fraction = {f: medians(f * best) for f in fractions}
        for label in labels:
            cells = []
            for f in fractions:
                m = by_fraction[f]
                hit, n = reached(label, f * best)
                cells.append(
                    f"{_fmt(m[label])} ({_ratio(m[label], m['random'], budget)}; {hit}/{n})"
                    if "random" in m
                    else f"{_fmt(m[label])} ({hit}/{n})"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny task and budget (< 60 s)")
    parser.add_argument("--seeds", type=int, default=None, help="search seeds per searcher")
    parser.add_argument("--budget", type=int, default=None, help="trial-epochs per run")
    parser.add_argument("--concurrency", type=int, default=None, help="trials at once")
    parser.add_argument(
        "--target-fraction", type=float, default=None, help="of the best found (0.9; smoke 0.5)"
    )
    parser.add_argument(
        "--also-fractions",
        default=None,
        help="more target fractions for the second table (0.8,0.95,0.97; smoke: none)",
    )
    parser.add_argument("--searchers", default=None, help=f"comma-separated, of {list(SEARCHERS)}")
    parser.add_argument("--cache", type=Path, default=None, help="JSON file of learning curves")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    task = SMOKE if args.smoke else FULL
    seeds = args.seeds or (3 if args.smoke else 40)
    budget = args.budget or (8 if args.smoke else 128 * task.max_epochs)
    concurrency = args.concurrency or (2 if args.smoke else 4)
    target_fraction = args.target_fraction or (0.5 if args.smoke else 0.9)
    also_text = (
        args.also_fractions
        if args.also_fractions is not None
        else ("" if args.smoke else "0.8,0.95,0.97")
    )
    also = tuple(float(f) for f in also_text.split(",") if f.strip())
    searchers = args.searchers or ",".join(SMOKE_SEARCHERS if args.smoke else DEFAULT_SEARCHERS)
    labels = [s.strip() for s in searchers.split(",") if s.strip()]
    unknown = [s for s in labels if s not in SEARCHERS]
    if unknown:
        parser.error(f"unknown searcher(s) {unknown}; known: {list(SEARCHERS)}")

    started = time.perf_counter()
    space = SweepSearcher(task.spec("random", False, 0, 1)).spaces[0]
    landscape = Landscape(space.dims, task.max_epochs, task.per_decade)
    fingerprint = json.dumps({"task": task.__dict__, "dims": repr(space.dims)}, sort_keys=True)
    if args.cache:
        landscape.load(args.cache, fingerprint)
    print(
        f"search efficiency: kan on synthetic bars (signal {task.signal}, {task.n_assets} assets x "
        f"{task.n_bars} bars), max_t {task.max_epochs} epochs, concurrency {concurrency}, "
        f"budget {budget} trial-epochs, {seeds} seeds, searched: {sorted(space.dims)}",
        flush=True,
    )
    runs = []
    for label in labels:
        mine = [
            run_search(label, seed, task, landscape, budget, concurrency) for seed in range(seeds)
        ]
        runs += mine
        print(
            f"  {label:<12} {seeds} runs: median {statistics.median(r.trials for r in mine):.0f} "
            f"trials, best {max(r.best() for r in mine):.3f} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
        if args.cache:
            landscape.save(args.cache, fingerprint)
    print()
    for line in report(runs, labels, target_fraction, budget, also):
        print(line)
    wall = time.perf_counter() - started
    print()
    print(
        f"wall {wall:.0f} s; trainer epochs actually computed {landscape.epochs_trained} "
        f"({landscape.train_seconds:.0f} s) for {sum(r.epochs for r in runs)} counted "
        f"trial-epochs; {len(landscape.curves)} distinct snapped configs; "
        f"torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
