"""The sequential comparison against the fixed design, side by side in one run: per
distribution of the paired differences and sd / margin, the configurations each needs for
80% power to say "equivalent", and the error rates of both.

    nice .venv/bin/python bench/sequential.py                 # 4,000 replications per cell
    .venv/bin/python bench/sequential.py --smoke              # 2 cells, 300 replications, seconds
    .venv/bin/python bench/sequential.py --reps 10000 --dists normal --ratios 1,2
    .venv/bin/python bench/sequential.py --power-table        # EQUIVALENCE_POWER, re-simulated

Results and what they mean: bench/README.md, "Sequential comparison"; the method:
docs/statistics.md, "Deciding in steps".

Differences ``d = other - reference`` are ``mu + r * margin * Z`` with ``Z`` of mean 0
and sd 1 from one of five shapes: normal; t(3) (heavy tails); a negated gamma(4)
(skewness -1) and a negated exponential (skewness -2), long tails of losses; and
"contaminated": 94% near 0 (sd 0.25), 6% losing 2 to 8 (uniform), standardized (the
skewed-but-centred family of issue 39, skewness about -4.1). The margin is 0.1.

Per cell (a shape and ``r``), with common random numbers across the designs and truths:

* fixed n: the smallest n at which :func:`hpo.stats.equivalence_test` (signed-rank TOST
  and the mean's interval, alpha 0.05) says "equivalent" in >= 80% of the samples at
  ``mu = 0``; its P(equivalent) at ``mu = -margin`` and ``+margin`` (type I) and
  P(worse or better) at ``mu = 0``. The fixed verdict is computed vectorized here
  (:func:`fixed_decisions`, checked against ``equivalence_test`` in the tests).
* sequential: looks from :data:`~hpo.stats.MIN_FIRST_LOOK` every
  :data:`~hpo.stats.DEFAULT_LOOK_EVERY` configurations; the smallest budget (last look)
  with P(equivalent) >= 80% at ``mu = 0``; at that budget the expected configurations to
  any stop at 0 (``E[n]``) and at ``-margin``, its power, P(equivalent) at
  ``-margin`` / ``+margin`` (and at ``-margin`` with looks every 2 and every 5) and
  P(worse or better) at 0. The rule is
  :func:`hpo.stats.sequential_verdict`'s own implementation run on all replications at
  once (``hpo.stats._sequential_batch``).
* ``E[n] / fixed``: the expected configurations over the fixed n at the sequential
  rule's achieved power (the smallest n with at least that power).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from scipy import stats

from hpo import stats as hs

MARGIN = 0.1
ALPHA = 0.05
POWER = 0.8
DISTRIBUTIONS = ("normal", "t3", "skew-1", "skew-2", "contaminated")
RATIOS = (0.5, 1.0, 1.5, 2.0, 3.0)
MAX_CONFIGS = 600  # search limit for the fixed n and the budget

# Contaminated: most configurations near 0, a few large losses (in units before scaling).
_P_LOSS, _CORE_SD, _LOSS_LOW, _LOSS_HIGH = 0.06, 0.25, 2.0, 8.0
_RAW_MEAN = -_P_LOSS * (_LOSS_LOW + _LOSS_HIGH) / 2.0
_LOSS_M2 = (_LOSS_LOW**2 + _LOSS_LOW * _LOSS_HIGH + _LOSS_HIGH**2) / 3.0  # E[L^2]
_LOSS_M3 = (_LOSS_HIGH**4 - _LOSS_LOW**4) / (4.0 * (_LOSS_HIGH - _LOSS_LOW))  # E[L^3]
_RAW_M2 = (1 - _P_LOSS) * _CORE_SD**2 + _P_LOSS * _LOSS_M2
_RAW_SD = math.sqrt(_RAW_M2 - _RAW_MEAN**2)


def _contaminated_skewness() -> float:
    """Skewness of the contaminated shape (core N(0, s^2) w.p. 1-p, -U(a, b) w.p. p)."""
    m1, m2 = _RAW_MEAN, _RAW_M2
    m3 = -_P_LOSS * _LOSS_M3  # the normal core's third moment is 0
    return (m3 - 3 * m1 * m2 + 2 * m1**3) / _RAW_SD**3


SKEWNESS = {
    "normal": 0.0,
    "t3": 0.0,
    "skew-1": -1.0,
    "skew-2": -2.0,
    "contaminated": _contaminated_skewness(),
}


def draw(rng: np.random.Generator, dist: str, shape: tuple[int, int]) -> np.ndarray:
    """``shape`` draws of mean 0 and sd 1 from ``dist``."""
    if dist == "normal":
        return rng.standard_normal(shape)
    if dist == "t3":
        return rng.standard_t(3, shape) / math.sqrt(3.0)  # var(t3) = 3
    if dist == "skew-1":
        return -(rng.gamma(4.0, 1.0, shape) - 4.0) / 2.0  # gamma(k): skewness 2/sqrt(k)
    if dist == "skew-2":
        return -(rng.exponential(1.0, shape) - 1.0)
    if dist == "contaminated":
        core = rng.normal(0.0, _CORE_SD, shape)
        loss = rng.uniform(_LOSS_LOW, _LOSS_HIGH, shape)
        raw = np.where(rng.random(shape) < _P_LOSS, -loss, core)
        return (raw - _RAW_MEAN) / _RAW_SD
    raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got {dist!r}")


# ---------------------------------------------------------------------------------------
# The two designs on many samples at once.

EQUIVALENT, WORSE, BETTER = 1, 2, 3


def fixed_decisions(d: np.ndarray, margin: float = MARGIN, alpha: float = ALPHA) -> np.ndarray:
    """:func:`hpo.stats.equivalence_test`'s verdict for every row of ``d`` (R, n), n >= 2,
    as 0 (inconclusive), 1 (equivalent), 2 (worse) or 3 (better): the exact signed-rank
    tests at the margins by Walsh-average counts, and the mean's interval."""
    rows, n = d.shape
    i, j = np.triu_indices(n)
    below_lower = np.empty(rows, dtype=np.int64)
    above_upper = np.empty(rows, dtype=np.int64)
    above_lower = np.empty(rows, dtype=np.int64)
    below_upper = np.empty(rows, dtype=np.int64)
    chunk = max(1, 2_000_000 // i.size)
    for start in range(0, rows, chunk):
        walsh = (d[start : start + chunk, i] + d[start : start + chunk, j]) / 2.0
        below_lower[start : start + chunk] = np.count_nonzero(walsh <= -margin, axis=1)
        above_upper[start : start + chunk] = np.count_nonzero(walsh >= margin, axis=1)
        above_lower[start : start + chunk] = np.count_nonzero(walsh >= -margin, axis=1)
        below_upper[start : start + chunk] = np.count_nonzero(walsh <= margin, axis=1)

    def cdf(counts: np.ndarray) -> np.ndarray:  # hs._signed_rank_cdf on every count
        if n <= hs.EXACT_MAX_N:
            return hs._untied_cdf(n)[np.minimum(counts, n * (n + 1) // 2)]
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        p = stats.norm.cdf((counts + 0.5 - n * (n + 1) / 4.0) / sd)
        return np.where(counts >= n * (n + 1) // 2, 1.0, p)

    def rejects(p: np.ndarray) -> np.ndarray:
        return p <= alpha * (1.0 + hs._LEVEL_RTOL)

    tost = rejects(np.maximum(cdf(below_lower), cdf(above_upper)))
    worse = rejects(cdf(above_lower))
    better = rejects(cdf(below_upper))
    low = np.empty(rows)
    high = np.empty(rows)
    for start in range(0, rows, 512):
        ms = hs._mean_stats(d[start : start + 512])
        lo, hi, _, _ = hs._mean_ends(ms, alpha)
        low[start : start + 512], high[start : start + 512] = lo, hi
    mean_inside = (low > -margin) & (high < margin)
    return np.where(
        tost,
        np.where(mean_inside, EQUIVALENT, 0),
        np.where(worse, WORSE, np.where(better, BETTER, 0)),
    )


class SequentialRun(NamedTuple):
    decision: np.ndarray  # (R,) the stopping decision's code (hs._EQUIVALENT, ...)
    configs: np.ndarray  # (R,) configurations at the stop


def sequential_run(d: np.ndarray, looks: tuple[int, ...], margin: float = MARGIN) -> SequentialRun:
    """The sequential rule on every row of ``d`` (R, >= budget)."""
    codes = hs._sequential_batch(d, looks, margin, ALPHA).codes  # (R, K)
    reached = codes != hs._NOT_REACHED
    last = reached.shape[1] - 1 - np.argmax(reached[:, ::-1], axis=1)
    decision = codes[np.arange(codes.shape[0]), last]
    return SequentialRun(decision.astype(np.int64), np.asarray(looks)[last])


def default_looks(budget: int) -> tuple[int, ...]:
    return hs.sequential_looks(hs.MIN_FIRST_LOOK, hs.DEFAULT_LOOK_EVERY, budget)


# ---------------------------------------------------------------------------------------
# Searches: the smallest fixed n and the smallest budget at a power.


def _smallest(candidates: Sequence[int], test: Callable[[int], bool], guess: int) -> int | None:
    """Smallest candidate for which ``test`` holds (assumed monotone): galloping up or down
    from ``guess``, then bisection, so the costly large candidates are tried only if needed."""
    index = min(max(int(np.searchsorted(candidates, guess)), 0), len(candidates) - 1)
    step = 1
    if test(candidates[index]):
        hi = index
        lo = index - step
        while lo > 0 and test(candidates[lo]):
            hi, step = lo, step * 2
            lo = hi - step
        lo = max(lo, 0)
        if test(candidates[lo]):
            return candidates[lo]
    else:
        lo = index
        hi = index + step
        while hi < len(candidates) - 1 and not test(candidates[hi]):
            lo, step = hi, step * 2
            hi = lo + step
        hi = min(hi, len(candidates) - 1)
        if not test(candidates[hi]):
            return None
    while hi - lo > 1:  # test(lo) is False, test(hi) True
        mid = (lo + hi) // 2
        if test(candidates[mid]):
            hi = mid
        else:
            lo = mid
    return candidates[hi]


class Cell(NamedTuple):
    dist: str
    ratio: float
    fixed_n: int | None
    fixed_eq_lower: float
    fixed_eq_upper: float
    fixed_directional: float
    budget: int | None
    expected: float
    expected_at_margin: float
    power: float
    eq_lower: float
    eq_upper: float
    eq_lower_every2: float
    eq_lower_every5: float
    directional: float
    fixed_n_same_power: int | None
    seconds: float


def run_cell(dist: str, ratio: float, reps: int, seed: int) -> Cell:
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    z = draw(rng, dist, (reps, MAX_CONFIGS))
    scale = ratio * MARGIN

    fixed_power: dict[int, float] = {}

    def fixed_eq(n: int, mu: float = 0.0) -> float:
        return float(np.mean(fixed_decisions(mu + scale * z[:, :n]) == EQUIVALENT))

    def fixed_ok(n: int, target: float = POWER) -> bool:
        if n not in fixed_power:
            fixed_power[n] = fixed_eq(n)
        return fixed_power[n] >= target

    fixed_n = _smallest(range(5, MAX_CONFIGS + 1), fixed_ok, hs.configs_for_equivalence(ratio))

    seq_power: dict[int, float] = {}

    def seq_ok(budget: int) -> bool:
        if budget not in seq_power:
            run = sequential_run(scale * z[:, :budget], default_looks(budget))
            seq_power[budget] = float(np.mean(run.decision == hs._EQUIVALENT))
        return seq_power[budget] >= POWER

    budgets = range(hs.MIN_FIRST_LOOK, MAX_CONFIGS + 1, hs.DEFAULT_LOOK_EVERY)
    budget = _smallest(budgets, seq_ok, round(1.2 * (fixed_n or 10)))

    nan = math.nan
    f_lower = f_upper = f_dir = nan
    if fixed_n is not None:
        f_lower = fixed_eq(fixed_n, -MARGIN)
        f_upper = fixed_eq(fixed_n, MARGIN)
        at_zero = fixed_decisions(scale * z[:, :fixed_n])
        f_dir = float(np.mean((at_zero == WORSE) | (at_zero == BETTER)))
    expected = expected_margin = power = eq_lower = eq_upper = directional = nan
    eq_lower_2 = eq_lower_5 = nan
    same_power = None
    if budget is not None:
        looks = default_looks(budget)
        at_zero_run = sequential_run(scale * z[:, :budget], looks)
        expected = float(at_zero_run.configs.mean())
        power = float(np.mean(at_zero_run.decision == hs._EQUIVALENT))
        directional = float(np.mean(np.isin(at_zero_run.decision, (hs._WORSE, hs._BETTER))))
        lower_run = sequential_run(-MARGIN + scale * z[:, :budget], looks)
        eq_lower = float(np.mean(lower_run.decision == hs._EQUIVALENT))
        expected_margin = float(lower_run.configs.mean())
        upper_run = sequential_run(MARGIN + scale * z[:, :budget], looks)
        eq_upper = float(np.mean(upper_run.decision == hs._EQUIVALENT))
        every2, every5 = (hs.sequential_looks(hs.MIN_FIRST_LOOK, k, budget) for k in (2, 5))
        lower_2 = sequential_run(-MARGIN + scale * z[:, :budget], every2)
        eq_lower_2 = float(np.mean(lower_2.decision == hs._EQUIVALENT))
        lower_5 = sequential_run(-MARGIN + scale * z[:, :budget], every5)
        eq_lower_5 = float(np.mean(lower_5.decision == hs._EQUIVALENT))
        same_power = _smallest(
            range(5, MAX_CONFIGS + 1), lambda n: fixed_ok(n, max(POWER, power)), fixed_n or 5
        )
    return Cell(
        dist,
        ratio,
        fixed_n,
        f_lower,
        f_upper,
        f_dir,
        budget,
        expected,
        expected_margin,
        power,
        eq_lower,
        eq_upper,
        eq_lower_2,
        eq_lower_5,
        directional,
        same_power,
        time.perf_counter() - started,
    )


def _fmt(x: float | int | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def table(cells: Sequence[Cell], header_only: bool = False) -> str:
    header = (
        "| differences | sd/m | fixed n | fixed P(eq) at -m / +m | fixed P(w or b) at 0 "
        "| seq budget | seq E[n] at 0 | E[n] / fixed | seq power | seq P(eq) at -m / +m "
        "| seq P(eq) at -m, looks every 2 / 5 | seq P(w or b) at 0 | seq E[n] at -m |"
    )
    lines = [header, "|" + "---|" * 13]
    if header_only:
        return "\n".join(lines)
    for c in cells:
        fixed_same = c.fixed_n_same_power
        ratio = c.expected / fixed_same if fixed_same else math.nan
        same = "" if fixed_same in (None, c.fixed_n) else f" ({fixed_same} at seq power)"
        lines.append(
            f"| {c.dist} ({SKEWNESS[c.dist]:+.1f}) | {c.ratio:g} | {_fmt(c.fixed_n)}{same} "
            f"| {_fmt(c.fixed_eq_lower)} / {_fmt(c.fixed_eq_upper)} | {_fmt(c.fixed_directional)} "
            f"| {_fmt(c.budget)} | {_fmt(c.expected, 1)} | {_fmt(ratio, 2)} | {_fmt(c.power)} "
            f"| {_fmt(c.eq_lower)} / {_fmt(c.eq_upper)} "
            f"| {_fmt(c.eq_lower_every2)} / {_fmt(c.eq_lower_every5)} "
            f"| {_fmt(c.directional)} "
            f"| {_fmt(c.expected_at_margin, 1)} |"
        )
    return "\n".join(lines)


def power_table(reps: int = 10_000) -> dict[float, int]:
    """:data:`hpo.stats.EQUIVALENCE_POWER` as docs/statistics.md defines it: normal
    differences, the smallest n whose power over ``reps`` samples is >= 80%, seed
    20250 + 10 x ratio."""
    out = {}
    for ratio in RATIOS:
        rng = np.random.default_rng(int(20250 + 10 * ratio))
        z = rng.standard_normal((reps, 200))
        n = 5
        while np.mean(fixed_decisions(ratio * MARGIN * z[:, :n]) == EQUIVALENT) < POWER:
            n += 1
        out[ratio] = n
    return out


def main(argv: list[str] | None = None) -> list[Cell]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 cells, 300 replications")
    parser.add_argument("--reps", type=int, default=4000, help="replications per cell")
    parser.add_argument("--dists", default=",".join(DISTRIBUTIONS))
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS))
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--power-table", action="store_true", help="re-simulate EQUIVALENCE_POWER")
    args = parser.parse_args(argv)
    if args.power_table:
        print("EQUIVALENCE_POWER =", power_table())
        return []
    dists = args.dists.split(",")
    ratios = [float(r) for r in args.ratios.split(",")]
    reps = args.reps
    if args.smoke:
        dists, ratios, reps = ["normal", "skew-1"], [1.0], 300
    print(
        f"sequential vs fixed: margin {MARGIN}, alpha {ALPHA}, power {POWER:.0%}, {reps} "
        f"replications per cell; sequential looks from {hs.MIN_FIRST_LOOK} every "
        f"{hs.DEFAULT_LOOK_EVERY}, spending alpha t^{hs.SPENDING_RHO:g}, futility below "
        f"{hs.FUTILITY_PROBABILITY:.0%}",
        flush=True,
    )
    print(table([], header_only=True), flush=True)
    cells = []
    for d_index, dist in enumerate(dists):
        for r_index, ratio in enumerate(ratios):
            cell = run_cell(dist, ratio, reps, args.seed + 100 * d_index + r_index)
            cells.append(cell)
            # A row as soon as its cell is done: a long run's finished rows are not lost.
            print(table([cell]).splitlines()[-1], flush=True)
            print(f"  {dist} sd/m {ratio:g}: {cell.seconds:.0f} s", file=sys.stderr, flush=True)
    mc = math.sqrt(ALPHA * (1 - ALPHA) / reps)
    print(f"Monte Carlo standard error of a rate near 0.05: {mc:.4f}")
    return cells


if __name__ == "__main__":
    main()
