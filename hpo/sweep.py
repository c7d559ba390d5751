"""Run and resume sweeps: the spec becomes a Ray Tune ``Tuner``.

A sweep lives in ``STORAGE/NAME`` (Ray's experiment directory) beside its record
(:mod:`hpo.record`); its trials are read back as rows by :mod:`hpo.trials`.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.storage import SweepLocation, writable_by_others
from hpo.population_board import start_population_board
from hpo.record import SUMMARY_FILE, SWEEP_FILE, SweepError, SweepRecord
from hpo.rungs import ASHA_REDUCTION_FACTOR, start_rung_board
from hpo.spec import SweepSpec
from hpo.tracking_store import StoreWarmup
from hpo.trials import TrialRow, best_rows, latest_attempts, trial_rows
from trainables.memory import resume_collection

if TYPE_CHECKING:  # imports ray (and torch); loaded when a sweep starts
    from mlflow.tracking import MlflowClient

    from cluster.gpu_types import GpuType
    from cluster.packing_plan import ClusterPacker
    from hpo.compare import Comparison
    from hpo.final_trials import FinalTrials
    from hpo.recovery import StopOnRepeatedError
    from hpo.search.budget import PolicyEvent
    from hpo.search.sweep_searcher import SweepSearcher
    from hpo.tracking import MlflowSweepCallback
    from trainables.config import TrainConfig

log = logging.getLogger("hpo.sweep")

# Renders a comparison as the HTML report logged beside its statistics (the caller's
# presentation layer: the CLI hands in dashboards.report.render_report).
ReportRenderer = Callable[["Comparison"], str]

PLAN_TEXT = "packing_plan.txt"  # parent-run artifacts: the plan the sweep launched with
PLAN_JSON = "packing_plan.json"


class TrialResources:
    """Resources of one trial as a function of its config (``tune.with_resources``).

    A class, not a closure, so Tune can pickle it into the experiment state.
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.cpu = spec.resources.cpu
        self.gpu = spec.resources.gpu
        self.headroom = spec.resources.headroom

    def __call__(self, config: dict[str, Any]) -> Any:
        from ray.tune import PlacementGroupFactory

        gpu = self.gpu
        if gpu == "measured":  # no GPU types to plan for (sweep_resources): this process sizes it
            from cluster.packing import gpu_fraction_for_trial
            from trainables.config import share_sized_by

            trial, group_size = share_sized_by(config)
            gpu = gpu_fraction_for_trial(
                trial.train_config(),
                headroom=self.headroom,
                floor=trial.gpu_fraction_floor,
                group_size=group_size,
            )
        bundle = {"CPU": float(self.cpu)}
        if float(gpu) > 0:
            bundle["GPU"] = float(gpu)
        return PlacementGroupFactory([bundle])


def sweep_resources(
    spec: SweepSpec, storage: str, types: list[GpuType] | None = None
) -> TrialResources | ClusterPacker:
    """What sizes each trial's bundle: with ``resources.gpu = "measured"`` on a cluster
    with GPU nodes, a :class:`~cluster.packing_plan.ClusterPacker` over its GPU types
    (``types``; default: the connected cluster's), profiling on those nodes into the VRAM
    cache of ``storage`` (the sweep's storage, which every node sees); otherwise the
    spec's fixed numbers (:class:`TrialResources`)."""
    if spec.resources.gpu != "measured":
        return TrialResources(spec)
    from cluster.gpu_types import cluster_gpu_types
    from cluster.packing_plan import ClusterPacker
    from cluster.vram_table import SharedVramCache

    types = cluster_gpu_types() if types is None else types
    if not types:
        return TrialResources(spec)
    return ClusterPacker(
        types,
        headroom=spec.resources.headroom,
        cpu_per_trial=spec.resources.cpu,
        cache=SharedVramCache.at(storage),
    )


def plan_configs(spec: SweepSpec) -> list[tuple[TrainConfig, int]]:
    """The trial shapes known before launch, as (config, trials in its group trial): one
    per (family, precision) stream, at the settings its search space fixes, in the family's
    largest group trial (:meth:`SweepSpec.trials_per_group`). A shape a searcher samples
    (a searched model size or batch size), or a smaller group (a last batch), is profiled
    when its first trial is created."""
    from hpo.search.space import trial_space
    from trainables.config import TrialConfig

    base = spec.trial_base()
    configs = []
    for family in spec.families:
        fixed = trial_space(family, spec.search_space.get(family)).fixed
        for precision in spec.precisions:
            trial = TrialConfig(family=family, precision=precision, seed=0, params=fixed, base=base)
            configs.append((trial.train_config(), spec.trials_per_group(family)))
    return configs


@dataclass(frozen=True)
class SweepPlan:
    """The GPU packing plan a sweep launches with (``hpo sweep SPEC --plan`` prints it)."""

    text: str
    rows: list[dict[str, Any]]  # cluster.packing_plan.plan_rows (none without measured shares)

    def log_to(self, client: MlflowClient, run_id: str) -> None:
        client.log_text(run_id, self.text, PLAN_TEXT)
        client.log_dict(run_id, {"rows": self.rows}, PLAN_JSON)


def sweep_plan(spec: SweepSpec, resources: TrialResources | ClusterPacker) -> SweepPlan:
    """The plan of ``spec`` with these resources; a packer profiles every shape of
    :func:`plan_configs` on every GPU type first (Ray tasks on those nodes)."""
    if isinstance(resources, TrialResources):  # the profiler (and torch) not needed
        from cluster.fixed_plan import render_fixed_plan

        per_group = max(spec.trials_per_group(f) for f in spec.families)
        return SweepPlan(render_fixed_plan(spec.resources.gpu, spec.resources.cpu, per_group), [])
    from cluster.packing_plan import plan_rows, render_plan

    rows = plan_rows(resources, plan_configs(spec))
    return SweepPlan(render_plan(rows, spec.resources.headroom), rows)


def plan_only(
    spec: SweepSpec,
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
) -> SweepPlan:
    """The plan of ``spec`` on the cluster, without launching: no sweep directory, no
    MLflow run (the profiles it takes are cached in the storage's VRAM cache, where the
    sweep finds them). A spec the cluster cannot run raises the SweepError a sweep would."""
    storage = SweepLocation.parse(spec.storage)
    _join_cluster(spec, storage.uri, address, num_cpus=num_cpus, num_gpus=num_gpus)
    return sweep_plan(spec, sweep_resources(spec, storage.uri))


@contextlib.contextmanager
def _sigterm_stops_gracefully() -> Iterator[None]:
    """Treat SIGTERM (``kill``, a job stop, a scheduler's preemption) like Ctrl+C.

    Tune stops gracefully on SIGINT/SIGUSR1: trials stop, the experiment state and the
    searcher state are saved, and ``hpo resume`` continues from there. Forwarding SIGTERM
    to SIGUSR1 gives it the same path; outside the main thread signals cannot be handled.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGUSR1))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _trial_dirname(trial: Any) -> str:
    config = trial.config
    return f"{config.get('family', 'trial')}-{config.get('precision', '')}-{trial.trial_id}"


def build_tuner(
    spec: SweepSpec,
    record: SweepRecord,
    watchers: SweepWatchers,
    resources: TrialResources | ClusterPacker | None = None,
    searcher: SweepSearcher | None = None,
) -> Any:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    from hpo.search.sweep_searcher import SweepSearcher

    if searcher is None:
        searcher = watchers.attach(SweepSearcher(spec))

    scheduler: Any
    if spec.asha_per_tune_trial:
        scheduler = ASHAScheduler(
            time_attr="epoch",
            metric=spec.metric,
            mode="max",
            max_t=spec.max_epochs,
            grace_period=spec.grace_epochs,
            reduction_factor=ASHA_REDUCTION_FACTOR,
        )
    else:  # FIFO, or ASHA per trial of a group trial, which the trials ask (hpo.rungs)
        scheduler = FIFOScheduler()
    # Per-epoch checkpoints with num_to_keep=2 make Tune snapshot the experiment state often
    # (by design: a snapshot must never point at a deleted checkpoint); its warning about
    # that is noise for this workload.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's newer console output prints a header even at verbose=0 (with "Number of trials
    # 9223372036854775807", as the searcher, not num_samples, ends the sweep) and a
    # TensorBoard hint; hpo.progress reports the sweep instead.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if resources is None:
        resources = sweep_resources(spec, record.sweep_dir.parent.uri)
    trainable = _trainable(spec, resources, record.sweep_dir.uri)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            # The searcher decides when the sweep is complete (FINISHED once every planned
            # trial has reported): OOM retries add trials beyond the plan.
            num_samples=-1,
            max_concurrent_trials=spec.max_concurrent,
            reuse_actors=True,
            trial_dirname_creator=_trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=spec.name,
            storage_path=record.sweep_dir.parent.uri,
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            callbacks=watchers.callbacks,
            stop=watchers.stop,
            verbose=0,
        ),
    )


def _trainable(spec: SweepSpec, resources: TrialResources | ClusterPacker, sweep_dir: str) -> Any:
    """The sweep's trainable: :func:`trainables.tune_entry.run_trial` keeping to its GPU share
    (:class:`cluster.trial_share.PackedShare`), sized by ``resources``, asking the
    sweep's rungs (:mod:`hpo.rungs`) where ASHA decides per trial or per population, and its population
    board (:mod:`hpo.population_board`) where populations train across processes."""
    from ray import tune

    from cluster.trial_share import PackedShare
    from trainables.tune_entry import run_trial

    judge = None
    if spec.rungs_on_board:
        judge = start_rung_board(
            spec.name,
            spec.metric,
            grace=spec.grace_epochs,
            max_t=spec.max_epochs,
            reduction_factor=ASHA_REDUCTION_FACTOR,
        )
    exchange = None
    if any(spec.population_spans_trials(f) for f in spec.families):
        exchange = start_population_board(spec.name, sweep_dir)
    return tune.with_resources(
        tune.with_parameters(run_trial, share=PackedShare(), judge=judge, exchange=exchange),
        resources=resources,
    )


@dataclass(frozen=True)
class SweepWatchers:
    """What watches a sweep: Tune callbacks, the stopper among them that ends a sweep
    whose first trials all fail alike (its ``reason`` says why), and what the searcher's
    budgets report (a sequential family's looks: a progress line, and the parent run's
    record through the MLflow callback's outbox, so Tune's loop never waits for it)."""

    callbacks: list[Any]
    stop: StopOnRepeatedError
    final: FinalTrials  # the trials' rows as the experiment ended
    mlflow: MlflowSweepCallback
    print_line: Callable[[str], None]

    def attach(self, searcher: SweepSearcher) -> SweepSearcher:
        """Tell these watchers what ``searcher``'s budgets report; returns it."""

        def on_policy_event(event: PolicyEvent) -> None:
            self.print_line(event.line)
            self.mlflow.log_looks(searcher.records(), event.stream, event.look)

        searcher.listeners = [on_policy_event]
        return searcher


def _watchers(record: SweepRecord, on_event: Callable[[str], None] | None) -> SweepWatchers:
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from hpo.ended_trials import DropCompletedTrialWindows
    from hpo.final_trials import FinalTrials
    from hpo.progress import SweepProgress
    from hpo.recovery import TRIALS_TO_STOP, AdoptReportedCheckpoint, StopOnRepeatedError
    from hpo.tracking import MlflowSweepCallback

    # Tune's own result files (result.json, progress.csv) but not its TensorBoard event
    # files, which MLflow makes redundant: their writer fsyncs on every flush, four times
    # per trial in Tune's event loop (bench/README.md, "A sweep's per-trial cost").
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Counted in Tune trials: a group trial's trials fail as one.
    stop = StopOnRepeatedError(trials=min(TRIALS_TO_STOP, record.spec.n_tune_trials))
    final = FinalTrials(record.sweep_dir)
    tracking = MlflowSweepCallback(record.tracking_uri, record.spec.name, record.parent_run_id)
    progress = SweepProgress(
        total=record.spec.n_trials, on_event=on_event, up_to=record.spec.sequential
    )
    callbacks = [
        JsonLoggerCallback(),
        CSVLoggerCallback(),
        tracking,
        progress,
        AdoptReportedCheckpoint(),
        stop,
        final,
        DropCompletedTrialWindows(),  # after ours that read the trial as it completed
    ]
    return SweepWatchers(
        callbacks=callbacks, stop=stop, final=final, mlflow=tracking, print_line=progress.on_event
    )


def _finish_or_refuse(
    record: SweepRecord,
    watchers: SweepWatchers,
    render_report: ReportRenderer | None,
    searcher: SweepSearcher,
) -> SweepRows:
    """The sweep's rows after it ended; a sweep its stopper called off is summarized the
    same way, then reported as a SweepError naming the error and the fix."""
    rows = finish_sweep(record, render_report, searcher, watchers.final.rows)
    if watchers.stop.reason is not None:
        raise SweepError(watchers.stop.reason)
    return rows


def run_sweep(
    spec: SweepSpec,
    *,
    address: str | None = None,
    on_event: Callable[[str], None] | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    render_report: ReportRenderer | None = None,
) -> SweepRows:
    """Run ``spec`` to completion (or until interrupted) and return every trial's row.
    A compare sweep logs its statistics on the parent run, with the HTML report where
    ``render_report`` is given."""
    from mlflow.tracking import MlflowClient

    from hpo.search.sweep_searcher import SweepSearcher
    from hpo.tracking import start_sweep_run

    # Decided once and recorded: a resumed sweep groups its trials, and looks, as it started.
    spec = spec.with_grouping_recorded().with_looks_recorded()
    storage = SweepLocation.parse(spec.storage)
    sweep_dir = storage.child(spec.name)
    if sweep_dir.exists(SWEEP_FILE):
        raise SweepError(
            f"a sweep named {spec.name!r} already exists in {sweep_dir}; continue it with "
            f"`hpo resume {sweep_dir}` or pick another --name"
        )
    store = StoreWarmup(spec.tracking_uri)  # a new store's schema, beside Ray's start
    try:
        _join_cluster(spec, storage.uri, address, num_cpus=num_cpus, num_gpus=num_gpus)
        # Profiled on the GPU nodes before anything is recorded: a shape that cannot be
        # profiled stops the sweep without leaving a parent run behind.
        resources = sweep_resources(spec, storage.uri)
        plan = sweep_plan(spec, resources)
    except BaseException:
        store.discard()
        raise
    comparison_plan = None
    if spec.compare:
        from hpo.compare.plan import comparison_plan_text

        comparison_plan = comparison_plan_text(spec)
    if on_event is not None:
        on_event(plan.text)
        if comparison_plan is not None:
            on_event(comparison_plan)
    store.join()
    client = MlflowClient(spec.tracking_uri)
    parent = start_sweep_run(
        client, spec.name, spec.model_dump(exclude={"search_space", "trainer"}), spec.compare
    )
    plan.log_to(client, parent)
    if comparison_plan is not None:
        from hpo.compare.plan import PLAN_ARTIFACT

        client.log_text(parent, comparison_plan, PLAN_ARTIFACT)
    record = SweepRecord(
        spec=spec, sweep_dir=sweep_dir, parent_run_id=parent, tracking_uri=spec.tracking_uri
    )
    record.write()
    _collect_after_the_imports()
    watchers = _watchers(record, on_event)
    searcher = watchers.attach(SweepSearcher(spec))
    tuner = build_tuner(spec, record, watchers, resources, searcher)
    with _sigterm_stops_gracefully():
        tuner.fit()
    del tuner  # Tune's trials and results: what the summary needs, the watchers kept
    return _finish_or_refuse(record, watchers, render_report, searcher)


def resume_sweep(
    sweep_dir: str | Path | SweepLocation,
    *,
    address: str | None = None,
    on_event: Callable[[str], None] | None = None,
    render_report: ReportRenderer | None = None,
) -> SweepRows:
    """Continue an interrupted sweep: unfinished trials from their newest checkpoints,
    finished ones kept as they are, the search continuing from its saved state (a
    sequential comparison's looks included: none is applied twice).

    Ray Tune unpickles that state from the sweep's storage: resume only storage you
    trust. A local sweep directory that other users can write is refused."""
    from ray import tune

    record = SweepRecord.read(sweep_dir)
    _refuse_untrusted(record.sweep_dir)
    if not tune.Tuner.can_restore(record.sweep_dir.uri):
        raise SweepError(f"{record.sweep_dir} has no Ray Tune experiment state to resume yet")
    _join_cluster(record.spec, record.sweep_dir.parent.uri, address)
    from mlflow.tracking import MlflowClient

    MlflowClient(record.tracking_uri).update_run(record.parent_run_id, status="RUNNING")
    # Restored trials keep the bundles Tune saved with them; this sizes the trials still to
    # be created (the shared VRAM cache holds the profiles the first run took).
    resources = sweep_resources(record.spec, record.sweep_dir.parent.uri)
    _collect_after_the_imports()
    trainable = _trainable(record.spec, resources, record.sweep_dir.uri)
    tuner = tune.Tuner.restore(
        record.sweep_dir.uri,
        trainable=trainable,
        resume_unfinished=True,
        resume_errored=True,
    )
    watchers = _watchers(record, on_event)
    _replace_watchers(tuner, watchers)
    searcher = watchers.attach(_restored_searcher(tuner))
    with _sigterm_stops_gracefully():
        tuner.fit()
    del tuner  # Tune's trials and results: what the summary needs, the watchers kept
    return _finish_or_refuse(record, watchers, render_report, searcher)


# What the sweep's Tune objects import as they are made (the searchers' optuna, the
# watchers', the scheduler's, the trainable's): imported with the collector still paused.
# A module missing here is only imported later, with the collector on.
TUNE_SIDE_MODULES = (
    "ray.tune.logger",
    "ray.tune.schedulers",
    "hpo.ended_trials",
    "hpo.final_trials",
    "hpo.progress",
    "hpo.recovery",
    "hpo.tracking",
    "hpo.search.optuna_searcher",
    "hpo.search.pso",
    "cluster.trial_share",
    "trainables.tune_entry",
)


def _collect_after_the_imports() -> None:
    """``hpo sweep`` and ``hpo resume`` start with the cyclic collector paused
    (trainables.memory): import what Tune's objects need, then run it again, before the
    first of those objects exists (frozen in a reference cycle, the tuner and its trials
    would never be freed when Tune's run ends)."""
    for name in TUNE_SIDE_MODULES:
        importlib.import_module(name)
    resume_collection()


def _refuse_untrusted(sweep_dir: SweepLocation) -> None:
    """Restoring unpickles Tune's experiment state: whoever can write it runs code as the
    user who resumes. Object stores are trusted as their access policy says."""
    if not sweep_dir.is_local:
        return
    problems = writable_by_others(sweep_dir.local_path)
    if problems:
        raise SweepError(
            f"refusing to resume {sweep_dir}: Ray Tune unpickles its saved state, so "
            "anyone who can write it could run code as you; "
            + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            + ". Check the files, then `chmod -R go-w` the directory (or copy it into one "
            "only you can write) and resume that"
        )


def _join_cluster(spec: SweepSpec, storage: str, address: str | None, **kwargs: Any) -> None:
    """Start or join Ray, then check the spec against the cluster before anything launches
    (resources no node offers, node-local storage on several nodes); a cluster problem
    becomes a SweepError that says what to do."""
    from cluster.connect import ClusterError, ensure_ray
    from cluster.preflight import preflight

    if address is None:  # a Ray started here: its workers inherit this environment
        os.environ.setdefault(TUNE_TRIAL_ENV_VAR, "1")
    try:
        info = ensure_ray(address, **kwargs)
        preflight(spec, info, storage)
    except ClusterError as exc:
        raise SweepError(str(exc)) from exc
    if info.started_here and os.environ.get(TUNE_TRIAL_ENV_VAR) == "1":
        _trials_on_prestarted_workers()


# Ray Tune gives every trial's actor a runtime_env of its own, {"env_vars":
# {"PL_DISABLE_FORK": "1"}} (for PyTorch Lightning, which hpo does not use), and a worker
# serves only actors of its runtime_env: no trial could start on the workers a local Ray
# prestarts (one per CPU, Ray already imported), so each started a new one (0.8 s more
# per one-trial sweep). A local Ray's workers have the variable from this process instead.
TUNE_TRIAL_ENV_VAR = "PL_DISABLE_FORK"


def _trials_on_prestarted_workers() -> None:
    from ray.tune.execution import class_cache

    class_cache.DEFAULT_ENV_VARS.pop(TUNE_TRIAL_ENV_VAR, None)


def _restored_searcher(tuner: Any) -> SweepSearcher:
    """The searcher Tune restored with the sweep (its saved state, looks included, is
    loaded into this object as the fit starts)."""
    from hpo.search.sweep_searcher import SweepSearcher

    searcher = tuner._local_tuner._tune_config.search_alg
    if not isinstance(searcher, SweepSearcher):
        raise SweepError(f"the sweep's saved search is a {type(searcher).__name__}, not hpo's")
    return searcher


def _replace_watchers(tuner: Any, watchers: SweepWatchers) -> None:
    """Fresh callbacks and stopper after a restore (MLflow clients and consoles are not
    restored); the callbacks' saved state (child run ids) is loaded by Tune from the
    experiment checkpoint."""
    internal = tuner._local_tuner
    internal._run_config.callbacks = watchers.callbacks
    internal._run_config.stop = watchers.stop


class SweepRows(list[TrialRow]):
    """A sweep's trial rows (a list, as readers of rows take it), with what it planned:
    ``planned`` trials (a sequential comparison's: those of the configurations it made,
    once complete; until then the most it may run), whether it is ``complete`` (every
    stream done, every trial reported), and its ``comparison`` (compare mode)."""

    def __init__(
        self,
        rows: list[TrialRow],
        planned: int,
        complete: bool,
        comparison: Comparison | None = None,
    ) -> None:
        super().__init__(rows)
        self.planned = planned
        self.complete = complete
        self.comparison = comparison


def finish_sweep(
    record: SweepRecord,
    render_report: ReportRenderer | None = None,
    searcher: SweepSearcher | None = None,
    attempts: list[TrialRow] | None = None,
) -> SweepRows:
    """Summarize into ``hpo-summary.json`` and the MLflow parent run (with the comparison
    in compare mode, see :func:`run_sweep`). ``searcher``: the sweep's, as the run left it
    (what it planned and whether it is complete; without it, the spec's plan).
    ``attempts``: every attempt's row as the driver held them when the experiment ended;
    without them the rows are read from the sweep's storage."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    rows = trial_rows(record.sweep_dir) if attempts is None else latest_attempts(attempts)
    best = best_rows(rows)
    planned = searcher.planned_trials if searcher is not None else record.spec.n_trials
    # One row per planned trial (latest_attempts): an OOM retry adds a Tune trial, not a
    # trial; an OOM attempt whose retry has not run yet is not done.
    complete = all(r.done for r in rows) and len(rows) == planned
    if searcher is not None:
        complete = complete and searcher.complete
    summary = {
        "sweep": record.spec.name,
        "n_trials": len(rows),
        "planned": planned,
        "complete": complete,
        "status_counts": _count(r.status for r in rows),
        "best": [r.to_dict() for r in best],
        **(
            {"sequential": searcher.records()}
            if searcher is not None and searcher.records()
            else {}
        ),
    }
    record.sweep_dir.write_text(SUMMARY_FILE, json.dumps(summary, indent=1, default=str))
    client = MlflowClient(record.tracking_uri)
    stamp = int(time.time() * 1000)
    metrics = [
        Metric(f"best_val_sharpe.{r.family}.{r.precision}", float(r.val_sharpe or 0.0), stamp, 0)
        for r in best
    ]
    metrics.append(Metric("n_trials", float(len(rows)), stamp, 0))
    client.log_batch(record.parent_run_id, metrics=metrics)
    client.log_dict(record.parent_run_id, summary, SUMMARY_FILE)
    if searcher is not None and searcher.records():
        from hpo.tracking import SEQUENTIAL_ARTIFACT, sequential_payload

        # The looks as the searcher holds them now: the outbox wrote them at each look,
        # but configurations made or finished since (and a write a stopped driver never
        # sent) are only here; the comparison below reads this.
        payload = sequential_payload(searcher.records())
        client.log_dict(record.parent_run_id, payload, SEQUENTIAL_ARTIFACT)
    comparison = None
    if record.spec.compare:
        from trainables.memory import release_freed_memory

        # The comparison's arrays would otherwise stack on what Tune freed but the heap
        # kept: the driver's peak of a large sweep (bench/README.md, "per-trial cost").
        release_freed_memory()
        comparison = _log_comparison(record, render_report)
    client.set_terminated(record.parent_run_id, status="FINISHED" if complete else "KILLED")
    return SweepRows(rows, planned, complete, comparison)


def _log_comparison(record: SweepRecord, render_report: ReportRenderer | None) -> Comparison | None:
    """Paired precision statistics (and the HTML report, rendered by ``render_report``)
    onto the parent run (compare mode).

    Recomputed from MLflow alone, as ``hpo compare`` does. A failure here is reported, not
    raised: the trials and the summary are already saved, and the comparison can be
    recomputed at any time.
    """
    from hpo.compare import comparison_from_mlflow, log_comparison
    from hpo.tracking import experiment_name

    experiment = experiment_name(record.spec.name)
    try:
        comparison = comparison_from_mlflow(
            experiment,
            record.tracking_uri,
            precisions=tuple(record.spec.precisions),
            parent_run_id=record.parent_run_id,
            margin=record.spec.comparison.margin,
        )
        log_comparison(
            comparison,
            record.tracking_uri,
            record.parent_run_id,
            report_html=render_report(comparison) if render_report is not None else None,
        )
        return comparison
    except Exception as exc:  # keep the sweep's own results; say how to redo this part
        log.warning(
            "comparison statistics not logged (%s: %s); recompute with "
            "`hpo compare --experiment %s --tracking-uri %s --log`",
            type(exc).__name__,
            exc,
            experiment,
            record.tracking_uri,
        )
        return None


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out
