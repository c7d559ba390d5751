"""MLflow conventions (the one place they are decided) and the sweep's tracking callback.

* One experiment per sweep name; one parent run per sweep (tag ``hpo.role = sweep``);
  one nested child run per trial (``mlflow.parentRunId``) with the tags family, precision,
  seed, pair_id, trial_id, fell_back_to_f32; params = the sampled config; metrics per
  epoch with ``step = epoch``.
* All logging happens in the sweep driver, from Tune's results: one writer per tracking
  store, and trials need no MLflow credentials of their own.
* Resume-safe: a trial's child run is found again by its ``trial_id`` tag under the
  sweep's parent run (and remembered in the callback state Tune saves with the sweep), so
  a resumed trial continues its own run; no epoch's metric point is logged twice.
* One run per trial, not per attempt: a retry after a GPU OOM (a new Tune trial, same
  configuration, precision and seed, a larger share) continues the trial's run, found by
  its ``config_id``, ``precision`` and ``seed`` tags; the ``trial_id`` tag becomes the
  retry's, ``hpo.oom_attempts`` lists the OOM attempts and ``hpo.attempt_started_ms``
  marks where the retry's points begin.
* Tune's event loop never waits for MLflow: one background thread sends queued calls in
  order. A call that failed on the connection or the server's side
  (:func:`may_succeed_later`) is retried with backoff before anything newer, and the
  sweep's end waits for the queue to drain. A call the server rejects is logged and
  dropped, counted on the parent run (metric ``hpo.dropped_writes``, tag
  ``hpo.last_dropped_write``); a store's INTERNAL_ERROR wrapping an error of its own gets
  :func:`retry_limit` retries, then the same. Why: docs/reliability.md#mlflow-tracking
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray.tune import Callback

from trainables.trial_keys import is_group_trial, trial_key, trials_of

log = logging.getLogger("hpo.tracking")

# Tag names: the MLflow UI filters and `hpo compare` read exactly these.
TAG_ROLE = "hpo.role"
TAG_SWEEP = "hpo.sweep"
TAG_PARENT = "mlflow.parentRunId"
TAG_FAMILY = "family"
TAG_PRECISION = "precision"
TAG_SEED = "seed"
TAG_PAIR = "pair_id"
TAG_CONFIG = "config_id"
TAG_OOM_ATTEMPTS = "hpo.oom_attempts"  # trial ids of the attempts that ran out of GPU memory
# When an OOM retry took over its trial's run (ms since the epoch, the driver's clock): the
# retry's metric points are the ones logged from then on, the attempts' are older.
TAG_ATTEMPT_START = "hpo.attempt_started_ms"
TAG_TRIAL = "trial_id"
TAG_GROUP = "hpo.group_id"  # a trial of a group trial: the Tune trial it trained in
TAG_FELL_BACK = "fell_back_to_f32"
TAG_NODE = "node_id"
TAG_NODE_IP = "node_ip"
TAG_STATUS = "trial_status"
TAG_FAILURE = "failure_reason"
ROLE_SWEEP, ROLE_TRIAL = "sweep", "trial"
# MLflow 3's UI opens an experiment by this tag: without it, a new experiment opens in the
# GenAI overview (traces, token usage); "custom_model_development" opens the runs table
# and charts of model training. The key and values are those of MLflow's UI bundle.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND_TRAINING = "custom_model_development"
RETURNS_ARTIFACT = "returns/returns.csv"
"""A trial run's artifact: the ``returns.csv`` of the trial's newest checkpoint (the final
epoch's out-of-sample returns: split, fold, timestamp, return), logged when the trial
ends; a resumed trial that ends again overwrites it (one file per run, never two)."""
MARGIN_PARAM = "comparison.margin"
"""Parent-run param: the spec's ``[comparison] margin`` (what ``hpo compare`` uses)."""
SEQUENTIAL_PARAM = "comparison.sequential"
"""Parent-run param: ``True`` for a sequential comparison (``[comparison] sequential``)."""
SEQUENTIAL_ARTIFACT = "sequential.json"
"""Parent-run artifact of a sequential comparison, rewritten at each look:
``{"version": 1, "families": {family: record}}``, each record what
:meth:`hpo.search.budget.SequentialBudget.record` returns (the planned looks, the
differences in the order the configurations completed, the looks applied, what the
family stopped on). ``hpo compare`` recomputes the looks from it."""


def sequential_payload(records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The :data:`SEQUENTIAL_ARTIFACT` of a sequential comparison's records by family."""
    return {"version": 1, "families": {k: dict(v) for k, v in records.items()}}


METRIC_DROPPED = "hpo.dropped_writes"  # parent run: calls the store rejected, so far
TAG_LAST_DROPPED = "hpo.last_dropped_write"

# MLflow error codes of a server that is away, overloaded or failing inside (HTTP 5xx and
# 429; SQLite's "database is locked" arrives as TEMPORARILY_UNAVAILABLE): the same call
# may succeed later. Every other code (INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST,
# NOT_IMPLEMENTED, ...) is the server refusing this call, now and on every retry.
_TRANSIENT_CODES = frozenset(
    {
        "INTERNAL_ERROR",
        "TEMPORARILY_UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "REQUEST_LIMIT_EXCEEDED",
        "RESOURCE_EXHAUSTED",
    }
)

LINEAGE_KEY = "pbt_lineage"  # a population's trial's entry: its exploits so far
LINEAGE_ARTIFACT = "pbt_lineage.json"  # their record in the trial's run

# Keys of a Tune result that are bookkeeping, not metrics.
_NOT_METRICS = frozenset(
    {
        "epoch",
        "step",
        "done",
        "training_iteration",
        "timestamp",
        "time_this_iter_s",
        "time_total_s",
        "pid",
        "time_since_restore",
        "iterations_since_restore",
        "checkpoint_dir_name",
        "should_checkpoint",
    }
)
# Keys that could hold credentials never reach MLflow, whatever a config carries.
_SECRET_HINTS = ("token", "password", "secret", "credential", "api_key", "auth")


def experiment_name(sweep_name: str) -> str:
    return sweep_name


def trial_run_name(config: Mapping[str, Any]) -> str:
    return f"{config['family']}-{config['precision']}-{config['pair_id']}"


def trial_params(config: Mapping[str, Any]) -> dict[str, str]:
    """MLflow params of a trial: the sampled config plus family, precision and seed."""
    flat = {
        "family": config["family"],
        "precision": config["precision"],
        "seed": config["seed"],
        **config["params"],
    }
    return {k: _param_value(v) for k, v in flat.items() if not is_secret(k)}


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(hint in lowered for hint in _SECRET_HINTS)


def _param_value(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 6000 else text[:6000]


def ensure_experiment(client: MlflowClient, name: str) -> str:
    """The sweep's experiment, created (or restored) as a model-training experiment; a
    kind someone already set on it is kept."""
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name, tags={TAG_EXPERIMENT_KIND: EXPERIMENT_KIND_TRAINING})
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    if TAG_EXPERIMENT_KIND not in experiment.tags:
        client.set_experiment_tag(
            experiment.experiment_id, TAG_EXPERIMENT_KIND, EXPERIMENT_KIND_TRAINING
        )
    return experiment.experiment_id


def start_sweep_run(
    client: MlflowClient, sweep_name: str, spec_payload: Mapping[str, Any], compare: bool
) -> str:
    """The sweep's parent run; its params are the spec's top-level scalars and the scalars
    of its tables as ``<table>.<key>`` (``comparison.margin``, ``data.n_bars``, ...)."""
    experiment_id = ensure_experiment(client, experiment_name(sweep_name))
    run = client.create_run(
        experiment_id,
        run_name=f"sweep-{sweep_name}",
        tags={TAG_ROLE: ROLE_SWEEP, TAG_SWEEP: sweep_name, "compare": str(compare).lower()},
    )
    flat: dict[str, Any] = {}
    for key, value in spec_payload.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    params = [
        Param(k, _param_value(v))
        for k, v in flat.items()
        if isinstance(v, str | int | float | bool | list) and not is_secret(k)
    ]
    if params:
        client.log_batch(run.info.run_id, params=params)
    return run.info.run_id


def may_succeed_later(exc: BaseException) -> bool:
    """Whether a failed MLflow call is worth sending again: the network or the server
    failed (connection refused or reset, a timeout, HTTP 5xx/429, a locked SQLite file),
    not the call itself. MLflow wraps a ``requests`` failure in an MlflowException with
    INTERNAL_ERROR, which counts as transient either way (but see :func:`retry_limit`)."""
    if isinstance(exc, MlflowException):
        return exc.error_code in _TRANSIENT_CODES
    return _network_failure(exc)


# A store's INTERNAL_ERROR that wraps an exception of its own (MLflow's SQL store raises it
# for any exception it does not classify) may be deterministic: it gets this many retries
# (0.5 + 1 + 2 + 4 + 8 s of backoff), then it is dropped like a rejection, so one bad call
# cannot block every later write of the sweep.
INTERNAL_ERROR_RETRIES = 5


def retry_limit(exc: BaseException) -> int | None:
    """How often to send a failed call again: ``None`` until it passes (the network or
    the server is down), a number for an ambiguous failure, 0 for a rejection."""
    if not may_succeed_later(exc):
        return 0
    if isinstance(exc, MlflowException) and exc.error_code == "INTERNAL_ERROR":
        cause = exc.__cause__ or exc.__context__
        if cause is not None and not _network_failure(cause):
            return INTERNAL_ERROR_RETRIES
    return None


def _network_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        # requests' ConnectionError and Timeout are OSErrors, as are socket errors.
        if isinstance(cause, OSError):
            return True
        if type(cause).__name__ == "OperationalError" and "database is locked" in str(cause):
            return True  # sqlite3's or SQLAlchemy's, when not wrapped by MLflow
        cause = cause.__cause__ or cause.__context__
    return False


class _Outbox:
    """MLflow calls sent in order by one background thread, so that the tracking store's
    latency (or absence) never holds up Tune's event loop. A call that fails in a way that
    may pass later is retried, with backoff, before anything newer is sent; a call the
    store rejects is dropped and handed to ``on_drop``. ``pending`` holds every call not
    yet through, the one being tried included."""

    def __init__(
        self,
        max_backoff_s: float = 30.0,
        on_drop: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.pending: deque[tuple[str, Callable[[], object], bool]] = deque()
        self.dropped: list[tuple[str, str]] = []  # (what, error) of every dropped call
        self.on_drop = on_drop
        self.max_backoff_s = max_backoff_s
        self._changed = threading.Condition()
        self._retry_now = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._send_all, name="hpo-mlflow", daemon=True)
        self._thread.start()

    def send(self, what: str, call: Callable[[], object], *, report_drop: bool = True) -> None:
        """Queue ``call``; ``report_drop=False`` for the drop report itself (no report of
        a report)."""
        with self._changed:
            self.pending.append((what, call, report_drop))
            self._changed.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued call went through (True) or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        self._retry_now.set()  # skip the rest of a backoff wait: someone is waiting
        with self._changed:
            while self.pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def close(self) -> None:
        """Stop the sender after its current call; what is still queued stays in
        ``pending`` (after a ``flush`` that timed out: calls the store never took)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._retry_now.set()

    def _send_all(self) -> None:
        backoff = 0.5
        retries = 0  # of the call at the head of the queue
        while True:
            with self._changed:
                while not self.pending and not self._closed:
                    self._changed.wait()
                if self._closed:
                    return
                what, call, report_drop = self.pending[0]
            try:
                call()
            except Exception as exc:
                limit = retry_limit(exc)
                if limit is None or retries < limit:
                    retries += 1
                    log.warning(
                        "MLflow unavailable (%s), %d call(s) buffered: %s",
                        what,
                        len(self.pending),
                        exc,
                    )
                    self._retry_now.wait(backoff)
                    self._retry_now.clear()
                    backoff = min(backoff * 2, self.max_backoff_s)
                    continue
                self.dropped.append((what, f"{type(exc).__name__}: {exc}"))
                log.warning(
                    "MLflow rejected %s; dropped it (%d dropped so far): %s",
                    what,
                    len(self.dropped),
                    exc,
                    exc_info=not isinstance(exc, MlflowException),  # our bug: show where
                )
                if report_drop and self.on_drop is not None:
                    self.on_drop(what, exc)
            with self._changed:
                self.pending.popleft()
                self._changed.notify_all()
            backoff = 0.5
            retries = 0


class MlflowSweepCallback(Callback):
    """Tune callback: a nested child run per trial, per-epoch metrics, statuses.

    Every MLflow call, creating a trial's run included, goes through the outbox and
    resolves run ids when it executes, so an unreachable tracking server never raises into
    Tune: calls wait in order and go out once the server answers again.
    """

    def __init__(self, tracking_uri: str, sweep_name: str, parent_run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.sweep_name = sweep_name
        self.parent_run_id = parent_run_id
        self.run_ids: dict[str, str] = {}  # trial_id -> child run id
        self.last_epoch: dict[str, int] = {}  # trial_id -> last epoch logged
        self.trial_runs: dict[str, str] = {}  # trial_key "config_id|precision/seed" -> run id
        self.closed: set[str] = set()  # trials of a group trial whose run ended before it
        self._connect()

    def _connect(self) -> None:
        # Fail fast inside one call (the outbox retries), instead of MLflow's own minutes-long
        # retry loop blocking Tune's event loop while a server is away.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        # With a tracking server, MLflow prints "View run ... / View experiment ..." (and
        # fetches the run again to do so) whenever a run ends: once per trial into the
        # sweep's output and job logs, which already name the MLflow UI once.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self._queued: set[str] = set()  # trials whose run lookup/creation is queued
        self._last_stamp: dict[str, int] = {}  # trial_id -> newest metric timestamp (ms)
        self._orphans_checked = False
        # Trials Tune restored with the sweep (None until its first step says): only they
        # can have a child run already. A trial this driver created never had one, so its
        # run is created without searching the sweep's runs (a search per trial costs time
        # in proportion to the runs so far).
        self._restored: set[str] | None = None
        # trial_id -> exploits in the pbt_lineage.json last queued (a resumed driver logs
        # the file again, whole: it is replaced, never appended to)
        self._lineage_logged: dict[str, int] = {}
        self.client = MlflowClient(self.tracking_uri)
        self.experiment_id: str | None = None
        self.outbox = _Outbox(on_drop=self._report_drop)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into its experiment state: keep ids, not live clients.
        skip = (
            *("client", "outbox", "_queued", "_last_stamp", "_orphans_checked", "_restored"),
            "_lineage_logged",
            "experiment_id",
        )
        return {k: v for k, v in self.__dict__.items() if k not in skip}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connect()

    # -- Tune hooks ------------------------------------------------------------------------
    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self._orphans_checked:
            return
        # The first step, before any trial starts: the trials Tune knows now are all those
        # of the sweep (none on a new sweep, the restored ones on a resume).
        self._orphans_checked = True
        known = {run_trial_id for t in trials for run_trial_id, _, _ in _trials_in(t)}
        self._restored = known
        if known:
            self.outbox.send("orphaned trial runs", lambda: self._delete_orphans(known))

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._ensure_run(trial)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        self._ensure_run(trial)
        if not is_group_trial(trial.config):
            self._log_lineage(trial.trial_id, None, result)  # a member across processes
            self._log_result(trial.trial_id, trial.config, result, final_may_repeat=True)
            return
        reported = result.get("trials") or {}
        for run_trial_id, config, slug in _trials_in(trial):
            entry = reported.get(slug)
            if entry is None or run_trial_id in self.closed:
                continue
            self._log_lineage(run_trial_id, trial.trial_id, entry)
            ended = _ended_as(entry)
            if ended:  # its final point once, and its run closed now
                self._log_result(run_trial_id, config, entry, final_may_repeat=True)
                reason = str(entry.get("failure_reason", ""))
                self._finish_trial_run(run_trial_id, "FAILED", ended, reason)
                self.closed.add(run_trial_id)
            else:
                self._log_result(run_trial_id, config, entry, final_may_repeat=False)

    def _log_result(
        self,
        trial_id: str,
        config: Mapping[str, Any],
        result: Mapping[str, Any],
        final_may_repeat: bool,
    ) -> None:
        """Queue one trial's epoch. A group trial reports an ended trial's
        final entry again each epoch (``final_may_repeat`` False): logged once."""
        epoch = int(result.get("epoch", result.get("training_iteration", 0)))
        # Strictly increasing per trial: MLflow orders points of one step by timestamp, and
        # a diverged trial's final NaN shares the step of the epoch it broke in.
        stamp = max(int(time.time() * 1000), self._last_stamp.get(trial_id, 0) + 1)
        self._last_stamp[trial_id] = stamp
        metrics = [
            Metric(key, float(value), stamp, epoch)
            for key, value in result.items()
            if key not in _NOT_METRICS and _is_number(value)
        ]
        if result.get("diverged"):
            # The final point of a diverged trial is an explicit NaN, so readers of the
            # last value (hpo compare) see the failure instead of an earlier epoch's Sharpe.
            metrics.append(Metric("val_sharpe", math.nan, stamp, epoch))
        if _is_retry(config) and "oom" not in result:
            # The trial's run holds the OOM attempt's oom = 1: the retry's epochs say 0.
            metrics.append(Metric("oom", 0.0, stamp, epoch))
        tags = [RunTag(TAG_FELL_BACK, str(bool(result.get("fell_back_to_f32"))).lower())]
        if result.get("node_id"):
            tags += [
                RunTag(TAG_NODE, str(result["node_id"])),
                RunTag(TAG_NODE_IP, str(result.get("node_ip", ""))),
            ]
        if result.get("failure_reason"):
            tags.append(RunTag(TAG_FAILURE, str(result["failure_reason"])[:5000]))
        final = final_may_repeat and bool(result.get("diverged") or result.get("oom"))

        def log_epoch() -> None:
            if epoch <= self.last_epoch.get(trial_id, 0) and not final:
                return  # an epoch re-run after a restore: its points are already in MLflow
            self.client.log_batch(self.run_ids[trial_id], metrics=metrics, tags=tags)
            self.last_epoch[trial_id] = max(epoch, self.last_epoch.get(trial_id, 0))

        self.outbox.send(f"metrics of {trial_id} epoch {epoch}", log_epoch)

    def _log_lineage(self, trial_id: str, group_id: str | None, entry: Mapping[str, Any]) -> None:
        """Queue a population's trial's lineage as the run artifact
        :data:`LINEAGE_ARTIFACT` when it is new or grew: one object per exploit (the
        epoch after which it copied, the donor's trial id and key, its settings before
        and after). Trials not in a population carry no lineage and get no file. In a
        group trial (``group_id``) a donor is named by its slug; across processes, by its
        own Tune trial id."""
        lineage = entry.get(LINEAGE_KEY)
        if not isinstance(lineage, list):
            return
        if trial_id in self._lineage_logged and len(lineage) <= self._lineage_logged[trial_id]:
            return
        self._lineage_logged[trial_id] = len(lineage)
        exploits = [
            {
                "epoch": e.get("epoch"),
                # A board's answer names the donor's run; a group trial's own exploit, the
                # donor's slug in it (trials_of names its run <group id>-<slug>).
                "donor_trial_id": e.get("donor_trial_id")
                or (f"{group_id}-{e.get('donor')}" if group_id else e.get("donor")),
                "donor_key": e.get("donor_key"),
                "before": e.get("before"),
                "after": e.get("after"),
            }
            for e in lineage
        ]
        text = json.dumps({"trial_id": trial_id, "exploits": exploits}, indent=1)

        def upload() -> None:
            self.client.log_text(self.run_ids[trial_id], text, LINEAGE_ARTIFACT)

        self.outbox.send(f"lineage of {trial_id}", upload)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        if is_group_trial(trial.config):
            from trainables.checkpoint_files import CKPT_SUBDIR

            reported = result.get("trials") or {}
            for run_trial_id, _, slug in _trials_in(trial):
                entry = reported.get(slug) or {}
                if run_trial_id in self.closed:
                    continue
                ended = _ended_as(entry)
                if ended:
                    reason = str(entry.get("failure_reason", ""))
                    self._finish_trial_run(run_trial_id, "FAILED", ended, reason)
                else:
                    self._log_returns_of(run_trial_id, trial, f"{CKPT_SUBDIR}/{slug}")
                    self._finish_trial_run(run_trial_id, "FINISHED", "completed")
            return
        if result.get("oom"):
            self._finish(trial, "FAILED", "oom", str(result.get("failure_reason", "")))
            return
        diverged = bool(result.get("diverged"))
        if not diverged:
            self._log_returns(trial)
        self._finish(
            trial, "FAILED" if diverged else "FINISHED", "diverged" if diverged else "completed"
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        reason = ""
        if getattr(trial, "error_file", None):
            reason = f"see {trial.error_file}"
        self._ensure_run(trial)
        for run_trial_id, _, _ in _trials_in(trial):
            self._finish_trial_run(run_trial_id, "FAILED", "error", reason)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.flush(timeout_s=300.0)
        self.outbox.close()
        if self.outbox.pending:
            log.error(
                "MLflow at %s stayed unreachable: %d call(s) not logged",
                self.tracking_uri,
                len(self.outbox.pending),
            )

    def log_looks(
        self,
        records: Mapping[str, Mapping[str, Any]],
        family: str,
        look: Mapping[str, Any] | None = None,
    ) -> None:
        """Queue a sequential comparison's records (every family's, as
        :meth:`hpo.search.budget.SequentialBudget.record` returns them) onto the parent run:
        the artifact :data:`SEQUENTIAL_ARTIFACT`, rewritten whole, the tags
        ``cmp.<family>.decision`` and ``cmp.<family>.stopped_on``, the metrics
        ``cmp.<family>.configs`` (the last look's) and ``cmp.<family>.configs_made``, and
        ``look``'s mean and interval as ``cmp.<family>.look_mean`` / ``look_low`` /
        ``look_high`` at step = its configurations. Through the outbox: never waits."""
        payload = sequential_payload(records)
        record = records[family]
        looks = record["looks"]
        stamp = int(time.time() * 1000)
        metrics = [
            Metric(f"cmp.{family}.configs", float(looks[-1]["configs"] if looks else 0), stamp, 0),
            Metric(f"cmp.{family}.configs_made", float(record["configs_made"]), stamp, 0),
        ]
        if look is not None:
            for key in ("mean", "low", "high"):
                if _is_number(look.get(key)):
                    metrics.append(
                        Metric(f"cmp.{family}.look_{key}", float(look[key]), stamp, look["configs"])
                    )
        tags = [
            RunTag(f"cmp.{family}.decision", str(record["decision"])),
            RunTag(f"cmp.{family}.stopped_on", str(record["stopped_on"] or "running")),
        ]

        def send() -> None:
            self.client.log_dict(self.parent_run_id, payload, SEQUENTIAL_ARTIFACT)
            self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags)

        self.outbox.send(f"sequential looks of {family}", send)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait for every queued MLflow call to go through; False if some are still queued."""
        return self.outbox.flush(timeout_s)

    def _report_drop(self, what: str, exc: BaseException) -> None:
        """Count a dropped call on the parent run, where the sweep's reader looks."""
        count = len(self.outbox.dropped)
        note = f"{what}: {type(exc).__name__}: {exc}"[:5000]

        def report() -> None:
            stamp = int(time.time() * 1000)
            self.client.log_batch(
                self.parent_run_id,
                metrics=[Metric(METRIC_DROPPED, float(count), stamp, count)],
                tags=[RunTag(TAG_LAST_DROPPED, note)],
            )

        self.outbox.send(f"count of dropped writes ({count})", report, report_drop=False)

    # -- runs ------------------------------------------------------------------------------
    def _ensure_run(self, trial: Any) -> None:
        """Queue finding (after a restore) or creating the child run of the trial (of each
        trial of a group trial), once."""
        group = trial.trial_id if is_group_trial(trial.config) else ""
        for run_trial_id, config, _ in _trials_in(trial):
            self._ensure_trial_run(run_trial_id, config, group)

    def _ensure_trial_run(self, trial_id: str, config: Mapping[str, Any], group: str = "") -> None:
        if trial_id in self._queued:
            return
        self._queued.add(trial_id)
        # Stamped here, on Tune's thread, like the metric points: with calls backed up in
        # the outbox, the run may open after this trial's first epochs were queued. Later
        # than every point stamped so far (an OOM attempt's last ones may share the ms).
        started = max(int(time.time() * 1000), max(self._last_stamp.values(), default=0) + 1)
        self._last_stamp[trial_id] = started
        self.outbox.send(
            f"run of {trial_id}", lambda: self._open_run(trial_id, config, started, group)
        )

    def _open_run(
        self, trial_id: str, config: Mapping[str, Any], started: int, group: str = ""
    ) -> None:
        if self.experiment_id is None:
            self.experiment_id = ensure_experiment(self.client, experiment_name(self.sweep_name))
        run_id = self.run_ids.get(trial_id)
        if run_id is None and (self._restored is None or trial_id in self._restored):
            run_id = self._find_child(trial_id)
        if run_id is not None:
            # Restored ids come from Tune's last experiment snapshot, which can be older
            # than what reached MLflow before a crash: ask MLflow what is already logged.
            logged = self._logged_epochs(run_id)
            self.last_epoch[trial_id] = max(self.last_epoch.get(trial_id, 0), logged)
            self.client.update_run(run_id, status="RUNNING")
        elif _is_retry(config) and (
            run_id := self._continue_trial_run(trial_id, config, started, group)
        ):
            self.client.update_run(run_id, status="RUNNING")
        else:
            tags = {
                TAG_PARENT: self.parent_run_id,
                TAG_ROLE: ROLE_TRIAL,
                TAG_SWEEP: self.sweep_name,
                TAG_FAMILY: config["family"],
                TAG_PRECISION: config["precision"],
                TAG_SEED: str(config["seed"]),
                TAG_PAIR: config["pair_id"],
                TAG_CONFIG: config["config_id"],
                TAG_TRIAL: trial_id,
                TAG_FELL_BACK: "false",
                TAG_STATUS: "running",
            }
            if group:
                tags[TAG_GROUP] = group
            run = self.client.create_run(
                self.experiment_id, run_name=trial_run_name(config), tags=tags
            )
            run_id = run.info.run_id
            self.last_epoch[trial_id] = 0
        self.run_ids[trial_id] = run_id
        self.trial_runs.setdefault(trial_key(config), run_id)
        # Params last, and on a reopened run too (MLflow accepts a param logged again with
        # its value): a retry after a failure here still logs them, and a rejected param
        # leaves the run known, so the trial's metrics still land.
        params = [Param(k, v) for k, v in trial_params(config).items()]
        self.client.log_batch(run_id, params=params)

    def _continue_trial_run(
        self, trial_id: str, config: Mapping[str, Any], started: int, group: str = ""
    ) -> str | None:
        """The run of the trial an OOM retry is an attempt at, taken over by the retry (None:
        the first attempt has no run, so the retry opens one); its group tag names the
        group trial the retry runs in (none for a retry alone)."""
        assert self.experiment_id is not None
        run_id = self.trial_runs.get(trial_key(config))
        if run_id is None:
            runs = self.client.search_runs(
                [self.experiment_id],
                filter_string=(
                    f"tags.{TAG_CONFIG} = '{config['config_id']}' and "
                    f"tags.{TAG_PRECISION} = '{config['precision']}' and "
                    f"tags.{TAG_SEED} = '{config['seed']}' and "
                    f"tags.`{TAG_PARENT}` = '{self.parent_run_id}'"
                ),
                max_results=1,
            )
            run_id = runs[0].info.run_id if runs else None
        if run_id is None:
            return None
        tags = self.client.get_run(run_id).data.tags
        attempts = [a for a in tags.get(TAG_OOM_ATTEMPTS, "").split(",") if a]
        previous = tags.get(TAG_TRIAL)
        if previous and previous != trial_id and previous not in attempts:
            attempts.append(previous)
        self.client.log_batch(
            run_id,
            tags=[
                RunTag(TAG_TRIAL, trial_id),
                RunTag(TAG_OOM_ATTEMPTS, ",".join(attempts)),
                RunTag(TAG_ATTEMPT_START, str(started)),
            ],
        )
        if TAG_FAILURE in tags:  # the OOM's reason; the retry's own outcome replaces it
            self.client.delete_tag(run_id, TAG_FAILURE)
        if group:
            self.client.set_tag(run_id, TAG_GROUP, group)
        elif TAG_GROUP in tags:
            self.client.delete_tag(run_id, TAG_GROUP)
        self.last_epoch[trial_id] = 0  # a fresh attempt: its epochs are logged from 1 again
        return run_id

    def _delete_orphans(self, known: set[str]) -> None:
        """Child runs of trials the resumed sweep does not know: a driver killed between
        starting a trial and its next experiment snapshot leaves that trial's run behind,
        and the resumed searcher hands the same configuration to a new trial. The orphan is
        deleted (MLflow keeps it restorable), so each trial of the sweep has one run."""
        if self.experiment_id is None:
            self.experiment_id = ensure_experiment(self.client, experiment_name(self.sweep_name))
        children = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{TAG_PARENT}` = '{self.parent_run_id}'",
            max_results=50_000,
        )
        for run in children:
            trial_id = run.data.tags.get(TAG_TRIAL)
            if trial_id is None or trial_id in known:
                continue
            log.warning(
                "deleting MLflow run %s of trial %s: the sweep's saved state never recorded "
                "that trial, and its configuration runs again under a new trial id "
                "(restore it with `mlflow runs restore --run-id %s`)",
                run.info.run_id,
                trial_id,
                run.info.run_id,
            )
            self.client.delete_run(run.info.run_id)

    def _find_child(self, trial_id: str) -> str | None:
        assert self.experiment_id is not None
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.{TAG_TRIAL} = '{trial_id}' and tags.`{TAG_PARENT}` = '{self.parent_run_id}'"
            ),
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def _logged_epochs(self, run_id: str) -> int:
        """The last epoch the run's current attempt logged: an OOM retry's run also holds
        the points of the attempts before it (:data:`TAG_ATTEMPT_START` tells them apart),
        and a resumed retry must still log its epochs past theirs."""
        since = int(self.client.get_run(run_id).data.tags.get(TAG_ATTEMPT_START, 0))
        history = self.client.get_metric_history(run_id, "val_sharpe")
        return max((m.step for m in history if m.timestamp >= since), default=0)

    def _log_returns(self, trial: Any) -> None:
        """Queue the trial's final returns (its newest checkpoint's returns.csv) as the run
        artifact :data:`RETURNS_ARTIFACT`, ahead of closing the run: a run that reads as
        ended has its artifact. Read in the outbox thread, so an object store never
        stalls Tune's loop; a checkpoint without the file (or with a bad checksum) is
        logged and skipped, and ``hpo compare`` says the series is not available."""
        from trainables.checkpoint_files import CKPT_SUBDIR

        self._ensure_run(trial)
        self._log_returns_of(trial.trial_id, trial, CKPT_SUBDIR)

    def _log_returns_of(self, trial_id: str, trial: Any, state: str) -> None:
        """:meth:`_log_returns` of one trial (alone or in a group trial), whose state is
        ``state`` inside the Tune checkpoint."""
        checkpoint = getattr(trial, "checkpoint", None)
        if checkpoint is None:
            return

        def upload() -> None:
            try:
                text = checkpoint_returns(checkpoint, state)
            except (OSError, ValueError) as exc:
                log.warning("trial %s: returns not logged: %s", trial_id, exc)
                return
            if text is not None:
                self.client.log_text(self.run_ids[trial_id], text, RETURNS_ARTIFACT)

        self.outbox.send(f"returns of {trial_id}", upload)

    def _finish(self, trial: Any, status: str, label: str, reason: str = "") -> None:
        self._ensure_run(trial)
        self._finish_trial_run(trial.trial_id, status, label, reason)

    def _finish_trial_run(self, trial_id: str, status: str, label: str, reason: str = "") -> None:
        tags = [RunTag(TAG_STATUS, label)]
        if reason:
            tags.append(RunTag(TAG_FAILURE, reason[:5000]))

        def close() -> None:
            run_id = self.run_ids[trial_id]
            self.client.log_batch(run_id, tags=tags)
            self.client.set_terminated(run_id, status=status)

        self.outbox.send(f"close {trial_id}", close)

    # -- state saved with the sweep (Tune experiment checkpoints) ---------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "run_ids": dict(self.run_ids),
            "last_epoch": dict(self.last_epoch),
            "trial_runs": dict(self.trial_runs),
            "closed": sorted(self.closed),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self.run_ids.update(state.get("run_ids", {}))
        self.last_epoch.update(state.get("last_epoch", {}))
        self.trial_runs.update(state.get("trial_runs", {}))
        self.closed.update(state.get("closed", []))


def _ended_as(entry: Mapping[str, Any]) -> str:
    """How one trial's entry in a group trial's result failed: ``"oom"`` (the group ran
    out of GPU memory; a retry continues its run), ``"diverged"``, or "" (it did not)."""
    if entry.get("oom"):
        return "oom"
    return "diverged" if entry.get("diverged") else ""


def _is_retry(config: Mapping[str, Any]) -> bool:
    """An OOM retry's trial config (it carries the larger share it must get)."""
    from trainables.config import RETRY_FLOOR_KEY

    return bool(config.get(RETRY_FLOOR_KEY))


def _trials_in(trial: Any) -> list[tuple[str, Mapping[str, Any], str]]:
    return trials_of(trial.trial_id, trial.config)


def checkpoint_returns(checkpoint: Any, state: str | None = None) -> str | None:
    """The text of the returns file in a reported Tune checkpoint (local or in an object
    store, through the checkpoint's pyarrow filesystem), verified against the checksum in
    its meta.json; None when the checkpoint has none (saved before an evaluation).

    Raises:
        ValueError: the file is not listed in meta.json's checksums, or does not match.
        OSError: the storage could not be read.
    """
    import hashlib
    import json

    from trainables.checkpoint_files import CKPT_SUBDIR, META_FILE
    from trainables.returns_file import RETURNS_FILE

    fs, root = checkpoint.filesystem, f"{checkpoint.path.rstrip('/')}/{state or CKPT_SUBDIR}"
    path = f"{root}/{RETURNS_FILE}"
    if fs.get_file_info(path).type.name != "File":
        return None
    with fs.open_input_stream(path) as stream:
        data = stream.read()
    with fs.open_input_stream(f"{root}/{META_FILE}") as stream:
        expected = (json.loads(stream.read()).get("checksums") or {}).get(RETURNS_FILE)
    if expected is None:
        raise ValueError(f"{path}: not listed in meta.json's checksums")
    if hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(f"{path}: checksum mismatch (truncated or corrupted file)")
    return data.decode("utf-8")


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
