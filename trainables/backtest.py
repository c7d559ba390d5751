"""Vectorised backtest of target positions: strategy returns, Sharpe and friends.

This is the single place where a model's positions become a Sharpe ratio, so every model
family, precision policy and walk-forward fold is scored by the same arithmetic. It is
plain float64 numpy on purpose: the scoring must not depend on the precision a trial was
trained in (a bf16 trial hands its positions over as float64 via
``tensor.float().cpu().numpy()``), otherwise an f32-vs-bf16 comparison would partly
measure the backtest's own rounding.

Conventions (README.md, "Data" and "Backtest"):

* ``positions[t]`` is the target weight decided with information up to the close of bar
  ``t`` and held over bar ``t + 1``; ``bar_returns[t]`` is the simple (not log) return of
  bar ``t``. Per asset, ``r_t = w_{t-1} * R_t - cost * |w_t - w_{t-1}|`` with
  ``w_{-1} = 0``: the first bar pays the cost of entering ``w_0`` and earns nothing. The
  position still open after the last bar is not closed (no exit cost is charged).
* The portfolio return is the equal-weight mean over assets, so a strategy that is fully
  invested (|w| = 1) in every asset has unit gross exposure, not ``A``.
* A ratio whose denominator is zero (flat or constant returns for Sharpe, no losing
  period for Sortino) is reported as ``0.0``. These values are HPO objectives: ``inf`` is
  not JSON-safe, and a large finite sentinel would let a degenerate fold (a few bars, no
  loss) win a whole sweep. ``0.0`` ranks such a trial as "no measurable edge".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BacktestResult", "backtest", "sharpe_ratio", "volatility"]


@dataclass(frozen=True, eq=False)
class BacktestResult:
    """Performance of one position path over one evaluation period.

    ``eq=False`` because field-wise ``==`` on an ndarray field is ambiguous; compare
    ``to_dict()`` and ``returns`` explicitly. ``returns`` is read-only so the frozen
    result cannot be changed through it.

    Ratios are annualised with ``sqrt(periods_per_year)``; ``mean_return`` and
    ``volatility`` are per period, so that they can be fed to :mod:`hpo.stats`
    (which works with per-period Sharpe ratios) without undoing an annualisation.
    """

    sharpe: float
    """Annualised Sharpe: ``mean(r) / std(r, ddof=1) * sqrt(ppy)``; 0.0 when ``std`` is 0."""
    sortino: float
    """Annualised Sortino with target 0: ``mean(r) / sqrt(mean(min(r, 0)^2)) * sqrt(ppy)``,
    the downside deviation averaged over all periods; 0.0 when no period lost money."""
    max_drawdown: float
    """Largest fall of compounded equity ``prod(1 + r)`` from its running peak (starting
    equity 1 counts as a peak), as a fraction in [0, 1]; above 1 only if equity went
    negative (a short position through a bar with return > 100%)."""
    turnover: float
    """Mean over periods of the mean over assets of ``|w_t - w_{t-1}|``, including the
    initial entry from ``w_{-1} = 0``; per period, not annualised."""
    hit_rate: float
    """Share of (period, asset) cells holding a position (``w_{t-1} != 0``) whose gross
    P&L ``w_{t-1} * R_t`` is strictly positive; costs are excluded so that this measures
    direction calls only. 0.0 when the strategy never held a position."""
    mean_return: float
    """Per-period mean of the portfolio returns ``r``."""
    volatility: float
    """Per-period standard deviation (ddof=1) of ``r``; exactly 0.0 when ``r`` is constant."""
    n_periods: int
    """Number of bars ``T``."""
    returns: np.ndarray
    """Per-period portfolio returns ``r``, shape (T,), float64."""

    def to_dict(self) -> dict[str, float | int]:
        """Scalar metrics only (no ``returns``), ready for ``tune.report`` / MLflow."""
        return {
            "sharpe": self.sharpe,
            "sortino": self.sortino,
            "max_drawdown": self.max_drawdown,
            "turnover": self.turnover,
            "hit_rate": self.hit_rate,
            "mean_return": self.mean_return,
            "volatility": self.volatility,
            "n_periods": self.n_periods,
        }


def _as_2d(name: str, values: np.ndarray) -> np.ndarray:
    """Return a float64 (T, A) view; (T,) is one asset. Other ranks are a caller bug."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        return arr[:, None]
    if arr.ndim == 2:
        return arr
    raise ValueError(f"{name} must have shape (T,) or (T, A), got shape {arr.shape}")


def _index_text(index: tuple[int, ...], one_asset: bool) -> str:
    """Name a cell as the caller sees it: ``t`` for (T,) input, ``(t, asset)`` for (T, A)."""
    return f"index {index[0]}" if one_asset else f"index (t={index[0]}, asset={index[1]})"


def backtest(
    positions: np.ndarray,
    bar_returns: np.ndarray,
    cost: float = 1e-4,
    periods_per_year: float = 252.0,
) -> BacktestResult:
    """Score target positions against bar returns.

    Args:
        positions: Target weights in [-1, 1], shape (T,) or (T, A). ``positions[t]`` is
            held over bar ``t + 1``. NaN is rejected rather than read as flat, because a
            NaN position means the model diverged and must not score like a cautious one.
        bar_returns: Simple returns of each bar, same shape as ``positions``; must be
            finite.
        cost: Proportional cost per unit of traded weight (1e-4 = 1 bp), >= 0.
        periods_per_year: Bars per year used to annualise Sharpe and Sortino (252 for
            daily bars), > 0.

    Returns:
        The metrics and the per-period portfolio returns; see :class:`BacktestResult`.

    Raises:
        ValueError: on a shape mismatch, fewer than 2 bars (a sample standard deviation
            needs two), a position outside [-1, 1] or NaN (the message names the first bad
            index and its value), a non-finite bar return, or a bad ``cost`` /
            ``periods_per_year``.
    """
    one_asset = np.ndim(positions) == 1
    w = _as_2d("positions", positions)  # (T, A)
    bar = _as_2d("bar_returns", bar_returns)  # (T, A)
    if w.shape != bar.shape:
        raise ValueError(
            f"positions and bar_returns must have the same shape, got "
            f"{np.shape(positions)} and {np.shape(bar_returns)}"
        )
    n_periods = w.shape[0]
    if n_periods < 2:
        raise ValueError(f"need at least 2 bars to compute a Sharpe ratio, got T={n_periods}")
    if w.shape[1] < 1:
        raise ValueError("positions must have at least one asset column, got A=0")
    cost, periods_per_year = float(cost), float(periods_per_year)
    if not (math.isfinite(cost) and cost >= 0.0):
        raise ValueError(f"cost must be a finite number >= 0, got {cost!r}")
    if not (math.isfinite(periods_per_year) and periods_per_year > 0.0):
        raise ValueError(f"periods_per_year must be a finite number > 0, got {periods_per_year!r}")

    # `~(|w| <= 1)` is True for NaN as well as for out-of-range values.
    bad = np.argwhere(~(np.abs(w) <= 1.0))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"positions must be in [-1, 1] (NaN not allowed); "
            f"{_index_text(idx, one_asset)} has value {float(w[idx])!r} ({len(bad)} bad value(s) in all)"
        )
    bad = np.argwhere(~np.isfinite(bar))
    if bad.size:
        idx = tuple(int(i) for i in bad[0])
        raise ValueError(
            f"bar_returns must be finite; {_index_text(idx, one_asset)} has value {float(bar[idx])!r} "
            f"({len(bad)} bad value(s) in all)"
        )

    w_prev = np.vstack([np.zeros((1, w.shape[1])), w[:-1]])  # (T, A), w_{t-1} with w_{-1}=0
    traded = np.abs(w - w_prev)  # (T, A)
    gross = w_prev * bar  # (T, A)
    r = (gross - cost * traded).mean(axis=1)  # (T,)
    r.setflags(write=False)

    ann = math.sqrt(periods_per_year)
    mean_return = float(r.mean())
    vol = volatility(r)
    sharpe = sharpe_ratio(r, periods_per_year)

    downside = math.sqrt(float(np.mean(np.minimum(r, 0.0) ** 2)))
    sortino = mean_return / downside * ann if downside > 0.0 else 0.0

    equity = np.cumprod(1.0 + r)  # (T,)
    peak = np.maximum.accumulate(np.maximum(equity, 1.0))  # starting equity 1 is a peak
    max_drawdown = max(float(np.max(1.0 - equity / peak)), 0.0)

    turnover = float(traded.mean(axis=1).mean())

    held = w_prev != 0.0
    n_held = int(held.sum())
    hit_rate = float(np.sum((gross > 0.0) & held) / n_held) if n_held else 0.0

    return BacktestResult(
        sharpe=float(sharpe),
        sortino=float(sortino),
        max_drawdown=max_drawdown,
        turnover=turnover,
        hit_rate=hit_rate,
        mean_return=mean_return,
        volatility=vol,
        n_periods=n_periods,
        returns=r,
    )


def volatility(returns: np.ndarray) -> float:
    """Per-period standard deviation (ddof=1) of returns (T,); exactly 0.0 when they are
    constant or fewer than two."""
    r = np.asarray(returns, dtype=np.float64)
    # An exactly constant series can still give std ~1e-19 from the rounding of its mean,
    # which would turn Sharpe into +-1e17; test constancy directly instead.
    if r.size < 2 or np.all(r == r[0]):
        return 0.0
    return float(r.std(ddof=1))


def sharpe_ratio(returns: np.ndarray, periods_per_year: float = 252.0) -> float:
    """Annualised Sharpe of per-period returns (T,): ``mean / std(ddof=1) * sqrt(ppy)``,
    0.0 when :func:`volatility` is 0 (see the module docstring). The one Sharpe formula:
    :func:`backtest` and the trainer's joined validation Sharpe both use it."""
    r = np.asarray(returns, dtype=np.float64)
    vol = volatility(r)
    return float(r.mean()) / vol * math.sqrt(float(periods_per_year)) if vol > 0.0 else 0.0
