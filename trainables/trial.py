"""The Ray Tune trainable: a thin function around the shared :class:`Trainer`.

Config in: a :class:`trainables.config.TrialConfig` dict (encoded by
:class:`hpo.search.sweep_searcher.SweepSearcher`, decoded here by ``TrialConfig.from_dict``).

Each epoch it reports the trainer's metrics together with a checkpoint directory
(``tune.report(metrics, checkpoint=...)``); a restarted trial (FailureConfig retry, or
``hpo resume``) continues from ``tune.get_checkpoint()``, falling back to the trial's
previous checkpoint when the newest one is corrupt. A trial that diverges even after the
bf16 -> f32 fallback reports ``diverged = 1`` with the reason and ends, instead of
raising: retrying a deterministic divergence would only repeat it.
"""

from __future__ import annotations

import gc
import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ray import tune

from cluster.gpu_types import GpuType, declared_memory_bytes, node_type_name, this_node
from cluster.packing import (
    TrialDoesNotFit,
    apply_memory_cap,
    caps_memory,
    retry_fraction_after_oom,
    trial_memory_metrics,
)
from cluster.vram_table import SharedVramCache, type_key
from trainables.checkpoint import Checkpoint, CheckpointError, load_checkpoint
from trainables.config import TrainConfig, TrialConfig
from trainables.memory import freeze_long_lived_objects
from trainables.trainer import Trainer, TrialDiverged

log = logging.getLogger("trainables.trial")

CKPT_SUBDIR = "state"  # inside each reported Tune checkpoint directory


def run_trial(config: dict[str, Any]) -> None:
    """Ray Tune function trainable."""
    freeze_long_lived_objects()  # first, while nothing of this trial exists yet
    resources = tune.get_context().get_trial_resources()
    required = resources.required_resources if resources is not None else {}
    torch.set_num_threads(max(1, int(required.get("CPU", 1))))
    gpu_fraction = float(required.get("GPU", 0.0))
    train_config = TrialConfig.from_dict(config).train_config()
    _cap_memory(train_config, gpu_fraction)  # Ray does not enforce GPU shares; the trial does
    node = _node()
    progress = _Progress()
    oom: str | None = None
    try:
        _train(train_config, gpu_fraction, node, progress)
    except torch.cuda.OutOfMemoryError as exc:
        # Building the trainer, restoring its checkpoint and every epoch are in here: an
        # OOM anywhere is the share's fault. Only the message leaves this block: the
        # exception's traceback holds _train's frame, and with it the trainer and every
        # tensor of the failed step; Python drops ``exc`` at the end of the block.
        oom = str(exc)
    if oom is not None:
        _report_oom(train_config, gpu_fraction, progress.epoch + 1, oom, node)


@dataclass
class _Progress:
    epoch: int = 0  # epochs completed (what an OOM report counts from)


def _train(
    train_config: TrainConfig, gpu_fraction: float, node: dict[str, str], progress: _Progress
) -> None:
    checkpoint = _restore_checkpoint()
    trainer = Trainer(train_config, checkpoint=checkpoint)
    del checkpoint  # its tensors are the trainer's now
    progress.epoch = trainer.epoch
    memory = trial_memory_metrics(train_config, gpu_fraction) if gpu_fraction > 0 else {}
    while trainer.epoch < train_config.epochs:
        try:
            metrics = trainer.train_epoch()
        except TrialDiverged as exc:
            # The epoch that diverged, reported once: no checkpoint (nothing worth resuming).
            tune.report(
                {
                    "epoch": trainer.epoch + 1,
                    "val_sharpe": math.nan,
                    "diverged": 1,
                    "failure_reason": str(exc),
                    "fell_back_to_f32": int(trainer.fell_back_to_f32),
                    "skipped_steps": trainer.skipped_steps,
                    **node,
                }
            )
            return
        _report(trainer, {**metrics, "diverged": 0, **memory, **node})
        progress.epoch = trainer.epoch


def _report_oom(
    config: TrainConfig, fraction: float, epoch: int, message: str, node: dict[str, str]
) -> None:
    """The measured share was too small: record it against the shape in the sweep's
    shared VRAM cache (where the driver sizes shares), re-measure here with the memory of
    the failed attempt freed, and hand the searcher a larger share to retry with.
    Reported, not raised: a FailureConfig retry would reuse the same too-small share."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    report: dict[str, Any] = {"epoch": epoch, "val_sharpe": math.nan, "oom": 1, **node}
    shared, gpu_type = _shared_cache(), _node_gpu_type()
    try:
        retry = retry_fraction_after_oom(config, fraction, shared=shared, gpu_type=gpu_type)
        report["oom_retry_gpu_fraction"] = retry
        report["failure_reason"] = (
            f"CUDA out of memory at GPU share {fraction:g}; retrying at {retry:g} ({message})"
        )
    except TrialDoesNotFit as too_big:
        report["failure_reason"] = f"CUDA out of memory on a whole GPU: {too_big}"
    if gpu_type is not None:
        report["gpu_type"] = gpu_type.name
    tune.report(report)


def _cap_memory(config: TrainConfig, gpu_fraction: float) -> float | None:
    """Cap the allocator to the trial's share less the CUDA context its share was planned
    with: the profile's (measured on the node, or the allowance), from the sweep's shared
    cache under this node's GPU type; the allowance where no profile is found there."""
    context = _planned_context_bytes(config) if caps_memory(gpu_fraction) else None
    return apply_memory_cap(gpu_fraction or None, context_bytes=context)


def _planned_context_bytes(config: TrainConfig) -> int | None:
    shared, gpu_type = _shared_cache(), _node_gpu_type()
    if shared is None or gpu_type is None:
        return None
    try:
        profile = shared.get(type_key(config, gpu_type))
    except Exception as exc:  # an unreadable cache costs the exact cap, not the trial
        log.warning("no profile in the sweep's VRAM cache (%s); capping with the allowance", exc)
        return None
    return profile.context_bytes if profile is not None else None


def _shared_cache() -> SharedVramCache | None:
    """The sweep storage's VRAM cache (every node and the driver see it)."""
    try:
        storage = tune.get_context().get_storage()
        return SharedVramCache.in_storage(storage.storage_filesystem, storage.storage_fs_path)
    except Exception as exc:  # outside Tune (a direct call in a test): no shared storage
        log.warning("no sweep storage for the VRAM cache (%s)", exc)
        return None


def _node_gpu_type() -> GpuType | None:
    """This node's GPU type, as the driver's :func:`cluster.gpu_types.gpu_types` sees it."""
    try:
        node_id, resources = this_node()
    except Exception:
        return None
    return GpuType(
        name=node_type_name(resources),
        memory_bytes=declared_memory_bytes(resources),
        gpus=float(resources.get("GPU", 0)),
        gpus_per_node=float(resources.get("GPU", 0)),
        cpus_per_node=float(resources.get("CPU", 0)),
        node_ids=(node_id,),
    )


def _report(trainer: Trainer, metrics: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="hpo-ckpt-") as tmp:
        trainer.save(Path(tmp) / CKPT_SUBDIR)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))


def _restore_checkpoint() -> Checkpoint | None:
    """The newest good checkpoint of this trial, or None for a fresh start."""
    reported = tune.get_checkpoint()
    if reported is None:
        return None
    try:
        return _load(reported)
    except CheckpointError as exc:
        log.warning("newest checkpoint unusable, trying older ones: %s", exc)
    # Tune keeps the previous checkpoints beside the newest (CheckpointConfig.num_to_keep),
    # on whatever storage the sweep uses (a path or an object store: list through pyarrow).
    # Only older ones qualify: a newer directory belongs to an epoch whose result never
    # reached the driver, so resuming from it would skip that epoch's metrics.
    from pyarrow import fs as pafs

    filesystem = reported.filesystem
    trial_dir, newest = reported.path.rstrip("/").rsplit("/", 1)
    listing = filesystem.get_file_info(pafs.FileSelector(trial_dir))
    older = sorted(
        (
            info.base_name
            for info in listing
            if info.type == pafs.FileType.Directory
            and info.base_name.startswith("checkpoint_")
            and info.base_name < newest
        ),
        reverse=True,
    )
    for name in older:
        try:
            found = _load(tune.Checkpoint(f"{trial_dir}/{name}", filesystem=filesystem))
        except CheckpointError as exc:
            log.warning("skipping %s", exc)
            continue
        log.warning("resuming from the previous checkpoint %s", name)
        return found
    raise CheckpointError(Path(reported.path), "no usable checkpoint for this trial")


def _load(checkpoint: tune.Checkpoint) -> Checkpoint:
    # as_directory() is the directory itself on a local path, a download otherwise; the
    # loaded checkpoint holds its tensors in memory, not the files.
    with checkpoint.as_directory() as directory:
        return load_checkpoint(Path(directory) / CKPT_SUBDIR)


def _node() -> dict[str, str]:
    import ray

    try:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}
    except Exception:
        return {}
