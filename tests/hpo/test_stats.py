"""PSR/DSR pinned to published and hand-checked numbers; paired comparison vs direct scipy.

Independent reference: the normal CDF is written with ``math.erf`` and its inverse taken
from ``statistics.NormalDist`` (the standard library, not scipy), so these tests do not
check scipy against itself.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from scipy import stats

from hpo.stats import (
    PairedComparison,
    SharpeMoments,
    compare_paired,
    deflated_sharpe_ratio,
    expected_max_sharpe,
    probabilistic_sharpe_ratio,
    sharpe_moments,
)
from trainables.backtest import backtest

TOL = 1e-12
EULER_GAMMA = 0.5772156649015329


def phi(x: float) -> float:
    """Standard normal CDF from math.erf."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def phi_inv(p: float) -> float:
    return NormalDist().inv_cdf(p)


def psr_reference(sr: float, sr_b: float, n_obs: int, skew: float, kurt: float) -> float:
    return phi(
        (sr - sr_b) * math.sqrt(n_obs - 1) / math.sqrt(1 - skew * sr + (kurt - 1) / 4 * sr**2)
    )


# --- Probabilistic Sharpe ratio ---------------------------------------------------------


def test_psr_hand_computed() -> None:
    # sr = 0.1, benchmark 0, n_obs = 101, skew -0.5, raw kurtosis 4:
    # denominator sqrt(1 - (-0.5)(0.1) + (4 - 1)/4 * 0.01) = sqrt(1.0575)
    # z = 0.1 * sqrt(100) / sqrt(1.0575) = 0.97243327665263...
    # Phi(0.9724) from a normal table: Phi(0.97) = 0.8340, Phi(0.98) = 0.8365 -> ~0.8346
    psr = probabilistic_sharpe_ratio(0.1, 0.0, 101, -0.5, 4.0)
    assert psr == pytest.approx(phi(1.0 / math.sqrt(1.0575)), abs=TOL)
    assert psr == pytest.approx(0.8345824780464072, abs=TOL)
    assert psr == pytest.approx(psr_reference(0.1, 0.0, 101, -0.5, 4.0), abs=TOL)


@pytest.mark.parametrize(("skew", "kurt"), [(0.0, 3.0), (-3.0, 10.0), (1.0, 5.0)])
@pytest.mark.parametrize("sr", [-0.2, 0.0, 0.05, 0.3])
def test_psr_is_one_half_at_the_benchmark(sr: float, skew: float, kurt: float) -> None:
    assert probabilistic_sharpe_ratio(sr, sr, 250, skew, kurt) == 0.5


def test_psr_monotonic_in_n_obs() -> None:
    n_values = [2, 10, 50, 250, 1000, 5000]
    above = [probabilistic_sharpe_ratio(0.05, 0.0, n, -1.0, 6.0) for n in n_values]
    below = [probabilistic_sharpe_ratio(-0.05, 0.0, n, -1.0, 6.0) for n in n_values]
    assert all(x < y for x, y in itertools.pairwise(above))
    assert all(x > y for x, y in itertools.pairwise(below))
    assert above[-1] > 0.99 and below[-1] < 0.01


def test_psr_penalises_negative_skew_and_fat_tails() -> None:
    normal = probabilistic_sharpe_ratio(0.1, 0.0, 250, 0.0, 3.0)
    assert probabilistic_sharpe_ratio(0.1, 0.0, 250, -2.0, 3.0 + 4.0) < normal
    assert probabilistic_sharpe_ratio(0.1, 0.0, 250, 0.0, 9.0) < normal


# --- Expected maximum Sharpe and DSR ----------------------------------------------------

# Bailey & López de Prado (2014), "The Deflated Sharpe Ratio", numerical example: the best
# of N = 100 trials has annualised SR 2.5 on T = 1250 daily returns (5 years of 250 days),
# the annualised variance of SR across trials is 0.5, skew -3, raw kurtosis 10. Per period:
# SR = 2.5 / sqrt(250), V = 0.5 / 250. The paper reports SR0 ~ 0.1132 and DSR ~ 0.9004.
PAPER_SR = 2.5 / math.sqrt(250)
PAPER_VAR = 0.5 / 250
PAPER_N_TRIALS = 100
PAPER_N_OBS = 1250
PAPER_SKEW = -3.0
PAPER_KURT = 10.0


def test_expected_max_sharpe_dsr_paper_example() -> None:
    # Phi^-1(1 - 1/100)        = 2.3263478740408408
    # Phi^-1(1 - 1/(100 e))    = 2.680210444966887
    # (1 - g) * 2.32634787... + g * 2.68021044... = 0.98354... + 1.54706... = 2.5306028932...
    # sqrt(0.5 / 250) = 0.0447213595499958 -> SR0 = 0.0447213595... * 2.5306028932 = 0.1131720
    sr0 = expected_max_sharpe(PAPER_VAR, PAPER_N_TRIALS)
    by_hand = math.sqrt(0.5 / 250) * (
        (1 - EULER_GAMMA) * phi_inv(1 - 1 / 100) + EULER_GAMMA * phi_inv(1 - 1 / (100 * math.e))
    )
    assert sr0 == pytest.approx(by_hand, abs=TOL)
    assert sr0 == pytest.approx(0.11317200186513214, abs=TOL)
    assert round(sr0, 4) == 0.1132  # as printed in the paper
    assert sr0 * math.sqrt(250) == pytest.approx(1.7894064662732077, abs=1e-11)  # annualised


def test_deflated_sharpe_ratio_dsr_paper_example() -> None:
    # SR = 0.15811388300841897, SR0 = 0.11317200186513214
    # 1 - (-3)(0.158114) + (10 - 1)/4 * 0.158114^2 = 1 + 0.474342 + 0.05625 = 1.530591649
    # z = (0.158114 - 0.113172) * sqrt(1249) / sqrt(1.530591649)
    #   = 0.0449419 * 35.341194 / 1.2371709 = 1.2838160
    # Phi(1.2838) from a normal table: Phi(1.28) = 0.89973, Phi(1.29) = 0.90147 -> ~0.90040
    dsr = deflated_sharpe_ratio(
        PAPER_SR, PAPER_VAR, PAPER_N_TRIALS, PAPER_N_OBS, PAPER_SKEW, PAPER_KURT
    )
    sr0 = math.sqrt(0.5 / 250) * (
        (1 - EULER_GAMMA) * phi_inv(1 - 1 / 100) + EULER_GAMMA * phi_inv(1 - 1 / (100 * math.e))
    )
    assert dsr == pytest.approx(psr_reference(PAPER_SR, sr0, 1250, -3.0, 10.0), abs=TOL)
    assert dsr == pytest.approx(0.9003968344493904, abs=TOL)
    assert round(dsr, 4) == 0.9004  # as printed in the paper


def test_dsr_is_psr_against_expected_max_sharpe() -> None:
    for n_trials in (1, 2, 20, 1000):
        benchmark = expected_max_sharpe(0.003, n_trials)
        dsr = deflated_sharpe_ratio(0.12, 0.003, n_trials, 500, -0.7, 5.5)
        assert dsr == probabilistic_sharpe_ratio(0.12, benchmark, 500, -0.7, 5.5)
    # One trial: no selection, so the DSR is the PSR against zero skill.
    assert deflated_sharpe_ratio(0.12, 0.003, 1, 500, -0.7, 5.5) == probabilistic_sharpe_ratio(
        0.12, 0.0, 500, -0.7, 5.5
    )


def test_expected_max_sharpe_increases_with_trials() -> None:
    values = [expected_max_sharpe(0.01, n) for n in (1, 2, 5, 10, 100, 1000, 10**6)]
    assert values[0] == 0.0
    assert all(x < y for x, y in itertools.pairwise(values))


def test_expected_max_sharpe_edge_values() -> None:
    assert expected_max_sharpe(0.0, 100) == 0.0
    assert expected_max_sharpe(0.5, 1) == 0.0
    # Linear in sqrt(V): quadrupling the variance doubles the benchmark.
    assert expected_max_sharpe(0.04, 50) == pytest.approx(
        2 * expected_max_sharpe(0.01, 50), abs=TOL
    )


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 1, 0.0, 3.0), "n_obs"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 25.5, 0.0, 3.0), "n_obs"),  # type: ignore[arg-type]
        (lambda: probabilistic_sharpe_ratio(float("nan"), 0.0, 100, 0.0, 3.0), "sr"),
        (lambda: probabilistic_sharpe_ratio(0.1, float("inf"), 100, 0.0, 3.0), "sr_benchmark"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 100, float("nan"), 3.0), "skew"),
        (lambda: probabilistic_sharpe_ratio(0.1, 0.0, 100, 0.0, 0.0), "excess kurtosis"),
        (lambda: probabilistic_sharpe_ratio(1.0, 0.0, 100, 3.0, 1.0), "inconsistent"),
        (lambda: expected_max_sharpe(-0.1, 10), "sr_variance"),
        (lambda: expected_max_sharpe(float("nan"), 10), "sr_variance"),
        (lambda: expected_max_sharpe(0.1, 0), "n_trials"),
        (lambda: deflated_sharpe_ratio(float("inf"), 0.1, 10, 100, 0.0, 3.0), "sr"),
        (lambda: deflated_sharpe_ratio(0.1, 0.1, 0, 100, 0.0, 3.0), "n_trials"),
        (lambda: deflated_sharpe_ratio(0.1, 0.1, 10, 1, 0.0, 3.0), "n_obs"),
    ],
)
def test_invalid_inputs_name_the_argument(call: Callable[[], float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()


# --- Sharpe moments ----------------------------------------------------------------------


def test_sharpe_moments_match_scipy_and_backtest() -> None:
    rng = np.random.default_rng(3)
    w = np.clip(rng.normal(0.3, 0.5, 300), -1, 1)
    result = backtest(w, rng.standard_t(4, 300) * 0.01, cost=1e-4, periods_per_year=252.0)
    moments = sharpe_moments(result.returns)
    r = result.returns
    assert moments == SharpeMoments(
        sr=float(np.mean(r) / np.std(r, ddof=1)),
        skew=float(stats.skew(r)),
        kurtosis=float(stats.kurtosis(r, fisher=False)),
        n_obs=300,
    )
    # Per-period Sharpe here, annualised in the backtest: same number up to sqrt(252).
    assert moments.sr * math.sqrt(252) == pytest.approx(result.sharpe, abs=TOL)


def test_sharpe_moments_kurtosis_is_raw() -> None:
    sample = np.random.default_rng(0).normal(size=200_000)
    assert sharpe_moments(sample).kurtosis == pytest.approx(3.0, abs=0.05)


def test_sharpe_moments_constant_and_invalid_returns() -> None:
    assert sharpe_moments(np.full(10, -0.001)) == SharpeMoments(0.0, 0.0, 3.0, 10)
    with pytest.raises(ValueError, match="index 2"):
        sharpe_moments(np.array([0.01, 0.02, np.nan]))
    with pytest.raises(ValueError, match="at least 2"):
        sharpe_moments(np.array([0.01]))
    with pytest.raises(ValueError, match="1-D"):
        sharpe_moments(np.zeros((3, 2)))


# --- Paired comparison ------------------------------------------------------------------

# Fixed paired per-period Sharpe ratios (f32, bf16) of 12 configurations.
F32 = [0.051, 0.032, 0.074, -0.012, 0.045, 0.088, 0.021, 0.060, 0.013, 0.039, 0.070, 0.002]
BF16 = [0.047, 0.035, 0.066, -0.020, 0.041, 0.079, 0.025, 0.052, 0.004, 0.036, 0.071, -0.009]


def test_compare_paired_equals_direct_scipy_calls() -> None:
    result = compare_paired(F32, BF16, n_resamples=9999, confidence=0.95, seed=0)
    a, b = np.array(F32), np.array(BF16)
    d = b - a

    wilcoxon = stats.wilcoxon(d)
    boot = stats.bootstrap(
        (d,),
        np.median,
        n_resamples=9999,
        confidence_level=0.95,
        method="BCa",
        rng=np.random.default_rng(0),
    )
    mannwhitney = stats.mannwhitneyu(a, b, alternative="two-sided")
    ks = stats.ks_2samp(a, b)

    assert result.n_pairs_total == result.n_pairs_used == 12
    assert result.n_excluded_nonfinite == 0 and result.excluded_indices == []
    assert result.median_a == np.median(a) and result.median_b == np.median(b)
    assert result.mean_difference == pytest.approx(np.mean(d), abs=TOL)
    assert result.median_difference == np.median(d)
    assert result.wilcoxon_statistic == wilcoxon.statistic
    assert result.wilcoxon_pvalue == wilcoxon.pvalue
    assert result.ci_low == boot.confidence_interval.low
    assert result.ci_high == boot.confidence_interval.high
    assert result.ci_low <= result.median_difference <= result.ci_high
    assert result.mannwhitney_statistic == mannwhitney.statistic
    assert result.mannwhitney_pvalue == mannwhitney.pvalue
    assert result.ks_statistic == ks.statistic
    assert result.ks_pvalue == ks.pvalue
    # bf16 is lower in 9 of 12 pairs: the paired test sees it, the unpaired ones barely do.
    assert result.wilcoxon_pvalue < 0.05 < result.mannwhitney_pvalue
    assert result.notes == []
    assert (result.label_a, result.label_b) == ("f32", "bf16")


def test_compare_paired_is_reproducible_by_seed() -> None:
    first = compare_paired(F32, BF16, n_resamples=2000, seed=5)
    second = compare_paired(F32, BF16, n_resamples=2000, seed=5)
    assert first.to_dict() == second.to_dict()


def test_diverged_trial_is_excluded_and_counted() -> None:
    a = [*F32, float("nan"), 0.03]
    b = [*BF16, 0.02, float("inf")]
    result = compare_paired(a, b, n_resamples=2000)
    clean = compare_paired(F32, BF16, n_resamples=2000)

    assert result.n_pairs_total == 14
    assert result.n_pairs_used == 12
    assert result.n_excluded_nonfinite == 2
    assert result.excluded_indices == [12, 13]
    assert any("excluded 2 of 14" in note and "[12, 13]" in note for note in result.notes)
    # Every statistic is the one of the finite pairs alone.
    skip = {"n_pairs_total", "n_excluded_nonfinite", "excluded_indices", "notes"}
    got, want = result.to_dict(), clean.to_dict()
    assert {k: v for k, v in got.items() if k not in skip} == {
        k: v for k, v in want.items() if k not in skip
    }


def test_all_differences_zero() -> None:
    result = compare_paired(F32, F32, n_resamples=500)
    assert result.wilcoxon_pvalue == 1.0
    assert result.wilcoxon_statistic == 0.0
    assert (result.ci_low, result.ci_high) == (0.0, 0.0)
    assert result.median_difference == 0.0
    assert any("all paired differences are zero" in note for note in result.notes)
    assert result.ks_statistic == 0.0 and result.ks_pvalue == 1.0


def test_single_pair_reports_too_few_pairs() -> None:
    result = compare_paired([0.05], [0.04])
    assert result.n_pairs_used == 1
    assert result.median_difference == pytest.approx(-0.01, abs=TOL)
    for name in ("wilcoxon_pvalue", "wilcoxon_statistic", "ci_low", "ci_high", "ks_pvalue"):
        assert math.isnan(getattr(result, name)), name
    assert any("too few pairs" in note for note in result.notes)
    as_dict = result.to_dict()
    assert as_dict["wilcoxon_pvalue"] is None and as_dict["ci_low"] is None
    json.dumps(as_dict, allow_nan=False)


def test_only_diverged_pairs_does_not_raise() -> None:
    result = compare_paired([float("nan"), 0.1], [0.2, float("nan")])
    assert (result.n_pairs_used, result.n_excluded_nonfinite) == (0, 2)
    assert math.isnan(result.median_a) and math.isnan(result.wilcoxon_pvalue)
    assert any("too few pairs" in note for note in result.notes)
    json.dumps(result.to_dict(), allow_nan=False)


def test_degenerate_bca_is_nan_with_note_and_no_warning_escapes() -> None:
    # Differences [0.01, 0.01, 0.01, 0.02]: every leave-one-out median is 0.01, so the BCa
    # acceleration is 0/0 and scipy cannot form the interval.
    a = [0.0, 0.0, 0.0, 0.0]
    b = [0.01, 0.01, 0.01, 0.02]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = compare_paired(a, b, n_resamples=999)
    assert math.isnan(result.ci_low) and math.isnan(result.ci_high)
    assert any("BCa" in note for note in result.notes)
    assert any("almost no power" in note for note in result.notes)
    assert result.wilcoxon_pvalue == stats.wilcoxon(np.array(b) - np.array(a)).pvalue


def test_constant_nonzero_differences_ci_is_the_point() -> None:
    # Binary-exact values so that every difference is exactly 0.125.
    result = compare_paired([0.0, 0.25, 0.5], [0.125, 0.375, 0.625], n_resamples=500)
    assert result.ci_low == result.ci_high == result.median_difference == 0.125
    assert any("CI is the point estimate" in note for note in result.notes)


def test_to_dict_is_json_safe() -> None:
    result = compare_paired(F32, BF16, labels=("bf16-mixed", "bf16"), n_resamples=500)
    as_dict = result.to_dict()
    text = json.dumps(as_dict, allow_nan=False)
    assert json.loads(text)["label_a"] == "bf16-mixed"
    assert set(as_dict) == {f.name for f in PairedComparison.__dataclass_fields__.values()}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"a": [0.1, 0.2], "b": [0.1]}, "same length"),
        ({"a": [[0.1]], "b": [[0.1]]}, "1-D"),
        ({"a": [0.1], "b": [0.1], "confidence": 1.0}, "confidence"),
        ({"a": [0.1], "b": [0.1], "n_resamples": 0}, "n_resamples"),
        ({"a": [0.1], "b": [0.1], "labels": ("f32",)}, "labels"),
    ],
)
def test_compare_paired_invalid_inputs(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compare_paired(**kwargs)
