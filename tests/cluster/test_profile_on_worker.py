"""Profiling runs in a Ray worker on a GPU node, not in the driver: the profile records the
worker's pid and node, lands in the sweep storage's shared cache, and a second planner
(another driver) finds it there instead of profiling again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cluster.gpu_types import cluster_gpu_types
from cluster.packing_plan import ClusterPacker, plan_rows
from cluster.vram_table import SharedVramCache, type_key
from tests.cluster.test_packing import train_config

pytestmark = [pytest.mark.ray]


def test_profiles_come_from_a_gpu_worker_and_are_shared(ray_session: Any, tmp_path: Path) -> None:
    import ray

    types = cluster_gpu_types()
    assert [(t.name, t.gpus, t.memory_bytes) for t in types] == [("GPU", 4.0, None)]
    cache = SharedVramCache.at(str(tmp_path / "storage"))
    packer = ClusterPacker(types, headroom=0.15, cpu_per_trial=0, cache=cache)
    config = train_config()
    (profile,) = packer.prefetch([config])
    # measured where the trial will run: a Ray worker process, on the GPU node
    assert profile.pid is not None and profile.pid != os.getpid()
    assert profile.node_id == ray.get_runtime_context().get_node_id()
    assert profile.gpu_type == "GPU" and profile.method == "estimated"  # no CUDA here
    assert profile.device_total_source is None  # nothing declared: the 80 GiB default
    stored = cache.get(type_key(config, types[0]))
    assert stored is not None and stored.pid == profile.pid
    assert stored.estimated_peak_bytes == profile.estimated_peak_bytes

    other = ClusterPacker(types, headroom=0.15, cpu_per_trial=0, cache=cache)
    assert other.prefetch([config]) == []  # found in the shared cache: no new task
    (row,) = plan_rows(other, [config])
    assert row["profiled_pid"] == profile.pid and row["binding"] == "GPU memory"
    assert row["share"] == other.shares(config)[0].packing.fraction < 0.02  # ~its context


@pytest.mark.slow
def test_benchmarks_packed_sweep_runs_at_the_planned_shares(
    ray_session: Any, tmp_path: Path
) -> None:
    """bench/gpu_packing.py's sweep (smoke shapes): profiled in workers, both trials at once
    on the logical GPUs, no OOM, no error."""
    from tests.cluster.test_packing import load_bench

    sweep = load_bench().packed_sweep(("tft",), smoke=True, headroom=0.15, storage=tmp_path)
    assert (sweep["trials"], sweep["ooms"], sweep["errors"]) == (2, 0, 0)
    assert sweep["most_at_once"] == 2
    rows = sweep["plan_rows"]
    assert [r["precision"] for r in rows] == ["f32", "bf16"]
    assert all(r["share"] < 0.02 and r["profiled_pid"] != os.getpid() for r in rows)
    assert "trials/GPU" in sweep["plan"]
