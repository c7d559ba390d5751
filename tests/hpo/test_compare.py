"""hpo.compare against hpo.stats on a synthetic sweep written by the real tracking callback:
the numbers read back from MLflow equal compare_paired / PSR / DSR on the known values,
a diverged pair is excluded and counted, fallbacks are counted, an unfinished pair is
pending, and `hpo compare --json` writes the same numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats
from typer.testing import CliRunner

from dashboards.report import render_report
from hpo.cli import app
from hpo.compare import (
    ALL_PRECISIONS,
    DEFAULT_MARGIN,
    MARGIN_PARAM,
    OVERALL,
    RETURNS_ARTIFACT,
    VERDICT_SPLIT,
    Comparison,
    ComparisonError,
    TrialRecord,
    TrialReturns,
    compare_trials,
    comparison_from_mlflow,
    comparison_metrics,
    comparison_tags,
    log_comparison,
    mlflow_reader,
)
from hpo.stats import (
    Verdict,
    compare_paired,
    deflated_sharpe_ratio,
    expected_max_sharpe,
    mean_interval,
    min_track_record_length,
    probabilistic_sharpe_ratio,
    probability_of_backtest_overfitting,
    sharpe_difference_test,
    sharpe_moments,
)
from hpo.tracking import MlflowSweepCallback
from tests.hpo.compare_helpers import (
    EPOCHS,
    VAL,
    FakeTrial,
    SyntheticSweep,
    copy_sweep,
    finite_pairs,
    moments,
    pair_id,
    paired_records,
    record_with_returns,
    shared_sweep,
    synthetic_returns,
    trial_record,
    tune_checkpoint,
)

CONTRAST = "bf16_vs_f32"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SyntheticSweep:
    return shared_sweep(tmp_path_factory)


@pytest.fixture(scope="module")
def comparison(sweep: SyntheticSweep) -> Comparison:
    # The store also holds bf16-mixed trials: asking for f32 and bf16 leaves them out.
    return comparison_from_mlflow(sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"))


def _expected(a: list[float], b: list[float]) -> dict:
    return compare_paired(a, b, labels=("f32", "bf16")).to_dict()


def _without_scipy_notes(result: dict) -> dict:
    # hpo.compare moves scipy's RuntimeWarnings (KS on ties) into the notes.
    return {**result, "notes": [n for n in result["notes"] if not n.startswith("scipy:")]}


@pytest.mark.parametrize("model", ["tft", "dqn"])
@pytest.mark.parametrize("split", ["val", "test"])
def test_family_statistics_equal_compare_paired_on_the_known_values(
    comparison: Comparison, model: str, split: str
) -> None:
    a, b = finite_pairs(model, split)
    contrast = comparison.families[model].contrasts[CONTRAST]
    got = contrast.split(split).to_dict()
    assert _without_scipy_notes(got) == _expected(a, b)


@pytest.mark.parametrize("split", ["val", "test"])
def test_overall_pools_the_pairs_of_every_family_in_family_then_pair_order(
    comparison: Comparison, split: str
) -> None:
    a_dqn, b_dqn = finite_pairs("dqn", split)
    a_tft, b_tft = finite_pairs("tft", split)
    got = comparison.overall.contrasts[CONTRAST].split(split).to_dict()
    assert _without_scipy_notes(got) == _expected(a_dqn + a_tft, b_dqn + b_tft)


def test_the_final_epoch_is_used_not_an_earlier_one(comparison: Comparison) -> None:
    tft = comparison.families["tft"].contrasts[CONTRAST].val
    assert tft.median_a == pytest.approx(np.median([0.80, 1.10, -0.20, 0.50, 0.90]))
    by_run = {t.run_id: t for t in comparison.trials}
    assert all(t.epochs == EPOCHS for t in by_run.values() if t.state == "completed")


def test_a_diverged_trial_is_excluded_with_its_pair_and_counted(
    comparison: Comparison, sweep: SyntheticSweep
) -> None:
    # MLflow holds the diverged trial's finite earlier Sharpe values, then a final NaN:
    # the earlier values must not be used.
    client = MlflowClient(sweep.tracking_uri)
    run_id = sweep.run_ids[("tft", "bf16", 2)]
    history = client.get_metric_history(run_id, "val_sharpe")
    assert any(math.isfinite(m.value) for m in history)
    assert math.isnan(client.get_run(run_id).data.metrics["val_sharpe"])
    tft = comparison.families["tft"]
    contrast = tft.contrasts[CONTRAST]
    for split in ("val", "test"):
        result = contrast.split(split)
        assert result.n_pairs_total == 6 and result.n_pairs_used == 5
        assert result.n_excluded_nonfinite == 1
        assert contrast.excluded_pair_ids(split) == [pair_id("tft", 2)]
    assert tft.counts["bf16"]["diverged"] == 1 and tft.counts["f32"]["diverged"] == 0
    assert comparison.overall.counts["bf16"]["diverged"] == 1
    diverged = next(t for t in comparison.trials if t.run_id == run_id)
    assert diverged.state == "diverged" and math.isnan(diverged.val_sharpe)
    assert "diverged" in (diverged.failure_reason or "")


def test_fallbacks_are_counted_and_kept_in_the_comparison(comparison: Comparison) -> None:
    tft = comparison.families["tft"]
    assert tft.counts["bf16"]["fell_back"] == 1 and tft.counts["f32"]["fell_back"] == 0
    assert comparison.families["dqn"].counts["bf16"]["fell_back"] == 0
    assert pair_id("tft", 4) in tft.contrasts[CONTRAST].pair_ids


def test_an_unfinished_pair_is_pending_not_compared(
    comparison: Comparison, sweep: SyntheticSweep
) -> None:
    dqn = comparison.families["dqn"]
    contrast = dqn.contrasts[CONTRAST]
    running = next(t for t in comparison.trials if t.run_id == sweep.run_ids[("dqn", "bf16", 5)])
    assert running.state == "unfinished" and running.epochs == EPOCHS - 1
    assert contrast.incomplete == {pair_id("dqn", 5): f"bf16 trial {running.trial_id} unfinished"}
    assert pair_id("dqn", 5) not in contrast.pair_ids
    assert dqn.counts["bf16"]["unfinished"] == 1
    assert comparison.overall.contrasts[CONTRAST].incomplete == contrast.incomplete


def test_psr_of_every_completed_trial_from_its_logged_moments(comparison: Comparison) -> None:
    completed = [t for t in comparison.trials if t.state == "completed"]
    assert len(completed) == 24 - 2
    for t in completed:
        index = int(t.pair_id.split("-c")[1][:3])
        m = moments(t.family, t.precision, index)
        expected = probabilistic_sharpe_ratio(
            m["val_sharpe_per_period"], 0.0, int(m["val_n_obs"]), m["val_skew"], m["val_kurtosis"]
        )
        assert t.psr == pytest.approx(expected, rel=1e-12)
    assert all(math.isnan(t.psr) for t in comparison.trials if t.state != "completed")


@pytest.mark.parametrize("scope", ["tft", "dqn", OVERALL])
@pytest.mark.parametrize("precision", ["f32", "bf16", ALL_PRECISIONS])
def test_dsr_of_the_best_trial_given_every_trial_tried(
    comparison: Comparison, scope: str, precision: str
) -> None:
    trials = [
        t
        for t in comparison.trials
        if scope in (OVERALL, t.family) and precision in (ALL_PRECISIONS, t.precision)
    ]
    finished = [t for t in trials if t.state == "completed"]
    best = max(finished, key=lambda t: t.val_sharpe)
    index = int(best.pair_id.split("-c")[1][:3])
    assert best.val_sharpe == VAL[best.family][best.precision][index]
    m = moments(best.family, best.precision, index)
    variance = float(np.var([t.sharpe_per_period for t in finished], ddof=1))
    owner = comparison.overall if scope == OVERALL else comparison.families[scope]
    selection = owner.selection[precision]
    assert selection.n_trials == len(trials)  # diverged and unfinished trials were tried
    assert selection.best_trial_id == best.trial_id
    assert selection.sr_variance == pytest.approx(variance, rel=1e-12)
    assert selection.expected_max_sharpe == pytest.approx(
        expected_max_sharpe(variance, len(trials)), rel=1e-12
    )
    args = (int(m["val_n_obs"]), m["val_skew"], m["val_kurtosis"])
    assert selection.dsr == pytest.approx(
        deflated_sharpe_ratio(m["val_sharpe_per_period"], variance, len(trials), *args), rel=1e-12
    )
    n_configs = len({(t.family, t.config_id) for t in trials})
    assert selection.dsr_by_configs == pytest.approx(
        deflated_sharpe_ratio(m["val_sharpe_per_period"], variance, n_configs, *args), rel=1e-12
    )
    assert selection.dsr <= selection.dsr_by_configs  # more trials, more deflation


def test_resources_are_medians_per_precision(comparison: Comparison) -> None:
    tft = comparison.families["tft"].resources
    # peak_mem_mb = base + pair index over the six trials of each precision.
    assert tft["f32"]["peak_mem_mb"] == pytest.approx(102.5)
    assert tft["bf16"]["peak_mem_mb"] == pytest.approx(62.5)
    assert tft["bf16"]["steps_per_s"] == pytest.approx(82.5)


def test_curves_hold_the_validation_sharpe_of_every_epoch(comparison: Comparison) -> None:
    t = next(t for t in comparison.trials if t.family == "tft" and t.pair_id == pair_id("tft", 1))
    steps = [s for s, _ in t.val_curve]
    assert steps == list(range(1, EPOCHS + 1))
    assert t.val_curve[-1][1] == pytest.approx(t.val_sharpe)


def test_trials_of_precisions_not_compared_are_left_out_and_noted(
    comparison: Comparison,
) -> None:
    assert {t.precision for t in comparison.trials} == {"f32", "bf16"}
    assert comparison.notes == ["left out trials of precisions not compared: {'bf16-mixed': 12}"]


def test_to_dict_is_json_safe_and_names_excluded_pairs(comparison: Comparison) -> None:
    payload = comparison.to_dict()
    json.dumps(payload, allow_nan=False)
    contrast = payload["families"]["tft"]["contrasts"][CONTRAST]
    assert contrast["val_excluded_pair_ids"] == [pair_id("tft", 2)]
    assert payload["reference"] == "f32" and payload["precisions"] == ["f32", "bf16"]
    diverged = [t for t in payload["trials"] if t["state"] == "diverged"]
    assert len(diverged) == 1 and diverged[0]["val_sharpe"] is None


def test_cli_json_reproduces_the_comparison(
    comparison: Comparison, sweep: SyntheticSweep, tmp_path: Path
) -> None:
    out = tmp_path / "cmp.json"
    result = CliRunner().invoke(
        app,
        [
            "compare",
            "--experiment",
            sweep.experiment,
            "--tracking-uri",
            sweep.tracking_uri,
            "--json",
            str(out),
            "--precision",
            "f32",
            "--precision",
            "bf16",
            "--wide",
        ],
    )
    assert result.exit_code == 0, result.output
    for text in ("tft: 12 trials", "dqn: 12 trials", "overall: 24 trials", "bf16 - f32 val"):
        assert text in result.output
    written = json.loads(out.read_text())
    expected = comparison.to_dict()
    for payload in (written, expected):
        payload.pop("computed_at")
    assert written == expected


def test_cli_names_a_missing_experiment(sweep: SyntheticSweep) -> None:
    result = CliRunner().invoke(
        app, ["compare", "--experiment", "nope", "--tracking-uri", sweep.tracking_uri]
    )
    assert result.exit_code != 0
    assert isinstance(result.exception, Exception)
    assert "no MLflow experiment named 'nope'" in str(result.exception)
    assert sweep.experiment in str(result.exception)


def test_precisions_default_to_the_sweeps_and_need_two(sweep: SyntheticSweep) -> None:
    inferred = comparison_from_mlflow(
        sweep.experiment,
        sweep.tracking_uri,
        precisions=None,
        with_curves=False,
    )
    assert inferred.precisions == ["f32", "bf16", "bf16-mixed"]  # the parent run's param
    with pytest.raises(ComparisonError, match="at least two distinct precisions"):
        comparison_from_mlflow(sweep.experiment, sweep.tracking_uri, precisions=("f32",))


def test_a_parent_without_its_precisions_takes_the_trials_f32_first(
    sweep: SyntheticSweep, tmp_path: Path
) -> None:
    """A sweep whose parent run names no precisions (made before the param was logged):
    the trials' tags name them, f32 first, and every trial of them is compared."""
    import sqlite3

    old = copy_sweep(sweep, tmp_path)
    with sqlite3.connect(old.tracking_uri.removeprefix("sqlite:///")) as db:
        gone = db.execute(
            "DELETE FROM params WHERE run_uuid = ? AND key = 'precisions'", (old.parent_run_id,)
        ).rowcount
    assert gone == 1
    inferred = comparison_from_mlflow(
        old.experiment, old.tracking_uri, precisions=None, with_curves=False
    )
    assert inferred.precisions == ["f32", "bf16", "bf16-mixed"]
    assert len(inferred.trials) == len(sweep.run_ids) == 36
    assert not any("left out" in note for note in inferred.notes)


def test_log_comparison_puts_statistics_and_report_on_the_parent_run(
    comparison: Comparison, sweep: SyntheticSweep, tmp_path: Path
) -> None:
    private = copy_sweep(sweep, tmp_path / "store")
    html = render_report(comparison)  # presentation is the caller's
    logged = log_comparison(
        comparison, private.tracking_uri, private.parent_run_id, report_html=html
    )
    client = MlflowClient(private.tracking_uri)
    parent = client.get_run(private.parent_run_id)
    metrics = parent.data.metrics
    val = comparison.families["tft"].contrasts[CONTRAST].val
    assert metrics["cmp.tft.bf16_vs_f32.val.median_diff"] == pytest.approx(val.median_difference)
    assert metrics["cmp.tft.bf16_vs_f32.val.wilcoxon_p"] == pytest.approx(val.wilcoxon_pvalue)
    assert metrics["cmp.tft.bf16_vs_f32.val.ci_low"] == pytest.approx(val.hl_low)
    assert metrics["cmp.tft.bf16_vs_f32.val.ci_confidence"] == pytest.approx(val.hl_confidence)
    headline = comparison.families["tft"].contrasts[CONTRAST].verdict()
    assert headline is not None and parent.data.tags["cmp.tft.verdict"] == headline
    assert metrics["cmp.tft.bf16_vs_f32.val.n_excluded"] == 1.0
    assert metrics["cmp.tft.bf16.n_diverged"] == 1.0
    assert metrics["cmp.tft.bf16.n_fell_back"] == 1.0
    assert metrics["cmp.dqn.bf16_vs_f32.val.n_incomplete"] == 1.0
    assert metrics["cmp.overall.dsr_best"] == pytest.approx(
        comparison.overall.selection[ALL_PRECISIONS].dsr
    )
    tft = comparison.families["tft"]
    assert metrics["cmp.tft.pbo"] == tft.overfitting.pbo
    assert metrics["cmp.tft.min_trl"] == tft.overfitting.min_trl
    assert metrics["cmp.tft.val_test_spearman"] == tft.overfitting.val_test_spearman
    assert "cmp.dqn.pbo" not in metrics  # one dqn trial has no returns artifact
    pair = pair_id("tft", 0)
    test = tft.contrasts[CONTRAST].pair_tests[pair]["test"]
    assert metrics[f"cmp.tft.{CONTRAST}.test.{pair}.hac_p"] == test.hac_pvalue
    assert metrics[f"cmp.tft.{CONTRAST}.test.{pair}.jkm_z"] == test.jkm_statistic
    assert set(logged) <= set(metrics)
    assert parent.data.tags["cmp.reference"] == "f32"
    artifacts = {a.path for a in client.list_artifacts(private.parent_run_id, "comparison")}
    assert artifacts == {"comparison/comparison.json", "comparison/report.html"}
    local = Path(client.download_artifacts(private.parent_run_id, "comparison", str(tmp_path)))
    payload = json.loads((local / "comparison.json").read_text())
    assert payload["families"]["tft"]["contrasts"][CONTRAST]["val"] == val.to_dict()
    assert (local / "report.html").read_text(encoding="utf-8") == html


def test_compare_is_computation_and_io_without_presentation() -> None:
    """hpo.compare does not import dashboards (the report and tables import it)."""
    code = (
        "import sys, hpo.compare; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dashboards'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
    import hpo.compare

    assert not hasattr(hpo.compare, "rich_tables")  # the formatting lives in dashboards


def test_log_comparison_without_a_report_logs_the_json_only(
    comparison: Comparison, sweep: SyntheticSweep, tmp_path: Path
) -> None:
    private = copy_sweep(sweep, tmp_path / "store")
    client = MlflowClient(private.tracking_uri)
    run_id = client.create_run(client.get_run(private.parent_run_id).info.experiment_id).info.run_id
    log_comparison(comparison, private.tracking_uri, run_id)
    assert [a.path for a in client.list_artifacts(run_id, "comparison")] == [
        "comparison/comparison.json"
    ]


def test_cli_margin_option_and_no_bootstrap_option(sweep: SyntheticSweep, tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    args = ["compare", "--experiment", sweep.experiment, "--tracking-uri", sweep.tracking_uri]
    result = CliRunner().invoke(app, [*args, "--margin", "0.2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["margin"] == 0.2
    assert "\u00b10.20" in result.output or "±0.20" in result.output
    refused = CliRunner().invoke(app, [*args, "--resamples", "99"])
    assert refused.exit_code == 2 and "--resamples" in refused.output
    bad = CliRunner().invoke(app, [*args, "--margin", "0"])
    assert bad.exit_code != 0 and "margin must be" in str(bad.exception or bad.output)


def test_a_sweep_not_in_compare_mode_says_why_nothing_pairs(
    sweep: SyntheticSweep, tmp_path: Path
) -> None:
    private = copy_sweep(sweep, tmp_path / "store")
    MlflowClient(private.tracking_uri).set_tag(private.parent_run_id, "compare", "false")
    result = comparison_from_mlflow(
        private.experiment,
        private.tracking_uri,
        precisions=("f32", "bf16"),
        with_curves=False,
    )
    assert any("did not run in compare mode" in note for note in result.notes)


def test_more_than_two_precisions_are_each_compared_with_the_first(
    sweep: SyntheticSweep,
) -> None:
    result = comparison_from_mlflow(
        sweep.experiment,
        sweep.tracking_uri,
        precisions=("f32", "bf16", "bf16-mixed"),
        with_curves=False,
    )
    tft = result.families["tft"]
    assert set(tft.contrasts) == {"bf16_vs_f32", "bf16-mixed_vs_f32"}
    # bf16-mixed is bf16 shifted by -0.05 and completes everywhere (no diverged trial).
    a = VAL["tft"]["f32"]
    b = [v - 0.05 if math.isfinite(v) else 0.6 - 0.05 for v in VAL["tft"]["bf16"]]
    got = tft.contrasts["bf16-mixed_vs_f32"].val.to_dict()
    assert _without_scipy_notes(got) == compare_paired(a, b, labels=("f32", "bf16-mixed")).to_dict()
    assert tft.contrasts["bf16_vs_f32"].val.n_excluded_nonfinite == 1


# ---------------------------------------------------------------------------------------
# Statistics on fixed data, without MLflow (compare_trials)


def _bf16_vs_f32(trials: list, **kwargs: object):  # type: ignore[no-untyped-def]
    result = compare_trials(trials, ("f32", "bf16"), **kwargs)
    return result, result.families[trials[0].family].contrasts[CONTRAST]


def test_wilcoxon_with_zero_differences_is_exact_on_the_non_zero_ones() -> None:
    # 15 configurations where both trials are flat (difference exactly 0) and five with
    # differences 0.1 .. 0.5: scipy's method='auto' counted the zeros and switched to the
    # normal approximation (p = 0.043); the exact p of the five non-zero differences is
    # 2 / 2**5 = 0.0625 (all five positive: the most extreme of 32 sign patterns, twice).
    diffs = [0.0] * 15 + [0.1, 0.2, 0.3, 0.4, 0.5]
    f32 = [[0.25]] * len(diffs)
    bf16 = [[0.25 + d] for d in diffs]
    _, contrast = _bf16_vs_f32(paired_records("tft", f32, bf16))
    for split in ("val", "test"):
        assert contrast.split(split).n_pairs_used == 20
        assert contrast.split(split).wilcoxon_pvalue == pytest.approx(0.0625, rel=1e-12)
        assert contrast.inference[split].wilcoxon_method == "exact"


def _method(diffs: list[float]) -> tuple[str, float]:
    _, contrast = _bf16_vs_f32(
        paired_records("tft", [[0.25]] * len(diffs), [[0.25 + d] for d in diffs])
    )
    return contrast.inference["val"].wilcoxon_method, contrast.val.wilcoxon_pvalue


def test_each_p_value_names_the_method_that_gave_it() -> None:
    assert _method([0.0, 0.0, 0.0]) == ("all differences zero", 1.0)
    # The zero is dropped: n = 3, W+ = 4, P(W+ >= 4) = 3/8, two-sided 0.75.
    method, p = _method([0.1, -0.3, 0.0, 0.4])
    assert method == "exact" and p == pytest.approx(0.75)
    # Tied magnitudes, exact over the 2^4 sign patterns with mid-ranks: W- = 1 arises
    # from (+,+,+,-) and its mirror, each reachable twice: p = 4/16.
    method, p = _method([0.2, 0.2, 0.2, -0.1])
    assert method == "exact" and p == pytest.approx(4 / 16)
    method, _ = _method(list(np.linspace(0.01, 1.0, 51)))
    assert method.startswith("normal approximation")
    _, contrast = _bf16_vs_f32(paired_records("tft", [[0.2]], [[0.3]]))
    assert contrast.inference["val"].wilcoxon_method.startswith("not computed")


def test_seeds_of_one_configuration_are_averaged_into_one_unit() -> None:
    # 2 configurations x 3 seeds: the unit of inference is the configuration, so n = 2.
    f32 = [[0.5, 0.6, 0.7], [0.2, 0.1, 0.0]]
    bf16 = [[0.6, 0.8, 0.7], [0.1, 0.1, 0.3]]
    comparison, contrast = _bf16_vs_f32(paired_records("tft", f32, bf16))
    val = contrast.val
    assert val.n_pairs_total == 2 and val.n_pairs_used == 2
    unit_diffs = [np.mean(np.subtract(b, a)) for a, b in zip(f32, bf16, strict=True)]
    assert val.mean_difference == pytest.approx(np.mean(unit_diffs), rel=1e-12)
    assert val.median_a == pytest.approx(np.median([np.mean(a) for a in f32]), rel=1e-12)
    assert contrast.config_ids == ["tft-c000", "tft-c001"]
    # The per-seed pairs are kept for the report.
    assert contrast.config_pairs == {
        "tft-c000": ["tft-c000-s0", "tft-c000-s1", "tft-c000-s2"],
        "tft-c001": ["tft-c001-s0", "tft-c001-s1", "tft-c001-s2"],
    }
    assert len(contrast.pair_ids) == 6
    assert comparison_metrics(comparison)["cmp.tft.bf16_vs_f32.val.n_configs"] == 2.0
    assert comparison_metrics(comparison)["cmp.tft.bf16_vs_f32.val.n_seed_pairs"] == 6.0


def test_a_configuration_with_a_diverged_seed_is_excluded_as_one_unit() -> None:
    trials = paired_records(
        "tft", [[0.5, 0.6], [0.2, 0.1], [0.3, 0.3]], [[0.6, 0.8], [0.1, math.nan], [0.4, 0.2]]
    )
    for t in trials:
        if math.isnan(t.val_sharpe):
            t.state = "diverged"
    _, contrast = _bf16_vs_f32(trials)
    assert contrast.val.n_pairs_total == 3 and contrast.val.n_pairs_used == 2
    assert contrast.excluded_config_ids("val") == ["tft-c001"]
    assert contrast.excluded_pair_ids("val") == ["tft-c001-s0", "tft-c001-s1"]


def test_a_configuration_with_a_pending_seed_waits_for_it() -> None:
    trials = paired_records(
        "tft", [[0.5, 0.6], [0.2, 0.1], [0.3, 0.3]], [[0.6, 0.8], [0.1, 0.0], [0.4, 0.2]]
    )
    running = next(t for t in trials if t.pair_id == "tft-c001-s1" and t.precision == "bf16")
    running.state = "unfinished"
    _, contrast = _bf16_vs_f32(trials)
    assert contrast.config_ids == ["tft-c000", "tft-c002"]
    assert contrast.incomplete == {
        "tft-c001-s1": f"bf16 trial {running.trial_id} unfinished",
        "tft-c001-s0": "configuration tft-c001 has a pending seed",
    }


def test_bh_adjusts_across_families_within_each_split(comparison: Comparison) -> None:
    for split in ("val", "test"):
        raw = [
            comparison.families[m].contrasts[CONTRAST].split(split).wilcoxon_pvalue
            for m in ("dqn", "tft")
        ]
        expected = stats.false_discovery_control(raw, method="bh")
        got = [
            comparison.families[m].contrasts[CONTRAST].inference[split].wilcoxon_p_bh
            for m in ("dqn", "tft")
        ]
        assert got == pytest.approx(list(expected), rel=1e-12)
        # One adjustment per contrast and split, one test per family: 2 here, not 4.
        assert [
            comparison.families[m].contrasts[CONTRAST].inference[split].bh_n_tests
            for m in ("dqn", "tft")
        ] == [2, 2]


def test_margin_flows_into_every_verdict_and_the_parent_run_tags() -> None:
    trials = paired_records("tft", [[0.5], [0.2], [0.3]], [[0.6], [0.1], [0.4]])
    comparison, contrast = _bf16_vs_f32(trials, margin=0.25)
    assert comparison.margin == 0.25
    assert all(contrast.inference[s].margin == 0.25 for s in ("val", "test"))
    tags = comparison_tags(comparison)
    assert tags["cmp.margin"] == "0.25"
    assert tags["cmp.verdict_split"] == VERDICT_SPLIT
    for scope in ("tft", OVERALL):
        expected = comparison.scope(scope).contrasts[CONTRAST].inference[VERDICT_SPLIT].verdict
        assert tags[f"cmp.{scope}.verdict"] == tags[f"cmp.{scope}.{CONTRAST}.verdict"]
        assert tags[f"cmp.{scope}.verdict"] == (expected or "not computed")


def test_the_default_margin_is_a_tenth_of_an_annualised_sharpe() -> None:
    trials = paired_records("tft", [[0.5], [0.2]], [[0.6], [0.1]])
    comparison, _ = _bf16_vs_f32(trials)
    assert comparison.margin == DEFAULT_MARGIN == 0.1


def test_the_ci_is_the_hodges_lehmann_interval_at_its_achieved_confidence() -> None:
    # Six differences 0.1 .. 0.6: the 21 Walsh averages have median 0.35. At n = 6 only
    # the two most extreme sign patterns have T+ <= 0 ... P(T+ <= 0) = 1/64 <= 0.025 <
    # P(T+ <= 1) = 2/64, so the 95% interval is [min, max] of the Walsh averages, and it
    # achieves 1 - 2/64 = 96.875%. The median of the differences stays descriptive.
    f32 = [[0.0]] * 6
    bf16 = [[0.1], [0.2], [0.3], [0.4], [0.5], [0.6]]
    comparison, contrast = _bf16_vs_f32(paired_records("tft", f32, bf16))
    val = contrast.val
    assert val.hl_estimate == pytest.approx(0.35, rel=1e-12)
    assert (val.hl_low, val.hl_high) == pytest.approx((0.1, 0.6), rel=1e-12)
    assert val.hl_confidence == pytest.approx(1 - 2 / 64, rel=1e-12)
    assert contrast.val.median_difference == pytest.approx(0.35, rel=1e-12)
    metrics = comparison_metrics(comparison)
    assert metrics["cmp.tft.bf16_vs_f32.val.ci_high"] == pytest.approx(0.6, rel=1e-12)


@pytest.mark.parametrize(
    ("diffs", "verdict"),
    [
        # Every Walsh average within +-0.02: the 90% HL interval is inside +-0.1.
        ([0.01, -0.02, 0.0, 0.015, -0.01, 0.005], "equivalent"),
        # Every Walsh average below -0.4: wholly beyond the margin, on the worse side.
        ([-0.5, -0.45, -0.6, -0.55, -0.4, -0.52], "bf16 worse"),
        ([0.5, 0.45, 0.6, 0.55, 0.4, 0.52], "bf16 better"),
    ],
)
def test_the_verdict_per_family_and_overall(diffs: list[float], verdict: str) -> None:
    f32 = [[0.3, 0.5]] * len(diffs)
    bf16 = [[0.3 + d, 0.5 + d] for d in diffs]  # two seeds, the same difference
    comparison, contrast = _bf16_vs_f32(paired_records("tft", f32, bf16))
    for split in ("val", "test"):
        assert contrast.inference[split].verdict == verdict
    assert comparison.overall.contrasts[CONTRAST].verdict() == verdict
    tags = comparison_tags(comparison)
    assert tags["cmp.tft.verdict"] == tags["cmp.overall.verdict"] == verdict


def test_few_configurations_are_inconclusive_and_say_how_many_more() -> None:
    # 3 configurations cannot reject at 5% whatever the data (2^-3 > 0.05).
    f32 = [[0.3], [0.5], [0.2]]
    bf16 = [[0.31], [0.49], [0.2]]
    _, contrast = _bf16_vs_f32(paired_records("tft", f32, bf16))
    inference = contrast.inference["test"]
    assert inference.verdict is not None and inference.verdict.startswith("inconclusive")
    assert inference.configs_needed is not None and inference.configs_needed >= 2  # n >= 5
    assert f"about {inference.configs_needed} more configurations needed" in inference.verdict
    assert "4 or fewer" in (inference.verdict_note or "")


def test_the_json_keeps_the_decision_and_its_note_apart() -> None:
    # comparison.json (what `hpo compare --json` writes) stores the Verdict's value and the
    # words after it as separate keys; the text ("bf16 worse", "inconclusive: about 2 more
    # configurations needed") is rendered from them for people, never stored or parsed.
    def split_json(comparison: Comparison) -> dict[str, Any]:
        payload = json.loads(json.dumps(comparison.to_dict(), allow_nan=False))
        return payload["families"]["tft"]["contrasts"][CONTRAST]["inference"][VERDICT_SPLIT]

    worse = [-0.5, -0.45, -0.6, -0.55, -0.4, -0.52]
    comparison, contrast = _bf16_vs_f32(
        paired_records("tft", [[0.3]] * 6, [[0.3 + d] for d in worse])
    )
    stored = split_json(comparison)
    assert stored["decision"] == "worse" and stored["decision_note"] is None
    assert stored["tost_decision"] == "worse" and stored["other"] == "bf16"
    assert "verdict" not in stored and "tost_verdict" not in stored
    assert contrast.inference[VERDICT_SPLIT].decision is Verdict.WORSE
    assert contrast.verdict() == "bf16 worse"

    few, contrast = _bf16_vs_f32(
        paired_records("tft", [[0.3], [0.5], [0.2]], [[0.31], [0.49], [0.2]])
    )
    stored = split_json(few)
    inference = contrast.inference[VERDICT_SPLIT]
    assert stored["decision"] == "inconclusive" and inference.decision is Verdict.INCONCLUSIVE
    assert stored["decision_note"] == f"about {inference.configs_needed} more configurations needed"
    assert inference.verdict == f"inconclusive: {stored['decision_note']}"
    assert comparison_tags(few)["cmp.tft.verdict"] == inference.verdict


# ---------------------------------------------------------------------------------------
# Selection on the joined validation Sharpe; return-series statistics (fixed data)

RNG = np.random.default_rng(20261201)
Z = RNG.standard_normal((4, 2, 120))  # (trial, fold, bar) fixed shocks
Z_TEST = RNG.standard_normal((4, 60))


def _folds(trial: int, means: tuple[float, float], vols: tuple[float, float]) -> list[np.ndarray]:
    return [m + v * Z[trial, k] for k, (m, v) in enumerate(zip(means, vols, strict=True))]


# Trial 0: a calm, strong fold and a volatile losing one; its fold-mean Sharpe is far above
# trial 1's, its joined track far below (the volatile fold dominates the joined variance).
LUCKY_FOLD = _folds(0, (0.004, -0.002), (0.002, 0.03))
STEADY = _folds(1, (0.0015, 0.0015), (0.01, 0.01))


@pytest.mark.parametrize("val_sharpe", ["joined", "fold_mean"])
def test_the_best_trial_is_the_best_joined_validation_track(val_sharpe: str) -> None:
    lucky = record_with_returns("tft", "f32", 0, 0, LUCKY_FOLD, Z_TEST[0], val_sharpe=val_sharpe)
    steady = record_with_returns("tft", "f32", 1, 0, STEADY, Z_TEST[1], val_sharpe=val_sharpe)
    joined = {r.trial_id: r.sharpe_per_period for r in (lucky, steady)}
    fold_mean = {
        r.trial_id: np.mean([sharpe_moments(f).sr for f in folds])
        for r, folds in ((lucky, LUCKY_FOLD), (steady, STEADY))
    }
    # The data disagree: the fold mean prefers the lucky trial, the joined track the steady.
    assert fold_mean[lucky.trial_id] > 2 * fold_mean[steady.trial_id]
    assert joined[steady.trial_id] > 2 * joined[lucky.trial_id] > 0
    result = compare_trials([lucky, steady], ("f32", "bf16"))
    selection = result.families["tft"].selection["f32"]
    assert selection.best_trial_id == steady.trial_id
    assert selection.best_sharpe_per_period == joined[steady.trial_id]
    srs = np.array([joined[lucky.trial_id], joined[steady.trial_id]])
    assert selection.sr_variance == pytest.approx(np.var(srs, ddof=1), rel=1e-12)
    assert selection.dsr == deflated_sharpe_ratio(
        steady.sharpe_per_period, selection.sr_variance, 2, steady.n_obs, steady.skew,
        steady.kurtosis,
    )  # fmt: skip


def _pair(group: int, shift: float, skip_ref: int = 0) -> list:  # type: ignore[type-arg]
    """f32 and bf16 trials of configuration ``group``: bf16's returns are f32's plus a
    small perturbation and ``shift`` per bar; f32 misses its first ``skip_ref`` bars."""
    base = _folds(group % 4, (0.001, 0.0012), (0.01, 0.012))
    other = [f + shift + 0.001 * Z[(group + 1) % 4, k] for k, f in enumerate(base)]
    test = 0.0008 + 0.01 * Z_TEST[group % 4]
    return [
        record_with_returns("tft", "f32", group, 0, base, test, skip=skip_ref),
        record_with_returns("tft", "bf16", group, 0, other, test + shift),
    ]


def test_pair_tests_are_jkm_and_hac_on_the_bars_both_trials_have() -> None:
    trials = _pair(0, 0.0004, skip_ref=5)  # f32 lacks the first 5 bars of each segment
    _, contrast = _bf16_vs_f32(trials)
    for split in ("val", "test"):
        got = contrast.pair_tests[pair_id("tft", 0)][split]
        # Reference per segment: bars 5.. of each fold (val) or of the test period.
        if split == "val":
            a = np.concatenate([f[5:] for f in _folds(0, (0.001, 0.0012), (0.01, 0.012))])
            b = np.concatenate(
                [
                    (f + 0.0004 + 0.001 * Z[1, k])[5:]
                    for k, f in enumerate(_folds(0, (0.001, 0.0012), (0.01, 0.012)))
                ]
            )
        else:
            a = (0.0008 + 0.01 * Z_TEST[0])[5:]
            b = a + 0.0004
        assert got.n_bars == a.size == (230 if split == "val" else 55)
        jkm = sharpe_difference_test(b, a, method="jkm")
        hac = sharpe_difference_test(b, a, method="hac")
        assert (got.jkm_statistic, got.jkm_pvalue) == (jkm.statistic, jkm.pvalue)
        assert (got.hac_statistic, got.hac_pvalue) == (hac.statistic, hac.pvalue)
        assert got.difference == jkm.difference > 0  # bf16 earns more: positive statistic
        assert got.jkm_statistic > 0 and got.note is None


def _family(n_groups: int) -> list:  # type: ignore[type-arg]
    return [t for g in range(n_groups) for t in _pair(g, 0.0002 * (g - 1))]


def test_pbo_min_trl_and_spearman_of_a_family_from_its_completed_trials() -> None:
    trials = _family(4)
    result, _ = _bf16_vs_f32(trials)
    fit = result.families["tft"].overfitting
    # Every trial has the same 240 validation bars; columns in the comparison's trial order.
    matrix = np.column_stack([t.returns.returns["val"] for t in result.trials])
    assert fit.n_completed == 8 and fit.pbo_n_bars == 240 and fit.pbo_n_blocks == 16
    assert fit.pbo == probability_of_backtest_overfitting(matrix, n_blocks=16)
    assert fit.pbo_note is None
    best = max(result.trials, key=lambda t: t.sharpe_per_period)
    assert fit.min_trl_trial_id == best.trial_id and fit.min_trl_n_obs == 240
    assert fit.min_trl == min_track_record_length(
        best.sharpe_per_period, 0.0, best.skew, best.kurtosis, 0.95
    )
    # On the 4 configurations (each the mean of its two trials), not the 8 trials.
    means = [
        (np.mean([t.val_sharpe for t in c]), np.mean([t.test_sharpe for t in c]))
        for c in (result.trials[i : i + 2] for i in range(0, 8, 2))
    ]
    rho = stats.spearmanr([v for v, _ in means], [t for _, t in means])
    assert fit.val_test_spearman == pytest.approx(rho.statistic) and fit.spearman_n == 4
    metrics = comparison_metrics(result)
    assert metrics["cmp.tft.pbo"] == fit.pbo
    assert metrics["cmp.tft.min_trl"] == fit.min_trl
    assert metrics["cmp.tft.val_test_spearman"] == fit.val_test_spearman
    pair_tests = result.families["tft"].contrasts[CONTRAST].pair_tests
    assert len(pair_tests) == 4
    assert metrics[f"cmp.tft.{CONTRAST}.test.{pair_id('tft', 2)}.hac_p"] == (
        pair_tests[pair_id("tft", 2)]["test"].hac_pvalue
    )


def test_pbo_uses_fewer_blocks_on_few_common_bars() -> None:
    short = [
        record_with_returns(
            "tft", p, g, 0, [f[:11] for f in _folds(g, (0.001, 0.0), (0.01, 0.01))], Z_TEST[g]
        )
        for g in range(3)
        for p in ("f32", "bf16")
    ]
    fit = compare_trials(short, ("f32", "bf16")).families["tft"].overfitting
    assert (fit.pbo_n_bars, fit.pbo_n_blocks) == (22, 10)  # 22 bars: 10 blocks of 2 or 3
    matrix = np.column_stack([t.returns.returns["val"] for t in sorted(short, key=_order)])
    assert fit.pbo == probability_of_backtest_overfitting(matrix, n_blocks=10)
    assert "10 blocks instead of 16" in fit.pbo_note


def _order(t: TrialRecord) -> tuple[str, str, int, str]:
    return (t.family, t.pair_id, ("f32", "bf16").index(t.precision), t.trial_id)


def test_a_missing_returns_artifact_makes_those_numbers_not_available() -> None:
    trials = _family(3)
    trials[2].returns, trials[2].returns_note = None, "no returns artifact returns/returns.csv"
    result, contrast = _bf16_vs_f32(trials)
    fit = result.families["tft"].overfitting
    assert math.isnan(fit.pbo) and fit.pbo_note.startswith("not available: 1 of 6")
    broken = contrast.pair_tests[trials[2].pair_id]["val"]
    assert math.isnan(broken.jkm_pvalue) and "no returns artifact" in broken.note
    assert math.isfinite(contrast.pair_tests[trials[0].pair_id]["val"].jkm_pvalue)
    metrics = comparison_metrics(result)
    assert "cmp.tft.pbo" not in metrics and "cmp.tft.min_trl" in metrics  # moments suffice
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.to_dict()["trials"][0]["returns"] == {"n_bars_val": 240, "n_bars_test": 60}


# ---------------------------------------------------------------------------------------
# The margin comes from the spec's [comparison] table


def test_the_spec_fixes_the_margin_in_a_comparison_table(tmp_path: Path) -> None:
    from hpo.spec import ComparisonSpec, SpecError, load_spec

    assert ComparisonSpec().margin == DEFAULT_MARGIN  # one default, documented in both
    path = tmp_path / "cmp.toml"
    base = 'name = "m"\nfamilies = ["tft"]\ncompare = true\n'
    path.write_text(base + "[comparison]\nmargin = 0.25\n")
    assert load_spec(path).comparison.margin == 0.25
    for bad, message in (("0", "greater than 0"), ("-0.1", "greater than 0"), ("nan", "")):
        path.write_text(base + f"[comparison]\nmargin = {bad}\n")
        with pytest.raises(SpecError) as raised:
            load_spec(path)
        assert any(
            p.startswith("comparison.margin:") and message in p for p in raised.value.problems
        )
    path.write_text(base + "[comparison]\nmargn = 0.2\n")
    with pytest.raises(
        SpecError,
        match=r"comparison\.margn: unknown field; allowed: \['in_flight', 'look_every', 'margin', 'max_configs', 'sequential'\]",
    ):
        load_spec(path)


# ---------------------------------------------------------------------------------------
# Return series read from MLflow (the trials' returns artifacts)


def _artifact(sweep: SyntheticSweep, model: str, precision: str, index: int) -> TrialReturns:
    client = MlflowClient(sweep.tracking_uri)
    run_id = sweep.run_ids[(model, precision, index)]
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(client.download_artifacts(run_id, RETURNS_ARTIFACT, tmp)).read_text()
    return TrialReturns.from_csv(text)


def test_pair_tests_and_pbo_are_recomputed_from_the_runs_artifacts(
    comparison: Comparison, sweep: SyntheticSweep
) -> None:
    tft = comparison.families["tft"]
    tracks = {
        (t.precision, t.pair_id): _artifact(sweep, "tft", t.precision, int(t.pair_id[5:8]))
        for t in comparison.trials_of("tft")
        if t.state == "completed"
    }
    for (precision, pair), track in tracks.items():
        record = next(t for t in comparison.trials if (t.precision, t.pair_id) == (precision, pair))
        # The artifact's joined validation track is the one whose Sharpe was logged.
        assert sharpe_moments(track.returns["val"]).sr == pytest.approx(
            record.sharpe_per_period, rel=1e-9
        )
    pair = pair_id("tft", 1)
    got = tft.contrasts[CONTRAST].pair_tests[pair]["val"]
    a, b = tracks[("f32", pair)].returns["val"], tracks[("bf16", pair)].returns["val"]
    assert got.n_bars == 240
    assert got.hac_pvalue == sharpe_difference_test(b, a, method="hac").pvalue
    assert got.jkm_pvalue == sharpe_difference_test(b, a, method="jkm").pvalue
    completed = [t for t in comparison.trials_of("tft") if t.state == "completed"]
    matrix = np.column_stack([tracks[(t.precision, t.pair_id)].returns["val"] for t in completed])
    assert tft.overfitting.n_completed == 11  # 12 trials, one diverged
    assert tft.overfitting.pbo == probability_of_backtest_overfitting(matrix, 16)
    # The diverged pair (c002) has no test; dqn c000's f32 trial has no artifact.
    assert "diverged" in tft.contrasts[CONTRAST].pair_tests[pair_id("tft", 2)]["val"].note
    dqn = comparison.families["dqn"]
    missing = dqn.contrasts[CONTRAST].pair_tests[pair_id("dqn", 0)]["test"]
    assert math.isnan(missing.hac_pvalue) and "no returns artifact" in missing.note
    assert math.isnan(dqn.overfitting.pbo) and "1 of 11" in dqn.overfitting.pbo_note


def test_returns_artifacts_are_read_once_per_finished_run(
    sweep: SyntheticSweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    original = mlflow_reader._artifact_text

    def counting(client, run, artifact):  # type: ignore[no-untyped-def]
        if artifact == RETURNS_ARTIFACT:
            calls.append(run.info.run_id)
        return original(client, run, artifact)

    monkeypatch.setattr(mlflow_reader, "_artifact_text", counting)
    monkeypatch.setattr(mlflow_reader, "_RETURNS_CACHE", type(mlflow_reader._RETURNS_CACHE)())
    first = comparison_from_mlflow(
        sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"), with_curves=False
    )
    completed = sum(t.state == "completed" for t in first.trials)
    assert len(calls) == completed == 22  # 24 trials: one diverged, one unfinished
    calls.clear()
    second = comparison_from_mlflow(
        sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"), with_curves=False
    )
    # Only the run without an artifact is asked again (a late upload would be seen).
    assert calls == [sweep.run_ids[("dqn", "f32", 0)]]
    assert second.families["tft"].overfitting.pbo == first.families["tft"].overfitting.pbo


def test_without_returns_the_comparison_is_unchanged_and_says_not_available(
    comparison: Comparison, sweep: SyntheticSweep
) -> None:
    bare = comparison_from_mlflow(
        sweep.experiment, sweep.tracking_uri, precisions=("f32", "bf16"), with_returns=False
    )
    for name in ("tft", "dqn"):
        fit = bare.families[name].overfitting
        assert math.isnan(fit.pbo) and fit.pbo_note.startswith("not available")
        assert fit.min_trl == comparison.families[name].overfitting.min_trl  # from moments
        with_returns = comparison.families[name].contrasts[CONTRAST]
        without = bare.families[name].contrasts[CONTRAST]
        assert without.val.to_dict() == with_returns.val.to_dict()
        assert without.inference == with_returns.inference


def test_hpo_compare_uses_the_sweeps_margin_unless_told_otherwise(
    sweep: SyntheticSweep, tmp_path: Path
) -> None:
    kwargs = {"precisions": ("f32", "bf16"), "with_curves": False, "with_returns": False}
    default = comparison_from_mlflow(sweep.experiment, sweep.tracking_uri, **kwargs)
    assert default.margin == DEFAULT_MARGIN  # the synthetic sweep's spec has no margin param
    private = copy_sweep(sweep, tmp_path / "store")
    MlflowClient(private.tracking_uri).log_param(private.parent_run_id, MARGIN_PARAM, "0.3")
    own = comparison_from_mlflow(private.experiment, private.tracking_uri, **kwargs)
    assert own.margin == 0.3
    assert own.families["tft"].contrasts[CONTRAST].inference["test"].margin == 0.3
    told = comparison_from_mlflow(private.experiment, private.tracking_uri, margin=0.05, **kwargs)
    assert told.margin == 0.05


def test_a_resumed_trial_overwrites_its_returns_artifact(
    sweep: SyntheticSweep, tmp_path: Path
) -> None:
    private = copy_sweep(sweep, tmp_path / "store")
    client = MlflowClient(private.tracking_uri)
    config = {
        "family": "tft", "precision": "f32", "seed": 0, "config_id": "tft-c099",
        "pair_id": "tft-c099-s0", "params": {"lr": 1e-3},
    }  # fmt: skip
    first, second = synthetic_returns(0.05, 0.01, seed=1), synthetic_returns(0.08, 0.02, seed=2)
    state: dict[str, Any] = {}
    for epoch, text in ((1, first), (2, second)):
        # A fresh callback each time, restored from the state Tune saved: a resumed sweep.
        callback = MlflowSweepCallback(
            private.tracking_uri, private.experiment, private.parent_run_id
        )
        callback.set_state(state)
        trial = FakeTrial("t-resumed", config)
        trial.checkpoint = tune_checkpoint(tmp_path / f"ckpt{epoch}", text)
        callback.on_trial_start(0, [], trial)
        trial.last_result = {"epoch": epoch, "val_sharpe": 0.5 * epoch}
        callback.on_trial_result(0, [], trial, trial.last_result)
        callback.on_trial_complete(0, [], trial)
        assert callback.flush()
        state = callback.get_state()
    run_id = state["run_ids"]["t-resumed"]
    assert [a.path for a in client.list_artifacts(run_id, "returns")] == [RETURNS_ARTIFACT]
    with tempfile.TemporaryDirectory() as tmp:
        assert Path(client.download_artifacts(run_id, RETURNS_ARTIFACT, tmp)).read_text() == second


def test_a_corrupt_returns_file_is_not_logged(
    sweep: SyntheticSweep, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    private = copy_sweep(sweep, tmp_path / "store")
    callback = MlflowSweepCallback(private.tracking_uri, private.experiment, private.parent_run_id)
    config = {
        "family": "tft", "precision": "f32", "seed": 0, "config_id": "tft-c098",
        "pair_id": "tft-c098-s0", "params": {"lr": 1e-3},
    }  # fmt: skip
    trial = FakeTrial("t-corrupt", config)
    trial.checkpoint = tune_checkpoint(tmp_path / "ckpt", synthetic_returns(0.05, 0.01, seed=1))
    returns_file = tmp_path / "ckpt" / "state" / "returns.csv"
    returns_file.write_text(returns_file.read_text()[:-20])  # truncated after the checksum
    callback.on_trial_start(0, [], trial)
    callback.on_trial_complete(0, [], trial)
    with caplog.at_level("WARNING", logger="hpo.tracking"):
        assert callback.flush()
    assert any("checksum mismatch" in r.message for r in caplog.records)
    run_id = callback.run_ids["t-corrupt"]
    assert MlflowClient(private.tracking_uri).list_artifacts(run_id, "returns") == []


def test_of_two_runs_of_one_trial_the_one_that_got_furthest_is_kept() -> None:
    # A sweep from before OOM retries continued their trial's run left the failed
    # attempt (an errored run) beside the retry; its trial id sorts first ("a" < "b"), and
    # the first id is not the retry. The completed retry is the trial's result.
    import dataclasses

    records = paired_records("tft", [[0.2], [0.4]], [[0.3], [0.6]])
    failed = dataclasses.replace(
        records[1], run_id="run-oom", trial_id="a-oom", state="error", val_sharpe=math.nan
    )
    _, contrast = _bf16_vs_f32([failed, *records])
    assert contrast.val.n_pairs_used == 2
    assert contrast.val.mean_difference == pytest.approx(np.mean([0.1, 0.2]), rel=1e-12)


# ---------------------------------------------------------------------------------------
# Issue 25: claims controlled across families, the mean beside the pseudo-median, one HL,
# selection-aware MinTRL, adjusted pair tests, Spearman on configurations, capped counts.

WORSE = [-0.5, -0.45, -0.6, -0.55, -0.4, -0.52]  # every one-sided p: 1/64
CALM = [0.01, -0.02, 0.0, 0.015, -0.01, 0.005]


def _families(diffs: dict[str, list[float]]) -> Comparison:
    trials = [
        t
        for model, d in diffs.items()
        for t in paired_records(model, [[0.3]] * len(d), [[0.3 + x] for x in d])
    ]
    return compare_trials(trials, ("f32", "bf16"))


def test_directional_claims_are_holm_adjusted_across_the_families() -> None:
    from hpo.stats import holm_adjust

    comparison = _families({"a": WORSE, "b": CALM, "c": CALM, "d": CALM, "e": CALM})
    for split in ("val", "test"):
        cells = [s.contrasts[CONTRAST].inference[split] for s in comparison.families.values()]
        raw = [p for c in cells for p in (c.pvalue_worse, c.pvalue_better)]
        adjusted = [p for c in cells for p in (c.holm_p_worse, c.holm_p_better)]
        assert adjusted == pytest.approx(list(holm_adjust(raw)), rel=1e-12)
        assert all(c.holm_n_tests == 10 for c in cells)
    a = comparison.families["a"].contrasts[CONTRAST].inference["test"]
    # Worse at 5% on its own (1/64), not once ten one-sided claims are made: 10/64.
    assert a.pvalue_worse == pytest.approx(1 / 64)
    assert a.holm_p_worse == pytest.approx(10 / 64)
    assert a.verdict is not None and a.verdict.startswith("inconclusive")
    metrics = comparison_metrics(comparison)
    assert metrics[f"cmp.a.{CONTRAST}.test.holm_p_worse"] == pytest.approx(10 / 64)
    assert metrics[f"cmp.a.{CONTRAST}.test.pvalue_worse"] == pytest.approx(1 / 64)
    # Ten configurations all worse (1/1024 each way) survive the adjustment: 10/1024.
    decisive = _families({"a": [*WORSE, -0.48, -0.58, -0.42, -0.62], "b": CALM, "c": CALM,
                          "d": CALM, "e": CALM})  # fmt: skip
    assert decisive.families["a"].contrasts[CONTRAST].verdict() == "bf16 worse"


def test_a_tail_of_configurations_blocks_equivalent_and_is_named() -> None:
    noise = [0.01, -0.01, 0.02, -0.02, 0.0, 0.015, -0.015, 0.005, -0.005, 0.012]
    d = [*noise, *(-x for x in noise[:8]), -0.5, -0.5]
    comparison = _families({"tft": d})
    contrast = comparison.families["tft"].contrasts[CONTRAST]
    inference = contrast.inference["test"]
    # The HL interval alone would say "equivalent"; the mean (-0.05) and the skew do not.
    assert inference.tost_low > -0.1 and inference.tost_high < 0.1
    assert inference.verdict is not None and inference.verdict.startswith("inconclusive")
    assert inference.tail_configs == ["tft-c018", "tft-c019"]
    assert "tft-c018" in (inference.verdict_note or "")
    diffs = np.array(d)
    half = stats.t.ppf(0.975, 19) * diffs.std(ddof=1) / math.sqrt(20)
    assert (contrast.test.mean_low, contrast.test.mean_high) == pytest.approx(
        (diffs.mean() - half, diffs.mean() + half), abs=1e-12
    )
    # The verdict's interval of the mean: per side the wider of the t-interval and the BCa
    # bootstrap's; the two losses pull the BCa's lower end below the t-interval's.
    half90 = stats.t.ppf(0.95, 19) * diffs.std(ddof=1) / math.sqrt(20)
    verdict_interval = mean_interval(diffs, 0.9)
    assert inference.mean_tost_low == pytest.approx(verdict_interval.low, abs=1e-12)
    assert inference.mean_tost_high == pytest.approx(verdict_interval.high, abs=1e-12)
    assert inference.mean_tost_low == pytest.approx(-0.12925, abs=1e-5)
    assert inference.mean_tost_low < diffs.mean() - half90 == pytest.approx(-0.10941, abs=1e-5)
    metrics = comparison_metrics(comparison)
    assert metrics[f"cmp.tft.{CONTRAST}.test.mean_ci_low"] == pytest.approx(contrast.test.mean_low)
    assert metrics[f"cmp.tft.{CONTRAST}.test.skewness"] == pytest.approx(
        stats.skew(diffs, bias=False), abs=1e-9
    )


def test_the_reported_hodges_lehmann_is_the_one_the_verdict_uses() -> None:
    d = [0.0] * 6 + [0.3, 0.4, 0.5]
    comparison = _families({"tft": d})
    contrast = comparison.families["tft"].contrasts[CONTRAST]
    assert contrast.val.hl_estimate == pytest.approx(0.15)
    assert contrast.inference["val"].tost_low == pytest.approx(0.0)
    assert contrast.inference["val"].tost_high == pytest.approx(0.25)
    metrics = comparison_metrics(comparison)
    assert metrics[f"cmp.tft.{CONTRAST}.val.hl_estimate"] == pytest.approx(0.15)
    assert metrics[f"cmp.tft.{CONTRAST}.val.hl_nonzero_estimate"] == pytest.approx(0.4)


def test_more_than_a_thousand_configurations_needed_is_said_so() -> None:
    d = [0.1001 + x for x in (-0.04, 0.03, -0.02, 0.05, -0.05, 0.02, -0.03, 0.04, 0.0)]
    inference = _families({"tft": d}).families["tft"].contrasts[CONTRAST].inference["test"]
    assert inference.verdict == "inconclusive: more than 1,000 more configurations needed"
    assert inference.configs_needed is None and inference.configs_needed_capped


def test_min_trl_is_also_measured_against_the_expected_maximum_of_luck() -> None:
    trials = _family(4)
    result, _ = _bf16_vs_f32(trials)
    scope = result.families["tft"]
    fit, pooled = scope.overfitting, scope.selection[ALL_PRECISIONS]
    best = next(t for t in result.trials if t.trial_id == pooled.best_trial_id)
    assert pooled.expected_max_sharpe > 0
    assert fit.min_trl_sr0_benchmark == pooled.expected_max_sharpe
    assert fit.min_trl_sr0 == min_track_record_length(
        best.sharpe_per_period, pooled.expected_max_sharpe, best.skew, best.kurtosis, 0.95
    )
    # Beating the best of N lucky trials takes longer than beating 0.
    assert fit.min_trl_sr0 > fit.min_trl
    assert comparison_metrics(result)["cmp.tft.min_trl_sr0"] == fit.min_trl_sr0


def test_pair_tests_are_bootstrapped_and_bh_adjusted_within_a_contrast_and_split() -> None:
    trials = _family(4)
    result, contrast = _bf16_vs_f32(trials)
    by_key = {(t.precision, t.pair_id): t for t in result.trials}
    metrics = comparison_metrics(result)
    for split in ("val", "test"):
        boot = []
        for pair, tests in contrast.pair_tests.items():
            ref, other = by_key[("f32", pair)].returns, by_key[("bf16", pair)].returns
            assert ref is not None and other is not None
            a, b = ref.returns[split], other.returns[split]
            expected = sharpe_difference_test(b, a, method="bootstrap")
            assert tests[split].boot_pvalue == expected.pvalue
            assert tests[split].boot_block == expected.block_size
            boot.append(expected.pvalue)
        q = stats.false_discovery_control(boot, method="bh")
        got = [tests[split].boot_p_bh for tests in contrast.pair_tests.values()]
        assert got == pytest.approx(list(q), rel=1e-12)
        pair = pair_id("tft", 1)
        assert metrics[f"cmp.tft.{CONTRAST}.{split}.{pair}.boot_p_bh"] == (
            contrast.pair_tests[pair][split].boot_p_bh
        )


def test_val_test_spearman_is_over_configuration_means() -> None:
    # 4 configurations x 2 seeds x 2 precisions: 16 trials, 4 independent units.
    val = [[0.1, 0.3], [0.5, 0.2], [0.9, 0.4], [0.7, 0.8]]
    test = [[0.2, 0.0], [0.1, 0.5], [0.6, 0.3], [0.9, 0.2]]
    trials = [
        trial_record("tft", p, g, s, val[g][s] + shift, test[g][s] - shift)
        for g in range(4)
        for s in range(2)
        for p, shift in (("f32", 0.0), ("bf16", 0.01 * (g + s)))
    ]
    fit = compare_trials(trials, ("f32", "bf16")).families["tft"].overfitting
    means = {
        g: (
            np.mean([t.val_sharpe for t in trials if t.config_id == f"tft-c00{g}"]),
            np.mean([t.test_sharpe for t in trials if t.config_id == f"tft-c00{g}"]),
        )
        for g in range(4)
    }
    rho = stats.spearmanr([v for v, _ in means.values()], [t for _, t in means.values()])
    assert fit.spearman_n == 4
    assert fit.val_test_spearman == pytest.approx(rho.statistic, abs=1e-12)
    assert fit.val_test_spearman_pvalue == pytest.approx(rho.pvalue, abs=1e-12)
