"""Inside a packed trial: keeping to its GPU share, and what an OOM does to it.

Ray does not enforce fractional GPU shares, so :class:`PackedShare` (the sweep hands it to
:func:`trainables.trial.run_trial`) caps the trial's CUDA allocator at its share less the
CUDA context its share was planned with: the profile's, read from the sweep storage's
shared VRAM cache under this node's GPU type, or the allowance where no profile is found.
After a CUDA out-of-memory error it records the OOM against the shape in that cache (the
driver's packer reads it there), re-measures on this node and names the larger share the
retry gets. On CPU it caps nothing.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from cluster.gpu_types import GpuType, declared_memory_bytes, node_type_name, this_node
from trainables.config import TrainConfig

if TYPE_CHECKING:
    from cluster.vram_table import SharedVramCache

# cluster.packing and cluster.vram_table (torch, the profiler) are imported by the methods
# that use them, in the trial's worker: the driver that builds a PackedShare stays torch-free.

log = logging.getLogger(__name__)


class PackedShare:
    """The :class:`trainables.trial.GpuShare` of a sweep's trials (stateless: picklable)."""

    def cap_memory(
        self, config: TrainConfig, gpu_fraction: float, group_size: int = 1
    ) -> float | None:
        """Cap the allocator to the share less the planned CUDA context; the cap set
        (None on CPU, for no GPU and for whole GPUs)."""
        from cluster.packing import apply_memory_cap, caps_memory

        context = planned_context_bytes(config, group_size) if caps_memory(gpu_fraction) else None
        return apply_memory_cap(gpu_fraction or None, context_bytes=context)

    def memory_metrics(
        self, config: TrainConfig, gpu_fraction: float, group_size: int = 1
    ) -> dict[str, float]:
        """The share and the shape's predicted peak, reported every epoch (GPU trials)."""
        if gpu_fraction <= 0:
            return {}
        from cluster.packing import trial_memory_metrics

        return trial_memory_metrics(config, gpu_fraction, group_size=group_size)

    def after_oom(
        self, config: TrainConfig, gpu_fraction: float, message: str, group_size: int = 1
    ) -> dict[str, Any]:
        """The OOM report's fields: the share to retry at (or why none fits) and the GPU
        type it ran out of memory on. A group that ran out of memory on a whole GPU is
        split in two (``oom_split`` 1): each half retries at no less than half the GPU,
        since the whole group did not fit in one. The failed attempt's memory must be
        freed first."""
        from cluster.packing import RAY_GPU_STEPS, TrialDoesNotFit, retry_fraction_after_oom

        report: dict[str, Any] = {}
        shared, gpu_type = shared_cache(), node_gpu_type()
        try:
            retry = retry_fraction_after_oom(
                config, gpu_fraction, shared=shared, gpu_type=gpu_type, group_size=group_size
            )
            report["oom_retry_gpu_fraction"] = retry
            report["failure_reason"] = (
                f"CUDA out of memory at GPU share {gpu_fraction:g}; retrying at {retry:g} "
                f"({message})"
            )
        except TrialDoesNotFit as too_big:
            if group_size > 1:
                half = math.ceil(gpu_fraction / 2 * RAY_GPU_STEPS) / RAY_GPU_STEPS
                report.update(oom_split=1, oom_retry_gpu_fraction=half)
                report["failure_reason"] = (
                    f"CUDA out of memory on a whole GPU as a group of {group_size}: split in "
                    f"two, each half at a share of at least {half:g} ({message})"
                )
            else:
                report["failure_reason"] = f"CUDA out of memory on a whole GPU: {too_big}"
        if gpu_type is not None:
            report["gpu_type"] = gpu_type.name
        return report


def planned_context_bytes(config: TrainConfig, group_size: int = 1) -> int | None:
    """The CUDA context ``config``'s share (its group's, of ``group_size``) was planned with
    on this node's GPU type (its profile in the sweep's shared cache), or None where no
    profile is found."""
    from cluster.vram_table import type_key

    shared, gpu_type = shared_cache(), node_gpu_type()
    if shared is None or gpu_type is None:
        return None
    try:
        profile = shared.get(type_key(config, gpu_type, group_size))
    except Exception as exc:  # an unreadable cache costs the exact cap, not the trial
        log.warning("no profile in the sweep's VRAM cache (%s); capping with the allowance", exc)
        return None
    return profile.context_bytes if profile is not None else None


def shared_cache() -> SharedVramCache | None:
    """The sweep storage's VRAM cache (every node and the driver see it)."""
    from ray import tune

    from cluster.vram_table import SharedVramCache

    try:
        storage = tune.get_context().get_storage()
        return SharedVramCache.in_storage(storage.storage_filesystem, storage.storage_fs_path)
    except Exception as exc:  # outside Tune (a direct call in a test): no shared storage
        log.warning("no sweep storage for the VRAM cache (%s)", exc)
        return None


def node_gpu_type() -> GpuType | None:
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
