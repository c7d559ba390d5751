"""Synthetic OHLCV with a planted, learnable signal: the embedded default data set.

With ``signal > 0`` a model that reads past bars can earn a positive out-of-sample Sharpe;
with ``signal = 0`` no model can, which makes it a null. The output is a pure function of
the arguments (every draw comes from ``np.random.default_rng(seed)``).

Generating process (t = 0..T-1 bars, k = 0..A-1 assets):

1. a 2-state Markov regime s_t in {calm, volatile}, shared by all assets, that sets the
   volatility (0.8 % / 2.0 % per bar) and, when ``signal != 0``, the drift;
2. standardized returns, a stationary VAR(1) with unit variance on a ring of assets:
   ``z_{t,k} = signal * z_{t-1,k} + lead_lag * z_{t-1,k-1} + b * e_{t,k}``, so the lag-1
   autocorrelation is ~= ``signal`` and asset k's next standardized return loads on asset
   k-1's current one with coefficient ``lead_lag``;
3. log returns ``r_{t,k} = mu(s_t) + sigma(s_t) * v_k * z_{t,k}`` (a fixed per-asset
   volatility scale v_k), closes compounding from a per-asset start price;
4. open, high, low and volume around the close path from the same bar's quantities only:
   high >= max(open, close), low <= min(open, close), volume > 0.

``signal = 0`` is a strict null: it switches off the own-lag term, the lead-lag term and
the regime drifts, leaving i.i.d. standardized shocks with regime-switching volatility.
Pass ``lead_lag=0`` with ``signal > 0`` to plant only the own-asset signal.
Every constant and equation, and why this null: docs/data.md#synthetic
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.linalg import solve_discrete_lyapunov

from trainables.data.ohlcv import Bars

__all__ = ["synthetic_bars"]

_TRANSITION = np.array([[0.985, 0.015], [0.040, 0.960]])
_REGIME_VOL = np.array([0.008, 0.020])
_REGIME_DRIFT = np.array([0.0003, -0.0005])
_BURN_IN = 200


def synthetic_bars(
    n_assets: int = 4,
    n_bars: int = 2000,
    seed: int = 0,
    signal: float = 0.15,
    lead_lag: float = 0.1,
    start: str = "2015-01-02",
    freq: str = "B",
) -> Bars:
    """Regime-switching OHLCV bars with a planted signal (process in the module docstring).

    Args:
        n_assets: A >= 1.
        n_bars: T >= 2.
        seed: seed of ``np.random.default_rng``; same arguments give identical bars.
        signal: lag-1 autocorrelation of standardized returns; 0 gives a strict null.
        lead_lag: loading of asset k's next standardized return on asset k-1's current one
            (ignored when ``signal == 0`` or ``n_assets == 1``).
        start: first timestamp, anything ``pandas.date_range`` accepts.
        freq: bar frequency, a pandas offset alias ("B" business days, "h", "min", ...).
    """
    if n_assets < 1:
        raise ValueError(f"synthetic_bars: n_assets must be >= 1, got {n_assets}")
    if n_bars < 2:
        raise ValueError(f"synthetic_bars: n_bars must be >= 2, got {n_bars}")
    if abs(signal) + abs(lead_lag) >= 1:
        raise ValueError(
            "synthetic_bars: |signal| + |lead_lag| must be < 1 for a stationary process, got "
            f"signal={signal}, lead_lag={lead_lag}"
        )
    try:
        timestamps = pd.date_range(start=start, periods=n_bars, freq=freq)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"synthetic_bars: cannot build {n_bars} timestamps from start={start!r}, "
            f"freq={freq!r}: {exc}"
        ) from exc

    rng = np.random.default_rng(seed)
    planted = signal != 0
    coef = _var_coefficients(n_assets, signal if planted else 0.0, lead_lag if planted else 0.0)
    # Stationary covariance for unit innovations; every diagonal entry is equal on a ring.
    sigma = solve_discrete_lyapunov(coef, np.eye(n_assets))
    innovation_scale = 1.0 / np.sqrt(sigma[0, 0])

    regimes = _markov_chain(rng, n_bars)  # (T,)
    shocks = rng.standard_normal((n_bars + _BURN_IN, n_assets))
    z = np.zeros((n_bars + _BURN_IN, n_assets))  # (T + burn, A)
    z[0] = rng.multivariate_normal(np.zeros(n_assets), sigma * innovation_scale**2)
    for t in range(1, n_bars + _BURN_IN):
        z[t] = coef @ z[t - 1] + innovation_scale * shocks[t]
    z = z[_BURN_IN:]  # (T, A)

    asset_vol = np.exp(rng.uniform(np.log(0.8), np.log(1.25), n_assets))  # (A,)
    vol = _REGIME_VOL[regimes][:, None] * asset_vol[None, :]  # (T, A)
    drift = _REGIME_DRIFT[regimes][:, None] if planted else np.zeros((n_bars, 1))
    log_ret = drift + vol * z  # (T, A)

    first_price = rng.uniform(20.0, 200.0, n_assets)  # (A,)
    log_close = np.log(first_price)[None, :] + np.cumsum(log_ret, axis=0)
    close = np.exp(log_close)
    prev_close = np.vstack([first_price[None, :], close[:-1]])

    n1, n2, n3, n4 = (rng.standard_normal((n_bars, n_assets)) for _ in range(4))
    open_ = prev_close * np.exp(0.25 * log_ret + 0.25 * vol * n1)
    high = np.maximum(open_, close) * np.exp(0.5 * vol * np.abs(n2))
    low = np.minimum(open_, close) * np.exp(-0.5 * vol * np.abs(n3))
    base_volume = np.exp(rng.uniform(np.log(1e5), np.log(3e6), n_assets))
    volume = base_volume[None, :] * np.exp(
        0.35 * n4 + 0.6 * (np.abs(z) - np.sqrt(2 / np.pi)) + 0.3 * (regimes[:, None] == 1)
    )

    return Bars(
        timestamps=timestamps.to_numpy(dtype="datetime64[ns]"),
        assets=tuple(f"SYN{k}" for k in range(n_assets)),
        open=open_,
        high=high,
        low=low,
        close=close,
        volume=volume,
    )


def _var_coefficients(n_assets: int, signal: float, lead_lag: float) -> np.ndarray:
    """(A, A) VAR(1) matrix: signal on the diagonal, lead_lag from asset k-1 to asset k."""
    coef = signal * np.eye(n_assets)
    if n_assets > 1:
        coef += lead_lag * np.roll(np.eye(n_assets), -1, axis=1)
    return coef


def _markov_chain(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n,) int regime path of the sticky 2-state chain, started from its stationary law."""
    p_volatile = _TRANSITION[0, 1] / (_TRANSITION[0, 1] + _TRANSITION[1, 0])
    uniforms = rng.random(n)
    states = np.empty(n, dtype=np.int64)
    states[0] = int(uniforms[0] < p_volatile)
    for t in range(1, n):
        states[t] = int(uniforms[t] >= _TRANSITION[states[t - 1], 0])
    return states
