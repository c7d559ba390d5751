"""The moments of a return series that the probabilistic and deflated Sharpe ratios need:
the per-period Sharpe, the skewness and the raw kurtosis, defined once.

Two callers share it: a trial's epoch metrics (``val_sharpe_per_period``, ``val_skew``,
``val_kurtosis``, in the trial worker) and the comparison's statistics (:mod:`hpo.stats`,
which re-exports it). numpy only: importing ``scipy.stats`` in a trial worker would stall
its first epoch (bench/README.md, "Ray Tune overhead"), and :mod:`hpo.compare` runs
without torch.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SharpeMoments(NamedTuple):
    """Moments of a return series needed by the PSR / DSR, all per-period (not annualised)."""

    sr: float
    """Per-period Sharpe ratio ``mean / std(ddof=1)``; 0.0 for constant returns."""
    skew: float
    """Sample skewness ``m3 / m2^1.5`` (the biased estimator, ``scipy.stats.skew``'s)."""
    kurtosis: float
    """Raw sample kurtosis ``m4 / m2^2`` (``scipy.stats.kurtosis(fisher=False)``, normal = 3)."""
    n_obs: int
    """Number of observations."""


def sharpe_moments(returns: np.ndarray) -> SharpeMoments:
    """Per-period Sharpe, skewness and raw kurtosis of a 1-D series of returns.

    The Sharpe uses the same ``ddof=1`` standard deviation as
    :func:`trainables.backtest.backtest`, so ``sr * sqrt(periods_per_year)`` equals that
    backtest's annualised Sharpe. Skewness and kurtosis are the biased moment ratios, which
    is what the PSR's asymptotic variance is written in.

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
    centred = r - r.mean()
    m2 = float(np.mean(centred**2))
    return SharpeMoments(
        sr=float(r.mean() / r.std(ddof=1)),
        skew=float(np.mean(centred**3)) / m2**1.5,
        kurtosis=float(np.mean(centred**4)) / m2**2,
        n_obs=int(r.size),
    )


__all__ = ["SharpeMoments", "sharpe_moments"]
