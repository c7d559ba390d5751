"""Mixed GPU types: a share per type, each trial constrained to one type where it fits,
types filled in proportion to what they hold, the plan table's binding constraint. The
profiles are planted in the packer (no Ray); tests/cluster/test_multinode_packing.py runs
the same on a loopback cluster."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyarrow import fs as pafs

from cluster.gpu_types import GpuType, gpu_types
from cluster.packing_plan import ClusterPacker, plan_rows, render_plan
from cluster.profiler import DEFAULT_CONTEXT_BYTES
from cluster.vram_table import SharedVramCache, key_string, type_key
from tests.cluster.test_vram_table import fake_profile
from trainables.config import DataConfig, TrainConfig, TrialBase, TrialConfig

GiB = 2**30
L4 = GpuType("L4", 24 * GiB, gpus=2, gpus_per_node=2, cpus_per_node=16, node_ids=("n1",))
H200 = GpuType("H200", 141 * GiB, gpus=2, gpus_per_node=2, cpus_per_node=8, node_ids=("n2",))


def trial(d_model: int, seed: int = 0, floor: float = 0.0) -> TrialConfig:
    return TrialConfig(
        family="tft",
        precision="bf16",
        seed=seed,
        params={"d_model": d_model, "n_heads": 1},
        base=TrialBase(epochs=1, trainer={"n_folds": 1}, data=DataConfig(n_bars=600)),
        gpu_fraction_floor=floor,
    )


def packer_with(profiles: dict[int, int], cache: SharedVramCache | None = None) -> ClusterPacker:
    """A packer over L4 + H200 whose d_model -> peak GiB profiles are already known."""
    packer = ClusterPacker([L4, H200], headroom=0.15, cpu_per_trial=1, cache=cache)
    for d_model, peak_gib in profiles.items():
        config = trial(d_model).train_config()
        for gpu_type in (L4, H200):
            packer.profiles[key_string(type_key(config, gpu_type))] = fake_profile(
                peak_mib=peak_gib * 1024, gpu_type=gpu_type.name
            )
    return packer


def test_types_come_from_node_resources() -> None:
    nodes = [
        {"NodeID": "h", "Alive": True, "Resources": {"CPU": 2}},  # the head: no GPU
        {
            "NodeID": "a",
            "Alive": True,
            "Resources": {
                "CPU": 8,
                "GPU": 4,
                "accelerator_type:L4": 1,
                "hpo_gpu_memory_mib": 23040,
            },
        },
        {
            "NodeID": "b",
            "Alive": True,
            "Resources": {
                "CPU": 4,
                "GPU": 2,
                "accelerator_type:L4": 1,
                "hpo_gpu_memory_mib": 24576,
            },
        },
        {"NodeID": "c", "Alive": True, "Resources": {"CPU": 4, "GPU": 1}},
        {
            "NodeID": "d",
            "Alive": False,
            "Resources": {"CPU": 4, "GPU": 8, "accelerator_type:A100": 1},
        },
    ]
    found = {t.name: t for t in gpu_types(nodes)}
    assert set(found) == {"L4", "GPU"}  # the dead A100 node is left out
    l4 = found["L4"]
    # the smallest declaration and node: a share planned on them fits every L4 node
    assert (l4.memory_bytes, l4.gpus, l4.gpus_per_node, l4.cpus_per_node) == (
        int(22.5 * GiB),
        6.0,
        2.0,
        4.0,
    )
    assert l4.constraint == {"accelerator_type:L4": 0.001} and found["GPU"].constraint == {}
    assert found["GPU"].memory_bytes is None


def test_a_share_per_type_and_trials_only_where_they_fit() -> None:
    packer = packer_with({8: 5, 16: 30})  # a 5 GiB and a 30 GiB trial shape
    small = {s.gpu_type.name: s for s in packer.shares(trial(8).train_config())}
    # (5 * 1.15 + 0.5) / 24 and / 141, at Ray's resolution
    assert small["L4"].packing.fraction == 0.2605 and small["L4"].packing.trials_per_gpu == 3
    assert small["H200"].packing.fraction == 0.0444 and small["H200"].packing.trials_per_gpu == 22
    big = {s.gpu_type.name: s for s in packer.shares(trial(16).train_config())}
    assert not big["L4"].packing.fits and big["H200"].packing.fraction == 0.2483

    bundles = [packer.resources_of(trial(16, seed)) for seed in range(5)]
    assert all(b == {"CPU": 1.0, "GPU": 0.2483, "accelerator_type:H200": 0.001} for b in bundles)
    # Small trials go where the GPUs would be least full, each trial taking 1 / its trials
    # per GPU: the big ones hold 5/4 of the two H200s, so the L4s (3 per GPU) fill first,
    # then both evenly: the 20th leaves L4s at 5/6 full and H200s at (5/4 + 15/22) / 2.
    small_bundles = [packer.resources_of(trial(8, seed)) for seed in range(20)]
    on_l4 = [b for b in small_bundles if "accelerator_type:L4" in b]
    on_h200 = [b for b in small_bundles if "accelerator_type:H200" in b]
    assert (len(on_l4), len(on_h200)) == (5, 15)
    assert {b["GPU"] for b in on_l4} == {0.2605} and {b["GPU"] for b in on_h200} == {0.0444}
    assert 5 / 6 <= (5 / 4 + 15 / 22) / 2 <= 1.0
    # Asked again (Tune may), a trial keeps its type; an OOM floor raises its share.
    assert packer.resources_of(trial(8, 0)) == small_bundles[0]
    assert packer.resources_of(trial(16, 9, floor=0.4))["GPU"] == 0.4


def test_one_type_needs_no_constraint_and_the_packer_pickles() -> None:
    packer = ClusterPacker([H200], headroom=0.15, cpu_per_trial=2)
    config = trial(8).train_config()
    packer.profiles[key_string(type_key(config, H200))] = fake_profile(peak_mib=5 * 1024)
    assert packer.resources_of(trial(8)) == {"CPU": 2.0, "GPU": 0.0444}
    again = pickle.loads(pickle.dumps(packer))  # Tune stores the callable in its state
    assert again.resources_of(trial(8, seed=1)) == {"CPU": 2.0, "GPU": 0.0444}


def test_ooms_in_the_shared_cache_raise_the_share(tmp_path: Path) -> None:
    cache = SharedVramCache.in_storage(pafs.LocalFileSystem(), str(tmp_path))
    packer = packer_with({8: 5}, cache=cache)
    config = trial(8).train_config()
    assert cache.record_oom(type_key(config, H200)) == 1  # as a trial on an H200 node does
    shares = {s.gpu_type.name: s for s in packer.shares(config)}
    # headroom doubled on the H200 only: (5 * 1.3 + 0.5) / 141
    assert (shares["H200"].oom_count, shares["H200"].packing.fraction) == (1, 0.0497)
    assert (shares["L4"].oom_count, shares["L4"].packing.fraction) == (0, 0.2605)
    assert (tmp_path / ".hpo-vram").is_dir()


def test_plan_rows_name_the_binding_constraint() -> None:
    packer = packer_with({8: 5, 16: 30})
    configs = [trial(8).train_config(), trial(16).train_config()]
    rows = {(r["family"], r["gpu_type"], r["share"]): r for r in plan_rows(packer, configs)}
    l4_small = rows[("tft", "L4", 0.2605)]
    h200_small = rows[("tft", "H200", 0.0444)]
    # L4 node: 2 GPUs x 3 = 6 trials, 16 CPUs: memory binds; H200: 44 by memory, 8 CPUs bind.
    assert (l4_small["trials_per_node"], l4_small["binding"]) == (6, "GPU memory")
    assert (h200_small["trials_per_node"], h200_small["binding"]) == (8, "CPUs per node")
    big_l4 = next(r for r in rows.values() if r["gpu_type"] == "L4" and r["share"] == 1.0)
    assert big_l4["binding"] == "does not fit"
    text = render_plan(list(rows.values()), 0.15)
    assert "CPUs per node" in text and "0.0444" in text and "H200" in text


def test_an_estimate_is_a_fraction_of_the_current_declaration() -> None:
    packer = packer_with({8: 5})
    bigger = GpuType("L4", 48 * GiB, gpus=2, gpus_per_node=2, cpus_per_node=16)
    packer.types = [bigger, H200]
    shares = {s.gpu_type.name: s for s in packer.shares(trial(8).train_config())}
    assert shares["L4"].packing.fraction == 0.1303  # (5 * 1.15 + 0.5) / 48


@pytest.mark.parametrize("config", [TrainConfig(family="tft")])
def test_type_key_differs_by_type_only(config: TrainConfig) -> None:
    a, b = type_key(config, L4), type_key(config, H200)
    assert a["device"] == "ray-type:L4" and b["device"] == "ray-type:H200"
    assert {k: v for k, v in a.items() if k != "device"} == {
        k: v for k, v in b.items() if k != "device"
    }


def test_an_oom_retry_stays_on_the_type_it_ran_out_of_memory_on() -> None:
    """Its floor is a share of that type's GPU: on another type it would mean nothing."""
    packer = packer_with({8: 5, 16: 30})
    first = packer.resources_of(trial(8, seed=0))
    assert first == {"CPU": 1.0, "GPU": 0.0444, "accelerator_type:H200": 0.001}
    for seed in range(1, 5):  # big trials fill the H200s: the L4s are now the emptier type
        packer.resources_of(trial(16, seed))
    assert "accelerator_type:L4" in packer.resources_of(trial(8, seed=5))
    retry = packer.resources_of(trial(8, seed=0, floor=0.05))
    assert retry == {"CPU": 1.0, "GPU": 0.05, "accelerator_type:H200": 0.001}


def test_an_oom_retry_keeps_its_type_in_a_packer_that_never_placed_it() -> None:
    """After `hpo resume` the driver's packer is new and has placed nothing: the retry's
    config itself names the type it ran out of memory on, and the packer honours it even
    where it would now choose the other type."""
    fresh = packer_with({8: 5})
    assert "accelerator_type:H200" in fresh.resources_of(trial(8, seed=7))  # its own choice
    retry = dataclasses.replace(trial(8, seed=0, floor=0.3), gpu_type="L4")
    assert TrialConfig.from_dict(retry.to_dict()) == retry  # the pin survives the codec
    assert packer_with({8: 5}).resources_of(retry) == {
        "CPU": 1.0,
        "GPU": 0.3,
        "accelerator_type:L4": 0.001,
    }
    # A type no longer in the cluster: the packer chooses again (the floor still holds).
    gone = dataclasses.replace(retry, gpu_type="A100")
    assert packer_with({8: 5}).resources_of(gone)["GPU"] == 0.3


def test_a_trials_memory_cap_leaves_out_the_context_its_share_was_planned_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The share is (peak x headroom + the profile's context) / total; the trial's cap
    must leave out that same context (here a measured 300 MiB), not the allowance,
    or the allocator gets less than the plan gave it. No profile for the node's type:
    the allowance."""
    import torch

    from cluster import packing, trial_share

    cache = SharedVramCache.in_storage(pafs.LocalFileSystem(), str(tmp_path))
    config = trial(8).train_config()
    measured = fake_profile(5 * 1024, method="measured", context_bytes=300 * 2**20)
    cache.put(type_key(config, H200), measured)
    node_type = H200
    monkeypatch.setattr(trial_share, "shared_cache", lambda: cache)
    monkeypatch.setattr(trial_share, "node_gpu_type", lambda: node_type)
    monkeypatch.setattr(packing, "_applied_cap", None)
    caps: list[float] = []
    fake_cuda = SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: 0,
        get_device_properties=lambda _: SimpleNamespace(total_memory=141 * GiB),
        set_per_process_memory_fraction=lambda fraction, device: caps.append(fraction),
    )
    monkeypatch.setattr(torch, "cuda", fake_cuda)
    assert trial_share.PackedShare().cap_memory(config, 0.05) == pytest.approx(
        0.05 - 300 / (141 * 1024)
    )
    node_type = L4  # no profile of this shape cached for L4 nodes
    assert trial_share.PackedShare().cap_memory(config, 0.05) == pytest.approx(
        0.05 - DEFAULT_CONTEXT_BYTES / (141 * GiB)
    )
    assert trial_share.PackedShare().cap_memory(config, 1.0) is None  # a whole GPU is not capped
    assert caps == [
        pytest.approx(0.05 - 300 / (141 * 1024)),
        pytest.approx(0.05 - DEFAULT_CONTEXT_BYTES / (141 * GiB)),
    ]
