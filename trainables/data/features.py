"""Per-bar features computed from past bars only.

``features[t]`` is what a trader knows at the close of bar t: it uses bars 0..t and
nothing later (``tests/trainables/test_data_features.py`` perturbs bars after t and checks
that features up to t do not move). The label of decision time t is the next bar's return
``bar_returns[t + 1]``; the backtest and the splits use that convention.

Features for ``windows=(w_1, ..., w_m)`` (defaults (5, 20)), with W = max(windows),
lr_t = log(close_t / close_{t-1}) and sigma_t = sample std (ddof=1) of lr over the W bars
ending at t (floored at 1e-8):

=================  ===========================================================
``ret_1``          lr_t / sigma_t
``ret_<w>``        log(close_t / close_{t-w}) / (sigma_t * sqrt(w)), per window
``log_vol_<W>``    log(sigma_t)
``hl_range``       (high_t - low_t) / close_t / sigma_t
``clv``            (2 close_t - high_t - low_t) / (high_t - low_t), 0 if high == low
``volume_z_<W>``   z-score of log1p(volume_t) within the W bars ending at t
``gap``            log(open_t / close_{t-1}) / sigma_t
=================  ===========================================================

so F = 6 + len(windows) (8 for the defaults), clipped to [-20, 20]; the trainer fits the
per-feature standardization on training folds only. ``first_valid = W``: before it some
window is incomplete and every feature is 0. Why these definitions: docs/data.md#features
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from trainables.data._running_median import running_median
from trainables.data.ohlcv import Bars

__all__ = ["FeatureSet", "make_features"]

_VOL_FLOOR = 1e-8
_CLIP = 20.0


@dataclass(frozen=True, eq=False)
class FeatureSet:
    """Model inputs and the returns they are scored against, on the bars' time axis."""

    features: np.ndarray
    """(T, A, F) float32; features[t] uses bars <= t only; 0 before first_valid."""
    bar_returns: np.ndarray
    """(T, A) float64 close[t] / close[t-1] - 1, with bar_returns[0] = 0."""
    names: tuple[str, ...]
    """(F,) feature names, in the order of the last axis of ``features``."""
    first_valid: int
    """First t at which every feature is defined."""
    timestamps: np.ndarray
    """(T,) datetime64[ns], the bars' timestamps."""
    assets: tuple[str, ...]
    """(A,) asset names."""
    time_gaps: np.ndarray
    """(T,) float32 time since the previous bar in units of the median gap among bars <= t
    (past-only, like the features); time_gaps[0] = 1. Continuous-time models (Liquid/CfC)
    use it as their step size; a weekend in daily bars is ~3."""

    def __post_init__(self) -> None:
        t, a = self.bar_returns.shape
        expected = (t, a, len(self.names))
        if self.features.shape != expected:
            raise ValueError(
                f"FeatureSet.features has shape {self.features.shape}, expected {expected}"
            )
        if self.timestamps.shape != (t,) or self.time_gaps.shape != (t,):
            raise ValueError("FeatureSet.timestamps and time_gaps must have shape (T,)")
        if len(self.assets) != a:
            raise ValueError(f"FeatureSet.assets has {len(self.assets)} names for {a} assets")
        if not 0 <= self.first_valid < t:
            raise ValueError(f"FeatureSet.first_valid must be in [0, {t}), got {self.first_valid}")

    @property
    def n_features(self) -> int:
        """F."""
        return len(self.names)


def make_features(bars: Bars, windows: Sequence[int] = (5, 20)) -> FeatureSet:
    """Compute the past-only features of the module docstring from ``bars``.

    Args:
        bars: validated bars (positive prices, non-negative volume).
        windows: increasing look-back lengths >= 2 for multi-bar returns; the largest also
            sets the volatility and volume windows and ``first_valid``.
    """
    windows = tuple(int(w) for w in windows)
    if not windows or any(w < 2 for w in windows) or list(windows) != sorted(set(windows)):
        raise ValueError(
            f"make_features: windows must be strictly increasing integers >= 2, got {windows}"
        )
    w_max = windows[-1]
    n = bars.n_bars
    if n <= w_max + 1:
        raise ValueError(
            f"make_features: need more than {w_max + 1} bars for windows {windows} (the "
            f"largest window plus one decision time with a label), got {n}"
        )

    close, high, low = bars.close, bars.high, bars.low  # (T, A) each
    log_close = np.log(close)
    lr = np.zeros_like(close)
    lr[1:] = np.diff(log_close, axis=0)  # (T, A), lr[0] = 0 is never used before first_valid

    # sigma[t] = std(lr[t-W+1 .. t]) for t >= W (the W returns ending at t).
    sigma = np.ones_like(close)
    sigma[w_max:] = sliding_window_view(lr[1:], w_max, axis=0).std(axis=-1, ddof=1)
    sigma = np.maximum(sigma, _VOL_FLOOR)

    columns: list[np.ndarray] = [lr / sigma]
    names = ["ret_1"]
    for w in windows:
        ret_w = np.zeros_like(close)
        ret_w[w:] = log_close[w:] - log_close[:-w]
        columns.append(ret_w / (sigma * np.sqrt(w)))
        names.append(f"ret_{w}")
    columns.append(np.log(sigma))
    names.append(f"log_vol_{w_max}")
    columns.append((high - low) / close / sigma)
    names.append("hl_range")
    span = high - low
    clv = np.divide(2 * close - high - low, span, out=np.zeros_like(close), where=span > 0)
    columns.append(clv)
    names.append("clv")
    columns.append(_rolling_zscore(np.log1p(bars.volume), w_max))
    names.append(f"volume_z_{w_max}")
    gap = np.zeros_like(close)
    gap[1:] = np.log(bars.open[1:] / close[:-1])
    columns.append(gap / sigma)
    names.append("gap")

    features = np.clip(np.stack(columns, axis=-1), -_CLIP, _CLIP)  # (T, A, F)
    features[:w_max] = 0.0

    bar_returns = np.zeros_like(close)
    bar_returns[1:] = close[1:] / close[:-1] - 1.0

    return FeatureSet(
        features=features.astype(np.float32),
        bar_returns=bar_returns,
        names=tuple(names),
        first_valid=w_max,
        timestamps=bars.timestamps,
        assets=bars.assets,
        time_gaps=_time_gaps(bars.timestamps),
    )


def _rolling_zscore(x: np.ndarray, window: int) -> np.ndarray:
    """(T, A) z-score of x[t] within x[t-window+1 .. t]; 0 where the window is incomplete."""
    out = np.zeros_like(x)
    view = sliding_window_view(x, window, axis=0)  # (T - window + 1, A, window)
    mean = view.mean(axis=-1)
    std = view.std(axis=-1, ddof=1)
    out[window - 1 :] = np.divide(
        x[window - 1 :] - mean, std, out=np.zeros_like(mean), where=std > _VOL_FLOOR
    )
    return out


def _time_gaps(timestamps: np.ndarray) -> np.ndarray:
    """(T,) gap to the previous bar over the running median of gaps so far; first = 1."""
    gaps = np.ones(timestamps.shape[0], dtype=np.float64)
    if timestamps.shape[0] > 1:
        dt = np.diff(timestamps.astype(np.int64)).astype(np.float64)
        gaps[1:] = dt / running_median(dt)
    return gaps.astype(np.float32)
