"""Load: a sweep of 200 tiny trials on the local Ray ends with all 200 child runs in
MLflow, and the driver's memory growth per trial is measured (printed, and kept in
test-artifacts/load.json; Ray has an open report of driver memory growing linearly with
the number of trials)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import psutil
import pytest

from hpo.sweep import run_sweep
from tests.hpo.sweep_helpers import tiny_spec, trial_runs

pytestmark = [pytest.mark.ray, pytest.mark.slow]
N_TRIALS = 200


def test_two_hundred_trials_all_reach_mlflow(ray_session, tmp_path: Path, mlflow_uri: str) -> None:  # type: ignore[no-untyped-def]
    spec = tiny_spec(
        tmp_path,
        tracking_uri=mlflow_uri,
        name="load",
        families=["kan"],
        precisions=["f32"],
        samples=N_TRIALS,
        max_epochs=1,
        data={"n_assets": 1, "n_bars": 400},
        trainer={"lookback": 8, "batch_size": 32, "max_steps_per_epoch": 2},
        search_space={"kan": {"window": 1, "width": 2, "n_layers": 1, "grid_size": 3}},
        grouping={"group_size": 1},  # the driver's load is per Tune trial: 200 of them
    )
    process = psutil.Process(os.getpid())
    samples: list[tuple[int, float]] = []

    def on_event(line: str) -> None:
        if line.startswith("trial "):
            samples.append((len(samples) + 1, process.memory_info().rss / 2**20))

    rows = run_sweep(spec, on_event=on_event)
    assert len(rows) == N_TRIALS and all(r.status == "TERMINATED" for r in rows)
    children = trial_runs(mlflow_uri, "load")
    assert len(children) == N_TRIALS
    assert len({r.data.tags["trial_id"] for r in children}) == N_TRIALS
    assert all(r.info.status == "FINISHED" and "val_sharpe" in r.data.metrics for r in children)

    # Driver memory per finished trial: the slope over the second half (after warm-up).
    done, rss = np.array(samples).T
    half = len(done) // 2
    slope_mb = float(np.polyfit(done[half:], rss[half:], 1)[0])
    report = {
        "trials": N_TRIALS,
        "rss_start_mb": float(rss[0]),
        "rss_end_mb": float(rss[-1]),
        "growth_mb_per_trial": slope_mb,
    }
    print("driver memory:", report)
    out = Path(__file__).resolve().parents[2] / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "load.json").write_text(json.dumps(report, indent=1))
    assert len(samples) == N_TRIALS
