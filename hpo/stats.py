"""Comparison statistics of a paired f32-vs-bf16 run, and selection-bias corrections.

1. *Is bf16 as good as f32?* The evidence is the per-configuration paired difference
   ``d = bf16 - f32`` (seeds averaged by the caller):

   - :func:`paired_signed_rank_test`: Wilcoxon signed-rank, zeros dropped, exact up to 50
     non-zero differences (ties included), and which method gave the p-value;
   - :func:`hodges_lehmann_interval` / :func:`hodges_lehmann`: the estimate and exact CI
     that invert that test, with the confidence actually achieved at small n;
   - :func:`equivalence_test`: the answer, a TOST verdict against a pre-set margin (the
     mean's t-interval and the skew checked too); :func:`holm_adjust` for many claims,
     :func:`configs_for_equivalence` for planning;
   - :func:`sharpe_difference_test`: per pair, the two trials' return series over the
     same bars (Ledoit-Wolf HAC and studentized block bootstrap; JKM, descriptive);
   - :func:`sequential_verdict` / :func:`sequential_comparison`: the same question
     decided as configurations finish (repeated confidence intervals of the mean with
     alpha spending, a non-binding futility stop); :func:`mean_interval`, the mean's
     interval valid under skew; :func:`loss_tail`, the share of configurations losing
     more than the margin; :func:`comparison_plan` and :func:`min_configs_for_verdict`
     for planning.

   :func:`compare_paired` bundles the cross-pair numbers; its Mann-Whitney U and KS are
   descriptive only (they ignore the pairing).
2. *Is the best trial's Sharpe better than luck?* The Probabilistic and the Deflated
   Sharpe Ratio (Bailey & López de Prado 2012, 2014), the Minimum Track Record Length
   (:func:`min_track_record_length`) and the Probability of Backtest Overfitting by CSCV
   (:func:`probability_of_backtest_overfitting`).

Units: the PSR/DSR functions take *per-period* Sharpe ratios (divide an annualised one by
``sqrt(periods_per_year)``), ``n_obs`` counts those periods, and ``kurtosis`` is *raw*
(normal = 3). Why these tests, and what is not taken from scipy: docs/statistics.md
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import numpy as np

# The normal and t distributions through scipy.special (ndtr, ndtri, stdtr, stdtrit): the
# functions scipy.stats.norm and .t call, bit for bit, without the argument handling that
# costs more than the arithmetic in the sequential rule's loops (10-20 ms a comparison).
from scipy import optimize, special, stats

from trainables.sharpe_moments import SharpeMoments, sharpe_moments

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "DEFAULT_LOOK_EVERY",
    "EQUIVALENCE_POWER",
    "EXACT_MAX_N",
    "FUTILITY_PROBABILITY",
    "LOSS_SKEW",
    "MEAN_BOOTSTRAP_RESAMPLES",
    "MIN_FIRST_LOOK",
    "PAIRS_NEEDED_CAP",
    "POWER_TABLE_SD_RATIOS",
    "SEQUENTIAL_POWER",
    "SKEW_LIMIT",
    "SPENDING_RHO",
    "VERDICTS",
    "ComparisonPlan",
    "EquivalenceTest",
    "HodgesLehmann",
    "LossTail",
    "MeanInterval",
    "PairedComparison",
    "SequentialComparison",
    "SequentialLook",
    "SequentialPlan",
    "SharpeDifferenceTest",
    "SharpeMoments",
    "SignedRankTest",
    "Verdict",
    "additional_pairs_needed",
    "compare_paired",
    "comparison_plan",
    "configs_for_equivalence",
    "deflated_sharpe_ratio",
    "equivalence_test",
    "expected_max_sharpe",
    "hodges_lehmann",
    "hodges_lehmann_interval",
    "holm_adjust",
    "loss_tail",
    "mean_interval",
    "min_configs_for_verdict",
    "min_track_record_length",
    "paired_signed_rank_test",
    "probabilistic_sharpe_ratio",
    "probability_of_backtest_overfitting",
    "sequential_comparison",
    "sequential_levels",
    "sequential_looks",
    "sequential_verdict",
    "sharpe_difference_test",
    "sharpe_moments",
]


# ---------------------------------------------------------------------------------------
# Input validation: errors name the argument, so a bad call site is found from the message.


def _finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return value


def _int_at_least(name: str, value: int, minimum: int) -> int:
    # operator.index accepts ints and numpy integers but rejects 12.5 instead of truncating.
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        as_int = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if as_int < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {as_int}")
    return as_int


def _positive(name: str, value: float) -> float:
    value = _finite(name, value)
    if value <= 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _check_alpha(alpha: float) -> float:
    alpha = _finite("alpha", alpha)
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    return alpha


# ---------------------------------------------------------------------------------------
# Probabilistic and deflated Sharpe ratio.


def _sharpe_variance_factor(sr: float, skew: float, kurtosis: float) -> float:
    """``1 - skew*sr + (kurtosis - 1)/4 * sr^2``: n_obs times the variance of the Sharpe
    estimator (the PSR's and MinTRL's denominator), with the moments checked."""
    if kurtosis < 1.0:
        raise ValueError(
            f"kurtosis must be raw (non-excess, normal = 3) and therefore >= 1, got {kurtosis!r}; "
            "was excess kurtosis passed?"
        )
    # For moments of one distribution (kurtosis >= 1 + skew^2) this equals at least
    # (1 - skew*sr/2)^2 >= 0; a non-positive value means the moments are inconsistent.
    variance_factor = 1.0 - skew * sr + (kurtosis - 1.0) / 4.0 * sr**2
    if not variance_factor > 0.0:
        raise ValueError(
            "1 - skew*sr + (kurtosis - 1)/4 * sr^2 must be > 0, got "
            f"{variance_factor!r} for sr={sr!r}, skew={skew!r}, kurtosis={kurtosis!r}; "
            "skew and kurtosis are inconsistent (raw kurtosis must be >= 1 + skew^2)"
        )
    return variance_factor


def probabilistic_sharpe_ratio(
    sr: float, sr_benchmark: float, n_obs: int, skew: float, kurtosis: float
) -> float:
    """Probability that the true Sharpe exceeds ``sr_benchmark`` given the observed ``sr``.

    ``PSR = Phi((sr - sr_b) * sqrt(n_obs - 1) / sqrt(1 - skew*sr + (kurtosis - 1)/4 * sr^2))``
    (Bailey & López de Prado 2012, "The Sharpe Ratio Efficient Frontier"). The denominator
    is the standard error of the Sharpe estimator under non-normal returns: negative skew
    and fat tails widen it, so the same ``sr`` is less convincing.

    Args:
        sr: Observed per-period Sharpe ratio.
        sr_benchmark: Per-period Sharpe ratio to beat (0 for "any skill at all").
        n_obs: Number of return observations behind ``sr``, >= 2.
        skew: Skewness of the returns.
        kurtosis: Raw (non-excess) kurtosis of the returns, normal = 3; must be >= 1, the
            minimum for any distribution, which also catches excess kurtosis passed by
            mistake for near-normal returns.

    Returns:
        A probability in [0, 1]; exactly 0.5 when ``sr == sr_benchmark``.
    """
    sr = _finite("sr", sr)
    sr_benchmark = _finite("sr_benchmark", sr_benchmark)
    n_obs = _int_at_least("n_obs", n_obs, 2)
    skew = _finite("skew", skew)
    kurtosis = _finite("kurtosis", kurtosis)
    variance_factor = _sharpe_variance_factor(sr, skew, kurtosis)
    z = (sr - sr_benchmark) * math.sqrt(n_obs - 1) / math.sqrt(variance_factor)
    return float(special.ndtr(z))


def expected_max_sharpe(sr_variance: float, n_trials: int) -> float:
    """Expected maximum Sharpe of ``n_trials`` independent trials that have no skill.

    ``E[max SR] = sqrt(V) * ((1 - g) * Phi^-1(1 - 1/N) + g * Phi^-1(1 - 1/(N e)))`` with
    ``g`` the Euler-Mascheroni constant (Bailey & López de Prado 2014, "The Deflated Sharpe
    Ratio", the false strategy theorem). It is the bar that the best of ``N`` lucky draws
    clears on average, so it is the benchmark of the DSR.

    Args:
        sr_variance: Variance of the per-period Sharpe ratios across the trials, >= 0.
        n_trials: Number of (effectively independent) trials, >= 1. With one trial there is
            no selection, and the result is 0.0 (the formula's ``Phi^-1(0)`` would be -inf).

    Returns:
        The expected maximum per-period Sharpe ratio, >= 0.
    """
    sr_variance = _finite("sr_variance", sr_variance)
    if sr_variance < 0.0:
        raise ValueError(f"sr_variance must be >= 0, got {sr_variance!r}")
    n_trials = _int_at_least("n_trials", n_trials, 1)
    if n_trials == 1:
        return 0.0
    # isf(p) == ppf(1 - p), without the cancellation of forming 1 - 1/N for large N.
    z_n = -special.ndtri(1.0 / n_trials)
    z_ne = -special.ndtri(1.0 / (n_trials * math.e))
    gamma = np.euler_gamma
    return float(math.sqrt(sr_variance) * ((1.0 - gamma) * z_n + gamma * z_ne))


def deflated_sharpe_ratio(
    sr: float,
    sr_variance: float,
    n_trials: int,
    n_obs: int,
    skew: float,
    kurtosis: float,
) -> float:
    """PSR of the selected (best) trial against the expected maximum Sharpe of luck.

    ``DSR = PSR(sr, expected_max_sharpe(sr_variance, n_trials), n_obs, skew, kurtosis)``
    (Bailey & López de Prado 2014). A DSR near 1 says the best trial's Sharpe is unlikely
    to be the product of trying ``n_trials`` configurations; near 0.5 or below, it is what
    the search alone would have produced.

    Args:
        sr: Per-period Sharpe ratio of the selected trial.
        sr_variance: Variance of the per-period Sharpe ratios across all trials, >= 0.
        n_trials: Number of trials tried, >= 1.
        n_obs: Number of return observations behind ``sr``, >= 2.
        skew: Skewness of the selected trial's returns.
        kurtosis: Raw (non-excess) kurtosis of the selected trial's returns, normal = 3.
    """
    sr = _finite("sr", sr)
    benchmark = expected_max_sharpe(sr_variance, n_trials)
    return probabilistic_sharpe_ratio(sr, benchmark, n_obs, skew, kurtosis)


# SharpeMoments and sharpe_moments: trainables/sharpe_moments.py (one definition, shared
# with a trial's epoch metrics), re-exported here.


# ---------------------------------------------------------------------------------------
# Minimum track record length.


def min_track_record_length(
    sr: float,
    sr_benchmark: float,
    skew: float,
    kurtosis: float,
    confidence: float = 0.95,
) -> float:
    """Number of observations needed before ``sr`` beats ``sr_benchmark`` at ``confidence``.

    ``MinTRL = 1 + (1 - skew*sr + (kurtosis - 1)/4 * sr^2) * (Phi^-1(confidence) / (sr - sr_b))^2``
    (Bailey & López de Prado 2012, "The Sharpe Ratio Efficient Frontier"). It is the PSR
    solved for ``n_obs``: ``probabilistic_sharpe_ratio(sr, sr_b, MinTRL, skew, kurtosis)``
    equals ``confidence`` (for a non-integer ``n_obs``). A track record shorter than the
    MinTRL does not yet show, at that confidence, that the true Sharpe exceeds the benchmark.

    Args:
        sr: Observed per-period Sharpe ratio.
        sr_benchmark: Per-period Sharpe ratio to beat.
        skew: Skewness of the returns.
        kurtosis: Raw (non-excess) kurtosis of the returns, normal = 3, >= 1.
        confidence: In (0, 1).

    Returns:
        The minimum number of observations (periods, not years; a float, round up to use
        it). ``math.inf`` when ``sr <= sr_benchmark``: no track record length makes an
        observed Sharpe at or below the benchmark convincing.
    """
    sr = _finite("sr", sr)
    sr_benchmark = _finite("sr_benchmark", sr_benchmark)
    skew = _finite("skew", skew)
    kurtosis = _finite("kurtosis", kurtosis)
    confidence = _probability("confidence", confidence)
    variance_factor = _sharpe_variance_factor(sr, skew, kurtosis)
    if sr <= sr_benchmark:
        return math.inf
    z = float(special.ndtri(confidence))
    return 1.0 + variance_factor * (z / (sr - sr_benchmark)) ** 2


# ---------------------------------------------------------------------------------------
# Wilcoxon signed-rank test and Hodges-Lehmann interval of paired differences.
#
# The signed-rank statistic T+ (sum of the ranks of |d| over the positive d) has, under the
# null of a distribution symmetric about 0, the law of sum_i r_i * B_i with B_i independent
# fair coins. Counting the sign patterns that give each value of T+ is a knapsack over the
# ranks: exact in float64 (counts < 2^53) for n <= 50, so p-values are exact rationals.

EXACT_MAX_N = 50
"""Largest number of (non-zero) differences for which exact signed-rank distributions are
used; above it the normal approximation with continuity (and tie) correction."""

_LEVEL_RTOL = 1e-12  # an exact level equal to the requested one counts as achieved


def _check_diffs(diffs: Sequence[float] | np.ndarray, name: str = "diffs") -> np.ndarray:
    """1-D finite float array, non-empty; NaN/inf raise ValueError naming the first index.

    A NaN difference is a diverged pair; :func:`compare_paired` excludes and counts those
    before calling here, so a NaN reaching these functions is a caller's bug, not data.
    """
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {d.shape}")
    if d.size == 0:
        raise ValueError(f"{name} is empty: at least one paired difference is needed")
    bad = np.flatnonzero(~np.isfinite(d))
    if bad.size:
        raise ValueError(
            f"{name} must be finite; index {int(bad[0])} is {float(d[bad[0]])!r} "
            "(exclude diverged pairs first and count them)"
        )
    return d


def _probability(name: str, value: float) -> float:
    value = _finite(name, value)
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return value


def _sign_pattern_counts(int_ranks: tuple[int, ...]) -> np.ndarray:
    """counts[t] = number of the 2^n sign patterns whose positive ranks sum to t."""
    counts = np.zeros(sum(int_ranks) + 1, dtype=np.float64)
    counts[0] = 1.0
    top = 0
    for r in int_ranks:
        # Each rank is either left out (counts unchanged) or added (counts shifted by r).
        counts[r : top + r + 1] += counts[: top + 1].copy()
        top += r
    return counts


@lru_cache(maxsize=64)
def _untied_cdf(n: int) -> np.ndarray:
    """Exact P(T+ <= t), t = 0..n(n+1)/2, for n untied non-zero differences (read-only)."""
    cdf = np.cumsum(_sign_pattern_counts(tuple(range(1, n + 1)))) / 2.0**n
    cdf.setflags(write=False)
    return cdf


def _signed_rank_cdf(n: int, t: int) -> float:
    """P(T+ <= t) under the null for n untied differences: exact up to EXACT_MAX_N, else
    the normal approximation with continuity correction (R's psignrank / wilcox.test)."""
    n_walsh = n * (n + 1) // 2
    if t < 0:
        return 0.0
    if t >= n_walsh:
        return 1.0
    if n <= EXACT_MAX_N:
        return float(_untied_cdf(n)[t])
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    return float(special.ndtr((t + 0.5 - n_walsh / 2.0) / sd))


def _critical_count(n: int, tail: float) -> int:
    """Largest c >= 0 with P(T+ <= c) <= tail (0 when even c = 0 exceeds it)."""
    if n <= EXACT_MAX_N:
        cdf = _untied_cdf(n)
        return max(int(np.searchsorted(cdf, tail * (1.0 + _LEVEL_RTOL), side="right")) - 1, 0)
    n_walsh = n * (n + 1) // 2
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
    return max(math.floor(n_walsh / 2.0 - 0.5 + sd * float(special.ndtri(tail))), 0)


def _rejects(pvalue: float, alpha: float) -> bool:
    return pvalue <= alpha * (1.0 + _LEVEL_RTOL)


def _walsh_averages(d: np.ndarray) -> np.ndarray:
    """Sorted (d_i + d_j) / 2 over i <= j: the n(n+1)/2 Walsh averages."""
    i, j = np.triu_indices(d.size)
    return np.sort((d[i] + d[j]) / 2.0)


class SignedRankTest(NamedTuple):
    """Wilcoxon signed-rank test of paired differences (zero differences dropped)."""

    statistic: float
    """T+: sum of the ranks of |d| over the positive non-zero differences (R's ``V``);
    midranks when |d| ties. 0.0 when no difference is non-zero."""
    pvalue: float
    """p-value for ``alternative``; 1.0 when every difference is zero."""
    n_nonzero: int
    """Differences that entered the test (zeros are dropped, ``zero_method='wilcox'``)."""
    n_zero: int
    """Zero differences dropped."""
    method: Literal["exact", "normal"]
    """"exact": the exact null distribution of the non-zero differences (conditional on
    their tie pattern when |d| ties); "normal": normal approximation with continuity and
    tie correction (more than :data:`EXACT_MAX_N` non-zero differences)."""
    ties: bool
    """Whether some non-zero |d| tie (midranks were used)."""


def paired_signed_rank_test(
    diffs: Sequence[float] | np.ndarray,
    alternative: Literal["two-sided", "less", "greater"] = "two-sided",
) -> SignedRankTest:
    """Wilcoxon signed-rank test that the paired differences are centred on 0.

    Zero differences (both sides of a pair equal, e.g. both flat) are dropped
    (``zero_method='wilcox'``) and the *exact* null distribution of the remaining ``n``
    differences is used for ``n <= 50``; scipy's default instead counts the zeros toward
    ``n``, switches to the normal approximation, and gives p = 0.043 for 15 zeros and
    [0.1, 0.2, 0.3, 0.4, 0.5], whose exact p is 2/32 = 0.0625.

    - No ties among the non-zero |d|: ``scipy.stats.wilcoxon(method="exact")``.
    - Ties: scipy's "exact" is then only a conservative rounding, so the exact null
      distribution *conditional on the observed midranks* is enumerated here (the 2^n
      equally likely sign patterns, counted by a knapsack over the doubled midranks),
      which is what a full permutation test gives.
    - ``n > 50``: ``scipy.stats.wilcoxon(method="asymptotic")`` with continuity and tie
      correction.

    The two-sided p-value is ``min(1, 2 * min(P(T+ <= t), P(T+ >= t)))``, as in scipy.

    Args:
        diffs: Paired differences, e.g. bf16 Sharpe - f32 Sharpe, one per configuration.
        alternative: "greater" tests a positive shift of the differences, "less" negative.

    Raises:
        ValueError: if ``diffs`` is empty, not 1-D, or has a NaN/inf (named by index).
    """
    d = _check_diffs(diffs)
    if alternative not in ("two-sided", "less", "greater"):
        raise ValueError(
            f"alternative must be 'two-sided', 'less' or 'greater', got {alternative!r}"
        )
    nonzero = d[d != 0.0]
    n = int(nonzero.size)
    n_zero = int(d.size - n)
    if n == 0:
        return SignedRankTest(0.0, 1.0, 0, n_zero, "exact", False)
    ranks = stats.rankdata(np.abs(nonzero))  # midranks, (n,)
    t_plus = float(ranks[nonzero > 0].sum())
    ties = bool(np.unique(np.abs(nonzero)).size < n)
    if n > EXACT_MAX_N:
        result = stats.wilcoxon(
            nonzero, method="asymptotic", correction=True, alternative=alternative
        )
        return SignedRankTest(t_plus, float(result.pvalue), n, n_zero, "normal", ties)
    if not ties:
        result = stats.wilcoxon(nonzero, method="exact", alternative=alternative)
        return SignedRankTest(t_plus, float(result.pvalue), n, n_zero, "exact", False)
    # Doubled midranks are integers, so 2*T+ is an integer-valued knapsack sum.
    doubled = tuple(np.rint(2.0 * ranks).astype(int).tolist())
    counts = _sign_pattern_counts(doubled)
    observed = int(np.rint(2.0 * t_plus))
    total = 2.0**n
    p_less = float(counts[: observed + 1].sum() / total)
    p_greater = float(counts[observed:].sum() / total)
    if alternative == "less":
        p = p_less
    elif alternative == "greater":
        p = p_greater
    else:
        p = min(1.0, 2.0 * min(p_less, p_greater))
    return SignedRankTest(t_plus, p, n, n_zero, "exact", True)


class HodgesLehmann(NamedTuple):
    """Hodges-Lehmann estimate of the centre of paired differences, with its CI."""

    estimate: float
    """Median of the Walsh averages (d_i + d_j)/2, i <= j (R's "(pseudo)median")."""
    low: float
    """Lower end: the k-th smallest Walsh average."""
    high: float
    """Upper end: the k-th largest Walsh average."""
    confidence: float
    """Confidence the interval achieves (exact for n <= 50): >= the requested one, or the
    most any interval of Walsh averages reaches at this n when that is less."""
    requested_confidence: float
    """The confidence asked for."""
    n: int
    """Number of differences used (without zeros unless ``zeros="keep"``)."""
    method: Literal["exact", "normal"]
    """How ``k`` and ``confidence`` were found: the exact signed-rank distribution
    (n <= 50), or its normal approximation with continuity correction."""

    @property
    def achieved(self) -> bool:
        """Whether the requested confidence is achieved (False: widest interval reported)."""
        return self.confidence >= self.requested_confidence * (1.0 - _LEVEL_RTOL)


def hodges_lehmann_interval(
    diffs: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    zeros: Literal["drop", "keep"] = "drop",
) -> HodgesLehmann:
    """Hodges-Lehmann estimate and exact signed-rank CI of the centre of ``diffs``.

    The interval ``[W_(k), W_(N-k+1)]`` of the sorted Walsh averages ``W`` (``N =
    n(n+1)/2``) with ``k - 1`` the largest count ``c`` such that ``P(T+ <= c) <= (1 -
    confidence)/2`` under the signed-rank null; it covers the centre of any continuous
    symmetric distribution with probability ``1 - 2 P(T+ <= k - 1)``, which is the achieved
    ``confidence`` returned (Hollander & Wolfe; the interval of R's
    ``wilcox.test(conf.int = TRUE, exact = TRUE)``, which inverts the signed-rank test).
    The achievable confidences are discrete at small n, so the one returned is usually
    above the requested one. Where R picks ``qsignrank(alpha/2)`` the two coincide except
    when an exact level equals the requested one, where this keeps the narrower interval
    (its coverage is exactly the requested confidence).

    When the requested confidence is not achievable (``2^-n > (1 - confidence)/2``, e.g.
    n <= 5 at 95%), the widest interval ``[min(d), max(d)]`` is returned with its achieved
    confidence ``1 - 2^(1-n)`` (n = 4: 87.5%); ``achieved`` is then False. One difference
    gives the point ``[d, d]`` with confidence 0.

    Zero differences are dropped by default (``zeros="drop"``), as R's ``wilcox.test``
    drops them before the estimate and the interval: then the interval and
    :func:`paired_signed_rank_test` (which drops them too) agree on whether 0 is
    plausible. All differences zero gives the point ``[0, 0]`` with confidence 0.
    ``zeros="keep"`` treats them as observations at 0, which is right for a test at
    another point (the equivalence test's ``±margin``).
    Ties among Walsh averages need no special treatment: with discrete data the closed
    interval covers at least as often. For n > 50, ``k`` comes from the normal
    approximation with continuity correction (R's non-exact CI solves the same normal
    equation by root finding; the two agree to about one Walsh average).

    Raises:
        ValueError: if ``diffs`` is empty, not 1-D or has a NaN/inf, or ``confidence`` is
            not in (0, 1).
    """
    d = _check_diffs(diffs)
    confidence = _probability("confidence", confidence)
    if zeros == "drop":
        d = d[d != 0.0]
        if d.size == 0:
            return HodgesLehmann(0.0, 0.0, 0.0, 0.0, confidence, 0, "exact")
    elif zeros != "keep":
        raise ValueError(f"zeros must be 'drop' or 'keep', got {zeros!r}")
    n = int(d.size)
    walsh = _walsh_averages(d)
    c = _critical_count(n, (1.0 - confidence) / 2.0)
    achieved = 1.0 - 2.0 * _signed_rank_cdf(n, c)
    return HodgesLehmann(
        estimate=float(np.median(walsh)),
        low=float(walsh[c]),
        high=float(walsh[walsh.size - 1 - c]),
        confidence=float(achieved),
        requested_confidence=confidence,
        n=n,
        method="exact" if n <= EXACT_MAX_N else "normal",
    )


def hodges_lehmann(
    diffs: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    zeros: Literal["drop", "keep"] = "drop",
) -> tuple[float, float, float]:
    """``(estimate, low, high)`` of :func:`hodges_lehmann_interval` (see there, including
    what is returned when ``confidence`` is not achievable at this n)."""
    result = hodges_lehmann_interval(diffs, confidence, zeros)
    return result.estimate, result.low, result.high


# ---------------------------------------------------------------------------------------
# Equivalence (TOST) of paired Sharpe differences.


class Verdict(StrEnum):
    """A family's decision. :func:`equivalence_test` (the fixed design) ends in EQUIVALENT,
    WORSE, BETTER or INCONCLUSIVE; :func:`sequential_verdict` in CONTINUE (look again after
    more configurations), EQUIVALENT, WORSE, BETTER or FUTILE (the budget cannot reach a
    decision). WORSE and BETTER are "by more than the margin"; which precision is worse is
    said beside it. Code decides from the enum value; :meth:`text` spells the verdict for
    people ("bf16 worse"), and records keep the decision and its note as separate fields."""

    EQUIVALENT = "equivalent"
    WORSE = "worse"
    BETTER = "better"
    INCONCLUSIVE = "inconclusive"
    FUTILE = "futile"
    CONTINUE = "continue"

    def text(self, other: str, note: str | None = None) -> str:
        """The verdict as the CLI, the report and the MLflow tags print it, the one place it
        is spelled: WORSE and BETTER name the precision (``other``: "bf16 worse"), the
        rest are the bare word; a ``note`` follows a colon ("inconclusive: about 3 more
        configurations needed")."""
        head = f"{other} {self.value}" if self in (Verdict.WORSE, Verdict.BETTER) else self.value
        return f"{head}: {note}" if note else head


VERDICTS: tuple[Verdict, ...] = (
    Verdict.EQUIVALENT,
    Verdict.WORSE,
    Verdict.BETTER,
    Verdict.INCONCLUSIVE,
)
"""The decisions of the fixed design (:func:`equivalence_test`)."""
PAIRS_NEEDED_CAP = 1000
"""Above this many more pairs, ``pairs_needed`` says "more than 1,000" (None + a flag):
an estimate near the margin divides by almost nothing (7.2 million was seen)."""
SKEW_LIMIT = 2.0
"""|sample skewness| above which the differences count as strongly skewed."""
POWER_TABLE_SD_RATIOS = (0.5, 1.0, 1.5, 2.0, 3.0)
"""sd(d) / margin of the power table (:data:`EQUIVALENCE_POWER`)."""
EQUIVALENCE_POWER: dict[float, int] = {0.5: 6, 1.0: 12, 1.5: 23, 2.0: 39, 3.0: 86}
"""Configurations for 80% power to show equivalence when the true difference is 0, by
sd(d) / margin: the smallest n at which :func:`equivalence_test` (alpha 0.05, checks
included) said "equivalent" for at least 80% of 10000 normal samples (docs/statistics.md);
:func:`configs_for_equivalence` is its normal approximation, a few fewer at small n."""

# Asymptotic variance of the Hodges-Lehmann estimator relative to the mean's under
# normality: pi/3 (the signed-rank test's efficiency is 3/pi = 0.955).
_HL_VARIANCE_RATIO = math.pi / 3.0


class EquivalenceTest(NamedTuple):
    """Two one-sided signed-rank tests of the paired differences ``d = other - reference``."""

    decision: Verdict
    """EQUIVALENT, WORSE, BETTER or INCONCLUSIVE (:data:`VERDICTS`); :attr:`verdict` spells
    it with the precision's name."""
    other: str
    """The precision the differences are of (``other - reference``), named in
    :attr:`verdict`."""
    pvalue: float
    """TOST p-value ``max(pvalue_lower, pvalue_upper)``: equivalence is shown iff <= alpha."""
    pvalue_lower: float
    """H0: centre <= -margin (other worse by at least the margin), vs > -margin."""
    pvalue_upper: float
    """H0: centre >= +margin (other better by at least the margin), vs < +margin."""
    pvalue_worse: float
    """H0: centre >= -margin vs < -margin: <= alpha means worse by more than the margin."""
    pvalue_better: float
    """H0: centre <= +margin vs > +margin: <= alpha means better by more than the margin."""
    estimate: float
    """Hodges-Lehmann estimate of the centre of ``d``."""
    low: float
    """Lower end of the (1 - 2 alpha) Hodges-Lehmann interval."""
    high: float
    """Upper end of the (1 - 2 alpha) Hodges-Lehmann interval."""
    confidence: float
    """Achieved confidence of [low, high] (< 1 - 2 alpha when n is too small for it)."""
    margin: float
    """Equivalence margin, in the units of ``d``."""
    alpha: float
    """Level of each one-sided test."""
    n: int
    """Number of differences."""
    method: Literal["exact", "normal"]
    """Null distribution used (exact for n <= 50)."""
    pairs_needed: int | None
    """0 when the verdict is decided; otherwise about how many *more* pairs would decide
    it if the centre and spread stay as observed; None when that cannot be estimated (a
    single pair, an estimate exactly on the margin) or when it is more than
    :data:`PAIRS_NEEDED_CAP` (``pairs_needed_capped``)."""
    mean: float = math.nan
    """Mean of ``d``: what a strategy pays on average, beside the pseudo-median."""
    mean_low: float = math.nan
    """Lower end of the (1 - 2 alpha) t-interval of the mean (NaN for n < 2)."""
    mean_high: float = math.nan
    """Upper end of that t-interval (the verdict reads ``mean_verdict_high``)."""
    skewness: float = math.nan
    """Sample skewness of ``d`` (``scipy.stats.skew(bias=False)``; NaN for n < 3 or no
    spread)."""
    skewed: bool = False
    """Strongly skewed: ``|skewness| >`` :data:`SKEW_LIMIT`, or the mean and the HL
    estimate more than half the margin apart. Reported (``note``), no longer a block: the
    mean's interval holds under skew."""
    blocked: str | None = None
    """Why the signed-rank TOST's "equivalent" was withheld (the mean's interval leaves
    the margin); None when it was not."""
    tail: tuple[int, ...] = ()
    """Positions of the differences beyond Tukey's fences (1.5 IQR beyond the quartiles),
    most extreme first: the configurations that drive a tail (n >= 5)."""
    pairs_needed_capped: bool = False
    """True when more than :data:`PAIRS_NEEDED_CAP` more pairs would be needed."""
    mean_verdict_low: float = math.nan
    """Lower end of the mean's (1 - 2 alpha) interval that the verdict reads
    (:func:`mean_interval`): the lower of the t-interval's and the BCa bootstrap's,
    valid under skew; NaN for n < 2."""
    mean_verdict_high: float = math.nan
    """Upper end of that interval: "equivalent" needs it inside ``±margin`` too."""
    loss_tail: LossTail | None = None
    """How many configurations lose more than the margin, with an interval, and the worst
    (:func:`loss_tail`): the line to print beside the verdict."""
    note: str | None = None
    """When strong skew makes the answer fragile: what the interval rests on."""

    @property
    def verdict(self) -> str:
        """ "equivalent", "<other> worse", "<other> better" or "inconclusive"
        (:meth:`Verdict.text`)."""
        return self.decision.text(self.other)


def equivalence_test(
    diffs: Sequence[float] | np.ndarray,
    margin: float,
    alpha: float = 0.05,
    other: str = "bf16",
) -> EquivalenceTest:
    """Is ``other`` as good as the reference, within ``margin``? (TOST on paired differences)

    Orientation: ``diffs = other - reference`` (bf16 Sharpe - f32 Sharpe, one per sampled
    configuration, seeds averaged); negative means ``other`` is worse.

    Nonparametric, on purpose: with 2-10 pairs and Sharpe differences that are skewed
    or have outliers (a trial that nearly diverged), a t-based TOST leans on normality
    that cannot be checked. The signed-rank tests only assume a distribution symmetric
    about its centre, and are consistent with :func:`hodges_lehmann_interval`:

    Each one-sided test is the exact signed-rank test of the shifted differences in
    Tukey's Walsh-average form: ``T+(d - m) = #{Walsh averages > m}``, with a Walsh
    average exactly *at* ``m`` counted against rejection (conservative for tied data).
    For instance ``pvalue_upper = P(T+ <= #{W >= margin})``. Hence, with ``[low, high]``
    the (1 - 2 alpha) interval of :func:`hodges_lehmann_interval`, exactly:

    - "equivalent" iff both one-sided tests reject at ``alpha`` (``pvalue <= alpha``)
      iff ``-margin < low`` and ``high < margin``, *and* the pseudo-median stands for the
      mean: the mean's (1 - 2 alpha) interval lies inside ``±margin``; otherwise
      "inconclusive" with the reason in ``blocked`` (with 80% of pairs unchanged and 20%
      0.5 worse, the HL centre alone said "equivalent" ~40% of the time with the mean at
      the margin);
    - "<other> worse" iff ``pvalue_worse <= alpha`` iff ``high < -margin``: worse by more
      than the margin;
    - "<other> better" iff ``pvalue_better <= alpha`` iff ``low > margin``;
    - "inconclusive" otherwise, including an interval that excludes 0 but straddles a
      margin (a difference, of unresolved size).

    Under skew the mean's interval is :func:`mean_interval`'s (t or BCa bootstrap, the
    wider per side), so strong skew no longer withholds "equivalent" forever: it is
    flagged (``skewed``, ``note``) and the tail is reported (``loss_tail``: the share of
    configurations where ``other`` loses more than the margin, with its interval).

    These are mutually exclusive. When n is too small for the (1 - 2 alpha) level (``2^-n
    > alpha``: n <= 4 at alpha = 0.05) no test can reject, and the verdict is
    "inconclusive" whatever the data.

    ``pairs_needed`` (when inconclusive): the total n at which the (1 - 2 alpha) interval,
    of half-width ``z_(1-alpha) * s * sqrt(pi/3) / sqrt(n)`` (the HL estimator's
    asymptotic standard error; ``s`` the standard deviation of ``d``), would clear the
    nearest margin ``| |estimate| - margin |`` (the mean's, ``margin - |mean|`` without
    the ``sqrt(pi/3)``, too, when the HL estimate is inside the margin), and at least
    the smallest n whose level is achievable, minus the pairs already there; None and
    ``pairs_needed_capped`` above :data:`PAIRS_NEEDED_CAP`. A planning number: for a
    family decided in steps, :func:`sequential_verdict` is the rule.

    The directional verdicts are each at ``alpha`` one-sided: together "worse or better"
    is a two-sided ``2 alpha`` statement, and over several families more again
    (:func:`holm_adjust`; :mod:`hpo.compare` adjusts them).

    Args:
        diffs: Paired differences ``other - reference``.
        margin: Equivalence margin, > 0, same units as ``diffs`` (pre-set, not tuned).
        alpha: Level of each one-sided test, in (0, 0.5).
        other: Name used in the "worse"/"better" verdicts.

    Raises:
        ValueError: on empty, non-1-D or non-finite ``diffs``, ``margin <= 0``, or
            ``alpha`` outside (0, 0.5).
    """
    d = _check_diffs(diffs)
    margin = _positive("margin", margin)
    alpha = _check_alpha(alpha)
    n = int(d.size)
    walsh = _walsh_averages(d)
    # Tested at +-margin, not at 0: a zero difference is an observation here.
    interval = hodges_lehmann_interval(d, 1.0 - 2.0 * alpha, zeros="keep")

    # P(T+ <= count): T+ is symmetric under the null, so each tail uses the lower CDF.
    p_upper = _signed_rank_cdf(n, int(np.count_nonzero(walsh >= margin)))
    p_lower = _signed_rank_cdf(n, int(np.count_nonzero(walsh <= -margin)))
    p_worse = _signed_rank_cdf(n, int(np.count_nonzero(walsh >= -margin)))
    p_better = _signed_rank_cdf(n, int(np.count_nonzero(walsh <= margin)))
    pvalue = max(p_lower, p_upper)
    mean_ci = mean_interval(d, 1.0 - 2.0 * alpha)
    mean = mean_ci.mean
    skewness = _skewness(d)
    skewed = abs(skewness) > SKEW_LIMIT or abs(mean - interval.estimate) > margin / 2.0

    blocked = None
    if _rejects(pvalue, alpha):
        blocked = _equivalence_withheld(mean_ci, skewness, margin, alpha)
        decision = Verdict.INCONCLUSIVE if blocked else Verdict.EQUIVALENT
    elif _rejects(p_worse, alpha):
        decision = Verdict.WORSE
    elif _rejects(p_better, alpha):
        decision = Verdict.BETTER
    else:
        decision = Verdict.INCONCLUSIVE

    pairs_needed: int | None = 0
    capped = False
    if decision is Verdict.INCONCLUSIVE:
        pairs_needed, capped = _pairs_needed(d, interval.estimate, mean, margin, alpha)
    return EquivalenceTest(
        decision=decision,
        other=other,
        pvalue=pvalue,
        pvalue_lower=p_lower,
        pvalue_upper=p_upper,
        pvalue_worse=p_worse,
        pvalue_better=p_better,
        estimate=interval.estimate,
        low=interval.low,
        high=interval.high,
        confidence=interval.confidence,
        margin=margin,
        alpha=alpha,
        n=n,
        method=interval.method,
        pairs_needed=pairs_needed,
        mean=mean,
        mean_low=mean_ci.t_low,
        mean_high=mean_ci.t_high,
        skewness=skewness,
        skewed=bool(skewed),
        blocked=blocked,
        tail=_tail(d),
        pairs_needed_capped=capped,
        mean_verdict_low=mean_ci.low,
        mean_verdict_high=mean_ci.high,
        loss_tail=loss_tail(d, margin),
        note=_skew_note(skewness, d, margin, other) if skewed and n >= 3 else None,
    )


def _pairs_needed(
    d: np.ndarray, estimate: float, mean: float, margin: float, alpha: float
) -> tuple[int | None, bool]:
    """More pairs for an inconclusive verdict: towards "equivalent" (HL estimate inside the
    margin) both the HL's and the mean's interval must clear it; towards "worse"/"better",
    the HL's."""
    n = int(d.size)
    spread = float(np.std(d, ddof=1)) if n > 1 else math.nan
    distance = abs(abs(estimate) - margin) * math.sqrt(1.0 / _HL_VARIANCE_RATIO)
    by_hl = additional_pairs_needed(n, spread, distance, alpha)
    if abs(estimate) >= margin:
        return by_hl
    by_mean = additional_pairs_needed(n, spread, margin - abs(mean), alpha)
    if by_hl[1] or by_mean[1]:
        return None, True
    if by_hl[0] is None or by_mean[0] is None:
        return None, False
    return max(by_hl[0], by_mean[0]), False


def _mean_interval(d: np.ndarray, confidence: float) -> tuple[float, float]:
    """Two-sided t-interval of the mean of ``d`` (the point when ``d`` has no spread)."""
    if d.size < 2:
        return math.nan, math.nan
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
    return float(ci.low), float(ci.high)


def _skewness(d: np.ndarray) -> float:
    if d.size < 3 or np.all(d == d[0]):
        return math.nan
    return float(stats.skew(d, bias=False))


def _equivalence_withheld(
    ci: MeanInterval, skewness: float, margin: float, alpha: float
) -> str | None:
    if -margin < ci.low and ci.high < margin:
        return None
    # Which side left the margin, and whether the BCa side made it wider than the t's.
    widened = (ci.low < ci.t_low and ci.low <= -margin) or (
        ci.high > ci.t_high and ci.high >= margin
    )
    why = (
        f"the BCa side, wider than the t-interval: skewed differences, sample skewness "
        f"{skewness:+.2f}"
        if widened and math.isfinite(skewness)
        else "t or BCa bootstrap, the wider"
    )
    return (
        f"the mean difference {ci.mean:+.3f} has a {1 - 2 * alpha:.0%} interval "
        f"[{ci.low:+.3f}, {ci.high:+.3f}] ({why}) that leaves the margin ±{margin:g}"
    )


def _tail(d: np.ndarray) -> tuple[int, ...]:
    """Positions beyond Tukey's fences, most extreme (from the median) first."""
    if d.size < 5:
        return ()
    q1, median, q3 = np.percentile(d, [25, 50, 75])
    reach = 1.5 * (q3 - q1)
    outside = np.flatnonzero((d < q1 - reach) | (d > q3 + reach))
    order = sorted(outside.tolist(), key=lambda i: (-abs(float(d[i]) - median), i))
    return tuple(order)


def additional_pairs_needed(
    n: int, spread: float, distance: float, alpha: float = 0.05
) -> tuple[int | None, bool]:
    """About how many more pairs a one-sided level-``alpha`` claim needs at ``distance``.

    With ``n`` pairs now and ``spread`` the standard deviation of their differences: the
    total n with ``z_(1-alpha) * spread / sqrt(n) <= distance`` (for the HL estimate pass
    its distance divided by ``sqrt(pi/3)``, its efficiency), at least the smallest n whose
    level ``2^-n <= alpha`` is reachable and one more than now, minus ``n``. Returns
    ``(count, capped)``: ``(None, True)`` above :data:`PAIRS_NEEDED_CAP`, ``(None,
    False)`` when it cannot be estimated (fewer than 2 pairs, or ``distance <= 0``).
    """
    # Smallest n whose most extreme sign pattern (probability 2^-n) is already <= alpha.
    n_min = math.ceil(math.log2(1.0 / alpha) - _LEVEL_RTOL)
    if n < 2 or not distance > 0.0 or not math.isfinite(spread):
        return None, False
    if spread == 0.0:
        n_total = n_min  # identical differences: only the discreteness of the level limits
    else:
        z = float(special.ndtri(1.0 - alpha))
        ratio = z * spread / distance
        if ratio**2 > PAIRS_NEEDED_CAP + n:
            return None, True
        n_total = math.ceil(ratio**2)
    more = max(n_total, n_min, n + 1) - n
    return (None, True) if more > PAIRS_NEEDED_CAP else (more, False)


def configs_for_equivalence(sd_ratio: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """Configurations needed to show equivalence with probability ``power`` when the true
    difference is 0 and ``sd(d) = sd_ratio * margin`` (normal approximation).

    ``n = ((z_(1-alpha) + z_(1-(1-power)/2)) * sqrt(pi/3) * sd_ratio)^2``, rounded up and
    at least the smallest n whose level is reachable (5 at alpha = 0.05): the HL
    interval's half-width (efficiency 3/pi) must clear the margin on both sides. A
    simulation of :func:`equivalence_test` (normal differences, checks included) gives
    about the stated power at these n (tests/hpo/test_stats_coverage.py).
    """
    sd_ratio = _finite("sd_ratio", sd_ratio)
    if sd_ratio <= 0.0:
        raise ValueError(f"sd_ratio must be > 0, got {sd_ratio!r}")
    power = _probability("power", power)
    alpha = _finite("alpha", alpha)
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    z = float(-special.ndtri(alpha) - special.ndtri((1.0 - power) / 2.0))
    n_min = math.ceil(math.log2(1.0 / alpha) - _LEVEL_RTOL)
    return max(n_min, math.ceil((z * math.sqrt(_HL_VARIANCE_RATIO) * sd_ratio) ** 2))


def holm_adjust(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error), in the input order.

    Sorted ascending, ``p_(i)`` becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``; a claim
    is made where the adjusted value is <= alpha. scipy has Benjamini-Hochberg
    (``false_discovery_control``) but not Holm.

    Raises:
        ValueError: if a value is not a finite number in [0, 1].
    """
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    if p.size and not (np.all(np.isfinite(p)) and np.all((p >= 0.0) & (p <= 1.0))):
        raise ValueError(f"p-values must be finite and in [0, 1], got {p.tolist()}")
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped) if m else stepped
    return adjusted


# ---------------------------------------------------------------------------------------
# The mean difference's interval, valid under skew: the wider, per side, of the t-interval
# and the BCa bootstrap's. The resamples are a fixed matrix of multinomial counts per n, so
# the bootstrap means of many samples at once are one matrix product and a result is
# reproducible.

MEAN_BOOTSTRAP_RESAMPLES = 2000
"""Resamples of the BCa bootstrap of the mean (a fixed seeded set per sample size)."""
_MEAN_BOOTSTRAP_SEED = 39
_ROW_CHUNK = 512  # rows of a batch per bootstrap product: (512, 2000) floats per array


def _resample_counts(n: int) -> np.ndarray:
    """(B, n) multinomial counts: how often each of ``n`` values is drawn by each resample
    (the same for every sample of size ``n``), as floats for the matrix product."""
    return _resample_counts_stored(n).astype(np.float64)


@lru_cache(maxsize=256)
def _resample_counts_stored(n: int) -> np.ndarray:
    # uint16 (n < 65536): a quarter of the float64 memory, 0.8 MB at n = 200. 256 sizes:
    # a sequential family looks at every size from 9 to its budget, three times per call
    # (decisions, intervals, repeated p-values), so a smaller cache regenerated every
    # size at every look once the budget passed it (1.4 s against 0.2 s per outcome at
    # 90 configurations). At most 20 MB up to a budget of 100, 140 MB at 264.
    if n >= 2**16:
        raise ValueError(f"at most {2**16 - 1} differences per bootstrap, got {n}")
    rng = np.random.default_rng((_MEAN_BOOTSTRAP_SEED, n))
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=MEAN_BOOTSTRAP_RESAMPLES)
    counts = counts.astype(np.uint16)
    counts.setflags(write=False)
    return counts


class _MeanStats(NamedTuple):
    """Per row of a (R, n) batch: what the mean's interval at any level needs."""

    n: int
    mean: np.ndarray  # (R,)
    se: np.ndarray  # (R,) s / sqrt(n), s with ddof = 1
    boot: np.ndarray  # (R, B) bootstrap means, sorted per row
    z0: np.ndarray  # (R,) BCa bias correction
    accel: np.ndarray  # (R,) BCa acceleration (jackknife of the mean, closed form)


def _mean_stats(d: np.ndarray) -> _MeanStats:
    """``d``: (R, n), n >= 2."""
    n = d.shape[1]
    mean = d.mean(axis=1)
    dev = d - mean[:, None]
    ss = np.einsum("ij,ij->i", dev, dev)  # (R,)
    se = np.sqrt(ss / (n - 1) / n)
    boot = np.sort(d @ _resample_counts(n).T / n, axis=1)  # (R, B)
    b = boot.shape[1]
    # A constant sample resamples to its own mean: every bootstrap mean "equals" it.
    tol = 1e-12 * np.maximum(np.abs(mean), np.sqrt(ss / n))[:, None]
    below = np.count_nonzero(boot < mean[:, None] - tol, axis=1)
    equal = np.count_nonzero(np.abs(boot - mean[:, None]) <= tol, axis=1)
    share = np.clip((below + 0.5 * equal) / b, 0.5 / b, 1.0 - 0.5 / b)
    z0 = special.ndtri(share)
    # Jackknife acceleration of the mean: sum(dev^3) / (6 sum(dev^2)^1.5) (Efron 1987).
    with np.errstate(divide="ignore", invalid="ignore"):
        accel = np.where(ss > 0.0, np.einsum("ij,ij,ij->i", dev, dev, dev) / (6.0 * ss**1.5), 0.0)
    return _MeanStats(n, mean, se, boot, z0, accel)


def _bca_ends(ms: _MeanStats, level: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """BCa ends at one-sided ``level`` (per row or one): the order statistics of the sorted
    bootstrap means at the BCa-adjusted levels, the outer one on a split."""
    b = ms.boot.shape[1]
    level = np.broadcast_to(np.asarray(level, dtype=np.float64), ms.mean.shape)
    ends = []
    for z, lower in ((special.ndtri(level), True), (-special.ndtri(level), False)):
        shifted = ms.z0 + z
        denominator = 1.0 - ms.accel * shifted
        with np.errstate(divide="ignore", invalid="ignore"):
            adjusted = special.ndtr(ms.z0 + shifted / denominator)
        # Past the pole of the acceleration the adjusted level runs off: the extreme.
        adjusted = np.where(denominator > 0.0, adjusted, 0.0 if lower else 1.0)
        if lower:
            rank = np.floor(adjusted * (b + 1)).astype(np.int64)
        else:
            rank = np.ceil(adjusted * (b + 1)).astype(np.int64)
        index = np.clip(rank, 1, b) - 1
        ends.append(np.take_along_axis(ms.boot, index[:, None], axis=1)[:, 0])
    return ends[0], ends[1]


def _mean_ends(
    ms: _MeanStats, level: np.ndarray | float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, t_low, t_high) at one-sided ``level``: the union per side of the
    t-interval and the BCa interval, and the t-interval alone."""
    half = -special.stdtrit(ms.n - 1, level) * ms.se
    t_low, t_high = ms.mean - half, ms.mean + half
    bca_low, bca_high = _bca_ends(ms, level)
    return np.minimum(t_low, bca_low), np.maximum(t_high, bca_high), t_low, t_high


class MeanInterval(NamedTuple):
    """The mean of paired differences and its interval (:func:`mean_interval`)."""

    mean: float
    """Mean of the differences: what a strategy pays on average."""
    low: float
    """Lower end: the lower of the t-interval's and the BCa bootstrap interval's."""
    high: float
    """Upper end: the higher of the two."""
    t_low: float
    """Lower end of the t-interval alone (``scipy.stats.t``)."""
    t_high: float
    """Upper end of the t-interval alone."""
    confidence: float
    """Two-sided confidence of [low, high] (each side at ``(1 - confidence) / 2``)."""
    n: int
    """Number of differences."""


def mean_interval(
    differences: Sequence[float] | np.ndarray, confidence: float = 0.9
) -> MeanInterval:
    """The mean difference's interval that stays valid when the differences are skewed.

    Per side, the wider of the t-interval and the BCa bootstrap interval
    (:data:`MEAN_BOOTSTRAP_RESAMPLES` resamples from a fixed seed, so the same differences
    give the same interval). The t-interval is exact for normal differences and
    conservative for symmetric heavy tails, where the bootstrap is not; the BCa interval is
    second-order accurate for the mean of a skewed distribution, where the t-interval's
    lower end sits too high for left-skewed differences (losses). Each side's error is at
    most the smaller of the two methods' (docs/statistics.md gives the measured rates).
    With no spread the interval is the point; with one difference it is NaN.

    Raises:
        ValueError: on empty, non-1-D or non-finite ``differences``, or ``confidence``
            outside (0, 1).
    """
    d = _check_diffs(differences, "differences")
    confidence = _probability("confidence", confidence)
    mean = float(np.mean(d))
    if d.size < 2:
        return MeanInterval(mean, math.nan, math.nan, math.nan, math.nan, confidence, 1)
    ms = _mean_stats(d[None, :])
    low, high, t_low, t_high = (float(x[0]) for x in _mean_ends(ms, (1.0 - confidence) / 2.0))
    return MeanInterval(mean, low, high, t_low, t_high, confidence, int(d.size))


# ---------------------------------------------------------------------------------------
# The tail: configurations where the other precision loses more than the margin.


class LossTail(NamedTuple):
    """How often the other precision loses more than the margin (:func:`loss_tail`)."""

    margin: float
    """The margin: a configuration is in the tail when its difference is below -margin."""
    losing: int
    """Configurations in the tail."""
    n: int
    """Configurations looked at."""
    share: float
    """``losing / n``."""
    low: float
    """Lower end of the Clopper-Pearson interval of the share."""
    high: float
    """Upper end (with no configuration in the tail: about 3 / n at 95%)."""
    confidence: float
    """Confidence of [low, high]."""
    worst: tuple[int, ...]
    """Positions of the worst configurations in the tail, most negative first."""
    worst_differences: tuple[float, ...]
    """Their differences."""

    def line(self, other: str = "bf16", names: Sequence[str] | None = None) -> str:
        """One sentence, e.g. ``bf16 loses more than 0.1 in 3 of 50 configurations (6%,
        95% CI 1.3%-16.5%); worst: kan-c012 -0.750, ...``; ``names[i]`` labels position i."""

        def label(i: int) -> str:
            return names[i] if names is not None else f"#{i}"

        head = (
            f"{other} loses more than {self.margin:g} in {self.losing} of {self.n} "
            f"configuration{'s' if self.n != 1 else ''} ({self.share:.0%}, "
            f"{self.confidence:.0%} CI {self.low:.1%}-{self.high:.1%})"
        )
        if not self.worst:
            return head
        worst = ", ".join(
            f"{label(i)} {x:+.3f}" for i, x in zip(self.worst, self.worst_differences, strict=True)
        )
        more = f" and {self.losing - len(self.worst)} more" if self.losing > len(self.worst) else ""
        return f"{head}; worst: {worst}{more}"


def loss_tail(
    differences: Sequence[float] | np.ndarray,
    margin: float,
    confidence: float = 0.95,
    worst: int = 5,
) -> LossTail:
    """The share of configurations whose difference ``other - reference`` is below
    ``-margin`` (the other precision loses more than the margin), with its exact
    Clopper-Pearson interval (``scipy.stats.binomtest``), and the ``worst`` most negative
    of them by position, so a caller maps them to configuration ids.

    It is reported beside a verdict: "equivalent on average" and "bf16 breaks 6% of
    configurations badly" are both true of a skewed family, and the mean alone hides the
    second.

    Raises:
        ValueError: on empty, non-1-D or non-finite ``differences``, ``margin <= 0``,
            ``confidence`` outside (0, 1) or ``worst < 0``.
    """
    d = _check_diffs(differences, "differences")
    margin = _positive("margin", margin)
    confidence = _probability("confidence", confidence)
    worst = _int_at_least("worst", worst, 0)
    losing = np.flatnonzero(d < -margin)
    count, n = int(losing.size), int(d.size)
    ci = stats.binomtest(count, n).proportion_ci(confidence_level=confidence, method="exact")
    order = losing[np.argsort(d[losing], kind="stable")][:worst]
    return LossTail(
        margin=margin,
        losing=count,
        n=n,
        share=count / n,
        low=float(ci.low),
        high=float(ci.high),
        confidence=confidence,
        worst=tuple(int(i) for i in order),
        worst_differences=tuple(float(d[i]) for i in order),
    )


# ---------------------------------------------------------------------------------------
# Sequential comparison: repeated confidence intervals of the mean (Jennison & Turnbull
# 1993) with an alpha-spending boundary (Lan & DeMets 1983, the power family of Kim &
# DeMets 1987), looks from MIN_FIRST_LOOK configurations, and a non-binding futility rule.

MIN_FIRST_LOOK = 9
"""Fewest configurations at which the sequential rule looks: earlier looks read "continue"
and spend no alpha. At fewer, a skewed family's interval is too fragile: at skewness -1
and sd / margin 1 (4,000 samples), P(equivalent) at -margin is 0.097 from 8 and 0.088
from 9 or 10 (docs/statistics.md); a naive t-interval from 4 reaches 0.13."""
DEFAULT_LOOK_EVERY = 1
"""Configurations added to a family between two looks, unless the spec says otherwise:
a look after every configuration lets a family stop at the first count that decides it
(at sd / margin 1, 9.5 configurations on average against 9.6 with looks every 2, and
0.8x the fixed design's at equal power; bench/README.md). How many of a family's
configurations run at once is the spec's ``comparison.in_flight``, apart from the looks."""
SPENDING_RHO = 2.0
"""Exponent of the spending function ``alpha * t^rho``: between Pocock (about 1) and
O'Brien-Fleming (about 3); the smallest expected configurations at 80% power."""
FUTILITY_PROBABILITY = 0.10
"""A look stops a family as "futile" when the predicted probability that the budget's
look decides anything is below this (normal approximation, the spread as observed)."""

_CONTINUE, _EQUIVALENT, _WORSE, _BETTER, _FUTILE, _NOT_REACHED = 0, 1, 2, 3, 4, -1
_CODES = {
    _CONTINUE: "continue",
    _EQUIVALENT: "equivalent",
    _WORSE: "worse",
    _BETTER: "better",
    _FUTILE: "futile",
}
_BOUNDARY_GRID = 201  # points per look of the recursive integration


def _normal_pdf(x: np.ndarray) -> np.ndarray:
    # scipy.stats.norm.pdf's argument checks cost more than the recursion's arithmetic.
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _spent(fraction: np.ndarray, alpha: float) -> np.ndarray:
    return alpha * np.minimum(fraction, 1.0) ** SPENDING_RHO


def _boundary_levels(looks: tuple[int, ...], alpha: float) -> np.ndarray:
    """One-sided nominal level at each look of a Brownian motion observed at information
    ``looks`` (the configurations), such that the first crossing of the upper boundary
    happens by look k with probability ``alpha * (n_k / n_K)^rho`` under the null.

    The recursive numerical integration of Armitage, McPherson & Rowe (1969), as in
    Jennison & Turnbull (2000, ch. 19): the sub-density of the score S_k = Z_k sqrt(n_k) on
    the continuation region, carried from look to look on a trapezoid grid; scipy has
    no group-sequential boundary (its multivariate normal CDF checks this one in the
    tests). Each level is what a single look at that n would use as its one-sided alpha.
    """
    info = np.asarray(looks, dtype=np.float64)
    increments = np.diff(_spent(info / info[-1], alpha), prepend=0.0)
    bounds = np.empty(info.size)
    bounds[0] = -special.ndtri(increments[0])
    root = math.sqrt(info[0])
    grid = np.linspace(-8.0 * root, bounds[0] * root, _BOUNDARY_GRID)
    density = _normal_pdf(grid / root) / root
    for k in range(1, info.size):
        step = math.sqrt(info[k] - info[k - 1])
        weights = np.full(grid.size, grid[1] - grid[0])
        weights[[0, -1]] /= 2.0
        mass = density * weights  # (G,) probability carried at each grid point
        root = math.sqrt(info[k])

        bounds[k] = optimize.brentq(
            _crossing, -12.0, 40.0, args=(mass, grid, root, step, increments[k]), xtol=1e-12
        )
        new_grid = np.linspace(-8.0 * root, bounds[k] * root, _BOUNDARY_GRID)
        density = _normal_pdf((new_grid[:, None] - grid[None, :]) / step) @ mass / step
        grid = new_grid
    return special.ndtr(-bounds)


def _crossing(
    bound: float, mass: np.ndarray, grid: np.ndarray, root: float, step: float, target: float
) -> float:
    """Probability of crossing ``bound`` (z scale) at a look, minus ``target``: ``mass`` at
    the previous look's scores ``grid``, increments of sd ``step``, ``root`` = sqrt(n_k)."""
    return float(mass @ special.ndtr((grid - bound * root) / step)) - target


@lru_cache(maxsize=256)
def _levels_cached(looks: tuple[int, ...], alpha: float) -> np.ndarray:
    levels = _boundary_levels(looks, alpha)
    levels.setflags(write=False)
    return levels


def _check_looks(looks: Sequence[int]) -> tuple[int, ...]:
    try:
        values = tuple(_int_at_least("looks", x, 1) for x in looks)
    except TypeError:
        raise ValueError(f"looks must be a sequence of integers, got {looks!r}") from None
    if not values:
        raise ValueError("looks is empty: at least one look (the budget) is needed")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ValueError(f"looks must be strictly increasing, got {list(values)}")
    return values


def sequential_levels(looks: Sequence[int], alpha: float = 0.05) -> tuple[float, ...]:
    """The one-sided nominal level of each look's repeated confidence interval (the
    interval at look k has two-sided confidence ``1 - 2 level_k``); 0.0 for a look before
    :data:`MIN_FIRST_LOOK`, which spends nothing. The last look is the budget.

    Raises:
        ValueError: on looks that are empty, not positive integers or not increasing, or
            ``alpha`` outside (0, 0.5).
    """
    values = _check_looks(looks)
    alpha = _check_alpha(alpha)
    active = tuple(n for n in values if n >= MIN_FIRST_LOOK)
    if not active:
        return tuple(0.0 for _ in values)
    levels = iter(_levels_cached(active, alpha).tolist())
    return tuple(next(levels) if n >= MIN_FIRST_LOOK else 0.0 for n in values)


def _decision_probability(
    mean: np.ndarray, sd: np.ndarray, n: int, budget: int, final_level: float, margin: float
) -> np.ndarray:
    """Predicted probability that the budget's look decides anything, given a look at ``n``
    with ``mean`` and ``sd``: the budget's mean is normal around ``mean`` with variance
    sd^2 (budget - n) / (budget n) (the predictive law of a flat prior), and its interval
    the t-interval's half-width at the observed spread."""
    half = -special.stdtrit(budget - 1, final_level) * sd / math.sqrt(budget)
    scale = sd * math.sqrt((budget - n) / (budget * n))
    inner = np.maximum(margin - half, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        equivalent = special.ndtr((inner - mean) / scale) - special.ndtr((-inner - mean) / scale)
        worse = special.ndtr((-margin - half - mean) / scale)
        better = special.ndtr((mean - margin - half) / scale)
    probability = np.where(half < margin, equivalent, 0.0) + worse + better
    # No spread: the budget's mean is the current one, its interval a point.
    point = (np.abs(mean) < margin) | (np.abs(mean) > margin)
    return np.where(scale > 0.0, probability, point.astype(np.float64))


class _Batch(NamedTuple):
    codes: np.ndarray  # (R, K) int8: a decision code per look, -1 where not reached
    low: np.ndarray  # (R, K) the look's interval (NaN where not computed)
    high: np.ndarray  # (R, K)
    levels: tuple[float, ...]  # (K,) nominal one-sided levels


def _sequential_batch(
    d: np.ndarray,
    looks: tuple[int, ...],
    margin: float,
    alpha: float,
    futility: bool = True,
    directional_alpha: float | None = None,
) -> _Batch:
    """The rule on every row of ``d`` (R, N) at once: the implementation of
    :func:`sequential_verdict` (which calls it with one row), used as is by the tests'
    and the benchmark's simulations. ``futility=False`` drops the futility stops before
    the budget (to show that they are non-binding). ``directional_alpha`` (at most
    ``alpha``): the "worse" and "better" claims read the repeated interval at that error
    rate instead (a sweep's families share a Bonferroni split of ``alpha``, so that a
    family stopped on a claim keeps it after the Holm adjustment across families)."""
    rows, available = d.shape
    levels = sequential_levels(looks, alpha)
    claim_levels = (
        levels if directional_alpha is None else sequential_levels(looks, directional_alpha)
    )
    budget = looks[-1]
    codes = np.full((rows, len(looks)), _NOT_REACHED, dtype=np.int8)
    low = np.full((rows, len(looks)), np.nan)
    high = np.full((rows, len(looks)), np.nan)
    running = np.ones(rows, dtype=bool)
    for k, n in enumerate(looks):
        if n > available:
            break
        idx = np.flatnonzero(running)
        if idx.size == 0:
            break
        if levels[k] == 0.0:  # before the first look the rule applies at
            codes[idx, k] = _FUTILE if n == budget else _CONTINUE
            running[idx] = n != budget
            continue
        for chunk in np.array_split(idx, max(1, math.ceil(idx.size / _ROW_CHUNK))):
            x = d[chunk, :n]
            ms = _mean_stats(x)
            lo, hi, _, _ = _mean_ends(ms, levels[k])
            claim_lo, claim_hi = (
                (lo, hi) if claim_levels is levels else _mean_ends(ms, claim_levels[k])[:2]
            )
            code = np.where(
                (lo > -margin) & (hi < margin),
                _EQUIVALENT,
                np.where(
                    claim_hi < -margin, _WORSE, np.where(claim_lo > margin, _BETTER, _CONTINUE)
                ),
            )
            if n == budget:
                code = np.where(code == _CONTINUE, _FUTILE, code)
            elif futility:
                sd = ms.se * math.sqrt(n)
                hope = _decision_probability(ms.mean, sd, n, budget, levels[-1], margin)
                code = np.where((code == _CONTINUE) & (hope < FUTILITY_PROBABILITY), _FUTILE, code)
            codes[chunk, k] = code
            low[chunk, k], high[chunk, k] = lo, hi
        running[idx] = codes[idx, k] == _CONTINUE
    return _Batch(codes, low, high, levels)


def sequential_verdict(
    differences: Sequence[float], looks: Sequence[int], margin: float, alpha: float = 0.05
) -> list[str]:
    """The sequential rule's decision at each look reached: "continue", "equivalent",
    "worse", "better" or "futile", ending at the first that is not "continue".

    ``differences`` are the per-configuration differences ``other - reference`` (bf16
    Sharpe - f32 Sharpe, seeds averaged) in the order the configurations finished;
    ``looks`` the cumulative counts at which the rule is applied, the last one the budget.
    A look beyond ``len(differences)`` is not reached (the list is shorter than ``looks``
    and its last entry is "continue" while the family is undecided).

    At look k the mean difference of the first n_k configurations gets its repeated
    confidence interval (:func:`mean_interval`'s t-or-BCa interval at the one-sided
    nominal level of :func:`sequential_levels`; together they cover the mean at every look
    with probability 1 - 2 alpha): "equivalent" when it lies inside ``(-margin, margin)``,
    "worse" below ``-margin``, "better" above ``margin``. Otherwise "futile" at the budget,
    or before it when a decision by the budget is predicted with probability below
    :data:`FUTILITY_PROBABILITY` (non-binding: the error rates hold without it); else
    "continue". Looks before :data:`MIN_FIRST_LOOK` configurations read "continue" (or
    "futile" when such a look is the budget). Each claim errs with probability at most
    about ``alpha`` at the margin (docs/statistics.md has the measured rates). A sweep
    splits alpha over its families' directional claims, stopping on "worse" or "better"
    at ``alpha / (2 x families)`` (:func:`sequential_comparison`'s ``directional_alpha``):
    this function, every claim at ``alpha``, can say "worse" or "better" at a look where
    a sweep went on; ``sequential_comparison(..., directional_alpha=...)`` is a sweep's
    rule exactly.

    Raises:
        ValueError: naming the argument, on non-finite or non-1-D ``differences``, looks
            that are empty, not positive integers or not strictly increasing,
            ``margin <= 0`` or ``alpha`` outside (0, 0.5).
    """
    d, checked, margin, alpha = _sequential_args(differences, looks, margin, alpha)
    codes = _sequential_batch(d[None, :], checked, margin, alpha).codes[0]
    return [_CODES[int(c)] for c in codes if c != _NOT_REACHED]


def _sequential_args(
    differences: Sequence[float] | np.ndarray, looks: Sequence[int], margin: float, alpha: float
) -> tuple[np.ndarray, tuple[int, ...], float, float]:
    """The checked arguments of :func:`sequential_verdict` and :func:`sequential_comparison`."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"differences must be 1-D, got shape {d.shape}")
    if d.size:
        d = _check_diffs(d, "differences")
    return d, _check_looks(looks), _positive("margin", margin), _check_alpha(alpha)


def _check_directional_alpha(directional_alpha: float | None, alpha: float) -> float | None:
    if directional_alpha is None:
        return None
    directional_alpha = _check_alpha(directional_alpha)
    if directional_alpha > alpha:
        raise ValueError(f"directional_alpha ({directional_alpha}) must be at most alpha ({alpha})")
    return directional_alpha


class SequentialLook(NamedTuple):
    """One look of a family's sequential comparison."""

    configs: int
    """Configurations seen at this look (n_k)."""
    decision: Verdict
    """CONTINUE, EQUIVALENT, WORSE, BETTER or FUTILE."""
    mean: float
    """Mean difference of the first ``configs`` configurations."""
    low: float
    """Lower end of the repeated confidence interval of the mean (NaN before
    :data:`MIN_FIRST_LOOK`)."""
    high: float
    """Upper end."""
    level: float
    """One-sided nominal level of [low, high] (0.0 before :data:`MIN_FIRST_LOOK`)."""
    hl_estimate: float
    """Hodges-Lehmann estimate beside the mean (every difference, zeros included)."""
    hl_low: float
    """Lower end of its exact signed-rank interval at the look's level (NaN before
    :data:`MIN_FIRST_LOOK`; the widest, [min, max], when the level is out of reach)."""
    hl_high: float
    """Upper end."""
    decision_probability: float
    """Predicted probability that the budget's look decides (the futility rule's number;
    NaN at the budget and before :data:`MIN_FIRST_LOOK`)."""


class SequentialComparison(NamedTuple):
    """A family's sequential comparison so far (:func:`sequential_comparison`)."""

    decision: Verdict
    """The last look's decision: CONTINUE while undecided and below the budget."""
    looks: tuple[SequentialLook, ...]
    """Every look reached, in order; the last is the decision."""
    configs: int
    """Configurations the decision rests on (the last look's)."""
    budget: int
    """The last planned look: the most configurations the family may get."""
    margin: float
    """Equivalence margin."""
    alpha: float
    """Error rate of each one-sided claim over all looks."""
    p_worse: float
    """Repeated p-value of "worse by more than the margin" over the looks reached: the
    smallest alpha at which the rule would have said "worse" by now (1.0 when none below
    0.5 would). Valid across looks, so :func:`holm_adjust` over families holds."""
    p_better: float
    """Repeated p-value of "better by more than the margin"."""
    tail: LossTail | None
    """Configurations losing more than the margin, at the last look (None before any)."""
    note: str | None
    """Why it stopped (futility, with the interval reached), or why it has not looked
    yet, and a warning when strong skew makes the interval fragile."""

    @property
    def verdicts(self) -> list[str]:
        """The decisions as :func:`sequential_verdict` returns them."""
        return [look.decision.value for look in self.looks]


def sequential_comparison(
    differences: Sequence[float] | np.ndarray,
    looks: Sequence[int],
    margin: float,
    alpha: float = 0.05,
    other: str = "bf16",
    directional_alpha: float | None = None,
) -> SequentialComparison:
    """:func:`sequential_verdict` with what a report shows: per look the interval, its
    level, the Hodges-Lehmann interval beside it and the futility number; the repeated
    p-values of the directional claims (for :func:`holm_adjust` across families); the
    loss tail (:func:`loss_tail`) and a note. ``other`` names the precision in the note.
    ``directional_alpha`` (at most ``alpha``): the error rate the "worse" and "better"
    stops read their interval at (a compare sweep's ``alpha / (2 x families)``, so a
    family stopped on a claim keeps it under Holm's adjustment across families).

    The decisions are those of :func:`sequential_verdict`, exactly.

    Raises:
        ValueError: as :func:`sequential_verdict`.
    """
    d, checked, margin, alpha = _sequential_args(differences, looks, margin, alpha)
    directional_alpha = _check_directional_alpha(directional_alpha, alpha)
    batch = _sequential_batch(
        d[None, :], checked, margin, alpha, directional_alpha=directional_alpha
    )
    budget = checked[-1]
    rows: list[SequentialLook] = []
    for k, code in enumerate(batch.codes[0]):
        if code == _NOT_REACHED:
            break
        n, level = checked[k], batch.levels[k]
        x = d[:n]
        hl_estimate = float(np.median(_walsh_averages(x)))
        hl_low = hl_high = hope = math.nan
        if level > 0.0:
            hl = hodges_lehmann_interval(x, 1.0 - 2.0 * level, zeros="keep")
            hl_low, hl_high = hl.low, hl.high
            if n < budget:
                sd = np.array([np.std(x, ddof=1)])
                hope = float(
                    _decision_probability(
                        np.array([x.mean()]), sd, n, budget, batch.levels[-1], margin
                    )[0]
                )
        rows.append(
            SequentialLook(
                configs=n,
                decision=Verdict(_CODES[int(code)]),
                mean=float(np.mean(x)),
                low=float(batch.low[0, k]),
                high=float(batch.high[0, k]),
                level=level,
                hl_estimate=hl_estimate,
                hl_low=hl_low,
                hl_high=hl_high,
                decision_probability=hope,
            )
        )
    decision = rows[-1].decision if rows else Verdict.CONTINUE
    configs = rows[-1].configs if rows else 0
    reached = [look.configs for look in rows if look.level > 0.0]
    p_worse = _repeated_pvalue(d, checked, reached, margin, "worse")
    p_better = _repeated_pvalue(d, checked, reached, margin, "better")
    tail = loss_tail(d[:configs], margin) if configs else None
    return SequentialComparison(
        decision=decision,
        looks=tuple(rows),
        configs=configs,
        budget=budget,
        margin=margin,
        alpha=alpha,
        p_worse=p_worse,
        p_better=p_better,
        tail=tail,
        note=_sequential_note(rows, d, budget, margin, alpha, other),
    )


def _repeated_pvalue(
    d: np.ndarray, looks: tuple[int, ...], reached: list[int], margin: float, side: str
) -> float:
    """Smallest total alpha at which some reached look's interval clears the margin on
    ``side`` ("worse": below -margin, "better": above +margin).

    Per look, the interval clears it at every nominal level above a stagewise level
    (closed form for the t side, bisection on the BCa side's step function); the rule at
    total alpha ``a`` rejects iff some look's boundary level ``p_k(a)`` reaches its
    stagewise level, which is increasing in ``a``: a root search on ``log a``, one
    boundary recursion per step."""
    if not reached:
        return 1.0
    stagewise = np.array([_stagewise_level(d[:n], margin, side) for n in reached])
    if np.any(stagewise <= 0.0):
        return 0.0  # no spread and beyond the margin: rejected at every level
    top, bottom = 0.499, 1e-9
    if stagewise.min() >= top:
        return 1.0  # each look's level is below the total alpha, so no a < 0.5 rejects
    active = tuple(n for n in looks if n >= MIN_FIRST_LOOK)

    def excess(log_a: float) -> float:
        levels = _boundary_levels(active, math.exp(log_a))[: len(reached)]
        return float(np.max(np.log(levels) - np.log(stagewise)))

    if excess(math.log(top)) < 0.0:
        return 1.0
    if excess(math.log(bottom)) >= 0.0:
        return bottom
    return math.exp(optimize.brentq(excess, math.log(bottom), math.log(top), xtol=1e-6))


def _stagewise_level(x: np.ndarray, margin: float, side: str) -> float:
    """Smallest one-sided nominal level at which the interval of ``x``'s mean lies wholly
    below -margin ("worse") or above +margin ("better"); 1.0 when none below 0.5 does."""
    ms = _mean_stats(x[None, :])
    mean, se = float(ms.mean[0]), float(ms.se[0])
    beyond = (-margin - mean) if side == "worse" else (mean - margin)
    if se == 0.0:
        return 0.0 if beyond > 0.0 else 1.0
    # t side: mean + t_(1-l) se < -margin  <=>  l > P(T_(n-1) > (-margin - mean) / se).
    t_level = float(special.stdtr(ms.n - 1, -(beyond / se)))

    def clears(level: float) -> bool:
        low, high = _bca_ends(ms, level)
        return bool(high[0] < -margin) if side == "worse" else bool(low[0] > margin)

    lo, hi = 1e-12, 0.4999
    if not clears(hi):
        return 1.0
    if clears(lo):
        return max(t_level, lo)
    for _ in range(32):  # bisection on the log scale: the BCa ends are a step function
        mid = math.sqrt(lo * hi)
        if clears(mid):
            hi = mid
        else:
            lo = mid
    return max(t_level, hi)


def _sequential_note(
    rows: list[SequentialLook],
    d: np.ndarray,
    budget: int,
    margin: float,
    alpha: float,
    other: str,
) -> str | None:
    notes = []
    if not rows:
        return None
    last = rows[-1]
    coverage = f"{1 - 2 * alpha:.0%} repeated confidence interval"
    if last.level == 0.0:
        if last.decision is Verdict.FUTILE:
            notes.append(
                f"the budget of {budget} configurations is below the first look "
                f"({MIN_FIRST_LOOK}): no verdict is reachable"
            )
        else:
            notes.append(f"no look before {MIN_FIRST_LOOK} configurations")
    elif last.decision is Verdict.FUTILE:
        reached = (
            f"the mean difference {last.mean:+.3f} has the {coverage} "
            f"[{last.low:+.3f}, {last.high:+.3f}] at {last.configs} configurations"
        )
        if last.configs == budget:
            notes.append(f"budget spent: {reached}, neither inside nor beyond ±{margin:g}")
        else:
            notes.append(
                f"futile: {reached}; a decision by the budget of {budget} is predicted "
                f"with probability {last.decision_probability:.1%}"
            )
    x = d[: last.configs]
    skewness = _skewness(x)
    if last.level > 0.0 and math.isfinite(skewness) and abs(skewness) > SKEW_LIMIT:
        notes.append(_skew_note(skewness, x, margin, other))
    elif last.decision is Verdict.EQUIVALENT and skewness < -LOSS_SKEW:
        # A tail of losses, not strong: the rule's "equivalent" errs more than alpha here
        # (bench/sequential.py at the margin: 5-9% at skewness -1, 8-13% at -2).
        notes.append(
            f"a tail of losses (sample skewness {skewness:+.2f}) at {last.configs} "
            f"configurations: with differences this skewed, 'equivalent' was measured to err "
            f"about 9% at skewness -1 and up to 13% at -2, rather than {alpha:.0%} "
            f"(bench/README.md); the loss tail says how often {other} loses more than "
            f"{margin:g}"
        )
    return "; ".join(notes) or None


LOSS_SKEW = 1.0
"""Sample skewness below ``-LOSS_SKEW`` (and not below ``-SKEW_LIMIT``) marks a tail of
losses: a sequential "equivalent" then says its measured error (skewness -1: 0.052-0.089,
-2: 0.077-0.134 at the margin in bench/README.md, "Sequential comparison")."""


def _skew_note(skewness: float, x: np.ndarray, margin: float, other: str) -> str:
    """Strong skew: what the mean's interval rests on, and how large the tail may be."""
    tail = loss_tail(x, margin)
    return (
        f"strongly skewed differences (sample skewness {skewness:+.2f}): the mean's interval "
        f"rests on the {tail.losing} of {tail.n} configurations where {other} loses more "
        f"than {margin:g}, and such losses may reach {tail.high:.0%} of configurations "
        f"({tail.confidence:.0%} upper bound); a rarer tail may not have been drawn yet"
    )


# ---------------------------------------------------------------------------------------
# Planning: what a family needs before a sweep starts.


class SequentialPlan(NamedTuple):
    """The sequential rule's design for 80% power (:data:`SEQUENTIAL_POWER`)."""

    budget: int
    """Smallest budget (last look) at which the rule says "equivalent" with probability
    >= 80% when the true difference is 0."""
    expected_configs: float
    """Expected configurations to a decision (any stop) at a true difference of 0."""
    power: float
    """Simulated probability of "equivalent" at that budget."""


SEQUENTIAL_POWER: dict[float, SequentialPlan] = {
    0.5: SequentialPlan(9, 9.0, 1.0),
    1.0: SequentialPlan(11, 9.5, 0.803),
    1.5: SequentialPlan(26, 18.1, 0.803),
    2.0: SequentialPlan(46, 31.6, 0.800),
    3.0: SequentialPlan(104, 70.0, 0.803),
}
"""The sequential rule at 80% power by sd(d) / margin: normal differences, alpha 0.05,
looks from :data:`MIN_FIRST_LOOK` every :data:`DEFAULT_LOOK_EVERY` configurations;
simulated by ``bench/sequential.py`` (4,000 samples per row; bench/README.md, "Sequential
comparison"). The fixed design needs 6, 12, 23, 39, 86 (:data:`EQUIVALENCE_POWER`)."""


class ComparisonPlan(NamedTuple):
    """Per sd(d) / margin, what a family needs (:func:`comparison_plan`)."""

    sd_ratio: float
    """sd of the differences over the margin (unknown before a sweep: read the rows)."""
    fixed_configs: int
    """Fixed design, 80% power: simulated (:data:`EQUIVALENCE_POWER`)."""
    fixed_configs_approx: int
    """Its normal approximation (:func:`configs_for_equivalence`)."""
    sequential_budget: int
    """Sequential rule, budget for 80% power (:data:`SEQUENTIAL_POWER`)."""
    sequential_expected: float
    """Expected configurations the sequential rule takes to stop at a true difference of 0."""


def min_configs_for_verdict(alpha: float = 0.05, sequential: bool = False) -> int:
    """Fewest configurations at which a family can reach any verdict: for the fixed design
    the smallest n with ``2^-n <= alpha`` (no one-sided signed-rank test rejects below it:
    5 at 0.05), for the sequential rule :data:`MIN_FIRST_LOOK` (its first look). A fixed
    compare sweep with fewer configurations per family cannot answer.

    Raises:
        ValueError: if ``alpha`` is outside (0, 0.5).
    """
    alpha = _check_alpha(alpha)
    fixed = math.ceil(math.log2(1.0 / alpha) - _LEVEL_RTOL)
    return max(fixed, MIN_FIRST_LOOK) if sequential else fixed


def sequential_looks(first: int, every: int, budget: int) -> tuple[int, ...]:
    """The looks ``first, first + every, ...`` up to and including ``budget`` (the last look
    is the budget even when ``every`` does not land on it).

    Raises:
        ValueError: if ``first``, ``every`` or ``budget`` is not an integer >= 1, or
            ``budget < first``.
    """
    first = _int_at_least("first", first, 1)
    every = _int_at_least("every", every, 1)
    budget = _int_at_least("budget", budget, first)
    looks = list(range(first, budget, every))
    return (*looks, budget)


def comparison_plan() -> tuple[ComparisonPlan, ...]:
    """Per sd(d) / margin of :data:`POWER_TABLE_SD_RATIOS`: the configurations for 80% power
    of the fixed design (simulated and approximated) and the sequential rule's budget and
    expected configurations (default looks), at alpha 0.05. Table look-ups: cheap at the
    start of a sweep."""
    return tuple(
        ComparisonPlan(
            sd_ratio=r,
            fixed_configs=EQUIVALENCE_POWER[r],
            fixed_configs_approx=configs_for_equivalence(r),
            sequential_budget=SEQUENTIAL_POWER[r].budget,
            sequential_expected=SEQUENTIAL_POWER[r].expected_configs,
        )
        for r in POWER_TABLE_SD_RATIOS
    )


# ---------------------------------------------------------------------------------------
# Sharpe-ratio difference of two return series over the same bars.

_HAC_KERNELS = ("parzen", "bartlett")
_MIN_SHARPE_OBS = 8
BOOTSTRAP_RESAMPLES = 1000
"""Default resamples of the studentized block bootstrap (``method="bootstrap"``)."""


class SharpeDifferenceTest(NamedTuple):
    """Test of equal Sharpe ratios of two return series observed over the same bars."""

    statistic: float
    """z statistic, asymptotically N(0, 1) under equal Sharpe ratios; > 0 when a's
    Sharpe is higher. NaN when undefined (see ``note``)."""
    pvalue: float
    """Two-sided p-value ``2 * Phi(-|z|)``; NaN when undefined."""
    difference: float
    """Per-period Sharpe of a minus that of b (``mean / std(ddof=1)``)."""
    std_error: float
    """Standard error of ``difference`` (so ``statistic = difference / std_error``)."""
    method: Literal["jkm", "hac", "bootstrap"]
    """"jkm": Jobson-Korkie with Memmel's correction; "hac": Ledoit-Wolf (2008) HAC;
    "bootstrap": Ledoit-Wolf's studentized circular block bootstrap of that statistic."""
    n_obs: int
    """Number of bars."""
    bandwidth: float
    """HAC kernel bandwidth used (0.0 for "jkm")."""
    note: str
    """Why the statistic is special-cased, or ""."""
    block_size: int = 0
    """Bars per circular block ("bootstrap" only, else 0)."""
    n_boot: int = 0
    """Bootstrap resamples ("bootstrap" only, else 0)."""


def sharpe_difference_test(
    returns_a: Sequence[float] | np.ndarray,
    returns_b: Sequence[float] | np.ndarray,
    method: Literal["jkm", "hac", "bootstrap"] = "jkm",
    kernel: Literal["parzen", "bartlett"] = "parzen",
    bandwidth: float | None = None,
    *,
    block_size: int | None = None,
    n_boot: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> SharpeDifferenceTest:
    """Test H0: equal Sharpe ratios of two strategies' per-period returns on the same bars.

    ``method="jkm"``: Jobson & Korkie (1981) with Memmel's (2003) correction. With
    sample means ``m``, standard deviations ``s`` and covariance ``s_ab`` (ddof=1),
    ``z = (s_b m_a - s_a m_b) / sqrt(theta)``,
    ``theta = (2 s_a^2 s_b^2 - 2 s_a s_b s_ab + m_a^2 s_b^2 / 2 + m_b^2 s_a^2 / 2
    - m_a m_b s_ab^2 / (s_a s_b)) / T``. It assumes i.i.d. bivariate normal returns;
    ``std_error = sqrt(theta) / (s_a s_b)``.

    ``method="hac"``: Ledoit & Wolf (2008), section 3.1. The difference ``f(v) = m_a /
    sqrt(g_a - m_a^2) - m_b / sqrt(g_b - m_b^2)`` of the uncentred moments ``v = (m_a,
    m_b, g_a, g_b)`` (g = mean of r^2) gets the delta-method standard error
    ``sqrt(grad f' Psi grad f / T)``, with ``Psi`` the kernel (HAC) estimate of the
    long-run covariance of ``y_t = (r_a - m_a, r_b - m_b, r_a^2 - g_a, r_b^2 - g_b)``:
    ``Psi = T/(T-4) * sum_j k(j/S) Gamma(j)`` (LW's small-sample factor). Valid under heavy
    tails and serial correlation. The kernel is Parzen by default (positive semi-definite;
    LW used a prewhitened quadratic-spectral kernel, not reproduced here) or Bartlett
    (Newey-West); the bandwidth ``S`` defaults to Andrews' (1991) AR(1) plug-in rule
    fitted to the scalar influence series ``psi_t = grad f' y_t`` (``2.6614 (alpha2
    T)^(1/5)``, ``alpha2 = 4 rho^2 / (1 - rho)^4`` for Parzen; ``1.1447 (alpha1 T)^(1/3)``,
    ``alpha1 = 4 rho^2 / ((1 - rho)^2 (1 + rho)^2)`` for Bartlett; ``rho`` clipped to
    +-0.97). ``psi`` is unit-free, so the test does not depend on the returns' units.
    The delta method runs on ddof=0 moments; ``difference`` and ``std_error`` are both
    reported for the ddof=1 Sharpes (a common factor ``sqrt((T-1)/T)``), as for "jkm".

    ``method="bootstrap"``: Ledoit & Wolf (2008), section 3.2: the HAC statistic ``d =
    |z|`` against ``n_boot`` circular block resamples (``T // block_size`` blocks with
    starts ``numpy.random.default_rng(seed).integers(0, T, (n_boot, T // block_size))``),
    each studentized by its own block standard error (``Psi* = mean_j zeta_j zeta_j'``,
    ``zeta_j = sqrt(b) * mean of block j of y*``): ``p = (#{|Delta* - Delta| / se* >= d}
    + 1) / (n_boot + 1)``. ``block_size`` defaults to ``round(T^(1/3))``, or half the HAC
    bandwidth when that is longer (stronger serial correlation). ``statistic``,
    ``std_error`` and ``bandwidth`` are the HAC ones. Sizes measured: docs/statistics.md.

    Degenerate inputs: identical series -> statistic 0, p-value 1 ("identical returns");
    a constant series (e.g. a flat trial) has no Sharpe ratio -> NaN with a note.

    Args:
        returns_a, returns_b: Per-period returns over the same bars, equal length >= 8.
        method: "jkm", "hac" or "bootstrap".
        kernel: HAC kernel ("hac" and "bootstrap").
        bandwidth: HAC bandwidth ``S`` > 0 (lags with ``k(j/S) > 0`` enter; ``S <= 1``
            means no lag, the i.i.d. delta method); None for the automatic rule.
        block_size: Bars per bootstrap block, 1 <= b <= T / 2; None for the rule above.
        n_boot: Bootstrap resamples, >= 1.
        seed: Seed of the bootstrap's generator (the same seed, the same p-value).

    Raises:
        ValueError: on shapes that differ or are not 1-D, fewer than 8 bars, NaN/inf
            (named by index), an unknown ``method`` / ``kernel``, ``bandwidth <= 0``, or a
            bad ``block_size`` / ``n_boot``.
    """
    a = np.asarray(returns_a, dtype=np.float64)
    b = np.asarray(returns_b, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ValueError(
            "returns_a and returns_b must be 1-D over the same bars, got shapes "
            f"{a.shape} and {b.shape}"
        )
    for name, series in (("returns_a", a), ("returns_b", b)):
        bad = np.flatnonzero(~np.isfinite(series))
        if bad.size:
            raise ValueError(
                f"{name} must be finite; index {int(bad[0])} is {float(series[bad[0]])!r}"
            )
    if a.size < _MIN_SHARPE_OBS:
        raise ValueError(f"need at least {_MIN_SHARPE_OBS} bars, got {a.size}")
    if method not in ("jkm", "hac", "bootstrap"):
        raise ValueError(f"method must be 'jkm', 'hac' or 'bootstrap', got {method!r}")
    if kernel not in _HAC_KERNELS:
        raise ValueError(f"kernel must be one of {_HAC_KERNELS}, got {kernel!r}")
    if bandwidth is not None and not (math.isfinite(bandwidth) and bandwidth > 0.0):
        raise ValueError(f"bandwidth must be > 0 (or None for automatic), got {bandwidth!r}")
    t_obs = int(a.size)
    block, resamples = 0, 0
    if method == "bootstrap":
        # The default grows with the HAC bandwidth below, once it is known.
        block = max(1, round(t_obs ** (1.0 / 3.0))) if block_size is None else block_size
        block = _int_at_least("block_size", block, 1)
        if block > t_obs // 2:
            raise ValueError(f"block_size must be <= T / 2 = {t_obs // 2}, got {block}")
        resamples = _int_at_least("n_boot", n_boot, 1)
    nan = float("nan")
    if np.array_equal(a, b):
        return SharpeDifferenceTest(
            0.0, 1.0, 0.0, 0.0, method, t_obs, 0.0, "identical returns", block, resamples
        )
    s_a, s_b = float(a.std(ddof=1)), float(b.std(ddof=1))
    if s_a == 0.0 or s_b == 0.0:
        which = "returns_a" if s_a == 0.0 else "returns_b"
        return SharpeDifferenceTest(
            nan, nan, nan, nan, method, t_obs, 0.0,
            f"{which} is constant: its Sharpe ratio is undefined", block, resamples,
        )  # fmt: skip
    m_a, m_b = float(a.mean()), float(b.mean())
    difference = m_a / s_a - m_b / s_b
    if method == "jkm":
        s_ab = float(np.cov(a, b, ddof=1)[0, 1])
        theta = (
            2.0 * s_a**2 * s_b**2
            - 2.0 * s_a * s_b * s_ab
            + 0.5 * m_a**2 * s_b**2
            + 0.5 * m_b**2 * s_a**2
            - m_a * m_b / (s_a * s_b) * s_ab**2
        ) / t_obs
        used_bandwidth = 0.0
        std_error = math.sqrt(theta) / (s_a * s_b) if theta > 0.0 else 0.0
        numerator = s_b * m_a - s_a * m_b
        z = numerator / math.sqrt(theta) if theta > 0.0 else nan
    else:
        z, std_error, used_bandwidth = _ledoit_wolf_hac(a, b, kernel, bandwidth)
        if method == "bootstrap" and block_size is None:
            block = min(max(block, round(used_bandwidth / 2.0)), t_obs // 2)
    if not math.isfinite(z):
        return SharpeDifferenceTest(
            nan, nan, difference, std_error, method, t_obs, used_bandwidth,
            "zero standard error: the test is undefined", block, resamples,
        )  # fmt: skip
    if method == "bootstrap":
        pvalue = _block_bootstrap_pvalue(a, b, abs(z), block, resamples, seed)
    else:
        pvalue = float(2.0 * special.ndtr(-abs(z)))
    return SharpeDifferenceTest(
        float(z), pvalue, difference, std_error, method, t_obs, used_bandwidth, "", block,
        resamples,
    )  # fmt: skip


def _kernel_weights(kernel: str, lags: np.ndarray, bandwidth: float) -> np.ndarray:
    x = lags / bandwidth
    if kernel == "bartlett":
        return np.clip(1.0 - x, 0.0, None)
    # Parzen.
    return np.where(x <= 0.5, 1.0 - 6.0 * x**2 + 6.0 * x**3, np.clip(2.0 * (1.0 - x) ** 3, 0, None))


def _andrews_bandwidth(psi: np.ndarray, kernel: str) -> float:
    """Andrews (1991) AR(1) plug-in bandwidth of one (mean-zero) series ``psi`` (T,)."""
    lagged, current = psi[:-1], psi[1:]
    denom = float(lagged @ lagged)
    rho = float(np.clip(lagged @ current / denom, -0.97, 0.97)) if denom > 0 else 0.0
    t_obs = psi.size
    if kernel == "bartlett":
        alpha1 = 4.0 * rho**2 / ((1.0 - rho) ** 2 * (1.0 + rho) ** 2)
        return 1.1447 * (alpha1 * t_obs) ** (1.0 / 3.0)
    alpha2 = 4.0 * rho**2 / (1.0 - rho) ** 4
    return 2.6614 * (alpha2 * t_obs) ** 0.2


def _sharpe_gradient(m_a: Any, m_b: Any, g_a: Any, g_b: Any) -> tuple[Any, Any]:
    """(delta, gradient) of ``f = m_a/sqrt(g_a - m_a^2) - m_b/sqrt(g_b - m_b^2)`` at the
    uncentred moments (scalars, or arrays with the 4 gradient entries on the last axis)."""
    var_a, var_b = g_a - m_a**2, g_b - m_b**2
    delta = m_a / np.sqrt(var_a) - m_b / np.sqrt(var_b)
    gradient = np.stack(
        [g_a / var_a**1.5, -g_b / var_b**1.5, -m_a / (2 * var_a**1.5), m_b / (2 * var_b**1.5)],
        axis=-1,
    )
    return delta, gradient


def _ledoit_wolf_hac(
    a: np.ndarray, b: np.ndarray, kernel: str, bandwidth: float | None
) -> tuple[float, float, float]:
    """(z, std_error, bandwidth) of the Ledoit-Wolf (2008) HAC test of equal Sharpe ratios."""
    t_obs = a.size
    m_a, m_b = a.mean(), b.mean()
    g_a, g_b = np.mean(a * a), np.mean(b * b)
    delta, gradient = _sharpe_gradient(m_a, m_b, g_a, g_b)
    y = np.column_stack([a - m_a, b - m_b, a * a - g_a, b * b - g_b])  # (T, 4)
    # The influence series: grad' Psi grad is the kernel long-run variance of psi.
    psi = y @ gradient  # (T,)
    s = _andrews_bandwidth(psi, kernel) if bandwidth is None else float(bandwidth)
    long_run = float(psi @ psi) / t_obs  # Gamma(0)
    max_lag = min(math.ceil(s) - 1 if s > 0 else 0, t_obs - 1)
    if max_lag >= 1:
        lags = np.arange(1, max_lag + 1)
        weights = _kernel_weights(kernel, lags.astype(np.float64), s)
        for lag, weight in zip(lags, weights, strict=True):
            if weight > 0.0:
                long_run += 2.0 * weight * float(psi[lag:] @ psi[:-lag]) / t_obs
    long_run *= t_obs / (t_obs - 4.0)
    variance = long_run / t_obs
    if not variance > 0.0:
        return float("nan"), 0.0, s
    # The se of the ddof=0 difference, rescaled to the ddof=1 Sharpes that are reported
    # (a common factor sqrt((T - 1) / T)), so that statistic = difference / std_error.
    std_error = math.sqrt(variance)
    z = float(delta / std_error)
    return z, std_error * math.sqrt((t_obs - 1.0) / t_obs), s


def _block_bootstrap_pvalue(
    a: np.ndarray, b: np.ndarray, d: float, block: int, n_boot: int, seed: int
) -> float:
    """Ledoit-Wolf (2008) section 3.2 p-value of the studentized statistic ``d = |z|``.

    A resample is ``T // block`` circular blocks; everything a resample needs is in the sums
    of ``u_t = (a, b, a^2, b^2)`` over its blocks, so those sums are taken once for every
    start (``B``, (T, 4)) and gathered: (n_boot, blocks, 4) numbers, not the series.
    """
    t_obs = a.size
    n_blocks = t_obs // block
    u = np.column_stack([a, b, a * a, b * b])  # (T, 4)
    wrapped = np.concatenate([u, u[: block - 1]])
    cumulative = np.concatenate([np.zeros((1, 4)), np.cumsum(wrapped, axis=0)])
    block_sums = cumulative[block : block + t_obs] - cumulative[:t_obs]  # (T, 4) by start
    m_a, m_b, g_a, g_b = u.mean(axis=0)
    delta, _ = _sharpe_gradient(m_a, m_b, g_a, g_b)
    starts = np.random.default_rng(seed).integers(0, t_obs, (n_boot, n_blocks))
    sums = block_sums[starts]  # (M, blocks, 4)
    moments = sums.sum(axis=1) / (n_blocks * block)  # (M, 4)
    with np.errstate(divide="ignore", invalid="ignore"):
        delta_star, gradient = _sharpe_gradient(*moments.T)  # (M,), (M, 4)
        # zeta_j = sqrt(b) * (block mean - resample mean); psi_j = grad' zeta_j.
        zeta_psi = (
            np.einsum("mjk,mk->mj", sums, gradient) - block * (moments * gradient).sum(1)[:, None]
        ) / math.sqrt(block)
        se_star = np.sqrt(np.mean(zeta_psi**2, axis=1) / (n_blocks * block))
        d_star = np.abs(delta_star - delta) / se_star
    # A degenerate resample (a constant series: no se) counts against rejection.
    exceed = int(np.count_nonzero(~(d_star < d)))
    return (exceed + 1.0) / (n_boot + 1.0)


# ---------------------------------------------------------------------------------------
# Probability of backtest overfitting (CSCV).


def _subset_sharpes(
    sums: np.ndarray, squares: np.ndarray, counts: np.ndarray, centre: np.ndarray
) -> np.ndarray:
    """Per-period Sharpe (ddof=1) of row subsets from the sums of ``x = r - centre`` and of
    ``x^2`` over the subset and its size; 0.0 for a flat subset (the backtest's rule)."""
    shifted_mean = sums / counts
    variance = (squares - counts * shifted_mean**2) / (counts - 1.0)
    sd = np.sqrt(np.clip(variance, 0.0, None))
    mean = shifted_mean + centre
    # A constant subset leaves only rounding in sd; call it flat rather than divide by it.
    flat = sd <= 1e-12 * np.abs(mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(flat | (sd == 0.0), 0.0, mean / sd)


def probability_of_backtest_overfitting(returns: np.ndarray, n_blocks: int = 16) -> float:
    """PBO by combinatorially symmetric cross-validation (Bailey, Borwein, López de Prado &
    Zhu 2015, "The Probability of Backtest Overfitting").

    The (T, N) matrix of per-period returns of N trials over the same T bars is cut into
    ``n_blocks`` = S contiguous blocks (sizes differ by at most one bar when S does not
    divide T, as ``numpy.array_split``). For each of the C(S, S/2) choices of S/2 blocks as
    in-sample (the rest out-of-sample), the trial with the best in-sample Sharpe
    (``mean / std(ddof=1)``, first trial on ties) is ranked by out-of-sample Sharpe among
    the N (rank 1 = worst, average rank on ties), ``w = rank / (N + 1)``, ``lambda =
    ln(w / (1 - w))``; PBO is the share of choices with ``lambda <= 0``, i.e. where the
    in-sample winner is at or below the out-of-sample median. Near 0: selection carries
    over; near or above 0.5: the best in-sample trial is no better than a random one.

    Vectorised: block sums of the returns and of their squares make each choice's in- and
    out-of-sample Sharpes a matrix product (12870 choices for S = 16).

    Raises:
        ValueError: if ``returns`` is not 2-D with N >= 2 trials, has NaN/inf, or S is not
            an even integer with 2 <= S and 2 bars per block (T >= 2 S).
    """
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"returns must be 2-D (T bars, N trials), got shape {r.shape}")
    t_obs, n_trials = r.shape
    if n_trials < 2:
        raise ValueError(f"returns must hold at least 2 trials (columns), got {n_trials}")
    bad = np.argwhere(~np.isfinite(r))
    if bad.size:
        row, col = (int(v) for v in bad[0])
        raise ValueError(f"returns must be finite; row {row}, trial {col} is {r[row, col]!r}")
    n_blocks = _int_at_least("n_blocks", n_blocks, 2)
    if n_blocks % 2:
        raise ValueError(f"n_blocks must be even, got {n_blocks}")
    if t_obs < 2 * n_blocks:
        raise ValueError(
            f"returns has {t_obs} bars: at least 2 per block needed for n_blocks={n_blocks}"
        )
    # numpy.array_split's blocks: the first T mod S blocks hold one bar more.
    base, extra = divmod(t_obs, n_blocks)
    sizes = np.full(n_blocks, base, dtype=np.int64)
    sizes[:extra] += 1
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # Centring each trial first keeps sum-of-squares variances free of cancellation (the
    # variance is shift-invariant; the mean is shifted back in _block_sharpes).
    centre = r.mean(axis=0)  # (N,)
    x = r - centre
    sums = np.add.reduceat(x, starts, axis=0)  # (S, N)
    squares = np.add.reduceat(x * x, starts, axis=0)  # (S, N)
    sizes = sizes.astype(np.float64)

    chosen = np.array(list(itertools.combinations(range(n_blocks), n_blocks // 2)))
    in_sample = np.zeros((chosen.shape[0], n_blocks))  # (C, S) membership
    np.put_along_axis(in_sample, chosen, 1.0, axis=1)
    out_sample = 1.0 - in_sample
    # The choices in chunks, so the (chunk, N) Sharpe arrays stay a few MB however many
    # trials a sweep has (all C at once took about 0.9 GB at N = 1000).
    chunk = max(1, PBO_CHUNK_VALUES // n_trials)
    overfit = 0
    for start in range(0, chosen.shape[0], chunk):
        ins, outs = in_sample[start : start + chunk], out_sample[start : start + chunk]
        is_sr = _subset_sharpes(ins @ sums, ins @ squares, (ins @ sizes)[:, None], centre)
        oos_sr = _subset_sharpes(outs @ sums, outs @ squares, (outs @ sizes)[:, None], centre)
        best = np.argmax(is_sr, axis=1)  # (chunk,)
        best_oos = oos_sr[np.arange(best.size), best][:, None]
        below = np.sum(oos_sr < best_oos, axis=1)
        rank = 1.0 + below + 0.5 * (np.sum(oos_sr == best_oos, axis=1) - 1)
        w = rank / (n_trials + 1.0)
        overfit += int(np.sum(np.log(w / (1.0 - w)) <= 0.0))
    return overfit / chosen.shape[0]


PBO_CHUNK_VALUES = 1 << 18
"""Sharpe values (choices x trials) :func:`probability_of_backtest_overfitting` holds per
array at once: 2 MB of float64."""


# ---------------------------------------------------------------------------------------
# Paired f32-vs-bf16 comparison.

_MIN_PAIRS = 2


@dataclass
class PairedComparison:
    """Paired comparison of two precisions' Sharpe ratios, differences taken as ``b - a``.

    Statistics that cannot be computed are NaN (``None`` in :meth:`to_dict`) and the reason
    is in ``notes``; nothing here raises on degenerate data, because a comparison run that
    diverged in one precision is a result to report, not an error.
    """

    label_a: str
    """Name of the first sample (default "f32")."""
    label_b: str
    """Name of the second sample (default "bf16")."""
    n_pairs_total: int
    """Pairs passed in."""
    n_pairs_used: int
    """Pairs with both values finite; every statistic below is computed on these only."""
    n_excluded_nonfinite: int
    """Pairs dropped because either side is NaN/inf (a diverged trial)."""
    excluded_indices: list[int]
    """Input positions of the excluded pairs, so the diverged trials can be looked up."""
    median_a: float
    """Median of ``a`` over the used pairs."""
    median_b: float
    """Median of ``b`` over the used pairs."""
    mean_difference: float
    """Mean of ``b - a``: the average effect, which the pseudo-median need not be."""
    mean_low: float
    """Lower end of the t-interval of the mean difference at ``confidence``."""
    mean_high: float
    """Upper end of that t-interval."""
    median_difference: float
    """Median of ``b - a``: the point estimate that the CI brackets."""
    wilcoxon_statistic: float
    """``min(T+, T-)`` of the non-zero differences (scipy's two-sided statistic)."""
    wilcoxon_pvalue: float
    """Two-sided p-value of :func:`paired_signed_rank_test` on ``b - a``: zero differences
    dropped, exact distribution of the rest up to 50 of them."""
    wilcoxon_method: str
    """"exact" or "normal": which null distribution gave ``wilcoxon_pvalue`` ("" if none)."""
    wilcoxon_n_nonzero: int
    """Non-zero differences that entered the Wilcoxon test."""
    hl_estimate: float
    """Hodges-Lehmann estimate of the centre of ``b - a`` over every difference, zeros
    included: the estimate the verdict (:func:`equivalence_test`) reads."""
    hl_low: float
    """Lower end of the exact signed-rank (Hodges-Lehmann) CI, zeros included."""
    hl_high: float
    """Upper end of the Hodges-Lehmann CI."""
    hl_confidence: float
    """Confidence the Hodges-Lehmann CI achieves (discrete at small n; below ``confidence``
    when n is too small to reach it, e.g. 87.5% at n = 4 for 95%)."""
    hl_nonzero_estimate: float
    """The Hodges-Lehmann estimate with zero differences dropped (R's ``wilcox.test``),
    whose CI inverts ``wilcoxon_pvalue``; equal to ``hl_estimate`` without zeros."""
    hl_nonzero_low: float
    """Lower end of the zero-dropped CI (at ``confidence``)."""
    hl_nonzero_high: float
    """Upper end of the zero-dropped CI."""
    confidence: float
    """Requested confidence of the Hodges-Lehmann CI (``hl_confidence`` is the achieved one)."""
    mannwhitney_statistic: float
    """Mann-Whitney U of ``a`` vs ``b`` (descriptive: ignores the pairing)."""
    mannwhitney_pvalue: float
    """Two-sided Mann-Whitney p-value (descriptive)."""
    ks_statistic: float
    """Two-sample Kolmogorov-Smirnov statistic of ``a`` vs ``b`` (descriptive)."""
    ks_pvalue: float
    """Two-sided KS p-value (descriptive)."""
    notes: list[str] = field(default_factory=list)
    """Why a statistic is missing or special-cased, and which pairs were excluded."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (``json.dumps(..., allow_nan=False)`` works): NaN/inf -> None."""

        def clean(value: Any) -> Any:
            if isinstance(value, float | np.floating):
                return float(value) if math.isfinite(value) else None
            if isinstance(value, np.integer):
                return int(value)
            if isinstance(value, list | tuple):
                return [clean(v) for v in value]
            return value

        return {key: clean(value) for key, value in asdict(self).items()}


def compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    labels: tuple[str, str] = ("f32", "bf16"),
    confidence: float = 0.95,
) -> PairedComparison:
    """Compare paired Sharpe ratios of two precisions (``a[i]`` and ``b[i]`` are one pair).

    Pairs where either value is non-finite (a trial that diverged) are excluded from every
    statistic and counted in ``n_excluded_nonfinite`` / ``excluded_indices`` with a note;
    they are never dropped silently, because a precision that diverges more often is itself
    a finding. Mann-Whitney U and KS use the same pairs so that all statistics describe one
    population.

    The inputs may be per-period or annualised Sharpe ratios; the differences and the CI
    are in the same units as the inputs and the rank tests do not depend on the scale.

    Args:
        a: Sharpe ratios of the first precision (default label "f32").
        b: Sharpe ratios of the second precision, same length as ``a``.
        labels: Names of ``a`` and ``b`` used in the result and its notes.
        confidence: Requested confidence of the Hodges-Lehmann CI, in (0, 1).

    The Wilcoxon p-value is :func:`paired_signed_rank_test`'s (zeros dropped, exact up to
    50 non-zero differences); the Hodges-Lehmann interval (``hl_*``, every difference's
    Walsh averages, zeros included, as the verdict reads them) is the CI to report, with
    ``hl_confidence`` its achieved confidence (a note says when the requested one is out
    of reach at this n); ``hl_nonzero_*`` is the zero-dropped one that inverts the
    Wilcoxon p (a note gives it when zeros occur). ``mean_low`` / ``mean_high``: the
    t-interval of the mean difference. There is no bootstrap: a BCa CI of the median
    covers 49-87% at n = 2..4 for a stated 95% (docs/statistics.md).

    Returns:
        A :class:`PairedComparison`. With fewer than 2 usable pairs the tests and the CI
        are NaN with the note "too few pairs"; with all differences zero the Wilcoxon
        p-value is 1.0 (no evidence of a difference) and the HL CI is the point 0.

    Raises:
        ValueError: if ``a`` and ``b`` differ in length or are not 1-D, or on a bad
            ``labels`` / ``confidence``.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"a and b must be 1-D sequences, got shapes {x.shape} and {y.shape}")
    if x.shape != y.shape:
        raise ValueError(f"a and b must be paired (same length), got {x.size} and {y.size} values")
    if len(labels) != 2 or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"labels must be two strings, got {labels!r}")
    confidence = _finite("confidence", confidence)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    label_a, label_b = labels

    notes: list[str] = []
    finite = np.isfinite(x) & np.isfinite(y)
    excluded = [int(i) for i in np.flatnonzero(~finite)]
    if excluded:
        notes.append(
            f"excluded {len(excluded)} of {x.size} pair(s) where {label_a} or {label_b} Sharpe "
            f"is NaN/inf (diverged trial): indices {excluded}"
        )
    xa, yb = x[finite], y[finite]
    diff = yb - xa  # (n_used,)
    n_used = int(diff.size)

    nan = float("nan")
    median_a = float(np.median(xa)) if n_used else nan
    median_b = float(np.median(yb)) if n_used else nan
    mean_diff = float(np.mean(diff)) if n_used else nan
    median_diff = float(np.median(diff)) if n_used else nan

    w_stat = w_p = mw_stat = mw_p = ks_stat = ks_p = nan
    hl_estimate = hl_low = hl_high = hl_confidence = nan
    nz_estimate = nz_low = nz_high = mean_low = mean_high = nan
    w_method, w_nonzero = "", 0
    if n_used < _MIN_PAIRS:
        notes.append(
            f"too few pairs: {n_used} finite pair(s), at least {_MIN_PAIRS} needed for the "
            "tests and the CI; reported as NaN"
        )
    else:
        signed_rank = paired_signed_rank_test(diff)
        n_nonzero = signed_rank.n_nonzero
        w_method, w_nonzero = signed_rank.method, n_nonzero
        if n_nonzero == 0:
            w_stat, w_p = 0.0, 1.0
            notes.append(
                "all paired differences are zero: no evidence of a difference, Wilcoxon "
                "statistic 0 and p-value set to 1.0"
            )
        else:
            t_total = n_nonzero * (n_nonzero + 1) / 2.0  # sum of the (mid)ranks
            w_stat = min(signed_rank.statistic, t_total - signed_rank.statistic)
            w_p = signed_rank.pvalue
            if n_nonzero < n_used:
                notes.append(
                    f"Wilcoxon dropped {n_used - n_nonzero} zero difference(s) "
                    f"(zero_method='wilcox'); {signed_rank.method} p-value of the "
                    f"{n_nonzero} non-zero one(s)"
                )
            if n_nonzero < 6:
                # The exact two-sided p-value is at least 2 / 2**n (0.0625 for n = 5), so
                # a "not significant" result here says little about the precisions.
                notes.append(
                    f"only {n_nonzero} non-zero difference(s): the Wilcoxon test has almost "
                    f"no power (exact two-sided p-value >= {2.0 / 2.0**n_nonzero:.4g})"
                )
        hl = hodges_lehmann_interval(diff, confidence, zeros="keep")
        hl_estimate, hl_low, hl_high, hl_confidence = hl.estimate, hl.low, hl.high, hl.confidence
        if not hl.achieved:
            notes.append(
                f"a {confidence:.0%} Hodges-Lehmann CI is not achievable with {n_used} pairs: "
                f"the widest one, [min, max], is reported; it covers {hl.confidence:.1%}"
            )
        nonzero = hodges_lehmann_interval(diff, confidence, zeros="drop")
        nz_estimate, nz_low, nz_high = nonzero.estimate, nonzero.low, nonzero.high
        if 0 < n_nonzero < n_used:
            notes.append(
                f"the Hodges-Lehmann estimate and CI keep the {n_used - n_nonzero} zero "
                f"difference(s), as the verdict does; with them dropped, as the Wilcoxon "
                f"p-value does: {nz_estimate:+.3f} [{nz_low:+.3f}, {nz_high:+.3f}] "
                f"({nonzero.confidence:.1%})"
            )
        mean_low, mean_high = _mean_interval(diff, confidence)
        mannwhitney = stats.mannwhitneyu(xa, yb, alternative="two-sided")
        mw_stat, mw_p = float(mannwhitney.statistic), float(mannwhitney.pvalue)
        ks = stats.ks_2samp(xa, yb)
        ks_stat, ks_p = float(ks.statistic), float(ks.pvalue)

    return PairedComparison(
        label_a=label_a,
        label_b=label_b,
        n_pairs_total=int(x.size),
        n_pairs_used=n_used,
        n_excluded_nonfinite=len(excluded),
        excluded_indices=excluded,
        median_a=median_a,
        median_b=median_b,
        mean_difference=mean_diff,
        mean_low=mean_low,
        mean_high=mean_high,
        median_difference=median_diff,
        wilcoxon_statistic=w_stat,
        wilcoxon_pvalue=w_p,
        wilcoxon_method=w_method,
        wilcoxon_n_nonzero=w_nonzero,
        hl_estimate=hl_estimate,
        hl_low=hl_low,
        hl_high=hl_high,
        hl_confidence=hl_confidence,
        hl_nonzero_estimate=nz_estimate,
        hl_nonzero_low=nz_low,
        hl_nonzero_high=nz_high,
        confidence=confidence,
        mannwhitney_statistic=mw_stat,
        mannwhitney_pvalue=mw_p,
        ks_statistic=ks_stat,
        ks_pvalue=ks_p,
        notes=notes,
    )
