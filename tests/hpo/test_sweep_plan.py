"""The sweep's GPU plan: what sizes each trial (a ClusterPacker for measured shares on GPU
nodes, the spec's numbers otherwise), the plan table with two GPU types, the plan of a
sweep without measured shares, and `hpo sweep SPEC --plan` as a user runs it (the console
script in a subprocess, its own local Ray with logical GPUs): the table, exit 0, nothing
launched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from cluster.fixed_plan import render_fixed_plan
from cluster.gpu_types import GpuType
from cluster.packing import plan
from cluster.packing_plan import ClusterPacker, plan_rows, render_plan
from cluster.vram_table import SharedVramCache, key_string, type_key
from hpo.sweep import TrialResources, plan_configs, sweep_plan, sweep_resources
from tests.cluster.test_vram_table import fake_profile
from tests.hpo.sweep_helpers import tiny_spec
from trainables.config import RETRY_FLOOR_KEY, TrialConfig

GiB = 2**30
L4 = GpuType("L4", 24 * GiB, gpus=4, gpus_per_node=4, cpus_per_node=4, node_ids=("a",))
H200 = GpuType("H200", 141 * GiB, gpus=1, gpus_per_node=1, cpus_per_node=32, node_ids=("b",))


def test_measured_shares_on_gpu_nodes_use_the_cluster_packer(tmp_path: Path) -> None:
    measured = tiny_spec(tmp_path, resources={"cpu": 2, "gpu": "measured", "headroom": 0.3})
    storage = str(tmp_path / "results")
    packer = sweep_resources(measured, storage, types=[L4, H200])
    assert isinstance(packer, ClusterPacker)
    assert [t.name for t in packer.types] == ["H200", "L4"]
    assert (packer.headroom, packer.cpu_per_trial) == (0.3, 2)
    # profiles and OOM counts live in the sweep storage, which every node sees
    assert packer.cache is not None and packer.cache.root == f"{storage}/.hpo-vram"
    # no GPU nodes, or a fixed number: the spec's numbers
    assert isinstance(sweep_resources(measured, storage, types=[]), TrialResources)
    fixed = tiny_spec(tmp_path, resources={"cpu": 1, "gpu": 0.25})
    assert isinstance(sweep_resources(fixed, storage, types=[L4]), TrialResources)


def test_plan_configs_are_one_shape_per_family_and_precision(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path)
    shapes = [
        (c.family, c.precision, c.batch_size, c.lookback, group_size)
        for c, group_size in plan_configs(spec)
    ]
    assert shapes == [  # one sample of one seed: every group trial would be a trial alone
        ("tft", "f32", 32, 16, 1),
        ("tft", "bf16", 32, 16, 1),
        ("dqn", "f32", 32, 16, 1),
        ("dqn", "bf16", 32, 16, 1),
    ]
    tft = plan_configs(spec)[0][0]
    # the stream's fixed settings (the spec's search_space pins them) are in the shape
    assert (tft.model_config["d_model"], tft.model_config["n_heads"]) == (8, 1)


def test_fixed_resources_decode_the_trial_with_its_floor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPO_VRAM_CACHE", str(tmp_path / "vram.json"))
    monkeypatch.setenv("HPO_VRAM_MODE", "estimate")
    spec = tiny_spec(tmp_path, resources={"cpu": 1, "gpu": "measured"})
    trial = TrialConfig(
        family="tft", precision="bf16", seed=0, params={"d_model": 8, "n_heads": 1},
        base=spec.trial_base(), config_id="g",
    )  # fmt: skip
    resources = TrialResources(spec)
    small = resources(trial.to_dict()).required_resources["GPU"]
    assert 0 < small < 0.05  # a tiny TFT: mostly its CUDA context, of 80 GiB
    retry = trial.with_floor(0.4).to_dict()
    assert retry[RETRY_FLOOR_KEY] == 0.4
    assert resources(retry).required_resources == {"CPU": 1.0, "GPU": 0.4}


def _packer_with_profiles(tmp_path: Path) -> tuple[ClusterPacker, list]:
    """L4 (estimated from tensor bytes against its declared 24 GiB) + H200 (measured)."""
    cache = SharedVramCache.in_storage(pafs.LocalFileSystem(), str(tmp_path))
    packer = ClusterPacker([L4, H200], headroom=0.15, cpu_per_trial=1, cache=cache)
    spec = tiny_spec(tmp_path, families=["tft"], search_space={"tft": {"d_model": 8, "n_heads": 1}})
    configs = [config for config, _ in plan_configs(spec)]
    for config in configs:
        peak = 5 * 1024 if config.precision == "f32" else 3 * 1024
        packer.profiles[key_string(type_key(config, L4))] = fake_profile(
            peak_mib=peak, precision=config.precision, gpu_type="L4"
        )
        packer.profiles[key_string(type_key(config, H200))] = fake_profile(
            peak_mib=peak, precision=config.precision, gpu_type="H200", method="measured",
            device_name="NVIDIA H200", device_total_bytes=141 * GiB,
        )  # fmt: skip
    return packer, configs


def test_plan_table_has_a_row_per_family_precision_and_gpu_type(tmp_path: Path) -> None:
    packer, configs = _packer_with_profiles(tmp_path)
    rows = plan_rows(packer, configs)
    table = {(r["precision"], r["gpu_type"]): r for r in rows}
    assert list(table) == [("f32", "H200"), ("f32", "L4"), ("bf16", "H200"), ("bf16", "L4")]
    # (5 GiB x 1.15 + 0.5) / 24 = 0.26042 -> 0.2605: 3 per L4, 4 L4s on a 4-CPU node
    l4 = table[("f32", "L4")]
    assert (l4["method"], l4["share"], l4["trials_per_gpu"]) == ("estimated", 0.2605, 3)
    assert (l4["trials_per_node"], l4["binding"]) == (4, "CPUs per node")
    # (3 x 1.15 + 0.5) / 141 = 0.028014 -> 0.0281: 35 per H200, 32 CPUs on its node
    h200 = table[("bf16", "H200")]
    assert (h200["method"], h200["share"], h200["trials_per_gpu"]) == ("measured", 0.0281, 35)
    assert (h200["trials_per_node"], h200["binding"]) == (32, "CPUs per node")
    assert table[("bf16", "L4")]["binding"] == "CPUs per node"  # 6 per GPU x 4 GPUs > 4 CPUs
    assert table[("f32", "H200")]["trials_per_gpu"] == 22

    text = render_plan(rows, 0.15)
    lines = text.splitlines()
    assert lines[0] == (
        "GPU packing plan: share = (peak x (1 + 0.15) + context) / GPU memory, "
        "rounded at Ray's 1e-4"
    )
    assert lines[1].split() == [
        "family", "precision", "gpu", "type", "peak", "GiB", "how", "GPU", "GiB", "share",
        "trials/GPU", "by", "memory", "trials/node", "binding",
    ]  # fmt: skip
    body = [line.split() for line in lines[3:]]
    assert body[1] == [
        "tft", "f32", "L4", "5.00", "estimated", "24.0", "0.2605", "3", "3", "4", "CPUs",
        "per", "node",
    ]  # fmt: skip
    assert body[2][:9] == ["tft", "bf16", "H200", "3.00", "measured", "141.0", "0.0281", "35", "35"]
    # the rows a sweep stores as packing_plan.json are plain JSON
    assert json.loads(json.dumps(rows)) == rows


def test_a_sweep_without_measured_shares_says_what_each_trial_asks(tmp_path: Path) -> None:
    assert "0.25 per trial (4 trials per GPU, 1 CPU(s) each; not measured" in render_fixed_plan(
        0.25, 1
    )
    assert "no GPUs asked" in render_fixed_plan(0, 2)
    grouped = render_fixed_plan(0.25, 1, group_size=8)
    assert "4 group trials per GPU, up to 32 trials" in grouped
    assert "group trials of up to 8 trials (fused, one share each)" in grouped
    assert "'measured', but the cluster has no GPU nodes" in render_fixed_plan("measured", 1)
    spec = tiny_spec(tmp_path, resources={"cpu": 1, "gpu": 1})
    plan_of = sweep_plan(spec, TrialResources(spec))
    assert plan_of.rows == [] and "resources.gpu = 1 per trial (whole GPUs" in plan_of.text


@pytest.mark.ray
@pytest.mark.slow
def test_hpo_sweep_plan_prints_the_table_and_launches_nothing(tmp_path: Path) -> None:
    """The console script starts its own local Ray with 2 logical GPUs (--num-gpus); the
    profiles run as Ray tasks there (no CUDA: estimates, against HPO_GPU_TOTAL_GB)."""
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        "\n".join(
            [
                'name = "planned"',
                'families = ["tft", "kan"]',
                'precisions = ["f32", "bf16"]',
                "samples = 2",
                'search = "random"',
                'scheduler = "fifo"',
                "max_epochs = 1",
                f'storage = "{tmp_path / "results"}"',
                f'tracking_uri = "sqlite:///{tmp_path / "mlflow.db"}"',
                "[resources]",
                'gpu = "measured"',
                "cpu = 1",
                "headroom = 0.15",
                "[data]",
                "n_assets = 2",
                "n_bars = 600",
                "[trainer]",
                "lookback = 16",
                "batch_size = 32",
                # Small models: the profiles (bf16 emulated on a CPU) take seconds, not tens.
                "[search_space.tft]",
                "d_model = 8",
                "n_heads = 1",
                "lstm_layers = 1",
                "[search_space.kan]",
                "width = 4",
            ]
        )
    )
    hpo = Path(sys.executable).with_name("hpo")
    env = {**os.environ, "HPO_GPU_TOTAL_GB": "16"}
    done = subprocess.run(
        [str(hpo), "sweep", str(spec_path), "--plan", "--num-gpus", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU packing plan:"))
    rows = [line.split() for line in lines[start + 3 :] if line.strip()]
    # Two configurations of one shape per stream: each Tune trial is a group of 2.
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in rows] == [
        ("tft", "f32", "GPU", "2", "estimated"),
        ("tft", "bf16", "GPU", "2", "estimated"),
        ("kan", "f32", "GPU", "2", "estimated"),
        ("kan", "bf16", "GPU", "2", "estimated"),
    ]
    # Each share is the one the group's profile cached in the storage (by the Ray task)
    # implies against 16 GiB; the local Ray's 2 CPUs bind group trials per node.
    from hpo.spec import load_spec

    spec = load_spec(spec_path, {})
    cache = SharedVramCache.at(str(tmp_path / "results"))
    gpu_type = GpuType("GPU", None, gpus=2, gpus_per_node=2, cpus_per_node=2)
    for row, (config, group_size) in zip(rows, plan_configs(spec), strict=True):
        profile = cache.get(type_key(config, gpu_type, group_size))
        assert profile is not None and profile.pid is not None and profile.node_id
        assert profile.group_size == group_size == 2
        packing = plan(profile, 0.15, device_total=16 * GiB)
        assert row[6] == "16.0" and float(row[7]) == packing.fraction
        assert int(row[8]) == packing.trials_per_gpu and int(row[9]) == 2 * int(row[8])
        assert row[11:] == ["2", "CPUs", "per", "node"]
    # nothing launched: no sweep directory, no MLflow store
    assert not (tmp_path / "results" / "planned").exists()
    assert not (tmp_path / "mlflow.db").exists()


def test_a_group_trial_is_planned_and_placed_at_its_fused_share(tmp_path: Path) -> None:
    """A grouped sweep's plan profiles each model's largest group trial (8 trials here:
    4 configurations of one shape x 2 seeds) and shows groups and trials per GPU; Tune's
    resources callable gives a group trial its group's share, a trial alone its own."""
    from trainables.config import GroupTrialConfig

    cache = SharedVramCache.in_storage(pafs.LocalFileSystem(), str(tmp_path))
    packer = ClusterPacker([H200], headroom=0.15, cpu_per_trial=1, cache=cache)
    spec = tiny_spec(
        tmp_path, families=["kan"], precisions=["bf16"], samples=4, seeds=[0, 1], search_space={}
    )
    ((config, group_size),) = plan_configs(spec)
    assert group_size == 8
    for size, peak_gib in ((1, 1), (8, 6)):
        packer.profiles[key_string(type_key(config, H200, size))] = fake_profile(
            peak_mib=peak_gib * 1024, family="kan", precision="bf16", method="measured",
            device_name="NVIDIA H200", device_total_bytes=141 * GiB, group_size=size,
        )  # fmt: skip
    (row,) = plan_rows(packer, plan_configs(spec))
    # (6 GiB x 1.15 + 0.5) / 141 = 0.052482 -> 0.0525: 19 groups, 152 trials per H200
    assert (row["group_size"], row["share"], row["trials_per_gpu"]) == (8, 0.0525, 19)
    assert row["grouped_trials_per_gpu"] == 152
    header, _, body = render_plan([row], 0.15).splitlines()[1:4]
    assert header.split()[4:5] + header.split()[11:14] == [
        "trials", "groups/GPU", "trials/GPU", "groups",
    ]  # fmt: skip
    assert body.split()[:4] == ["kan", "bf16", "H200", "8"]
    assert body.split()[7:10] == ["0.0525", "19", "152"]

    trial = TrialConfig(
        family="kan", precision="bf16", seed=0, params={}, base=spec.trial_base(),
        config_id="kan-bf16-c000",
    )  # fmt: skip
    group = GroupTrialConfig(tuple(replace(trial, seed=s) for s in range(8)))
    (bundle,) = packer(group.to_dict()).bundles
    assert bundle == {"CPU": 1.0, "GPU": 0.0525}
    (alone,) = packer(trial.to_dict()).bundles
    assert alone == {"CPU": 1.0, "GPU": 0.0117}  # (1 x 1.15 + 0.5) / 141


def test_measured_shares_without_gpu_nodes_size_a_group_for_its_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local path (no GPU types to plan for): the group's fused profile, one context
    for all its trials, so less than that many trials alone."""
    from trainables.config import GroupTrialConfig

    monkeypatch.setenv("HPO_VRAM_CACHE", str(tmp_path / "vram.json"))
    monkeypatch.setenv("HPO_VRAM_MODE", "estimate")
    spec = tiny_spec(
        tmp_path, families=["kan"], search_space={}, resources={"cpu": 1, "gpu": "measured"}
    )
    trial = TrialConfig(
        family="kan", precision="bf16", seed=0, params={}, base=spec.trial_base(),
        config_id="g",
    )  # fmt: skip
    resources = TrialResources(spec)
    alone = resources(trial.to_dict()).required_resources["GPU"]
    group = GroupTrialConfig(tuple(replace(trial, seed=s) for s in range(4)))
    grouped = resources(group.to_dict()).required_resources["GPU"]
    # Tiny trials are mostly their 1 GiB context: both may round to the same 1e-4 share.
    assert alone <= grouped < 4 * alone
    shapes = json.loads((tmp_path / "vram.json").read_text())["entries"]
    assert sorted(json.loads(k).get("group_size", 1) for k in shapes) == [1, 4]  # its own
