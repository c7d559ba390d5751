"""The sequential comparison (issue 39): the rule's contract, its error rates under repeated
looks (Monte Carlo, vectorized: the rule's own batch implementation on every replication
at once), the skew-valid interval of the mean, the loss tail and the planning helpers.

Error-rate bounds are the requirement plus three Monte Carlo standard errors; the
benchmark (bench/sequential.py, bench/README.md) measures the same rates with 4,000
replications per cell.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from hpo import stats as hs
from hpo.stats import (
    DEFAULT_LOOK_EVERY,
    EQUIVALENCE_POWER,
    MIN_FIRST_LOOK,
    SEQUENTIAL_POWER,
    Verdict,
    comparison_plan,
    equivalence_test,
    holm_adjust,
    loss_tail,
    mean_interval,
    min_configs_for_verdict,
    sequential_comparison,
    sequential_levels,
    sequential_looks,
    sequential_verdict,
)

MARGIN = 0.1
ALPHA = 0.05


def bound(rate: float, reps: int) -> float:
    """``rate`` plus three Monte Carlo standard errors of a rate near it."""
    return rate + 3.0 * math.sqrt(rate * (1.0 - rate) / reps)


def shape(rng: np.random.Generator, dist: str, size: tuple[int, int]) -> np.ndarray:
    """Draws of mean 0 and sd 1 (the shapes of bench/sequential.py)."""
    if dist == "normal":
        return rng.standard_normal(size)
    if dist == "t3":
        return rng.standard_t(3, size) / math.sqrt(3.0)
    if dist == "skew-1":  # negated gamma(4): a long tail of losses, skewness -1
        return -(rng.gamma(4.0, 1.0, size) - 4.0) / 2.0
    raise ValueError(dist)


def final_decisions(d: np.ndarray, looks: tuple[int, ...], **kwargs: Any) -> np.ndarray:
    """The stopping decision of every row (codes of hpo.stats: 1 equivalent, 2 worse, ...)."""
    codes = hs._sequential_batch(d, looks, MARGIN, ALPHA, **kwargs).codes
    reached = codes != hs._NOT_REACHED
    last = reached.shape[1] - 1 - np.argmax(reached[:, ::-1], axis=1)
    return codes[np.arange(codes.shape[0]), last]


def skewed_but_centred() -> np.ndarray:
    """Issue 39's kan family: 47 of 50 differences within +-0.05, 3 losing 0.24-0.75."""
    rng = np.random.default_rng(39)
    d = np.concatenate([rng.uniform(-0.05, 0.05, 47), [-0.24, -0.5, -0.75]])
    rng.shuffle(d)
    return d


# --- the contract ------------------------------------------------------------------------


def test_the_signature_is_exactly_the_issues() -> None:
    signature = inspect.signature(sequential_verdict)
    assert list(signature.parameters) == ["differences", "looks", "margin", "alpha"]
    annotations = {name: p.annotation for name, p in signature.parameters.items()}
    assert annotations == {
        "differences": "Sequence[float]",
        "looks": "Sequence[int]",
        "margin": "float",
        "alpha": "float",
    }
    assert signature.parameters["alpha"].default == 0.05
    assert signature.return_annotation == "list[str]"
    assert sequential_verdict([0.0] * 10, [10], 0.1) == ["equivalent"]


def test_decisions_end_at_the_first_that_is_not_continue() -> None:
    rng = np.random.default_rng(1)
    allowed = {"continue", "equivalent", "worse", "better", "futile"}
    seen: set[str] = set()
    for _ in range(60):
        n = int(rng.integers(0, 40))
        d = rng.normal(rng.uniform(-0.3, 0.3), rng.uniform(0.01, 0.3), n)
        looks = sequential_looks(int(rng.integers(2, 12)), int(rng.integers(1, 6)), 40)
        result = sequential_verdict(d.tolist(), looks, MARGIN)
        assert set(result) <= allowed
        assert all(x == "continue" for x in result[:-1])
        reachable = sum(1 for k in looks if k <= n)
        if result and result[-1] != "continue":
            assert len(result) <= reachable
        else:  # undecided: every look the data reach was taken, none after
            assert len(result) == reachable
        seen.update(result)
    assert seen == allowed


def test_looks_beyond_the_data_are_not_reached() -> None:
    d = [0.1, -0.1, 0.15, -0.12, 0.05, -0.05, 0.12, -0.1, 0.03]  # 9: undecided at 8
    assert sequential_verdict(d, [8, 10, 12], MARGIN) == ["continue"]
    assert sequential_verdict(d[:7], [8, 10, 12], MARGIN) == []
    assert sequential_verdict([], [8, 10], MARGIN) == []


def test_looks_before_the_minimum_first_look_spend_nothing() -> None:
    # Identical zero differences decide at the first look the rule applies at: 9.
    assert MIN_FIRST_LOOK == 9
    assert sequential_verdict([0.0] * 12, [2, 4, 6, 8, 9, 12], MARGIN) == [
        "continue",
        "continue",
        "continue",
        "continue",
        "equivalent",
    ]
    # A schedule that skips 9 decides at its first look past it.
    assert sequential_verdict([0.0] * 12, [2, 4, 6, 8, 10, 12], MARGIN)[-2:] == [
        "continue",
        "equivalent",
    ]
    assert sequential_levels([2, 4, 6, 8, 10, 12])[:4] == (0.0, 0.0, 0.0, 0.0)
    # The looks before 10 take no alpha: the same levels as a schedule starting at 10.
    assert sequential_levels([2, 4, 6, 8, 10, 12])[4:] == sequential_levels([10, 12])
    # A budget below the first look can decide nothing: "futile" at the budget.
    assert sequential_verdict([0.0] * 8, [4, 8], MARGIN) == ["continue", "futile"]
    result = sequential_comparison([0.0] * 8, [4, 8], MARGIN)
    assert result.decision is Verdict.FUTILE and "below the first look" in (result.note or "")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"differences": [0.1, math.nan], "looks": [8], "margin": 0.1}, "differences"),
        ({"differences": [[0.1]], "looks": [8], "margin": 0.1}, "differences"),
        ({"differences": [0.1], "looks": [], "margin": 0.1}, "looks"),
        ({"differences": [0.1], "looks": [8, 8], "margin": 0.1}, "looks"),
        ({"differences": [0.1], "looks": [10, 8], "margin": 0.1}, "looks"),
        ({"differences": [0.1], "looks": [0, 8], "margin": 0.1}, "looks"),
        ({"differences": [0.1], "looks": [8.5], "margin": 0.1}, "looks"),
        ({"differences": [0.1], "looks": [8], "margin": 0.0}, "margin"),
        ({"differences": [0.1], "looks": [8], "margin": math.inf}, "margin"),
        ({"differences": [0.1], "looks": [8], "margin": 0.1, "alpha": 0.5}, "alpha"),
    ],
)
def test_invalid_inputs_raise_naming_the_argument(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sequential_verdict(**kwargs)


def test_the_batch_is_the_function_row_by_row() -> None:
    # The Monte Carlo below runs hs._sequential_batch on all replications at once; it
    # decides each row as sequential_verdict does alone.
    rng = np.random.default_rng(2)
    d = rng.normal(-0.05, 0.12, (40, 30)) + (rng.random((40, 30)) < 0.05) * -0.6
    looks = sequential_looks(6, 3, 30)
    codes = hs._sequential_batch(d, looks, MARGIN, ALPHA).codes
    for row, code in zip(d, codes, strict=True):
        expected = [hs._CODES[int(c)] for c in code if c != hs._NOT_REACHED]
        assert sequential_verdict(row.tolist(), looks, MARGIN) == expected
    assert len({tuple(c) for c in codes}) > 5  # the rows differ


def test_the_boundary_spends_alpha_as_its_function_says() -> None:
    # P(Z_1 > c_1 or ... or Z_k > c_k) for the Brownian motion observed at the looks, from
    # scipy's multivariate normal CDF, equals alpha * (n_k / n_K)^2 at every look.
    looks = (10, 14, 20, 30)
    levels = sequential_levels(looks, ALPHA)
    bounds = stats.norm.isf(levels)
    info = np.asarray(looks, dtype=float)
    corr = np.sqrt(np.minimum.outer(info, info) / np.maximum.outer(info, info))
    for k in range(1, len(looks) + 1):
        mvn = stats.multivariate_normal(np.zeros(k), corr[:k, :k], abseps=1e-6, releps=1e-6)
        crossed = 1.0 - float(mvn.cdf(bounds[:k], lower_limit=np.full(k, -np.inf)))
        assert crossed == pytest.approx(ALPHA * (looks[k - 1] / looks[-1]) ** 2, abs=2e-5)
    # Each look's level is below alpha, and the last one above a Bonferroni split.
    assert all(0 < level < ALPHA for level in levels)
    assert levels[-1] > ALPHA / len(looks)


# --- error rates under repeated looks (Monte Carlo) --------------------------------------

REPS = 2000


@pytest.mark.parametrize("dist", ["normal", "t3"])
@pytest.mark.parametrize(("ratio", "budget"), [(0.5, 20), (1.0, 16), (2.0, 32)])
@pytest.mark.parametrize("every", [DEFAULT_LOOK_EVERY, 2, 5])
def test_equivalent_at_the_margin_is_rare(dist: str, ratio: float, budget: int, every: int) -> None:
    # The true mean difference is -margin (symmetric shapes: +margin mirrors it).
    rng = np.random.default_rng(int(100 * ratio) + every + (0 if dist == "normal" else 7))
    d = -MARGIN + ratio * MARGIN * shape(rng, dist, (REPS, budget))
    looks = sequential_looks(MIN_FIRST_LOOK, every, budget)
    rate = float(np.mean(final_decisions(d, looks) == hs._EQUIVALENT))
    assert rate <= bound(ALPHA, REPS), (dist, ratio, every, rate)


@pytest.mark.parametrize(("ratio", "budget"), [(0.5, 20), (1.0, 16), (2.0, 32)])
def test_equivalent_at_the_margin_stays_below_ten_percent_at_skewness_minus_one(
    ratio: float, budget: int
) -> None:
    # A long tail of losses, mean at -margin: the issue bounds "equivalent" at 10% here
    # (8-9% in the benchmark). At these cells the t side alone would pass too; the BCa
    # side matters at skewness -2 (bench/README.md, "Sequential comparison").
    rng = np.random.default_rng(int(10 * ratio) + 39)
    d = -MARGIN + ratio * MARGIN * shape(rng, "skew-1", (REPS, budget))
    looks = sequential_looks(MIN_FIRST_LOOK, DEFAULT_LOOK_EVERY, budget)
    rate = float(np.mean(final_decisions(d, looks) == hs._EQUIVALENT))
    assert rate <= bound(0.10, REPS), (ratio, rate)
    # At +margin the same tail makes "equivalent" rarer still.
    upper = float(np.mean(final_decisions(d + 2 * MARGIN, looks) == hs._EQUIVALENT))
    assert upper < rate


def test_futility_is_non_binding() -> None:
    # Non-binding: the futility stops do not move the equivalence boundary, so the rule
    # with them says "equivalent" exactly where the pure repeated-interval rule says it
    # first, among the families futility has not stopped yet; its error can only be lower.
    rng = np.random.default_rng(5)
    d = -MARGIN + MARGIN * shape(rng, "normal", (REPS, 16))
    looks = sequential_looks(MIN_FIRST_LOOK, DEFAULT_LOOK_EVERY, 16)
    with_futility = hs._sequential_batch(d, looks, MARGIN, ALPHA).codes
    without = hs._sequential_batch(d, looks, MARGIN, ALPHA, futility=False).codes
    first = np.argmax(with_futility == hs._EQUIVALENT, axis=1)
    equivalent = (with_futility == hs._EQUIVALENT).any(axis=1)
    assert equivalent.sum() > 0
    rows = np.flatnonzero(equivalent)
    assert np.array_equal(np.argmax(without[rows] == hs._EQUIVALENT, axis=1), first[rows])
    assert np.all(without[rows, first[rows]] == hs._EQUIVALENT)
    rate_with = float(np.mean(final_decisions(d, looks) == hs._EQUIVALENT))
    rate_without = float(np.mean(final_decisions(d, looks, futility=False) == hs._EQUIVALENT))
    assert rate_with <= rate_without <= bound(ALPHA, REPS)
    # And it stops most non-equivalent families before the budget.
    assert np.mean(final_decisions(d, looks) == hs._FUTILE) > 0.5


def test_worse_or_better_at_zero_and_worse_at_the_margin() -> None:
    rng = np.random.default_rng(6)
    z = shape(rng, "normal", (REPS, 28))
    looks = sequential_looks(MIN_FIRST_LOOK, 2, 28)
    at_zero = final_decisions(0.15 * z, looks)
    assert np.mean(np.isin(at_zero, (hs._WORSE, hs._BETTER))) <= bound(ALPHA, REPS)
    # Far from it: 1 of 2000 with the first look at 9.
    assert np.mean(np.isin(at_zero, (hs._WORSE, hs._BETTER))) <= 0.001
    # "worse by more than the margin" when the truth is exactly -margin: one-sided alpha.
    at_margin = final_decisions(-MARGIN + 0.15 * z, looks)
    rate = float(np.mean(at_margin == hs._WORSE))
    assert 0.01 < rate <= bound(ALPHA, REPS)


def test_holm_over_families_keeps_the_directional_claims_at_five_percent() -> None:
    # Five families each centred exactly on -margin (the least favourable null of "worse").
    # Holm over their ten one-sided repeated p-values claims something iff the smallest
    # is <= alpha / 10, i.e. iff some family's intervals at the alpha / 10 boundary clear
    # the margin at a look the family reached; unadjusted, "worse" at 5% somewhere is
    # what five families produce by chance.
    families, reps, budget = 5, 1000, 16
    looks = sequential_looks(MIN_FIRST_LOOK, 2, budget)
    adjusted_levels = sequential_levels(looks, ALPHA / (2 * families))
    rng = np.random.default_rng(25)
    d = -MARGIN + MARGIN * rng.standard_normal((families, reps, budget))
    raw_claim = np.zeros(reps, dtype=bool)
    holm_claim = np.zeros(reps, dtype=bool)
    for f in range(families):
        codes = hs._sequential_batch(d[f], looks, MARGIN, ALPHA).codes
        raw_claim |= np.isin(codes, (hs._WORSE, hs._BETTER)).any(axis=1)
        for k, n in enumerate(looks):
            reached = codes[:, k] != hs._NOT_REACHED
            if adjusted_levels[k] == 0.0 or not reached.any():
                continue
            low, high, _, _ = hs._mean_ends(hs._mean_stats(d[f][reached, :n]), adjusted_levels[k])
            holm_claim[np.flatnonzero(reached)] |= (high < -MARGIN) | (low > MARGIN)
    assert raw_claim.mean() >= 0.12
    assert holm_claim.mean() <= bound(ALPHA, reps)
    # The same claims as hpo compare makes them: holm_adjust over the ten repeated
    # p-values sequential_comparison reports (10-20 ms a family). Where no family claims
    # at the unadjusted level, neither route should (the same looks, wider intervals), so
    # the check runs where some family does (those of the first 400 replications, 78
    # here) and on 20 replications where none does.
    assert not (holm_claim & ~raw_claim).any()
    claiming = np.flatnonzero(raw_claim[:400])
    checked = np.concatenate([claiming, np.flatnonzero(~raw_claim[:400])[:20]])
    via_pvalues = np.zeros(len(checked), dtype=bool)
    for i, r in enumerate(checked):
        results = [sequential_comparison(d[f, r], looks, MARGIN) for f in range(families)]
        raw = [p for result in results for p in (result.p_worse, result.p_better)]
        via_pvalues[i] = bool(np.any(holm_adjust(raw) <= ALPHA))
    assert len(claiming) >= 40
    assert not via_pvalues[len(claiming) :].any()  # nothing claimed unadjusted
    assert via_pvalues.sum() >= 4  # claims to agree on (6 here)
    assert np.count_nonzero(via_pvalues != holm_claim[checked]) <= 1  # a root at the edge
    # What a sweep's families stop on: "worse"/"better" at the Bonferroni share (the
    # budget's directional_alpha), so a stop somewhere stays within alpha as well.
    stopped = np.zeros(reps, dtype=bool)
    for f in range(families):
        batch = hs._sequential_batch(
            d[f], looks, MARGIN, ALPHA, directional_alpha=ALPHA / (2 * families)
        )
        stopped |= np.isin(batch.codes, (hs._WORSE, hs._BETTER)).any(axis=1)
    assert stopped.mean() <= bound(ALPHA, reps)


def test_repeated_pvalues_agree_with_the_decisions() -> None:
    d = [-0.3, -0.25, -0.35, -0.28, -0.32, -0.3, -0.27, -0.33, -0.29, -0.31]
    worse = sequential_comparison(d, [10], MARGIN)
    assert worse.decision is Verdict.WORSE
    assert worse.p_worse <= ALPHA < worse.p_better
    # One look: at the smallest alpha that says "worse" the rule says it, just below not.
    assert sequential_verdict(d, [10], MARGIN, alpha=worse.p_worse * 1.001) == ["worse"]
    assert sequential_verdict(d, [10], MARGIN, alpha=worse.p_worse * 0.99) == ["futile"]
    close = sequential_comparison([0.01, -0.01] * 6, [10, 12], MARGIN)
    assert close.decision is Verdict.EQUIVALENT
    assert close.p_worse == close.p_better == 1.0
    # Holm over families takes these p-values as they are.
    assert holm_adjust([worse.p_worse, close.p_worse])[0] == pytest.approx(2 * worse.p_worse)


# --- power and the configurations it takes -----------------------------------------------


@pytest.mark.parametrize("ratio", [1.0, 1.5])
def test_power_and_expected_configurations_match_the_plan(ratio: float) -> None:
    plan = SEQUENTIAL_POWER[ratio]
    rng = np.random.default_rng(int(1000 * ratio))
    d = ratio * MARGIN * rng.standard_normal((REPS, plan.budget))
    looks = sequential_looks(MIN_FIRST_LOOK, DEFAULT_LOOK_EVERY, plan.budget)
    codes = hs._sequential_batch(d, looks, MARGIN, ALPHA).codes
    reached = codes != hs._NOT_REACHED
    last = reached.shape[1] - 1 - np.argmax(reached[:, ::-1], axis=1)
    power = float(np.mean(codes[np.arange(REPS), last] == hs._EQUIVALENT))
    expected = float(np.mean(np.asarray(looks)[last]))
    se = math.sqrt(plan.power * (1 - plan.power) / REPS)
    assert abs(power - plan.power) <= 3 * se + 0.01
    assert expected == pytest.approx(plan.expected_configs, abs=0.05 * plan.expected_configs)
    # Fewer configurations, on average, than the fixed design needs for 80% power.
    assert expected < EQUIVALENCE_POWER[ratio]


# --- the skew-valid interval, the target case and the tail -------------------------------


def test_the_mean_interval_is_the_wider_of_t_and_bca_per_side() -> None:
    d = skewed_but_centred()
    result = mean_interval(d, 0.9)
    t = stats.ttest_1samp(d, 0.0).confidence_interval(0.9)
    assert (result.t_low, result.t_high) == pytest.approx((t.low, t.high), rel=1e-12)
    assert result.low < result.t_low  # the losses widen the lower side
    assert result.high == pytest.approx(result.t_high)  # no tail of gains
    # The BCa side agrees with scipy's BCa bootstrap up to resampling noise.
    scipy_bca = stats.bootstrap(
        (d,), np.mean, confidence_level=0.9, method="BCa", n_resamples=20000, random_state=0
    ).confidence_interval
    assert result.low == pytest.approx(scipy_bca.low, abs=0.006)
    assert result.mean == pytest.approx(float(d.mean()))
    # A constant sample: the point; one difference: NaN.
    assert mean_interval([0.02] * 6)[1:3] == pytest.approx((0.02, 0.02))
    assert math.isnan(mean_interval([0.02]).low)


def test_skewed_but_centred_family_is_equivalent_with_its_tail_line() -> None:
    d = skewed_but_centred()
    result = equivalence_test(d, margin=MARGIN)
    # Before issue 39: "inconclusive: strongly skewed differences", for ever.
    assert result.verdict == "equivalent" and result.decision is Verdict.EQUIVALENT
    assert result.skewed and result.skewness < -2 and result.blocked is None
    assert result.mean == pytest.approx(-0.0286, abs=1e-4)
    assert result.mean_verdict_low == pytest.approx(-0.0779, abs=1e-4)
    assert -MARGIN < result.mean_verdict_low < result.mean_low < result.mean < MARGIN
    assert result.mean_verdict_high == pytest.approx(result.mean_high)  # no tail of gains
    tail = result.loss_tail
    assert tail is not None and (tail.losing, tail.n, tail.share) == (3, 50, 0.06)
    assert [round(d[i], 2) for i in tail.worst] == [-0.75, -0.5, -0.24]
    assert tail.line() == (
        f"bf16 loses more than 0.1 in 3 of 50 configurations (6%, 95% CI 1.3%-16.5%); "
        f"worst: #{tail.worst[0]} -0.750, #{tail.worst[1]} -0.500, #{tail.worst[2]} -0.240"
    )
    assert "3 of 50" in (result.note or "") and "17%" in (result.note or "")
    # The sequential rule reaches "equivalent" too: in the order drawn at 16 (one loser
    # seen, and the note says the tail may reach 30%), with the losers first at 46 of a
    # budget of 50.
    drawn = sequential_comparison(d, sequential_looks(10, 2, 100), MARGIN)
    assert (drawn.decision, drawn.configs) == (Verdict.EQUIVALENT, 16)
    assert drawn.tail is not None and (drawn.tail.losing, drawn.tail.n) == (1, 16)
    assert "30%" in (drawn.note or "")
    losers_first = np.concatenate([np.sort(d[d < -MARGIN]), d[d >= -MARGIN]])
    first = sequential_comparison(losers_first, sequential_looks(10, 2, 50), MARGIN)
    assert (first.decision, first.configs) == (Verdict.EQUIVALENT, 46)
    assert first.looks[-1].low > -MARGIN and first.tail is not None and first.tail.losing == 3


def test_an_equivalent_with_a_tail_of_losses_says_its_error() -> None:
    # A moderately skewed sample (a tail of losses, sample skewness about -1.5): the
    # equivalent it reaches at its first look says that it errs more than 5% at this skew;
    # the same sample mirrored (a tail of gains) and a symmetric one say nothing of it.
    rng = np.random.default_rng(12)
    z = -(rng.gamma(1.5, 1.0, 12) - 1.5) / math.sqrt(1.5)
    d = 0.02 * z
    assert -2.0 < stats.skew(d) < -1.0
    looks = sequential_looks(MIN_FIRST_LOOK, 1, 20)
    losses = sequential_comparison(d, looks, MARGIN)
    assert losses.decision is Verdict.EQUIVALENT
    assert "a tail of losses" in (losses.note or "") and "up to 13%" in (losses.note or "")
    gains = sequential_comparison(-d, looks, MARGIN)
    assert gains.decision is Verdict.EQUIVALENT and "tail of losses" not in (gains.note or "")
    symmetric = sequential_comparison(0.02 * rng.standard_normal(12) / 3, looks, MARGIN)
    assert "tail of losses" not in (symmetric.note or "")


def test_loss_tail_numbers() -> None:
    d = [0.0, -0.2, 0.05, -0.15, -0.05, -0.3, 0.1, -0.1]
    tail = loss_tail(d, 0.1, worst=2)
    assert (tail.losing, tail.n, tail.share) == (3, 8, 0.375)  # -0.1 is not beyond it
    ci = stats.binomtest(3, 8).proportion_ci(0.95, method="exact")
    assert (tail.low, tail.high) == pytest.approx((ci.low, ci.high))
    assert tail.worst == (5, 1) and tail.worst_differences == (-0.3, -0.2)
    names = [f"kan-c{i:03d}" for i in range(8)]
    assert tail.line("bf16", names).endswith("worst: kan-c005 -0.300, kan-c001 -0.200 and 1 more")
    none = loss_tail([0.01] * 30, 0.1)
    assert none.losing == 0 and none.worst == () and none.high == pytest.approx(0.1157, abs=1e-4)
    with pytest.raises(ValueError, match="margin"):
        loss_tail(d, -0.1)
    with pytest.raises(ValueError, match="worst"):
        loss_tail(d, 0.1, worst=-1)


def test_futility_says_so_with_the_interval_reached() -> None:
    # issue 39's dqn: bf16 - f32 about -0.08 with a wide spread, budget 24.
    rng = np.random.default_rng(8)
    d = rng.normal(-0.08, 0.15, 24)
    result = sequential_comparison(d, sequential_looks(10, 2, 24), MARGIN)
    assert result.decision is Verdict.FUTILE and result.configs < 24
    last = result.looks[-1]
    assert last.decision_probability < hs.FUTILITY_PROBABILITY
    assert f"[{last.low:+.3f}, {last.high:+.3f}]" in (result.note or "")
    assert last.low < -MARGIN < last.high
    assert sequential_verdict(d.tolist(), sequential_looks(10, 2, 24), MARGIN) == result.verdicts


# --- verdicts and planning ---------------------------------------------------------------


def test_verdict_enum() -> None:
    assert [v.value for v in Verdict] == [
        "equivalent",
        "worse",
        "better",
        "inconclusive",
        "futile",
        "continue",
    ]
    # The one place a verdict is spelled: the precision named beside WORSE and BETTER, a
    # note after a colon; nothing parses it back.
    assert Verdict.WORSE.text("bf16") == "bf16 worse"
    assert Verdict.BETTER.text("bf16-mixed") == "bf16-mixed better"
    assert Verdict.EQUIVALENT.text("bf16") == "equivalent"
    assert (
        Verdict.INCONCLUSIVE.text("bf16", "about 3 more configurations needed")
        == "inconclusive: about 3 more configurations needed"
    )
    assert Verdict.FUTILE.text("bf16", None) == "futile"
    assert Verdict.WORSE == "worse"
    assert not hasattr(Verdict, "of")


def test_planning_helpers() -> None:
    assert min_configs_for_verdict() == 5
    assert min_configs_for_verdict(0.01) == 7
    assert min_configs_for_verdict(sequential=True) == MIN_FIRST_LOOK == 9
    assert sequential_looks(8, 2, 13) == (8, 10, 12, 13)
    assert sequential_looks(8, 4, 16) == (8, 12, 16)
    with pytest.raises(ValueError, match="budget"):
        sequential_looks(8, 2, 6)
    plan = comparison_plan()
    assert [row.sd_ratio for row in plan] == [0.5, 1.0, 1.5, 2.0, 3.0]
    for row in plan:
        assert row.fixed_configs == EQUIVALENCE_POWER[row.sd_ratio]
        assert row.fixed_configs_approx <= row.fixed_configs
        assert row.sequential_budget >= MIN_FIRST_LOOK
        if row.sd_ratio >= 1.0:  # the budget for 80% power: 0.9-1.21 x the fixed n
            assert row.sequential_budget <= 1.21 * row.fixed_configs
        # From sd / margin 1 the sequential rule takes fewer configurations on average;
        # at 0.5 the fixed design's 6 are below the sequential rule's first look.
        if row.sd_ratio >= 1.0:
            assert row.sequential_expected < row.fixed_configs
        else:
            assert row.sequential_expected >= MIN_FIRST_LOOK > row.fixed_configs
