"""Every model family can be swept: one tiny bf16 trial of each of the ten through the
Ray Tune path, each ending with a finite validation Sharpe in its MLflow child run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hpo.sweep import run_sweep
from hpo.tracking import TAG_ROLE
from models import family_names
from tests.hpo.sweep_helpers import tiny_spec
from tests.models.test_contract import TINY

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_each_family_runs_as_a_sweep_trial(ray_session, tmp_path: Path, mlflow_uri: str) -> None:  # type: ignore[no-untyped-def]
    names = list(family_names())
    spec = tiny_spec(
        tmp_path,
        tracking_uri=mlflow_uri,
        name="zoo",
        families=names,
        precisions=["bf16"],
        max_epochs=1,
        trainer={"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 4, "rl_iterations": 6},
        search_space={m: dict(TINY[m]) for m in names},
    )
    rows = run_sweep(spec)
    assert sorted(r.family for r in rows) == sorted(names)
    assert all(r.status == "TERMINATED" and not r.diverged for r in rows)
    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("zoo")
    children = [
        r
        for r in client.search_runs([experiment.experiment_id])
        if r.data.tags.get(TAG_ROLE) == "trial"
    ]
    assert sorted(r.data.tags["family"] for r in children) == sorted(names)
    for run in children:
        assert math.isfinite(run.data.metrics["val_sharpe"]), run.data.tags["family"]
