"""Failed trials: retried from the checkpoint of their last recorded epoch, and a sweep
stopped when its first trials all fail with the same error of their own code.


A function trainable's checkpoint reaches Tune in two steps: the epoch's result (already
naming its persisted ``checkpoint_dir_name``) is processed and logged first, and the
checkpoint is registered only when a separate ``save`` round-trip to the trial's actor
returns. A worker killed between the two leaves the epoch in ``result.json`` and MLflow
while Tune would retry from the epoch before, training that epoch twice. This callback
registers the checkpoint the last recorded result names before the retry is scheduled (and
before a resumed sweep restarts its trials), so a restarted trial redoes nothing it has
reported. The trial itself still falls back to an older checkpoint if this one turns out
unreadable (``trainables.trial``).

:class:`StopOnRepeatedError` ends a sweep whose first trials all raise one error of the
trial's own code (a missing data file, a setting the model refuses) before any trial
finished: every later trial would fail the same way. Faults of where a trial ran (a
killed worker, a lost node, a timeout) are not counted: Tune's FailureConfig retries them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import cloudpickle
from ray.exceptions import RayError, RayTaskError
from ray.tune import Callback, Checkpoint
from ray.tune.stopper import Stopper

from hpo.trials import TrialStatus

log = logging.getLogger(__name__)


class AdoptReportedCheckpoint(Callback):
    """Before a failed trial is retried, and before the trials of a resumed sweep restart
    (a stop can land between a result and its save just the same)."""

    def __init__(self) -> None:
        self._restored_checked = False

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self._restored_checked:
            return
        self._restored_checked = True  # the first step, before any trial (re)starts
        for trial in trials:
            if not TrialStatus(trial.status).terminated:
                adopt_reported_checkpoint(trial)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        adopt_reported_checkpoint(trial)


def adopt_reported_checkpoint(trial: Any) -> bool:
    """Register the checkpoint named by ``trial.last_result`` if Tune has not yet; True
    when it did."""
    from pyarrow import fs as pafs
    from ray.train._internal.session import _TrainingResult

    result = trial.last_result or {}
    name = result.get("checkpoint_dir_name")
    if not name:
        return False
    current = trial.checkpoint
    current_name = current.path.rstrip("/").rsplit("/", 1)[-1] if current is not None else ""
    # Checkpoint directories are numbered with zero padding: names order like epochs.
    if current_name >= name:
        return False
    storage = trial.storage
    path = f"{storage.trial_fs_path}/{name}"
    info = storage.storage_filesystem.get_file_info(path)
    if info.type != pafs.FileType.Directory:
        return False
    checkpoint = Checkpoint(path=path, filesystem=storage.storage_filesystem)
    try:
        trial.on_checkpoint(_TrainingResult(checkpoint=checkpoint, metrics=dict(result)))
    except FileNotFoundError as exc:
        # Registering it made Tune delete a checkpoint beyond num_to_keep that is already
        # gone (a killed driver's trial may have cleaned it up itself). Tune updates its list
        # before deleting, so the adoption stands; finish what on_checkpoint does after it.
        log.info("trial %s: an old checkpoint was already deleted (%s)", trial.trial_id, exc)
        trial.storage._update_checkpoint_index(result)
        trial.invalidate_json_state()
        trial.run_metadata.invalidate_cache()
    log.info("trial %s will resume from %s, its last reported checkpoint", trial.trial_id, name)
    return True


REPEATS_TO_STOP = 3  # the first failures of a sweep that decide, when all alike...
TRIALS_TO_STOP = 2  # ...and in at least this many different trials


def error_signature(error: BaseException | None) -> str | None:
    """``"Type: message"`` of an exception the trial's own code raised (Ray hands it over
    as a RayTaskError's ``cause``), which the same code raises again; None for a fault of
    where the trial ran (a Ray error: dead worker or node, out of memory, lost object) or
    of the network (a connection error, a timeout), which a retry can outlive."""
    cause = error.cause if isinstance(error, RayTaskError) else None
    if cause is None or isinstance(cause, RayError | ConnectionError | TimeoutError):
        return None
    return f"{type(cause).__name__}: {cause}"


class StopOnRepeatedError(Callback, Stopper):
    """Tune callback and stopper: when the sweep's failures so far (retries included) are
    at least ``repeats``, all one error of the trial's own code, in at least ``trials``
    different trials, and no trial has finished, the sweep stops and :attr:`reason` says
    why and what to do. A fault among them, a finished trial or a second, different error
    leave the sweep to Tune's FailureConfig for good. Two trials, not one: a single trial
    can fail on a value only its sampled configuration has. The trials are counted however
    the failures interleave: one trial at a time (``max_concurrent = 1``, one GPU), Tune
    retries a failed trial before it starts the next, so its retries come first."""

    def __init__(self, repeats: int = REPEATS_TO_STOP, trials: int = TRIALS_TO_STOP) -> None:
        self.repeats = max(1, repeats)
        self.trials = max(1, min(trials, self.repeats))
        self.failures: list[tuple[str, str]] = []  # (trial_id, error signature), in order
        self.watching = True
        self.reason: str | None = None

    # -- Callback --------------------------------------------------------------------------
    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.watching = False  # the spec can finish a trial: the errors are not the spec's

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._record(trial)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._record(trial)

    # -- Stopper ---------------------------------------------------------------------------
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False  # trials are never stopped one by one here

    def stop_all(self) -> bool:
        return self.reason is not None

    def _record(self, trial: Any) -> None:
        if not self.watching:
            return
        signature = error_signature(_recorded_error(trial))
        if signature is None:
            self.watching = False  # a fault: leave this sweep to the retries
            return
        if self.failures and signature != self.failures[0][1]:
            self.watching = False  # two different errors: not one cause every trial meets
            return
        self.failures.append((trial.trial_id, signature))
        in_trials = {trial_id for trial_id, _ in self.failures}
        if len(self.failures) >= self.repeats and len(in_trials) >= self.trials:
            self.watching = False
            self.reason = (
                f"stopped the sweep: its first {len(self.failures)} failures, in "
                f"{len(in_trials)} trials, were the same error before any trial finished, "
                f"so every trial would fail: {signature} (traceback: {trial.path}/error.txt). "
                "Fix what the error names (the spec, its data or the environment), then "
                "start the sweep again (`hpo resume SWEEP_DIR` continues this one when the "
                "fix is outside the spec)"
            )
            log.error("%s", self.reason)


def _recorded_error(trial: Any) -> BaseException | None:
    """The exception Tune recorded for the trial's latest failure: the pickle it writes
    into the driver's staging copy of the trial directory before calling the callbacks
    (``trial.get_pickled_error()`` reads the sweep's storage, which is synced later)."""
    path = trial.pickled_error_file
    if not path or not Path(path).is_file():
        return None
    with open(path, "rb") as f:
        # Written by this driver's Tune a moment ago, in its own staging directory; Tune
        # unpickles the same record itself when it builds the ResultGrid after fit().
        error = cloudpickle.load(f)
    return error if isinstance(error, BaseException) else None
