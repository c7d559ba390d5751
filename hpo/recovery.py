"""Retry a failed trial from the checkpoint of its last recorded epoch.

A function trainable's checkpoint reaches Tune in two steps: the epoch's result (already
naming its persisted ``checkpoint_dir_name``) is processed and logged first, and the
checkpoint is registered only when a separate ``save`` round-trip to the trial's actor
returns. A worker killed between the two leaves the epoch in ``result.json`` and MLflow
while Tune would retry from the epoch before, training that epoch twice. This callback
registers the checkpoint the last recorded result names before the retry is scheduled (and
before a resumed sweep restarts its trials), so a restarted trial redoes nothing it has
reported. The trial itself still falls back to an older checkpoint if this one turns out
unreadable (``trainables.trial``).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.tune import Callback, Checkpoint

from hpo.sweep import TrialStatus

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
            if not TrialStatus(trial.status).finished:
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
    trial.on_checkpoint(_TrainingResult(checkpoint=checkpoint, metrics=dict(result)))
    log.info("trial %s will resume from %s, its last reported checkpoint", trial.trial_id, name)
    return True
