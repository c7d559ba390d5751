"""A small sweep on local Ray -> ``hpo ensemble`` (in a subprocess) -> the ensemble served
on a CSV of new bars; MLflow holds the ensemble run under the sweep's parent run."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from hpo.record import SweepRecord
from hpo.sweep import run_sweep
from hpo.tracking import TAG_PARENT, TAG_ROLE
from tests.hpo.sweep_helpers import tiny_spec
from trainables.data import synthetic_bars
from trainables.ensemble import ENSEMBLE_FILE, load_ensemble, predict_ensemble

pytestmark = [pytest.mark.ray, pytest.mark.slow]
HPO = Path(sys.executable).with_name("hpo")  # the console script, as a user runs it


def test_sweep_then_ensemble_then_predict(ray_session, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = tiny_spec(tmp_path, samples=2, precisions=["f32", "bf16"], name="ens")
    rows = run_sweep(spec)
    assert all(r.status == "TERMINATED" for r in rows) and len(rows) == 8
    sweep_dir = Path(spec.storage) / spec.name
    out = tmp_path / "ensemble"
    done = subprocess.run(
        [
            str(HPO),
            "ensemble",
            str(sweep_dir),
            "--out",
            str(out),
            "--top",
            "2",
            "--weighting",
            "stacked",
            "--device",
            "cpu",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)

    # members: the best two per family by val_sharpe, whatever their precision
    expected = set()
    for model in ("tft", "dqn"):
        ranked = sorted(
            (r for r in rows if r.family == model), key=lambda r: (-(r.val_sharpe or 0), r.trial_id)
        )
        expected |= {r.trial_id for r in ranked[:2]}
    members = summary["members"]
    assert {m["trial_id"] for m in members} == expected
    weights = np.array([m["weight"] for m in members])
    assert weights.sum() == pytest.approx(1.0) and np.all(weights >= 0)
    ensemble = load_ensemble(out)
    assert [m.trial_id for m in ensemble.members] == [m["trial_id"] for m in members]

    # MLflow: one ensemble run under the sweep's parent, with members, weights, test metrics
    client = MlflowClient(spec.tracking_uri)
    record = SweepRecord.read(sweep_dir)
    experiment = client.get_experiment_by_name(spec.name)
    assert experiment is not None
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = 'ensemble'"
    )
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == summary["mlflow_run_id"]
    assert run.data.tags[TAG_PARENT] == record.parent_run_id
    assert run.info.status == "FINISHED"
    logged = {run.data.params[f"member.{i:02d}.trial_id"] for i in range(len(members))}
    assert logged == expected
    weight_metrics = [v for k, v in run.data.metrics.items() if k.startswith("weight.")]
    assert sorted(weight_metrics) == pytest.approx(sorted(weights))
    for key in (
        "test_sharpe",
        "test_sortino",
        "test_max_drawdown",
        "test_turnover",
        "best_member.test_sharpe",
        "val_sharpe",
        "val_dsr",
    ):
        assert np.isfinite(run.data.metrics[key]), key
    assert run.data.metrics["n_trials"] == len(rows) + 1
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "ensemble")}
    assert {"ensemble/positions.csv", "ensemble/ensemble.json"} <= artifacts
    assert json.loads((out / ENSEMBLE_FILE).read_text())["mlflow_run_id"] == run.info.run_id

    # serving new bars (same assets, another seed)
    bars = tmp_path / "bars.csv"
    synthetic_bars(n_assets=2, n_bars=300, seed=11).to_frame().to_csv(bars, index=False)
    positions_csv = tmp_path / "positions.csv"
    served = subprocess.run(
        [
            *(str(HPO), "predict", "--checkpoint", str(out), "--data", str(bars)),
            *("--out", str(positions_csv), "--precision", "f32"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    prediction = predict_ensemble(out, bars, precision="f32")
    with open(positions_csv) as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == len(prediction.timestamps) * 2 > 400
    assert [float(r["position"]) for r in table] == pytest.approx(
        prediction.positions.ravel().tolist(), abs=1e-6
    )
    pos = np.array([float(r["position"]) for r in table])
    conf = np.array([float(r["confidence"]) for r in table])
    assert np.all(np.abs(pos) <= 1) and np.all((conf >= 0) & (conf <= 1))
    assert np.isfinite(prediction.backtest.sharpe)
