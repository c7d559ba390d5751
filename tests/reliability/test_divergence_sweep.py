"""A configuration that diverges in bf16 inside a sweep: its non-finite steps are skipped and
counted, it falls back to f32 (tagged), still diverges there and ends as failed with the
reason in MLflow, while the other trial of the sweep finishes normally."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpo.sweep import run_sweep
from tests.hpo.sweep_helpers import tiny_spec, trial_runs

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_diverging_trial_fails_cleanly_and_the_sweep_goes_on(
    ray_session, tmp_path: Path, mlflow_uri: str
) -> None:  # type: ignore[no-untyped-def]
    spec = tiny_spec(
        tmp_path,
        tracking_uri=mlflow_uri,
        name="diverge",
        families=["tft", "kan"],
        precisions=["bf16"],
        max_epochs=3,
        trainer={
            "lookback": 16,
            "batch_size": 32,
            "max_steps_per_epoch": 12,
            "log_every": 4,
            "fallback_after": 4,
        },
        # lr 1e12: every Adam step moves each weight by ~1e12, so activations overflow at once.
        search_space={
            "tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1, "lr": 1e12, "weight_decay": 0.0},
            "kan": {"lr": 3e-3},
        },
    )
    rows = run_sweep(spec)
    assert len(rows) == 2 and all(r.status == "TERMINATED" for r in rows)
    by_model = {r.family: r for r in rows}
    assert by_model["tft"].diverged and by_model["tft"].fell_back_to_f32
    assert not by_model["kan"].diverged and by_model["kan"].epochs == 3

    runs = {r.data.tags["family"]: r for r in trial_runs(mlflow_uri, "diverge")}
    failed = runs["tft"]
    assert failed.info.status == "FAILED"
    assert failed.data.tags["fell_back_to_f32"] == "true"
    assert "tft diverged under f32" in failed.data.tags["failure_reason"]
    assert failed.data.metrics["skipped_steps"] >= 2 * 4  # K skips in bf16, then K more in f32
    assert math.isnan(failed.data.metrics["val_sharpe"])
    assert runs["kan"].info.status == "FINISHED" and math.isfinite(
        runs["kan"].data.metrics["val_sharpe"]
    )
