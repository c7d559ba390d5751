"""Comparison statistics of a paired f32-vs-bf16 run, and selection-bias corrections.

Two questions are answered here, and they are kept apart on purpose:

1. *Does precision change out-of-sample Sharpe?* A comparison run is paired (every sampled
   configuration and seed runs once per precision), so the primary evidence is the
   per-pair difference ``b - a``: a Wilcoxon signed-rank test and a BCa bootstrap CI of
   the median difference (:func:`compare_paired`). Mann-Whitney U and two-sample KS
   ignore the pairing and are reported as descriptive checks of the two distributions.
2. *Is the best trial's Sharpe better than luck?* The Probabilistic Sharpe Ratio (Bailey &
   López de Prado 2012) and the Deflated Sharpe Ratio (Bailey & López de Prado 2014),
   which benchmarks against the expected maximum Sharpe of ``n_trials`` unskilled trials.

Units: every Sharpe ratio taken by the PSR/DSR functions is *per period* (not annualised),
``n_obs`` counts those periods, and ``kurtosis`` is *raw* (non-excess; normal = 3). An
annualised Sharpe must be divided by ``sqrt(periods_per_year)`` and an annualised Sharpe
variance by ``periods_per_year`` first; otherwise the PSR saturates at 1.

All distribution functions and tests come from :mod:`scipy.stats`; nothing that scipy
provides is re-derived here.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

__all__ = [
    "PairedComparison",
    "SharpeMoments",
    "compare_paired",
    "deflated_sharpe_ratio",
    "expected_max_sharpe",
    "probabilistic_sharpe_ratio",
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


# ---------------------------------------------------------------------------------------
# Probabilistic and deflated Sharpe ratio.


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
    z = (sr - sr_benchmark) * math.sqrt(n_obs - 1) / math.sqrt(variance_factor)
    return float(stats.norm.cdf(z))


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
    z_n = stats.norm.isf(1.0 / n_trials)
    z_ne = stats.norm.isf(1.0 / (n_trials * math.e))
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


class SharpeMoments(NamedTuple):
    """Inputs of the PSR/DSR measured on one return series."""

    sr: float
    """Per-period Sharpe ratio ``mean / std(ddof=1)``; 0.0 for constant returns."""
    skew: float
    """Sample skewness (``scipy.stats.skew``, biased estimator)."""
    kurtosis: float
    """Raw sample kurtosis (``scipy.stats.kurtosis(fisher=False)``, normal = 3)."""
    n_obs: int
    """Number of observations."""


def sharpe_moments(returns: np.ndarray) -> SharpeMoments:
    """Per-period Sharpe, skewness and raw kurtosis of a 1-D series of returns.

    The Sharpe uses the same ``ddof=1`` standard deviation as
    :func:`trainables.backtest.backtest`, so ``sr * sqrt(periods_per_year)`` equals that
    backtest's annualised Sharpe. Skewness and kurtosis use scipy's default (biased)
    moment estimators, which is what the PSR's asymptotic variance is written in.

    Constant returns (e.g. a flat strategy) have no defined Sharpe or higher moments; they
    are reported as ``sr = 0.0`` (the backtest's convention), ``skew = 0.0`` and
    ``kurtosis = 3.0`` so that PSR/DSR stay computable. With ``sr = 0`` the moments drop
    out of the PSR's denominator, so this choice does not affect any PSR value.

    Raises:
        ValueError: if ``returns`` is not 1-D, has fewer than 2 values, or has a
            non-finite value (the message names the first such index).
    """
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"returns must be 1-D, got shape {r.shape}")
    if r.size < 2:
        raise ValueError(f"returns must have at least 2 observations, got {r.size}")
    bad = np.flatnonzero(~np.isfinite(r))
    if bad.size:
        raise ValueError(
            f"returns must be finite; index {int(bad[0])} has value {float(r[bad[0]])!r}"
        )
    if np.all(r == r[0]):
        return SharpeMoments(sr=0.0, skew=0.0, kurtosis=3.0, n_obs=int(r.size))
    sr = float(r.mean() / r.std(ddof=1))
    skew = float(stats.skew(r))
    kurtosis = float(stats.kurtosis(r, fisher=False))
    return SharpeMoments(sr=sr, skew=skew, kurtosis=kurtosis, n_obs=int(r.size))


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
    """Mean of ``b - a``."""
    median_difference: float
    """Median of ``b - a``: the point estimate that the CI brackets."""
    wilcoxon_statistic: float
    """``scipy.stats.wilcoxon(b - a).statistic`` (zero differences dropped, 'wilcox')."""
    wilcoxon_pvalue: float
    """Two-sided p-value of the Wilcoxon signed-rank test of a zero median difference."""
    ci_low: float
    """Lower end of the BCa bootstrap CI of the median of ``b - a``."""
    ci_high: float
    """Upper end of the BCa bootstrap CI of the median of ``b - a``."""
    confidence: float
    """Confidence level of the CI."""
    n_resamples: int
    """Bootstrap resamples."""
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


def _median_ci(
    differences: np.ndarray, n_resamples: int, confidence: float, seed: int, notes: list[str]
) -> tuple[float, float]:
    """BCa bootstrap CI of the median of paired differences; degenerate cases -> notes.

    Paired resampling is resampling the differences: each pair is one unit. BCa corrects
    the percentile interval for bias and skew of the bootstrap distribution, but its
    jackknife acceleration is 0/0 when leave-one-out medians are all equal (many tied
    differences); scipy then returns NaN, which is kept rather than silently swapped for
    another method.
    """
    point = float(np.median(differences))
    if np.all(differences == differences[0]):
        notes.append(
            "all paired differences are equal: every bootstrap resample has the same median, "
            "so the CI is the point estimate"
        )
        return point, point
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = stats.bootstrap(
            (differences,),
            np.median,
            n_resamples=n_resamples,
            confidence_level=confidence,
            method="BCa",
            rng=np.random.default_rng(seed),
        )
    for w in caught:
        if issubclass(w.category, stats.DegenerateDataWarning | RuntimeWarning):
            message = f"bootstrap: {w.message}"
            if message not in notes:
                notes.append(message)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    low = float(result.confidence_interval.low)
    high = float(result.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        notes.append(
            "BCa CI of the median difference is undefined (degenerate jackknife, typically "
            "many tied differences); reported as NaN"
        )
    return low, high


def compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    labels: tuple[str, str] = ("f32", "bf16"),
    n_resamples: int = 9999,
    confidence: float = 0.95,
    seed: int = 0,
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
        n_resamples: Bootstrap resamples, >= 1.
        confidence: Confidence level of the CI, in (0, 1).
        seed: Seed of the bootstrap generator, so a report is reproducible.

    Returns:
        A :class:`PairedComparison`. With fewer than 2 usable pairs the tests and the CI
        are NaN with the note "too few pairs"; with all differences zero the Wilcoxon
        p-value is 1.0 (no evidence of a difference) and the CI is the point 0.

    Raises:
        ValueError: if ``a`` and ``b`` differ in length or are not 1-D, or on a bad
            ``labels`` / ``n_resamples`` / ``confidence``.
    """
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"a and b must be 1-D sequences, got shapes {x.shape} and {y.shape}")
    if x.shape != y.shape:
        raise ValueError(f"a and b must be paired (same length), got {x.size} and {y.size} values")
    if len(labels) != 2 or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"labels must be two strings, got {labels!r}")
    n_resamples = _int_at_least("n_resamples", n_resamples, 1)
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

    w_stat = w_p = ci_low = ci_high = mw_stat = mw_p = ks_stat = ks_p = nan
    if n_used < _MIN_PAIRS:
        notes.append(
            f"too few pairs: {n_used} finite pair(s), at least {_MIN_PAIRS} needed for the "
            "tests and the CI; reported as NaN"
        )
    else:
        n_nonzero = int(np.count_nonzero(diff))
        if n_nonzero == 0:
            w_stat, w_p = 0.0, 1.0
            notes.append(
                "all paired differences are zero: no evidence of a difference, Wilcoxon "
                "statistic 0 and p-value set to 1.0"
            )
        else:
            wilcoxon = stats.wilcoxon(diff)
            w_stat, w_p = float(wilcoxon.statistic), float(wilcoxon.pvalue)
            if n_nonzero < n_used:
                notes.append(
                    f"Wilcoxon dropped {n_used - n_nonzero} zero difference(s) "
                    "(zero_method='wilcox')"
                )
            if n_nonzero < 6:
                # The exact two-sided p-value is at least 2 / 2**n (0.0625 for n = 5), so
                # a "not significant" result here says little about the precisions.
                notes.append(
                    f"only {n_nonzero} non-zero difference(s): the Wilcoxon test has almost "
                    f"no power (exact two-sided p-value >= {2.0 / 2.0**n_nonzero:.4g})"
                )
        ci_low, ci_high = _median_ci(diff, n_resamples, confidence, seed, notes)
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
        median_difference=median_diff,
        wilcoxon_statistic=w_stat,
        wilcoxon_pvalue=w_p,
        ci_low=ci_low,
        ci_high=ci_high,
        confidence=confidence,
        n_resamples=n_resamples,
        mannwhitney_statistic=mw_stat,
        mannwhitney_pvalue=mw_p,
        ks_statistic=ks_stat,
        ks_pvalue=ks_p,
        notes=notes,
    )
