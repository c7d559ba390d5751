"""A small comparison sweep end to end on local Ray: the parent run holds the statistics
and the report, and `hpo compare` reproduces them from MLflow alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from hpo.cli import app
from hpo.compare import comparison_from_mlflow
from hpo.sweep import SweepRecord, run_sweep
from tests.hpo.sweep_helpers import tiny_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_compare_sweep_logs_statistics_that_hpo_compare_reproduces(
    ray_session, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    spec = tiny_spec(tmp_path, name="cmp-e2e", compare=True, samples=2)
    rows = run_sweep(spec)
    assert len(rows) == spec.n_trials == 8
    record = SweepRecord.read(Path(spec.storage) / spec.name)
    client = MlflowClient(spec.tracking_uri)
    parent = client.get_run(record.parent_run_id)
    metrics = parent.data.metrics
    for model in ("tft", "dqn"):
        # One seed: every configuration is one unit of inference.
        assert (
            metrics[f"cmp.{model}.bf16_vs_f32.val.n_units"]
            + metrics[f"cmp.{model}.bf16_vs_f32.val.n_excluded"]
            == 2.0
        )
        assert f"cmp.{model}.f32.n_trials" in metrics
        # Two configurations cannot show equivalence at 5%: the verdict says so.
        assert parent.data.tags[f"cmp.{model}.verdict"].startswith(("inconclusive", "not computed"))
    artifacts = {a.path for a in client.list_artifacts(record.parent_run_id, "comparison")}
    assert artifacts == {"comparison/comparison.json", "comparison/report.html"}

    out = tmp_path / "again.json"
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--experiment",
            spec.name,
            "--tracking-uri",
            spec.tracking_uri,
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    again = json.loads(out.read_text())
    local = client.download_artifacts(
        record.parent_run_id, "comparison/comparison.json", str(tmp_path)
    )
    logged = json.loads(Path(local).read_text())
    for payload in (again, logged):
        payload.pop("computed_at")
    assert again["families"] == logged["families"] and again["overall"] == logged["overall"]
    assert again["margin"] == logged["margin"] == 0.1
    recomputed = comparison_from_mlflow(spec.name, spec.tracking_uri)
    val = recomputed.families["tft"].contrasts["bf16_vs_f32"].val
    if val.n_pairs_used:
        assert metrics["cmp.tft.bf16_vs_f32.val.median_diff"] == pytest.approx(
            val.median_difference
        )
