"""How long ``hpo compare`` takes on a large comparison sweep, per trial beyond MLflow's
run search: today's reads against the reads as they were, side by side in one run.

    .venv/bin/python bench/compare_scale.py                  # 2,000 trials (minutes)
    .venv/bin/python bench/compare_scale.py --trials 200     # a shorter run
    .venv/bin/python bench/compare_scale.py --smoke          # 24 trials, seconds
    .venv/bin/python bench/compare_scale.py --no-before      # today's reads only
    .venv/bin/python bench/compare_scale.py --dir /tmp/cmp   # keep the store, reuse it
    .venv/bin/python bench/compare_scale.py --rounds 1       # one round (default: 3)

The store is a SQLite MLflow store with a file artifact root (what an embedded sweep
writes) in a temporary directory (or ``--dir``): a sweep parent run and ``--trials`` child
runs tagged as :class:`hpo.tracking.MlflowSweepCallback` tags them (the same constants,
params from :func:`hpo.tracking.trial_params`), f32 and bf16 trials of each
configuration and seed over a few families, each with a short ``val_sharpe`` history and
a returns artifact written by the trainer's own writer
(:func:`trainables.returns_file.returns_csv`) through ``MlflowClient.log_text``, as the
callback logs it. A few trials diverge, run still, or have no returns artifact, as in a
real sweep.

:func:`hpo.compare.comparison_from_mlflow` is then timed on a cold returns cache: "search"
is its MLflow run searches (``_search_page``, a page each), "reads" the trial records, histories and
returns artifacts, "stats" :func:`hpo.compare.compare_trials`; "per trial" is everything
beyond the search divided by the trials; each the median of ``--rounds`` rounds, rows
interleaved. Rows:

* "before": the reads as they were (:func:`one_by_one`): one after another, every
  artifact through ``MlflowClient.download_artifacts`` into a temporary directory, parsed
  a row at a time (``trainables.returns_file``'s row parse).
* "now": as ``hpo compare`` reads (on this store: in place, one thread).
* "now on a pool of 16": the same on the thread pool that a server's reads get.
* "now, no curves": no metric history read (``with_curves=False``), what a comparison
  that draws no curve (the terminal's) needs.

Every row must give the same records as "now", and the script says whether they do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The old path's downloads would draw one progress bar per trial (hpo's CLI sets the same).
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import numpy as np
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from hpo import compare
from hpo.compare import mlflow_reader
from hpo.stats import sharpe_moments
from hpo.tracking import (
    RETURNS_ARTIFACT,
    ROLE_TRIAL,
    TAG_CONFIG,
    TAG_FAILURE,
    TAG_FAMILY,
    TAG_FELL_BACK,
    TAG_PAIR,
    TAG_PARENT,
    TAG_PRECISION,
    TAG_ROLE,
    TAG_SEED,
    TAG_STATUS,
    TAG_SWEEP,
    TAG_TRIAL,
    start_sweep_run,
    trial_params,
    trial_run_name,
)
from trainables import returns_file
from trainables.returns_file import returns_csv

FAMILIES = ("tft", "dqn", "lstm", "tlob", "kan")
PRECISIONS = ("f32", "bf16")
SEEDS = 2
EPOCHS = 3
VAL_BARS = 150  # per fold, 2 folds
TEST_BARS = 150
PERIODS_PER_YEAR = 252
START = np.datetime64("2021-01-04T00:00:00", "ns")
# By default one trial in each of these numbers diverges / is still running / has no
# returns artifact.
DIVERGED_EVERY, UNFINISHED_EVERY, NO_RETURNS_EVERY = 97, 89, 83


@dataclass(frozen=True)
class Store:
    tracking_uri: str
    experiment: str
    parent_run_id: str
    run_ids: list[str]
    """Child run ids in the order they were made."""


@contextmanager
def _unsynced_sqlite() -> Iterator[None]:
    """SQLite connections opened inside skip the fsync of every commit (``synchronous =
    OFF``): MLflow commits several times per call, and on a slow disk building 2,000 runs
    took a quarter of an hour. Reads are the same either way; the store is throwaway."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def unsynced(connection: Any, _record: Any) -> None:
        if type(connection).__module__.startswith("sqlite3"):
            connection.execute("PRAGMA synchronous = OFF")

    event.listen(Engine, "connect", unsynced)
    try:
        yield
    finally:
        event.remove(Engine, "connect", unsynced)


def build_store(
    root: Path,
    trials: int,
    experiment: str = "cmp-scale",
    *,
    diverged: Collection[int] | None = None,
    unfinished: Collection[int] | None = None,
    no_returns: Collection[int] | None = None,
) -> Store:
    """A comparison sweep of ``trials`` child runs in ``root/mlflow.db`` (artifacts under
    ``root/artifacts``): trial ``i`` is precision ``i % 2``, seed ``i // 2 % 2`` of
    configuration ``i // 4``, families in turn. ``diverged``, ``unfinished`` and
    ``no_returns`` are trial numbers (default: one in every 97, 89 and 83)."""

    def every(n: int) -> set[int]:
        return set(range(n - 1, trials, n))

    with _unsynced_sqlite():
        return _build_store(
            root,
            trials,
            experiment,
            every(DIVERGED_EVERY) if diverged is None else set(diverged),
            every(UNFINISHED_EVERY) if unfinished is None else set(unfinished),
            every(NO_RETURNS_EVERY) if no_returns is None else set(no_returns),
        )


def _build_store(
    root: Path,
    trials: int,
    experiment: str,
    diverging: set[int],
    running: set[int],
    without_returns: set[int],
) -> Store:
    tracking_uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment(
        experiment, artifact_location=(root / "artifacts").as_uri()
    )
    spec = {"name": experiment, "precisions": list(PRECISIONS), "compare": True}
    parent = start_sweep_run(client, experiment, spec, compare=True)
    common = np.random.default_rng(7).standard_normal(2 * VAL_BARS + TEST_BARS)
    stamps = START + np.arange(2 * VAL_BARS + TEST_BARS) * np.timedelta64(1, "D")
    run_ids = []
    for i in range(trials):
        precision, seed, group = PRECISIONS[i % 2], i // 2 % SEEDS, i // (2 * SEEDS)
        model = FAMILIES[group % len(FAMILIES)]
        config_id = f"{model}-c{group:04d}"
        config: dict[str, Any] = {
            "family": model,
            "precision": precision,
            "seed": seed,
            "config_id": config_id,
            "pair_id": f"{config_id}-s{seed}",
            "params": {"lr": 1e-4 * (1 + group % 7), "hidden": 16 * (1 + group % 4)},
        }
        diverged = i in diverging
        unfinished = i in running and not diverged
        # (T,) returns: a common market, the configuration's edge, a little precision noise.
        own = np.random.default_rng([group, seed]).standard_normal(common.size)
        noise = np.random.default_rng([group, seed, i % 2]).standard_normal(common.size)
        returns = 0.01 * (0.7 * common + 0.6 * own + 0.05 * noise + 0.02 * (group % 5 - 2))
        val, test = returns[: 2 * VAL_BARS], returns[2 * VAL_BARS :]
        val_m, test_m = sharpe_moments(val), sharpe_moments(test)
        annual = math.sqrt(PERIODS_PER_YEAR)
        final = {
            "val_sharpe": val_m.sr * annual,
            "test_sharpe": test_m.sr * annual,
            "val_sharpe_per_period": val_m.sr,
            "val_skew": val_m.skew,
            "val_kurtosis": val_m.kurtosis,
            "val_n_obs": float(val_m.n_obs),
            "steps_per_s": (50.0 if precision == "f32" else 85.0) + group % 3,
            "peak_mem_mb": (120.0 if precision == "f32" else 70.0) + group % 5,
            "fell_back_to_f32": 0.0,
            "diverged": 0.0,
            # What a trial on a CPU node reports of its cost.
            "time_s_total": (30.0 if precision == "f32" else 18.0) + group % 4,
            "cpu_s_total": (28.0 if precision == "f32" else 17.0) + group % 4,
            "gpu_s_total": 0.0,
            "gpu_fraction": 0.0,
        }
        epochs = EPOCHS - 1 if unfinished else EPOCHS
        stamp = int(time.time() * 1000)
        metrics = []
        for epoch in range(1, epochs + 1):
            # Earlier epochs differ from the final one, as a real history does.
            scale = 1.0 if epoch == EPOCHS else epoch / EPOCHS + 0.05
            for key, value in final.items():
                late = key in ("val_sharpe", "test_sharpe")
                metrics.append(Metric(key, value * scale if late else value, stamp + epoch, epoch))
            metrics.append(Metric("train_loss", 1.0 / epoch, stamp + epoch, epoch))
        status = "completed"
        tags = {
            TAG_PARENT: parent,
            TAG_ROLE: ROLE_TRIAL,
            TAG_SWEEP: experiment,
            TAG_FAMILY: model,
            TAG_PRECISION: precision,
            TAG_SEED: str(seed),
            TAG_PAIR: config["pair_id"],
            TAG_CONFIG: config_id,
            TAG_TRIAL: f"t{i:05d}",
            TAG_FELL_BACK: "false",
        }
        if diverged:
            status = "diverged"
            metrics.append(Metric("val_sharpe", math.nan, stamp + EPOCHS + 1, EPOCHS))
            metrics.append(Metric("diverged", 1.0, stamp + EPOCHS + 1, EPOCHS))
            tags[TAG_FAILURE] = f"{model} diverged under {precision}: non-finite steps"
        tags[TAG_STATUS] = "running" if unfinished else status
        run = client.create_run(
            experiment_id, start_time=stamp, run_name=trial_run_name(config), tags=tags
        )
        run_id = run.info.run_id
        client.log_batch(
            run_id,
            metrics=metrics,
            params=[Param(k, v) for k, v in trial_params(config).items()],
            tags=[RunTag(TAG_STATUS, tags[TAG_STATUS])],
        )
        if not (diverged or unfinished or i in without_returns):
            segments = [
                ("val", 0, stamps[:VAL_BARS], val[:VAL_BARS]),
                ("val", 1, stamps[VAL_BARS : 2 * VAL_BARS], val[VAL_BARS:]),
                ("test", 1, stamps[2 * VAL_BARS :], test),
            ]
            client.log_text(run_id, returns_csv(segments), RETURNS_ARTIFACT)
        if not unfinished:
            client.set_terminated(
                run_id, "FAILED" if diverged else "FINISHED", end_time=stamp + EPOCHS + 2
            )
        run_ids.append(run_id)
    return Store(tracking_uri, experiment, parent, run_ids)


BEFORE, NOW, POOL, NO_CURVES = "before: one by one", "now", "now on a pool of 16", "now, no curves"


@dataclass
class Timing:
    label: str
    trials: int
    search_s: float
    reads_s: float
    stats_s: float
    reads_cpu_s: float
    """Process CPU seconds of the reads (every thread's)."""
    records: list[compare.TrialRecord]

    @property
    def rest_s(self) -> float:
        return self.reads_s + self.stats_s

    @property
    def per_trial_s(self) -> float:
        return self.rest_s / max(self.trials, 1)


@contextmanager
def _timed(name: str, spent: dict[str, float]) -> Iterator[None]:
    """Time every call of ``hpo.compare.mlflow_reader.<name>`` (the names
    :func:`hpo.compare.comparison_from_mlflow` calls) into ``spent[name]`` (wall) and
    ``spent[name + " cpu"]`` (process CPU)."""
    original: Callable[..., Any] = getattr(mlflow_reader, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
            spent[f"{name} cpu"] = spent.get(f"{name} cpu", 0.0) + time.process_time() - cpu

    with mock.patch.object(mlflow_reader, name, wrapper):
        yield


@contextmanager
def one_by_one() -> Iterator[None]:
    """The reads as they were: one after another, every artifact through
    ``download_artifacts`` into a temporary directory, parsed a row at a time."""
    with (
        mock.patch.object(mlflow_reader, "_read_threads", lambda *_: 1),
        mock.patch.object(mlflow_reader, "_local_artifact_path", lambda run: None),
        mock.patch.object(returns_file, "_parse_columns", lambda lines: None),
    ):
        yield


@contextmanager
def on_pool() -> Iterator[None]:
    """Today's reads on the pool of threads, which a file store's reads do not get."""
    threads = mlflow_reader._READ_THREADS
    with mock.patch.object(
        mlflow_reader, "_read_threads", lambda _, runs, *__: min(threads, len(runs))
    ):
        yield


def time_compare(store: Store, label: str) -> Timing:
    """One ``comparison_from_mlflow`` on a cold returns cache (a fresh ``hpo compare``)."""
    mlflow_reader._RETURNS_CACHE.clear()
    spent: dict[str, float] = {}
    context = {BEFORE: one_by_one, POOL: on_pool}.get(label, nullcontext)()
    with context, _timed("_search_page", spent), _timed("compare_trials", spent):
        start, cpu = time.perf_counter(), time.process_time()
        result = compare.comparison_from_mlflow(
            store.experiment,
            store.tracking_uri,
            parent_run_id=store.parent_run_id,
            with_curves=label != NO_CURVES,
        )
        total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    search, stats = spent.get("_search_page", 0.0), spent.get("compare_trials", 0.0)
    reads_cpu = (
        total_cpu - spent.get("_search_page cpu", 0.0) - spent.get("compare_trials cpu", 0.0)
    )
    return Timing(
        label, len(result.trials), search, total - search - stats, stats, reads_cpu, result.trials
    )


def _median(runs: list[Timing]) -> Timing:
    """Each time the median over ``runs`` of one row; the first run's records."""

    def mid(name: str) -> float:
        return statistics.median(getattr(t, name) for t in runs)

    first = runs[0]
    return Timing(
        first.label,
        first.trials,
        search_s=mid("search_s"),
        reads_s=mid("reads_s"),
        stats_s=mid("stats_s"),
        reads_cpu_s=mid("reads_cpu_s"),
        records=first.records,
    )


def same_records(a: list[compare.TrialRecord], b: list[compare.TrialRecord]) -> bool:
    """Equal field by field (NaN equal to NaN, return series element by element)."""

    def key(record: compare.TrialRecord) -> tuple[Any, ...]:
        out: list[Any] = []
        for f in record.__dataclass_fields__:
            value = getattr(record, f)
            if f == "returns" and value is not None:
                value = tuple(
                    (s, value.bars[s].tobytes(), value.returns[s].tobytes()) for s in value.bars
                )
            elif isinstance(value, float | list):
                value = repr(value)  # NaN equal to NaN, in curves too
            out.append(value)
        return tuple(out)

    return [key(r) for r in a] == [key(r) for r in b]


def open_store(root: Path, trials: int) -> Store:
    """The store in ``root``: the one built there before for as many trials, else new."""
    saved = root / "store.json"
    if saved.is_file():
        store = Store(**json.loads(saved.read_text()))
        if len(store.run_ids) == trials:
            print(f"store: {trials} trials in {root}, built before")
            return store
        raise SystemExit(f"{root} holds a store of {len(store.run_ids)} trials, not {trials}")
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    store = build_store(root, trials)
    print(f"store: {trials} trials built in {time.perf_counter() - start:.1f} s")
    saved.write_text(json.dumps(dataclasses.asdict(store)))
    return store


def run(store: Store, before: bool, rounds: int) -> list[Timing]:
    """Every row once per round, rounds one after another (the rows interleaved, so a
    slower spell of a shared machine falls on all of them); the median per row."""
    # Warm SQLite's page cache and MLflow's imports for every row alike.
    client = MlflowClient(store.tracking_uri)
    found = client.get_experiment_by_name(store.experiment)
    assert found is not None
    mlflow_reader._search_all(client, found.experiment_id, "")
    labels = [BEFORE, NOW, POOL, NO_CURVES] if before else [NOW, POOL, NO_CURVES]
    runs: dict[str, list[Timing]] = {label: [] for label in labels}
    for number in range(rounds):
        for label in labels:
            timing = time_compare(store, label)
            if number:
                timing.records = []  # the first round's are compared
            runs[label].append(timing)
    return [_median(runs[label]) for label in labels]


def main(argv: list[str] | None = None) -> list[Timing]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="child runs (default 2000)")
    parser.add_argument("--smoke", action="store_true", help="24 trials")
    parser.add_argument(
        "--no-before", action="store_true", help="skip the reads as they were (minutes)"
    )
    parser.add_argument(
        "--dir", type=Path, help="keep the store here and reuse it (default: a temp dir)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every row (median)")
    args = parser.parse_args(argv)
    trials = 24 if args.smoke else args.trials
    rounds = 1 if args.smoke else args.rounds
    if args.dir is not None:
        timings = run(open_store(args.dir, trials), not args.no_before, rounds)
    else:
        with tempfile.TemporaryDirectory(prefix="hpo-compare-scale-") as tmp:
            timings = run(open_store(Path(tmp), trials), not args.no_before, rounds)
    print(f"\nmedian of {rounds} round(s), rows interleaved\n")
    print(
        "| reads | trials | search s | reads s | reads CPU s | stats s | rest s "
        "| s/trial beyond search |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in timings:
        print(
            f"| {t.label} | {t.trials} | {t.search_s:.2f} | {t.reads_s:.2f} "
            f"| {t.reads_cpu_s:.2f} | {t.stats_s:.2f} | {t.rest_s:.2f} | {t.per_trial_s:.4f} |"
        )
    row = {t.label: t for t in timings}
    now, pool = row[NOW], row[POOL]
    print(f"\npool / now, reads: {pool.reads_s / now.reads_s:.2f}x")
    print(f"same records on the pool: {same_records(pool.records, now.records)}")
    if BEFORE in row:
        old = row[BEFORE]
        print(f"before / now, beyond search: {old.rest_s / now.rest_s:.1f}x")
        print(f"before / now, reads: {old.reads_s / now.reads_s:.1f}x")
        print(f"same records as before: {same_records(old.records, now.records)}")
    return timings


if __name__ == "__main__":
    main()
