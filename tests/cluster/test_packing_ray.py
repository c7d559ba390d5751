"""Ray with logical GPUs runs exactly as many trials at once as their GPU fractions allow.

The session's Ray has 4 logical GPUs and 2 CPUs; trials ask for 0 CPUs so only the GPU
fractions bind. Each trial writes its start to a shared folder and holds its GPU share
until the running trials fill the 4 GPUs (or every trial has started): so if the
scheduler packs as it should, full waves are observed, and the trials' start/end
timestamps show the concurrency it allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cluster.packing import gpu_fraction

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GPUS = 4.0  # logical GPUs of the ray_session fixture
GiB = 2**30


def holding_trainable(folder: str, total: int) -> Callable[[dict[str, Any]], None]:
    """A trainable that records its start and end and holds its share until the GPUs are
    full, every trial has started, or 60 s passed. Built here so Ray pickles it by value."""

    def trainable(config: dict[str, Any]) -> None:
        import json
        import os
        import time
        import uuid

        from ray import tune

        me, frac = uuid.uuid4().hex, config["trial"]["frac"]
        start = time.time()

        def write(name: str, payload: dict[str, float]) -> None:
            tmp = os.path.join(folder, f".{name}.tmp")
            with open(tmp, "w") as handle:
                json.dump(payload, handle)
            os.replace(tmp, os.path.join(folder, name))

        write(f"start-{me}", {"frac": frac, "t": start})
        while time.time() < start + 60:
            names = os.listdir(folder)
            ended = {n.removeprefix("end-") for n in names if n.startswith("end-")}
            starts = [n for n in names if n.startswith("start-")]
            running = 0.0
            for name in starts:
                if name.removeprefix("start-") not in ended:
                    with open(os.path.join(folder, name)) as handle:
                        running += json.load(handle)["frac"]
            if running >= GPUS - 1e-6:
                write(f"full-{uuid.uuid4().hex}", {"t": time.time()})
                break
            fulls = [n for n in names if n.startswith("full-")]
            full_since_start = False
            for name in fulls:
                with open(os.path.join(folder, name)) as handle:
                    full_since_start |= json.load(handle)["t"] >= start
            if full_since_start or len(starts) >= total:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        end = time.time()
        write(f"end-{me}", {"t": end})
        tune.report({"start": start, "end": end, "frac": frac})

    return trainable


def run_packed(tmp_path: Path, trials: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """Run ``trials`` (each with a ``frac``); (start, end, frac) of every trial."""
    from ray import tune

    folder = tmp_path / "events"
    folder.mkdir()

    def resources(config: dict[str, Any]) -> Any:  # a dict, as TrialResources returns
        return {"cpu": 0, "gpu": config["trial"]["frac"]}

    trainable = tune.with_resources(holding_trainable(str(folder), len(trials)), resources)
    tuner = tune.Tuner(
        trainable,
        param_space={"trial": tune.grid_search(trials)},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), verbose=0),
    )
    results = tuner.fit()
    assert results.num_errors == 0
    spans = []
    for i in range(len(results)):
        metrics = results[i].metrics
        assert metrics is not None
        spans.append((metrics["start"], metrics["end"], metrics["frac"]))
    return spans


def concurrency(spans: list[tuple[float, float, float]]) -> tuple[int, float]:
    """Most trials and most GPU share running at once (checked at every start)."""
    most, most_share = 0, 0.0
    for t, _, _ in spans:
        running = [frac for start, end, frac in spans if start <= t < end]
        most, most_share = max(most, len(running)), max(most_share, sum(running))
    return most, most_share


def test_half_gpu_trials_run_eight_at_a_time_on_four_gpus(ray_session: Any, tmp_path: Path) -> None:
    spans = run_packed(tmp_path, [{"frac": 0.5, "i": i} for i in range(12)])
    assert len(spans) == 12
    assert concurrency(spans) == (8, 4.0), sorted(spans)


def test_mixed_f32_and_bf16_fractions_pack_to_the_gpus_and_never_beyond(
    ray_session: Any, tmp_path: Path
) -> None:
    # Measured-style fractions: an f32 trial peaking at 34 GiB and its bf16 twin at
    # 16.5 GiB, 0.5 GiB context, 15% headroom, 80 GiB GPUs; rounded at 1/20 here (exact:
    # 0.495 and 0.2435) so that full GPUs add up to exactly 4.
    f32 = gpu_fraction(34 * GiB, GiB // 2, 80 * GiB, 0.15, steps=20)
    bf16 = gpu_fraction(int(16.5 * GiB), GiB // 2, 80 * GiB, 0.15, steps=20)
    assert (f32, bf16) == (0.5, 0.25)
    trials = (
        [{"frac": f32, "precision": "f32", "i": i} for i in range(4)]
        + [{"frac": bf16, "precision": "bf16", "i": i} for i in range(8)]
        + [{"frac": f32, "precision": "f32", "i": i} for i in range(4, 6)]
    )
    spans = run_packed(tmp_path, trials)
    assert len(spans) == 14
    most, share = concurrency(spans)
    # The GPUs were full at some moment (and, below, never over-committed).
    assert share == 4.0, sorted(spans)
    # Full 4 GPUs hold between 8 (all 0.5) and 12 (four 0.5 + eight 0.25) of these trials.
    assert 8 <= most <= 12
    for t, _, _ in spans:
        running = [frac for start, end, frac in spans if start <= t < end]
        assert sum(running) <= GPUS + 1e-9
