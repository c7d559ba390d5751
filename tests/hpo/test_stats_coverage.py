"""Simulated coverage of the Hodges-Lehmann interval at the small n of a comparison run.

The interval of :func:`hpo.stats.hodges_lehmann_interval` claims an *achieved*
confidence; for a continuous distribution symmetric about its centre the coverage is
exactly that number, so the simulated coverage must not fall short of it by more than
Monte Carlo error. The bootstrap CI of the median it replaces covered 49-87% at n = 2-4.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpo.stats import hodges_lehmann_interval

N_SAMPLES = 400
CENTRE = 0.3


def draw(rng: np.random.Generator, family: str, n: int) -> np.ndarray:
    if family == "normal":
        return CENTRE + rng.normal(0.0, 1.0, n)
    if family == "laplace":  # fat tails, like a Sharpe difference with an outlier pair
        return CENTRE + rng.laplace(0.0, 1.0, n)
    return CENTRE + rng.uniform(-1.0, 1.0, n)


@pytest.mark.parametrize("family", ["normal", "laplace", "uniform"])
@pytest.mark.parametrize("confidence", [0.95, 0.80])
def test_hodges_lehmann_covers_at_its_achieved_confidence(family: str, confidence: float) -> None:
    rng = np.random.default_rng(20260412)
    for n in range(4, 11):
        covered = 0
        achieved = math.nan
        for _ in range(N_SAMPLES):
            result = hodges_lehmann_interval(draw(rng, family, n), confidence)
            covered += result.low <= CENTRE <= result.high
            achieved = result.confidence  # depends on n only
        coverage = covered / N_SAMPLES
        # Never more than 3 binomial standard errors below the stated confidence.
        slack = 3.0 * math.sqrt(achieved * (1.0 - achieved) / N_SAMPLES)
        assert coverage >= achieved - slack, (family, n, coverage, achieved)
        # The stated confidence is honest, not merely the requested one: at n = 4 and 95%
        # it says 87.5%, and at every n it is at least the requested level when reachable.
        if n == 4 and confidence == 0.95:
            assert achieved == 0.875
        elif 2.0**-n <= (1 - confidence) / 2:
            assert achieved >= confidence


def test_pooled_coverage_is_not_below_the_pooled_stated_confidence() -> None:
    # Pooled over n = 4..10 the Monte Carlo error is small enough for a tight bound.
    rng = np.random.default_rng(7)
    covered, stated, total = 0, 0.0, 0
    for n in range(4, 11):
        for _ in range(N_SAMPLES):
            result = hodges_lehmann_interval(draw(rng, "normal", n), 0.9)
            covered += result.low <= CENTRE <= result.high
            stated += result.confidence
            total += 1
    mean_stated = stated / total
    slack = 2.0 * math.sqrt(mean_stated * (1 - mean_stated) / total)
    assert covered / total >= mean_stated - slack


# ---------------------------------------------------------------------------------------
# Issue 25: sizes and power of the comparison's decisions, by Monte Carlo (fixed seeds).


def ar1_pairs(rng: np.random.Generator, t: int, reps: int, phi: float = 0.3) -> np.ndarray:
    """(reps, t, 2) returns with equal true Sharpe (0.05 per bar): AR(1) with coefficient
    ``phi``, t(4) innovations scaled to unit variance, the two series correlated 0.5."""
    e = rng.standard_t(4, (reps, t + 100, 2)) / math.sqrt(2.0)
    e[..., 1] = 0.5 * e[..., 0] + math.sqrt(0.75) * e[..., 1]
    x = np.zeros_like(e)
    for i in range(1, t + 100):
        x[:, i] = phi * x[:, i - 1] + e[:, i]
    return 0.05 + x[:, 100:] * math.sqrt(1.0 - phi**2)


def test_the_bootstrap_pair_test_keeps_its_size_on_correlated_fat_tailed_returns() -> None:
    # T = 250: JKM rejects ~14% and HAC ~7% of equal-Sharpe pairs at 5% (docs/statistics.md,
    # 2000 replications); the studentized circular block bootstrap stays at about 5%.
    from hpo.stats import sharpe_difference_test

    reps = 300
    series = ar1_pairs(np.random.default_rng(2025), 250, reps)
    rejected = {"jkm": 0, "bootstrap": 0}
    for r in range(reps):
        a, b = series[r, :, 0], series[r, :, 1]
        rejected["jkm"] += sharpe_difference_test(a, b, method="jkm").pvalue <= 0.05
        boot = sharpe_difference_test(a, b, method="bootstrap", n_boot=500, seed=r)
        rejected["bootstrap"] += boot.pvalue <= 0.05
    assert rejected["bootstrap"] / reps <= 0.075
    assert rejected["jkm"] / reps >= 0.10  # why JKM is descriptive only


def test_holm_keeps_the_directional_claims_of_five_families_at_five_percent() -> None:
    # Five families of ten configurations, each centred exactly on -margin (the least
    # favourable null of "worse"): one family or another reads "worse" or "better" at
    # 5% each ~20% of the time; Holm over the ten one-sided p-values keeps it at <= 5%.
    from hpo.stats import equivalence_test, holm_adjust

    rng = np.random.default_rng(25)
    reps, families, n, margin = 300, 5, 10, 0.1
    raw_claims = adjusted_claims = 0
    for _ in range(reps):
        tests = [equivalence_test(rng.normal(-margin, margin, n), margin) for _ in range(families)]
        directional = np.array([[t.pvalue_worse, t.pvalue_better] for t in tests]).ravel()
        raw_claims += bool(np.any(directional <= 0.05))
        adjusted_claims += bool(np.any(holm_adjust(directional) <= 0.05))
    assert raw_claims / reps >= 0.12
    assert adjusted_claims / reps <= 0.07


@pytest.mark.parametrize("n", [10, 20, 40])
def test_equivalent_is_rare_when_a_fifth_of_configurations_lose_half_a_sharpe(n: int) -> None:
    # 80% of configurations unchanged (noise 0.02), 20% losing 0.5: the mean difference
    # is -0.1 = -margin, the pseudo-median ~0. TOST on the HL centre alone says
    # "equivalent" ~40% of the time; with the mean's interval (t or BCa) it is the test's
    # level at the margin, 5%, once a loser is likely drawn, and at n = 10 about the
    # draws with no loser at all (0.8^10 = 11%). Until issue 39 a skew block also
    # withheld the verdict (1.2% and 0% at n = 20, 40), and every skewed family with it.
    from hpo.stats import equivalence_test

    rng = np.random.default_rng(1000 + n)
    reps = 300
    equivalent = hl_only = 0
    for _ in range(reps):
        d = rng.normal(0.0, 0.02, n) - 0.5 * (rng.random(n) < 0.2)
        result = equivalence_test(d, margin=0.1)
        equivalent += result.verdict == "equivalent"
        hl_only += result.pvalue <= 0.05
    assert hl_only / reps >= 0.25
    level = 0.05 + 3.0 * math.sqrt(0.05 * 0.95 / reps)  # 5% and three MC standard errors
    assert equivalent / reps <= (0.16 if n == 10 else level)


@pytest.mark.parametrize("ratio", [1.0, 2.0])
def test_the_power_table_is_the_simulated_power_of_the_verdict(ratio: float) -> None:
    # Normal differences centred on 0 with sd = ratio * margin, at the table's n: the
    # exact signed-rank TOST with the mean and skew checks says "equivalent" about 80% of
    # the time (the table: 10000 replications; here 300 with other seeds).
    from hpo.stats import EQUIVALENCE_POWER, equivalence_test

    rng = np.random.default_rng(int(ratio * 100))
    n, reps = EQUIVALENCE_POWER[ratio], 300
    hits = sum(
        equivalence_test(rng.normal(0.0, 0.1 * ratio, n), margin=0.1).verdict == "equivalent"
        for _ in range(reps)
    )
    assert 0.74 <= hits / reps <= 0.92
