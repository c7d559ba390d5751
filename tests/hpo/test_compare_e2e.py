"""A small comparison sweep end to end on local Ray: the parent run holds the verdict, the
per-pair Sharpe-difference tests and the PBO, every completed trial's run holds its
returns artifact, and `hpo compare` reproduces all of it from MLflow alone."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from dashboards.report import render_report
from hpo.cli import app
from hpo.compare import RETURNS_ARTIFACT, TrialReturns, comparison_from_mlflow
from hpo.record import SweepRecord
from hpo.stats import sharpe_moments
from hpo.sweep import run_sweep
from tests.hpo.sweep_helpers import tiny_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
CONTRAST = "bf16_vs_f32"


def test_compare_sweep_logs_statistics_that_hpo_compare_reproduces(
    ray_session, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    spec = tiny_spec(tmp_path, name="cmp-e2e", compare=True, samples=2, comparison={"margin": 0.25})
    rows = run_sweep(spec, render_report=render_report)  # the report, as `hpo sweep` logs it
    assert len(rows) == spec.n_trials == 8
    record = SweepRecord.read(Path(spec.storage) / spec.name)
    client = MlflowClient(spec.tracking_uri)
    parent = client.get_run(record.parent_run_id)
    metrics, tags = parent.data.metrics, parent.data.tags
    assert tags["cmp.margin"] == "0.25"  # the spec's [comparison] margin
    recomputed = comparison_from_mlflow(spec.name, spec.tracking_uri)
    assert recomputed.margin == 0.25  # hpo compare defaults to the sweep's margin
    for model in ("tft", "dqn"):
        family = recomputed.families[model]
        contrast = family.contrasts[CONTRAST]
        # One seed: every configuration is one unit of inference.
        assert (
            metrics[f"cmp.{model}.{CONTRAST}.val.n_configs"]
            + metrics[f"cmp.{model}.{CONTRAST}.val.n_excluded"]
            == 2.0
        )
        # Two configurations cannot show equivalence at 5%: the verdict says so.
        assert tags[f"cmp.{model}.verdict"] == (contrast.verdict() or "not computed")
        assert tags[f"cmp.{model}.verdict"].startswith(("inconclusive", "not computed"))
        # Per pair: JKM and HAC on the trials' returns over the same bars.
        completed = [t for t in recomputed.trials_of(model) if t.state == "completed"]
        done = {t.pair_id for t in completed if t.precision == "bf16"} & {
            t.pair_id for t in completed if t.precision == "f32"
        }
        tested = {
            p for p, by in contrast.pair_tests.items() if math.isfinite(by["test"].hac_pvalue)
        }
        assert tested == done  # every pair with both trials completed has its tests
        for pair, by_split in contrast.pair_tests.items():
            for split, test in by_split.items():
                key = f"cmp.{model}.{CONTRAST}.{split}.{pair}"
                if math.isfinite(test.hac_pvalue):
                    assert metrics[f"{key}.hac_p"] == pytest.approx(test.hac_pvalue, rel=1e-12)
                    assert metrics[f"{key}.jkm_p"] == pytest.approx(test.jkm_pvalue, rel=1e-12)
                    assert test.n_bars > 50 and 0.0 <= test.hac_pvalue <= 1.0
        # PBO over every completed trial of the family (4 when none diverged).
        fit = family.overfitting
        if len(completed) >= 2:
            assert fit.pbo_note is None or "blocks instead" in fit.pbo_note, fit.pbo_note
            assert metrics[f"cmp.{model}.pbo"] == pytest.approx(fit.pbo, rel=1e-12)
            assert 0.0 <= fit.pbo <= 1.0 and fit.pbo_n_blocks == 16
        # Each completed trial's artifact is the validation track its val_sharpe is of.
        for trial in completed:
            with tempfile.TemporaryDirectory() as tmp:
                local = client.download_artifacts(trial.run_id, RETURNS_ARTIFACT, tmp)
                track = TrialReturns.from_csv(Path(local).read_text())
            assert sharpe_moments(track.returns["val"]).sr == pytest.approx(
                trial.sharpe_per_period, rel=1e-9
            )
            listed = client.list_artifacts(trial.run_id, "returns")
            assert [a.path for a in listed] == [RETURNS_ARTIFACT]  # one, never duplicated
        print(  # the measured numbers, for the record (pytest -s)
            model,
            tags[f"cmp.{model}.verdict"],
            {p: (round(by["test"].jkm_pvalue, 4), round(by["test"].hac_pvalue, 4))
             for p, by in contrast.pair_tests.items()},
            f"PBO={fit.pbo} blocks={fit.pbo_n_blocks} bars={fit.pbo_n_bars}",
            f"MinTRL={fit.min_trl:.1f} (track {fit.min_trl_n_obs})",
            f"rho={fit.val_test_spearman}",
        )  # fmt: skip
    artifacts = {a.path for a in client.list_artifacts(record.parent_run_id, "comparison")}
    assert artifacts == {"comparison/comparison.json", "comparison/report.html"}
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(
            client.download_artifacts(record.parent_run_id, "comparison/report.html", tmp)
        ).read_text(encoding="utf-8")
    assert html.index('<h1 id="verdict">') < html.index('id="summary-table"')

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
    assert "PBO" in result.output
    again = json.loads(out.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(record.parent_run_id, "comparison/comparison.json", tmp)
        logged = json.loads(Path(local).read_text())
    for payload in (again, logged):
        payload.pop("computed_at")
    assert again["families"] == logged["families"] and again["overall"] == logged["overall"]
    assert again["margin"] == logged["margin"] == 0.25
