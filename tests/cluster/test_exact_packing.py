"""Exact shares reach the memory-alone bound: trials per GPU at the share Ray is asked for
are at least 0.95 of what memory alone allows, for every family at its default size and
at the seed's scale (DQN with a 1,000,000-transition replay, lookback 64), on a 141 GB
GPU, from CPU estimates. The old 1/20 grid gave 10 (f32) and 20 (bf16) at seed scale."""

from __future__ import annotations

import math

import pytest
import torch

from cluster.packing import plan
from cluster.profiler import MemoryProfile, profile_trial
from trainables.config import build_train_config

H200 = 141 * 10**9
SEED_CAPACITY = 1_000_000


def seed_scale_dqn(precision: str) -> MemoryProfile:
    """The estimate at 1,000,000 transitions from two small builds: the replay is the only
    part that grows with the capacity, linearly (one slot per transition)."""
    import dataclasses

    small, large = (
        profile_trial(
            build_train_config("dqn", {"buffer_capacity": c}, precision=precision, lookback=64),
            device="cpu",
            measure=False,
        )
        for c in (4096, 8192)
    )
    per_transition = (large.data_bytes - small.data_bytes) / 4096
    assert per_transition > 0 and large.activations_bytes == small.activations_bytes
    data = small.data_bytes + per_transition * (SEED_CAPACITY - 4096)
    return dataclasses.replace(small, data_bytes=int(data))


def grid_trials(profile: MemoryProfile, total: int) -> int:
    """What the old 1/20 grid packed."""
    raw = (profile.peak_bytes * 1.15 + profile.context_bytes) / total
    return math.floor(1 / (min(20, math.ceil(raw * 20 - 1e-9)) / 20) + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_seed_scale_dqn_packs_the_memory_bound(precision: str) -> None:
    torch.set_num_threads(1)
    profile = seed_scale_dqn(precision)
    packing = plan(profile, 0.15, device_total=H200)
    # memory allows 13 f32 / 23 bf16 of these on 141 GB (1 GiB context each); the grid
    # gave 10 / 20
    expected_bound = {"f32": 13, "bf16": 23}[precision]
    assert packing.trials_per_gpu_unrounded == expected_bound
    assert grid_trials(profile, H200) == {"f32": 10, "bf16": 20}[precision]
    assert packing.trials_per_gpu == expected_bound  # shares rounded up at 1e-4 lose none
    assert packing.of_memory_bound >= 0.95


@pytest.mark.slow
def test_every_family_at_default_size_packs_the_memory_bound() -> None:
    from models import family_names

    torch.set_num_threads(1)
    ratios = {}
    for family in family_names():
        for precision in ("f32", "bf16"):
            config = build_train_config(family, {}, precision=precision)
            packing = plan(
                profile_trial(config, device="cpu", measure=False), 0.15, device_total=H200
            )
            ratios[f"{family}/{precision}"] = (
                packing.trials_per_gpu,
                packing.trials_per_gpu_unrounded,
                packing.of_memory_bound,
            )
    low = {name: r for name, r in ratios.items() if r[2] < 0.95}
    assert not low, ratios
    assert len(ratios) == 2 * len(family_names())


def test_a_share_never_packs_beyond_the_memory_bound() -> None:
    """Stepping down never buys trials memory does not hold: over a sweep of peaks, the
    trials per GPU at the share are within [0.95, 1] x the memory-alone bound whenever
    that bound is at least 20, and never above it."""
    from cluster.packing import gpu_fraction, trials_per_gpu

    for i in range(4000):
        peak = int(2**20 * (30 + i * 7.3))  # 30 MiB .. 28 GiB
        share = gpu_fraction(peak, 512 * 2**20, H200, 0.15)
        bound = math.floor(H200 / (peak * 1.15 + 512 * 2**20) + 1e-9)
        got = trials_per_gpu(share)
        assert got <= bound, (peak, share, got, bound)
        if bound >= 20:
            assert got >= 0.95 * bound, (peak, share, got, bound)
