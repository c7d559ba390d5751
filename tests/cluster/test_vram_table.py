"""The VRAM table: what its key holds, one profile per shape, durable atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cluster.packing import profile_for_config
from cluster.profiler import MemoryProfile
from cluster.vram_table import VramTable, key_string, profile_key
from models import get_family
from tests.trainables.helpers import tiny_config

CPU = torch.device("cpu")


def fake_profile(peak_mib: int = 100, **changes: object) -> MemoryProfile:
    values: dict[str, object] = {
        "family": "tft",
        "precision": "f32",
        "batch_size": 32,
        "n_folds": 1,
        "n_params": 1000,
        "method": "estimated",
        "device_name": "estimate",
        "device_total_bytes": None,
        "torch_version": torch.__version__,
        "params_bytes": 0,
        "grads_bytes": 0,
        "optimizer_bytes": 0,
        "data_bytes": peak_mib * 2**20,
        "activations_bytes": 0,
        "temporaries_bytes": 0,
        "allocator_bytes": 0,
        "workspace_bytes": 0,
        "context_bytes": 512 * 2**20,
    }
    values.update(changes)
    return MemoryProfile(**values)  # type: ignore[arg-type]


def test_key_holds_device_name_and_torch_version(monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config("tft", "bf16")
    key = profile_key(config, CPU, "estimate")
    assert key["device"] == "estimate" and key["torch"] == torch.__version__
    assert key["family"] == "tft" and key["precision"] == "bf16" and key["batch_size"] == 32
    assert "allowances" in key  # an estimate depends on the context/workspace constants
    on_gpu = profile_key(config, CPU, "NVIDIA H100 80GB HBM3")
    assert key_string(on_gpu) != key_string(key)
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert key_string(profile_key(config, CPU, "estimate")) != key_string(key)


def test_key_ignores_float_values_but_not_sizes() -> None:
    def key(**model_config: object) -> str:
        merged = {"d_model": 8, "n_heads": 1, "dropout": 0.1, **model_config}
        return key_string(profile_key(tiny_config("tft", model_config=merged), CPU, "estimate"))

    assert key(position_scale=2.0) == key(position_scale=7.5)  # never sizes a tensor
    assert key(dropout=0.1) == key(dropout=0.3)
    assert key(dropout=0.0) != key(dropout=0.1)  # dropout off saves no masks
    assert key(d_model=8) != key(d_model=16)
    assert key() == key(d_model=8)  # explicit defaults and omitted ones are the same shape
    lr = tiny_config("tft", model_config={"d_model": 8, "n_heads": 1}, lr=3e-4)
    assert key_string(profile_key(lr, CPU, "estimate")) == key(dropout=0.1)


def test_key_holds_the_value_of_float_size_settings() -> None:
    """xLSTM's proj_factor and ffn_factor are floats that set layer widths: two values are
    two shapes. A float the family's adapter draws fresh per trial (dropout) still counts
    only by being zero or not."""

    def key(**model_config: object) -> str:
        merged = {"d_model": 16, "n_heads": 2, **model_config}
        return key_string(profile_key(tiny_config("xlstm", model_config=merged), CPU, "estimate"))

    assert key(proj_factor=2.0) != key(proj_factor=3.0)
    assert key(ffn_factor=4.0 / 3.0) != key(ffn_factor=2.0)
    assert key(proj_factor=2.0) == key()  # the default, explicit or omitted
    assert key(dropout=0.1) == key(dropout=0.25)
    assert key(dropout=0.0) != key(dropout=0.1)


def test_key_leaves_out_settings_a_family_declares_memory_neutral(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import models.dqn

    def key(period: int) -> str:
        config = tiny_config("dqn", model_config={"target_update_period": period})
        return key_string(profile_key(config, CPU, "estimate"))

    monkeypatch.delattr(models.dqn, "MEMORY_NEUTRAL", raising=False)
    assert key(100) != key(2000)  # an int counts by value unless declared neutral
    monkeypatch.setattr(models.dqn, "MEMORY_NEUTRAL", ("target_update_period",), raising=False)
    assert key(100) == key(2000)


def test_key_says_whether_the_folds_train_fused() -> None:
    """A fused step holds every fold's activations at once, so fused and unfused trials
    of one shape have their own profiles. ``auto`` profiles what a GPU runs: the folds
    fused, also for a family that stays unfused on a CPU, and never a single fold."""

    def key(**changes: object) -> dict[str, object]:
        return profile_key(tiny_config("mamba2", n_folds=2).replace(**changes), CPU, "estimate")

    assert key()["fused"] is True and key(fuse="on")["fused"] is True
    assert key(fuse="off")["fused"] is False and key(n_folds=1)["fused"] is False
    assert key_string(key()) != key_string(key(fuse="off"))
    assert profile_key(tiny_config("dqn", n_folds=2), CPU, "estimate")["fused"] is False
    assert not get_family("mamba2").fuse_on_cpu  # unfused on a CPU, fused in its profile


def test_second_lookup_does_not_measure(tmp_path: Path) -> None:
    path = tmp_path / "vram.json"
    table = VramTable(path)
    key = profile_key(tiny_config("tft"), CPU, "estimate")
    calls: list[int] = []

    def measure() -> MemoryProfile:
        calls.append(1)
        return fake_profile()

    first = table.get_or_measure(key, measure)
    second = table.get_or_measure(key, measure)
    assert first == second and calls == [1] and table.measurements == 1
    # Another process (a fresh table on the same file) finds it on disk.
    other = VramTable(path)
    assert other.get_or_measure(key, measure) == first and calls == [1]
    assert other.measurements == 0
    stored = json.loads(path.read_text())
    assert len(stored["entries"]) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_profile_for_config_profiles_a_shape_once(tmp_path: Path) -> None:
    table = VramTable(tmp_path / "vram.json")
    config = tiny_config("tft", model_config={"d_model": 8, "n_heads": 1})
    _, first = profile_for_config(config, table=table, mode="estimate")
    _, again = profile_for_config(config.replace(lr=5e-4, seed=3), table=table, mode="estimate")
    assert table.measurements == 1 and again == first
    assert first.method == "estimated" and first.activations_bytes > 0


def test_writes_merge_with_other_processes_and_survive_corruption(tmp_path: Path) -> None:
    path = tmp_path / "vram.json"
    a, b = VramTable(path), VramTable(path)
    key_a = profile_key(tiny_config("tft"), CPU, "estimate")
    key_b = profile_key(tiny_config("tft", batch_size=64), CPU, "estimate")
    a.put(key_a, fake_profile(100))
    b.put(key_b, fake_profile(200))  # b never read a's entry; the write merges it
    assert len(json.loads(path.read_text())["entries"]) == 2
    assert VramTable(path).get(key_a) == fake_profile(100)
    assert b.record_oom(key_a) == 1 and b.record_oom(key_a) == 2
    assert VramTable(path).oom_count(key_a) == 2
    assert VramTable(path).get(key_a) == fake_profile(100)  # the mark keeps the profile

    path.write_text("{ not json")
    fresh = VramTable(path)
    assert fresh.get(key_a) is None
    fresh.put(key_a, fake_profile(300))
    assert VramTable(path).get(key_a) == fake_profile(300)
