"""PBT against ASHA and random search at equal member-epochs on the planted task of
bench/search_efficiency.py: the best validation Sharpe each finds and the held-out test
Sharpe of the trial validation chose, side by side in one run.

    .venv/bin/python bench/pbt_search.py           # full: 20 seeds, ~10 min on 2 cores
    .venv/bin/python bench/pbt_search.py --smoke   # tiny task, 2 seeds, a few seconds
    options: --seeds N --members N --intervals 1,2,4 --populations 1,2,4 --asha-sizes 2
             --concurrency C --workers W --no-population --no-random

Results and what they say: bench/README.md, "PBT against ASHA and random".

PBT cannot use search_efficiency.py's memoized learning curves (an exploit changes a
trial's weights mid-training), so every trial here trains for real, once. Per search seed,
on search_efficiency's task and space (KAN, synthetic bars with ``signal = 0.3``, lr log
[1e-5, 1], width and window the adapter's ranges, ``max_epochs`` 8):

* ``pbt-iK``: one population of ``members`` trials as hpo's own sweep searcher draws it
  for ``scheduler = "pbt"`` (``search = "random"``, one ask of ``members`` configurations
  whose shape, width and window, is drawn once and held; lr drawn per trial), trained as
  one :class:`~trainables.group.TrainerGroup` with
  :meth:`~trainables.population.Population.after_epoch` after every epoch
  (``interval_epochs = K``, quantile 0.25, resample probability 0.25, mutations the
  spec's defaults: lr on its log range), ``max_epochs`` epochs: ``members x max_epochs``
  member-epochs.
* ``pbt-iKxP`` (``--populations``): the same members split into ``P`` populations of
  ``members / P``, each its own ask and so its own shape (``pbt.population_size``),
  trained in lockstep: what searching shapes adds.
* ``population``: the same population trained without exploits (what PBT adds to it).
* ``pbt-iK/S+asha`` (``--asha-sizes``): PBT with ASHA across populations
  (``pbt.early_stopping = "asha"``): populations of ``S`` drawn one ask at a time (each its
  own shape), ``concurrency / S`` at a time, each asking ASHA's rungs with its best
  trial's validation Sharpe after each epoch, before it exploits, as the sweep's group
  trials ask the sweep's rungs, until the same member-epochs are spent: more shapes
  tried, the poor ones stopped early.
* ``random+asha``: random search over the whole space (every trial its own draw, as in
  search_efficiency.py), ``concurrency`` trials at a time, each stopped by
  :class:`hpo.rungs.AshaRungs` (Ray's rule: grace 1, reduction factor 2, rungs 1, 2, 4),
  until the same ``members x max_epochs`` member-epochs are spent.
* ``random``: the same without early stopping (``members`` full trials).

Every trial is the real :class:`~trainables.trainer.Trainer` (alone, or in the group).
A trial's result is its last reported epoch (a PBT member's is its final epoch; a trial
ASHA stopped, its stopping epoch; a trial still running when the budget ran out, its
last epoch; a diverged trial has none): what ``hpo best`` ranks. A run's **best
validation Sharpe** is the highest of its trials' results, and its **test Sharpe** that
trial's ``test_sharpe`` at the same epoch (the held-out split no search decision reads).
Across seeds: medians, and each method's median minus ASHA's with a 95% percentile
bootstrap interval (runs resampled per method).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from bench.search_efficiency import FULL, SMOKE, Task
from hpo.rungs import ASHA_REDUCTION_FACTOR, AshaRungs
from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import parse_spec
from trainables.config import GroupTrialConfig, TrialConfig
from trainables.trial_keys import trial_key

BASELINE = "random+asha"


@dataclass
class Outcome:
    """One method's run on one search seed."""

    method: str
    seed: int
    best_val: float = math.nan
    test: float = math.nan
    trials: int = 0
    member_epochs: int = 0
    seconds: float = 0.0
    exploits: int = 0
    ancestors: int = 0
    """Populations: distinct initial trials the surviving members descend from at the end."""
    leader_won: bool | None = None
    """Populations: whether the chosen trial descends from the epoch-1 leader."""
    chosen: dict[str, Any] = field(default_factory=dict)


def _choose(results: dict[Any, tuple[float, float]]) -> tuple[Any, float, float]:
    """The trial validation chooses among ``results`` (trial -> (val, test) of its last
    epoch): the highest finite validation Sharpe."""
    finite = {k: v for k, v in results.items() if math.isfinite(v[0])}
    if not finite:
        return None, math.nan, math.nan
    key = max(finite, key=lambda k: finite[k][0])
    return key, finite[key][0], finite[key][1]


def _pair(metrics: dict[str, Any]) -> tuple[float, float]:
    return float(metrics["val_sharpe"]), float(metrics.get("test_sharpe", math.nan))


def population_trials(
    task: Task, seed: int, members: int, interval: int, populations: int = 1
) -> list[GroupTrialConfig]:
    """The populations hpo's searcher draws for ``scheduler = "pbt"`` on search seed
    ``seed``: ``populations`` group trials of ``members / populations`` configurations,
    each of its own shape (``pbt.population_size``)."""
    size = members // populations
    table = task.spec_table("random", False, seed, samples=members)
    table.update(
        scheduler="pbt",
        grouping={"group_size": size},
        pbt={"interval_epochs": interval, "population_size": size},
    )
    searcher = SweepSearcher(parse_spec(table, source="bench/pbt_search.py"))
    groups = []
    for index in range(populations):
        config = searcher.suggest(f"pbt-{seed}-{index}")
        assert isinstance(config, dict)
        group = GroupTrialConfig.from_dict(config)
        assert len(group.trials) == size and group.pbt is not None, config
        groups.append(group)
    return groups


def run_population(
    task: Task,
    seed: int,
    members: int,
    interval: int | None,
    default_interval: int,
    populations: int = 1,
) -> Outcome:
    """Populations trained as groups, in lockstep: with exploits every ``interval``
    epochs (PBT), or none (``interval`` None; the same draws as PBT's at
    ``default_interval``)."""
    from trainables.group import TrainerGroup
    from trainables.population import Population

    started = time.perf_counter()
    drawn = population_trials(task, seed, members, interval or default_interval, populations)
    groups = [TrainerGroup([t.train_config() for t in d.trials]) for d in drawn]
    runs = []
    for d, group in zip(drawn, groups, strict=True):
        population = None
        if interval is not None:
            assert d.pbt is not None
            identity = f"{trial_key(d.trials[0].to_dict())}|search-seed-{seed}"
            population = Population(group, d.pbt, identity)
        runs.append((group, population))
    results: dict[tuple[int, int], tuple[float, float]] = {}
    leader: tuple[int, int] | None = None
    while any(group.training for group in groups):
        for g, (group, population) in enumerate(runs):
            if not group.training:
                continue
            metrics = group.train_epoch()
            for index, m in metrics.items():
                results[g, index] = _pair(m)
            for index in group.diverged:
                results[g, index] = (math.nan, math.nan)
            if population is not None:
                population.after_epoch(metrics)
        if leader is None:
            leader, _, _ = _choose(results)
    ancestor = {(g, i): (g, i) for g, group in enumerate(groups) for i in range(len(group.trials))}
    for g, group in enumerate(groups):
        for record in group.exploits:
            ancestor[g, record.recipient] = ancestor[g, record.donor]
    chosen, best_val, test = _choose(results)
    alive = [
        (g, i)
        for g, group in enumerate(groups)
        for i in range(len(group.trials))
        if i not in group.diverged
    ]
    label = "population" if interval is None else _pbt_label(interval, populations)
    return Outcome(
        method=label,
        seed=seed,
        best_val=best_val,
        test=test,
        trials=members,
        member_epochs=sum(t.epoch for group in groups for t in group.trials),
        seconds=time.perf_counter() - started,
        exploits=sum(len(group.exploits) for group in groups),
        ancestors=len({ancestor[key] for key in alive}),
        leader_won=None if chosen is None else ancestor[chosen] == leader,
        chosen={} if chosen is None else groups[chosen[0]].mutable_settings(chosen[1]),
    )


def _pbt_label(interval: int, populations: int) -> str:
    """``pbt-iK`` for one population, ``pbt-iKxP`` for P populations of its members."""
    return f"pbt-i{interval}" + (f"x{populations}" if populations > 1 else "")


def _parse_pbt_label(method: str) -> tuple[int, int]:
    interval, _, populations = method.removeprefix("pbt-i").partition("x")
    return int(interval), int(populations or 1)


def _pbt_asha_label(interval: int, size: int) -> str:
    """``pbt-iK/S+asha``: populations of S, exploiting every K epochs, stopped by ASHA."""
    return f"pbt-i{interval}/{size}+asha"


def _parse_pbt_asha_label(method: str) -> tuple[int, int]:
    interval, _, size = method.removeprefix("pbt-i").removesuffix("+asha").partition("/")
    return int(interval), int(size)


@dataclass
class _RunningPopulation:
    index: int
    group: Any
    population: Any


def run_pbt_asha(
    task: Task, seed: int, budget: int, interval: int, size: int, concurrency: int
) -> Outcome:
    """``pbt.early_stopping = "asha"``: populations of ``size`` drawn one ask at a time (each
    its own shape), ``concurrency // size`` trained at a time, each a group trial with
    exploits every ``interval`` epochs that asks the rungs (Ray's rule) with its best
    trial's validation Sharpe after each epoch, before exploiting, as the product's group
    trial asks the sweep's rungs; drawn until ``budget`` member-epochs are spent (a
    population's epoch spends ``size`` of them, so the last may overshoot by up to
    ``size - 1`` where ``size`` does not divide the budget)."""
    from trainables.group import TrainerGroup
    from trainables.population import Population

    started = time.perf_counter()
    table = task.spec_table("random", False, seed, samples=size * (budget + concurrency))
    table.update(
        scheduler="pbt",
        grouping={"group_size": size},
        pbt={"interval_epochs": interval, "population_size": size, "early_stopping": "asha"},
    )
    searcher = SweepSearcher(parse_spec(table, source="bench/pbt_search.py"))
    rungs = AshaRungs(grace=1, max_t=task.max_epochs, reduction_factor=ASHA_REDUCTION_FACTOR)
    results: dict[tuple[int, int], tuple[float, float]] = {}
    groups: list[Any] = []
    slots: list[_RunningPopulation | None] = [None] * max(1, concurrency // size)
    spent = 0
    while spent < budget:
        for i, slot in enumerate(slots):
            if slot is None:
                config = searcher.suggest(f"pbt-asha-{seed}-{len(groups):04d}")
                assert isinstance(config, dict), config
                drawn = GroupTrialConfig.from_dict(config)
                assert drawn.pbt is not None and len(drawn.trials) == size, config
                group = TrainerGroup([t.train_config() for t in drawn.trials])
                identity = f"{trial_key(drawn.trials[0].to_dict())}|search-seed-{seed}"
                slots[i] = _RunningPopulation(
                    len(groups), group, Population(group, drawn.pbt, identity)
                )
                groups.append(group)
        for i, running in enumerate(slots):
            if running is None or spent >= budget:
                continue
            group, g = running.group, running.index
            metrics = group.train_epoch()
            spent += len(metrics)
            for index, m in metrics.items():
                results[g, index] = _pair(m)
            for index in group.diverged:
                results[g, index] = (math.nan, math.nan)
            # As trainables.trial._population_kept: the rungs asked with the population's
            # best validation Sharpe this epoch, before its exploits (never at its last).
            finite = [
                results[g, index][0] for index in metrics if math.isfinite(results[g, index][0])
            ]
            value = max(finite) if finite else math.nan
            epoch = max(t.epoch for t in group.trials)
            if not group.training or not rungs.keep(f"population-{g}", epoch, value):
                slots[i] = None
            else:
                running.population.after_epoch(metrics)
    chosen, best_val, test = _choose(results)
    return Outcome(
        method=_pbt_asha_label(interval, size),
        seed=seed,
        best_val=best_val,
        test=test,
        trials=size * len(groups),
        member_epochs=spent,
        seconds=time.perf_counter() - started,
        exploits=sum(len(group.exploits) for group in groups),
        chosen={} if chosen is None else groups[chosen[0]].mutable_settings(chosen[1]),
    )


@dataclass
class _Running:
    trial_id: str
    trainer: Any


def run_random(task: Task, seed: int, budget: int, asha: bool, concurrency: int) -> Outcome:
    """Random search over the whole space, ``concurrency`` trials at a time (a free slot
    takes the next draw at once), with ASHA or without, until ``budget`` member-epochs."""
    from trainables.fold_run import TrialDiverged
    from trainables.trainer import Trainer

    started = time.perf_counter()
    label = "random+asha" if asha else "random"
    searcher = SweepSearcher(task.spec("random", asha, seed, samples=budget + concurrency))
    rungs = (
        AshaRungs(grace=1, max_t=task.max_epochs, reduction_factor=ASHA_REDUCTION_FACTOR)
        if asha
        else None
    )
    results: dict[str, tuple[float, float]] = {}
    slots: list[_Running | None] = [None] * concurrency
    spent = trials = 0
    while spent < budget:
        for i, slot in enumerate(slots):
            if slot is None:
                trial_id = f"{label}-{seed}-{trials:04d}"
                config = searcher.suggest(trial_id)
                if not isinstance(config, dict):
                    continue
                slots[i] = _Running(trial_id, Trainer(TrialConfig.from_dict(config).train_config()))
                trials += 1
        if all(slot is None for slot in slots):
            break
        for i, running in enumerate(slots):
            if running is None or spent >= budget:
                continue
            try:
                results[running.trial_id] = _pair(running.trainer.train_epoch())
            except TrialDiverged:  # the trainable reports NaN and ends the trial
                results[running.trial_id] = (math.nan, math.nan)
            spent += 1
            epoch = running.trainer.epoch
            value = results[running.trial_id][0]
            done = math.isnan(value) or epoch >= task.max_epochs
            if rungs is not None:
                done = not rungs.keep(running.trial_id, epoch, value) or done
            if done:
                searcher.on_trial_complete(running.trial_id, {"val_sharpe": value, "epoch": epoch})
                slots[i] = None
    _, best_val, test = _choose(results)
    return Outcome(
        method=label,
        seed=seed,
        best_val=best_val,
        test=test,
        trials=trials,
        member_epochs=spent,
        seconds=time.perf_counter() - started,
    )


@dataclass(frozen=True)
class Job:
    task: Task
    method: str
    seed: int
    members: int
    concurrency: int
    default_interval: int


def run_job(job: Job) -> Outcome:
    torch.set_num_threads(1)
    budget = job.members * job.task.max_epochs
    if job.method in ("random", "random+asha"):
        return run_random(job.task, job.seed, budget, job.method == "random+asha", job.concurrency)
    if job.method == "population":
        return run_population(job.task, job.seed, job.members, None, job.default_interval)
    if job.method.endswith("+asha"):
        interval, size = _parse_pbt_asha_label(job.method)
        return run_pbt_asha(job.task, job.seed, budget, interval, size, job.concurrency)
    interval, populations = _parse_pbt_label(job.method)
    return run_population(
        job.task, job.seed, job.members, interval, job.default_interval, populations
    )


# -- report --------------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def _diff_ci(mine: Sequence[float], base: Sequence[float], n_boot: int = 2000) -> str:
    """Median of ``mine`` minus median of ``base``, with its 95% percentile-bootstrap
    interval (each resampled on its own)."""
    a = np.asarray([v for v in mine if not math.isnan(v)])
    b = np.asarray([v for v in base if not math.isnan(v)])
    if not a.size or not b.size:
        return "n/a"
    rng = np.random.default_rng(0)
    diffs = [
        float(np.median(rng.choice(a, a.size)) - np.median(rng.choice(b, b.size)))
        for _ in range(n_boot)
    ]
    low, high = np.percentile(diffs, [2.5, 97.5])
    return f"{np.median(a) - np.median(b):+.2f} [{low:+.2f}, {high:+.2f}]"


def report(outcomes: list[Outcome], methods: list[str]) -> list[str]:
    by = {m: [o for o in outcomes if o.method == m] for m in methods}
    base = by.get(BASELINE, [])
    lines = [
        "| method | runs | median trials | median member-epochs | median best val_sharpe "
        f"| minus {BASELINE} [95% CI] | median test_sharpe of chosen "
        f"| minus {BASELINE} [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        mine = by[method]
        val, test = [o.best_val for o in mine], [o.test for o in mine]
        lines.append(
            f"| {method} | {len(mine)} | {statistics.median(o.trials for o in mine):.0f} "
            f"| {statistics.median(o.member_epochs for o in mine):.0f} "
            f"| {_median(val):.3f} | {_diff_ci(val, [o.best_val for o in base])} "
            f"| {_median(test):.3f} | {_diff_ci(test, [o.test for o in base])} |"
        )
    populations = [
        m for m in methods if m == "population" or (m.startswith("pbt-i") and "+asha" not in m)
    ]
    if populations:
        lines += [
            "",
            "| population | median exploits | median distinct ancestors at the end "
            "| chosen trial descends from the epoch-1 leader | median lr of chosen |",
            "|---|---:|---:|---:|---:|",
        ]
        for method in populations:
            mine = by[method]
            won = [o.leader_won for o in mine if o.leader_won is not None]
            lrs = [float(o.chosen["lr"]) for o in mine if "lr" in o.chosen]
            lines.append(
                f"| {method} | {statistics.median(o.exploits for o in mine):.0f} "
                f"| {statistics.median(o.ancestors for o in mine):.0f} "
                f"| {sum(won)}/{len(won)} | {_median(lrs):.2g} |"
            )
    lines += ["", "best val_sharpe / test_sharpe of chosen, per run (seed order):"]
    for method in methods:
        cells = " ".join(f"{o.best_val:.2f}/{o.test:.2f}" for o in by[method])
        lines.append(f"  {method:<12} {cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny task, 2 seeds, seconds")
    parser.add_argument("--seeds", type=int, default=None, help="search seeds (20; smoke 2)")
    parser.add_argument("--members", type=int, default=None, help="population size (8; smoke 4)")
    parser.add_argument("--intervals", default=None, help="PBT interval_epochs (1,2,4; smoke 1)")
    parser.add_argument(
        "--populations",
        default="1",
        help="populations the members split into, each of its own shape (1; e.g. 1,2,4)",
    )
    parser.add_argument(
        "--asha-sizes",
        default="",
        help="population sizes for PBT with ASHA across populations (pbt-iK/S+asha; e.g. 2)",
    )
    parser.add_argument("--no-random", action="store_true", help="skip the random row")
    parser.add_argument("--concurrency", type=int, default=None, help="ASHA/random slots (4)")
    parser.add_argument("--workers", type=int, default=None, help="processes (2; smoke 1)")
    parser.add_argument("--no-population", action="store_true", help="skip the no-exploit row")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    task = SMOKE if args.smoke else FULL
    seeds = args.seeds or (2 if args.smoke else 20)
    members = args.members or (4 if args.smoke else 8)
    intervals_text = args.intervals or ("1" if args.smoke else "1,2,4")
    intervals = [int(k) for k in intervals_text.split(",") if k.strip()]
    concurrency = args.concurrency or (2 if args.smoke else 4)
    workers = args.workers or (1 if args.smoke else 2)
    bad = [k for k in intervals if not 1 <= k < task.max_epochs]
    if bad:
        parser.error(f"intervals {bad}: each must be in [1, max_epochs = {task.max_epochs})")
    splits = [int(p) for p in args.populations.split(",") if p.strip()]
    uneven = [p for p in splits if p < 1 or members % p or members // p < 2]
    if uneven:
        parser.error(f"populations {uneven}: each must split {members} members into 2 or more")
    asha_sizes = [int(p) for p in args.asha_sizes.split(",") if p.strip()]
    if any(size < 2 or concurrency % size for size in asha_sizes):
        parser.error(
            f"asha-sizes {asha_sizes}: a population has 2 or more trials, and the trials at a "
            f"time ({concurrency}) are whole populations"
        )
    methods = [
        *(_pbt_label(k, p) for p in splits for k in intervals),
        *(_pbt_asha_label(k, size) for size in asha_sizes for k in intervals),
        *([] if args.no_population else ["population"]),
        BASELINE,
        *([] if args.no_random else ["random"]),
    ]
    budget = members * task.max_epochs
    print(
        f"pbt search: kan on synthetic bars (signal {task.signal}, {task.n_assets} assets x "
        f"{task.n_bars} bars), {task.max_epochs} epochs, population {members}, budget "
        f"{budget} member-epochs per run, ASHA/random {concurrency} at a time, {seeds} seeds, "
        f"{workers} worker process(es)",
        flush=True,
    )
    started = time.perf_counter()
    jobs = [
        Job(task, method, seed, members, concurrency, intervals[0])
        for seed in range(seeds)
        for method in methods
    ]
    if workers == 1:
        outcomes = [run_job(job) for job in jobs]
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            outcomes = list(pool.map(run_job, jobs))
    outcomes.sort(key=lambda o: (methods.index(o.method), o.seed))
    for line in report(outcomes, methods):
        print(line)
    wall = time.perf_counter() - started
    per_method = ", ".join(
        f"{m} {sum(o.seconds for o in outcomes if o.method == m):.0f} s" for m in methods
    )
    print()
    print(
        f"wall {wall:.0f} s ({per_method}); torch threads {torch.get_num_threads()}, "
        f"{os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
