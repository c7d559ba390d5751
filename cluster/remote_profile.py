"""Profiling on the GPU nodes: one Ray task per (trial shape, GPU type).

The sweep's driver often has no GPU (a head node), or its GPU is not the trials' kind, so
it never profiles itself. For each distinct shape and GPU type it runs
:func:`profile_on_node` as a Ray task that asks for a sliver of a GPU
(``PROFILE_GPU_SHARE``) and, on a typed cluster, for that type (``accelerator_type:X``):

* where the task sees CUDA it measures (warm step + evaluation forward, the allocator's
  peak statistics; name and total memory from pynvml, MIG-aware);
* elsewhere (logical GPUs, a CPU-only torch) it estimates from tensor bytes and takes the
  device total from the node's declared GPU memory (``hpo_gpu_memory_mib``, see
  :mod:`cluster.gpu_types`).

The task records its Ray node id and process id in the profile, writes it to the sweep's
:class:`~cluster.vram_table.SharedVramCache`, and returns it to the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import torch

from cluster.gpu_types import GpuType, declared_memory_bytes, this_node
from cluster.profiler import MemoryProfile, profile_trial
from cluster.vram_table import SharedVramCache, type_key
from trainables.config import TrainConfig

log = logging.getLogger("cluster.remote_profile")

# A sliver of a GPU: the task must land on a GPU node (Ray sets CUDA_VISIBLE_DEVICES for
# it) but not wait behind trials; one Ray step (1e-4) is the least Ray can express.
PROFILE_GPU_SHARE = 1e-4
PROFILE_TIMEOUT_S = 900.0


def profile_on_node(
    config: TrainConfig, gpu_type: GpuType, mode: str = "auto", group_size: int = 1
) -> MemoryProfile:
    """Profile ``config`` (a group trial of ``group_size`` such trials when over 1) in this
    process (a Ray worker on a node of ``gpu_type``)."""
    node_id, resources = this_node()
    declared = gpu_type.memory_bytes or declared_memory_bytes(resources)
    source: str | None
    if mode != "estimate" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        profile = profile_trial(config, device=device, measure=True, group_size=group_size)
        total, source = profile.device_total_bytes, profile.device_total_source
    elif mode == "measure":
        raise RuntimeError(
            f"profiling needs CUDA (mode 'measure') but node {node_id} of type "
            f"{gpu_type.name} has none in its Ray workers"
        )
    else:
        profile = profile_trial(
            config, device=torch.device("cpu"), measure=False, group_size=group_size
        )
        total, source = declared, "declared" if declared else None
    return dataclasses.replace(
        profile,
        device_total_bytes=total,
        device_total_source=source,
        gpu_type=gpu_type.name,
        node_id=node_id,
        pid=os.getpid(),
    )


def _task(
    config: dict[str, Any],
    gpu_type: dict[str, Any],
    mode: str,
    cache: SharedVramCache | None,
    group_size: int = 1,
) -> dict[str, Any]:
    train_config, kind = TrainConfig.from_dict(config), GpuType.from_dict(gpu_type)
    profile = profile_on_node(train_config, kind, mode, group_size)
    if cache is not None:
        cache.put(type_key(train_config, kind, group_size), profile)
    return profile.to_dict()


def _shape_name(config: TrainConfig, group_size: int) -> str:
    group = f" x{group_size}" if group_size > 1 else ""
    return f"{config.family}/{config.precision}{group}"


def profile_on_types(
    requests: list[tuple[TrainConfig, GpuType, int]],
    *,
    mode: str = "auto",
    cache: SharedVramCache | None = None,
    timeout_s: float = PROFILE_TIMEOUT_S,
) -> list[MemoryProfile]:
    """Profile each (config, type, group_size) in a Ray task on a node of that type, all at
    once (group_size: the group trial's, 1 for a trial alone)."""
    import ray

    if not requests:
        return []
    remote = ray.remote(_task)
    refs = [
        remote.options(
            num_cpus=0,  # never queue behind the trials this profile sizes
            num_gpus=PROFILE_GPU_SHARE,
            resources=gpu_type.constraint,
            max_retries=0,
            name=f"hpo-profile:{_shape_name(config, group_size)}@{gpu_type.name}",
        ).remote(config.to_dict(), gpu_type.to_dict(), mode, cache, group_size)
        for config, gpu_type, group_size in requests
    ]
    return [MemoryProfile.from_dict(d) for d in ray.get(refs, timeout=timeout_s)]


__all__ = ["PROFILE_GPU_SHARE", "profile_on_node", "profile_on_types"]
