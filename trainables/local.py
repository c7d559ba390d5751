"""One trial in-process, without Ray: what ``hpo train`` runs.

A run directory looks like::

    DIR/checkpoints/epoch_0001/ ...   one checkpoint per epoch (newest 3 kept)
    DIR/metrics.json                  per-epoch metric history and the final summary

``--resume`` accepts a run directory, its ``checkpoints`` folder, or a single checkpoint
directory (for example a Ray Tune trial's ``checkpoint_000004`` that ``hpo best`` named).
A resumed run trains on the ``device`` it is given (``--device``), not on the device
named in the checkpoint's config: a trial trained on a GPU continues on a CPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainables.checkpoint import (
    CheckpointError,
    checkpoint_source,
    epoch_dir_name,
    latest_good_checkpoint,
    prune_checkpoints,
)
from trainables.checkpoint_files import CHECKPOINTS
from trainables.config import TrainConfig
from trainables.trainer import Trainer

METRICS_FILE = "metrics.json"
KEEP_CHECKPOINTS = 3


@dataclass(frozen=True)
class LocalRun:
    out_dir: Path
    history: list[dict[str, Any]]
    precision: str
    fell_back_to_f32: bool
    resumed_from: Path | None
    skipped_checkpoints: list[str]

    @property
    def final(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}


def train_local(
    config: TrainConfig | None,
    out_dir: Path | None,
    *,
    resume: Path | None = None,
    precision: str | None = None,
    epochs: int | None = None,
    device: str | None = None,
    on_epoch: Callable[[Trainer, dict[str, Any]], None] | None = None,
    on_start: Callable[[Trainer], None] | None = None,
) -> LocalRun:
    """Train a fresh trial (``config``) or continue one (``resume``) and write checkpoints.

    ``precision``, ``epochs`` and ``device`` (``auto``, ``cpu``, ``cuda[:N]``) replace the
    config's values when given; on resume they override what the checkpoint saved.
    """
    skipped: list[str] = []
    checkpoint = None
    if resume is not None:
        checkpoint, errors = latest_good_checkpoint(checkpoint_source(resume))
        skipped = [str(e) for e in errors]
        if checkpoint is None:
            detail = "; ".join(skipped) or "no checkpoint found"
            raise CheckpointError(Path(resume), f"nothing to resume from ({detail})")
        config = TrainConfig.from_dict(checkpoint.meta["config"])
        if out_dir is None:
            if (Path(resume) / CHECKPOINTS).is_dir():
                out_dir = Path(resume)
            else:
                raise ValueError(
                    "--out is required when resuming from a single checkpoint directory"
                )
    if config is None or out_dir is None:
        raise ValueError("train_local needs a config and an output directory")
    changes: dict[str, Any] = {}
    if precision is not None:
        changes["precision"] = precision
    if epochs is not None:
        changes["epochs"] = epochs
    if device is not None:
        changes["device"] = device
    config = config.replace(**changes) if changes else config

    trainer = Trainer(config, checkpoint=checkpoint)
    if on_start is not None:
        on_start(trainer)
    out_dir = Path(out_dir)
    ckpt_root = out_dir / CHECKPOINTS

    def after_epoch(t: Trainer, metrics: dict[str, Any]) -> None:
        t.save(ckpt_root / epoch_dir_name(t.epoch))
        prune_checkpoints(ckpt_root, KEEP_CHECKPOINTS)
        _write_metrics(out_dir, t)
        if on_epoch is not None:
            on_epoch(t, metrics)

    trainer.fit(after_epoch)
    _write_metrics(out_dir, trainer)
    return LocalRun(
        out_dir=out_dir,
        history=trainer.history,
        precision=trainer.policy.name,
        fell_back_to_f32=trainer.fell_back_to_f32,
        resumed_from=checkpoint.path if checkpoint else None,
        skipped_checkpoints=skipped,
    )


def _write_metrics(out_dir: Path, trainer: Trainer) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "family": trainer.family.name,
        "requested_precision": trainer.config.precision,
        "precision": trainer.policy.name,
        "fell_back_to_f32": trainer.fell_back_to_f32,
        "epochs": trainer.epoch,
        "final": trainer.history[-1] if trainer.history else {},
        "history": trainer.history,
        "config": trainer.config.to_dict(),
    }
    tmp = out_dir / (METRICS_FILE + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    tmp.replace(out_dir / METRICS_FILE)
