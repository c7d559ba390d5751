"""A CUDA OOM in the real ``run_trial`` path, on Ray with logical GPUs: raised while building
the trainer or in a training step, it is reported (not raised) with a larger share; the
failed trainer is gone before the re-measurement; the OOM is recorded in the sweep
storage's shared cache, where the driver's packer reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs as pafs

from cluster.gpu_types import cluster_gpu_types
from cluster.packing_plan import ClusterPacker
from cluster.vram_table import SharedVramCache, type_key
from tests.cluster.test_packing import trial_config
from trainables.config import TrialConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def oom_trainable(folder: str) -> Any:
    """``run_trial`` with an OOM planted where ``config["where"]`` says, and the
    re-measurement instrumented: it writes how many Trainers were still alive."""

    def trainable(config: dict[str, Any]) -> None:
        import gc
        import json
        import os
        import weakref

        import torch

        from cluster import packing
        from cluster.trial_share import PackedShare
        from trainables import trial as trial_module
        from trainables.trainer import Trainer

        os.environ["HPO_VRAM_CACHE"] = os.path.join(folder, "node-local-vram.json")
        where = config.pop("where")
        alive: list[weakref.ref] = []
        original_init, original_remeasure = Trainer.__init__, packing._remeasure

        def init(self: Trainer, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            alive.append(weakref.ref(self))
            if where == "build" and len(alive) == 1:  # the trial's, not the re-measurement's
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted in build)")

        def step(self: Trainer) -> dict[str, Any]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted in a step)")

        def remeasure(*args: Any, **kwargs: Any) -> Any:
            gc.collect()
            live = sum(ref() is not None for ref in alive)
            with open(os.path.join(folder, f"remeasure-{where}.json"), "w") as handle:
                json.dump({"live_trainers": live, "built": len(alive)}, handle)
            return original_remeasure(*args, **kwargs)

        Trainer.__init__ = init  # type: ignore[method-assign]
        Trainer.train_epoch = step  # type: ignore[method-assign]
        packing._remeasure = remeasure
        trial_module.run_trial(config, PackedShare())

    return trainable


def test_oom_in_build_and_step_reports_a_larger_share_and_reaches_the_driver(
    ray_session: Any, tmp_path: Path
) -> None:
    import json

    from ray import tune

    folder = tmp_path / "events"
    folder.mkdir()
    storage = tmp_path / "storage"
    trainable = tune.with_resources(oom_trainable(str(folder)), {"cpu": 0, "gpu": 0.25})
    tuner = tune.Tuner(
        trainable,
        param_space={**trial_config(), "where": tune.grid_search(["build", "step"])},
        tune_config=tune.TuneConfig(reuse_actors=False),
        run_config=tune.RunConfig(name="oom", storage_path=str(storage), verbose=0),
    )
    results = tuner.fit()
    assert results.num_errors == 0  # an OOM while building used to escape the try: an error
    for i in range(len(results)):
        metrics = results[i].metrics
        assert metrics is not None
        assert metrics["oom"] == 1 and metrics["oom_retry_gpu_fraction"] >= 0.25 * 1.15
        assert metrics["gpu_type"] == "GPU" and "planted" in metrics["failure_reason"]
    for where in ("build", "step"):
        seen = json.loads((folder / f"remeasure-{where}.json").read_text())
        # the failed attempt's trainer was freed before the re-measurement (the caller's
        # local and the exception's traceback kept it alive before)
        assert seen == {"live_trainers": 0, "built": 1}, where
    # Recorded in the sweep's storage, where the driver reads it; not in the node's table.
    assert not (folder / "node-local-vram.json").exists()
    cache = SharedVramCache.in_storage(pafs.LocalFileSystem(), str(storage))
    types = cluster_gpu_types()
    config = TrialConfig.from_dict(trial_config()).train_config()
    key = type_key(config, types[0])
    assert cache.oom_count(key) == 2
    packer = ClusterPacker(types, headroom=0.15, cpu_per_trial=0, cache=cache)
    (share,) = packer.shares(config)
    assert share.oom_count == 2 and share.profile.method == "estimated"
    assert share.packing.headroom == pytest.approx(0.15 * 4)  # doubled per OOM
