"""Two GPU node types on a loopback cluster: a head without GPUs, an "L4" worker declaring
1.25 GiB GPUs and an "H200" worker declaring 8 GiB GPUs (``--resources`` with
``accelerator_type:*`` and ``hpo_gpu_memory_mib``, as an operator would). The plan profiles
each shape in a Ray task on a node of each type (the profile names that node and a pid
that is not the driver's), gives the types different shares, and every trial runs on a
node of the type it was planned for; the shape that fits only the larger GPUs runs only
there."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.local_cluster import LocalCluster, start_cluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# Declared MiB per GPU. With the 1 GiB context allowance a tiny tft's share is ~1.15 GiB
# and the dqn's ~1.4 GiB: the "L4" holds one tft and no dqn, the "H200" six tft.
TYPES = {"L4": 1280, "H200": 8192}

DRIVER = """
import json, os, sys
import ray
from ray import tune

ray.init(address=sys.argv[1])
from cluster.gpu_types import cluster_gpu_types
from cluster.packing_plan import ClusterPacker, plan_rows
from cluster.vram_table import SharedVramCache
from trainables.config import DataConfig, TrialBase, TrialConfig

base = TrialBase(
    epochs=1, trainer={"n_folds": 1, "lookback": 16, "batch_size": 32},
    data=DataConfig(n_assets=2, n_bars=600),
)
def trial(model, params, seed):
    return TrialConfig(family=model, precision="f32", seed=seed, params=params, base=base)
small = [trial("tft", {"d_model": 8, "n_heads": 1}, s) for s in range(4)]
big = [trial("dqn", {"hidden": 32, "buffer_capacity": 300_000}, s) for s in range(2)]

packer = ClusterPacker(cluster_gpu_types(), headroom=0.15, cpu_per_trial=0,
                       cache=SharedVramCache.at(sys.argv[2]))
rows = plan_rows(packer, [small[0].train_config(), big[0].train_config()])
planned = {}
class ByTrial:
    def __call__(self, config):
        return packer(config["trial"])
def where(config):
    import time
    import ray
    from ray import tune
    time.sleep(0.5)
    tune.report({"node": ray.get_runtime_context().get_node_id(), "seed": config["trial"]["seed"],
                 "family": config["trial"]["family"]})
trials = [t.to_dict() for t in big + small]
bundles = [packer.resources_of(t) for t in big + small]
results = tune.Tuner(
    tune.with_resources(where, ByTrial()),
    param_space={"trial": tune.grid_search(trials)},
    run_config=tune.RunConfig(storage_path=sys.argv[2], name="mixed", verbose=0),
).fit()
ran = [results[i].metrics for i in range(len(results))]
print("RESULT " + json.dumps({
    "driver_pid": os.getpid(),
    "types": [t.to_dict() for t in packer.types],
    "rows": rows,
    "bundles": bundles,
    "ran": ran,
    "errors": results.num_errors,
}))
"""


@pytest.fixture(scope="module")
def typed_cluster() -> Iterator[LocalCluster]:
    cluster = start_cluster(workers=0, head_cpus=1)
    try:
        for name, mib in TYPES.items():
            resources = json.dumps({f"accelerator_type:{name}": 1, "hpo_gpu_memory_mib": mib})
            cluster._start(
                name.lower(),
                [
                    f"--address={cluster.gcs_address}",
                    "--num-cpus=1",
                    "--num-gpus=2",
                    f"--resources={resources}",
                ],
            )
        cluster.wait_for_nodes(1 + len(TYPES))
        yield cluster
    finally:
        cluster.stop()


def test_two_gpu_types_get_their_own_shares_and_trials_land_where_they_fit(
    typed_cluster: LocalCluster, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, typed_cluster.gcs_address, str(tmp_path / "shared")],
        cwd=REPO,
        env=typed_cluster.env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    out = json.loads(line.removeprefix("RESULT "))
    nodes = {n.name: n.node_id for n in typed_cluster.nodes}
    node_type = {nodes["l4"]: "L4", nodes["h200"]: "H200"}
    types = {t["name"]: t for t in out["types"]}
    assert {n: t["memory_bytes"] for n, t in types.items()} == {
        n: m * 2**20 for n, m in TYPES.items()
    }
    rows = {(r["family"], r["gpu_type"]): r for r in out["rows"]}
    for row in out["rows"]:  # profiled in a worker on a node of that type, not the driver
        assert node_type[row["profiled_on"]] == row["gpu_type"]
        assert row["profiled_pid"] != out["driver_pid"]
        assert row["device_total_bytes"] == types[row["gpu_type"]]["memory_bytes"]
    small_l4, small_h200 = rows[("tft", "L4")], rows[("tft", "H200")]
    assert small_l4["share"] > 4 * small_h200["share"]  # same bytes, 1.25 vs 8 GiB GPUs
    assert small_l4["trials_per_gpu"] == 1 and small_h200["trials_per_gpu"] >= 6
    assert rows[("dqn", "L4")]["binding"] == "does not fit"
    assert rows[("dqn", "H200")]["binding"] == "GPU memory"

    assert out["errors"] == 0 and len(out["ran"]) == 6
    planned = {}
    for bundle, (model, seed) in zip(
        out["bundles"], [("dqn", 0), ("dqn", 1)] + [("tft", s) for s in range(4)], strict=True
    ):
        (kind,) = [k.removeprefix("accelerator_type:") for k in bundle if k.startswith("acc")]
        planned[(model, seed)] = kind
        assert bundle["GPU"] == rows[(model, kind)]["share"]
    assert planned[("dqn", 0)] == planned[("dqn", 1)] == "H200"
    assert set(planned.values()) == {"L4", "H200"}  # the small ones fill both types
    for ran in out["ran"]:
        assert node_type[ran["node"]] == planned[(ran["family"], ran["seed"])], ran
