"""Features use past bars only, have the documented shapes, and match hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from trainables.data import Bars, make_features, synthetic_bars

NAMES = ("ret_1", "ret_5", "ret_20", "log_vol_20", "hl_range", "clv", "volume_z_20", "gap")


def _perturb_after(bars: Bars, t: int, seed: int) -> Bars:
    """Same bars up to t; every later bar changed (prices, volume and timestamps)."""
    rng = np.random.default_rng(seed)
    n_late = bars.n_bars - t - 1
    # One factor per bar and asset keeps high >= max(open, close) >= ... >= low.
    factor = np.ones((bars.n_bars, bars.n_assets))
    factor[t + 1 :] = np.exp(rng.normal(0.0, 0.05, (n_late, bars.n_assets)))
    volume = bars.volume.copy()
    volume[t + 1 :] *= rng.uniform(0.1, 10.0, (n_late, bars.n_assets))
    timestamps = bars.timestamps.copy()
    timestamps[t + 1 :] += np.cumsum(rng.integers(1, 5, n_late)) * np.timedelta64(1, "D")
    return Bars(
        timestamps=timestamps,
        assets=bars.assets,
        open=bars.open * factor,
        high=bars.high * factor,
        low=bars.low * factor,
        close=bars.close * factor,
        volume=volume,
    )


@pytest.mark.parametrize("t", [0, 19, 20, 57, 298])
def test_no_lookahead_features_up_to_t_ignore_later_bars(t: int) -> None:
    bars = synthetic_bars(n_assets=3, n_bars=300, seed=11)
    base = make_features(bars)
    moved = make_features(_perturb_after(bars, t, seed=t))
    np.testing.assert_array_equal(moved.features[: t + 1], base.features[: t + 1])
    np.testing.assert_array_equal(moved.time_gaps[: t + 1], base.time_gaps[: t + 1])
    np.testing.assert_array_equal(moved.bar_returns[: t + 1], base.bar_returns[: t + 1])
    # The perturbation is real: the first valid bar after t does change.
    later = max(t + 1, base.first_valid)
    assert not np.array_equal(moved.features[later], base.features[later])


def test_shapes_dtypes_and_warmup() -> None:
    bars = synthetic_bars(n_assets=4, n_bars=200, seed=12)
    fs = make_features(bars)
    assert fs.names == NAMES and fs.n_features == 8
    assert fs.features.shape == (200, 4, 8) and fs.features.dtype == np.float32
    assert fs.bar_returns.shape == (200, 4) and fs.bar_returns.dtype == np.float64
    assert fs.time_gaps.shape == (200,) and fs.time_gaps.dtype == np.float32
    assert fs.first_valid == 20
    assert fs.assets == bars.assets
    np.testing.assert_array_equal(fs.timestamps, bars.timestamps)
    assert not fs.features[:20].any()
    valid = fs.features[20:]
    assert np.isfinite(valid).all() and np.abs(valid).max() <= 20.0
    assert np.all(valid.std(axis=(0, 1)) > 0.05)  # every feature varies after warm-up


def test_custom_windows_change_names_and_first_valid() -> None:
    fs = make_features(synthetic_bars(n_bars=100), windows=(3, 10, 30))
    assert fs.names == (
        "ret_1",
        "ret_3",
        "ret_10",
        "ret_30",
        "log_vol_30",
        "hl_range",
        "clv",
        "volume_z_30",
        "gap",
    )
    assert fs.first_valid == 30


def test_values_match_hand_computation() -> None:
    bars = synthetic_bars(n_assets=2, n_bars=60, seed=13)
    fs = make_features(bars)
    t, k = 37, 1
    c, o, h, low, v = (getattr(bars, f)[:, k] for f in ("close", "open", "high", "low", "volume"))
    lr = [np.log(c[i] / c[i - 1]) for i in range(t - 19, t + 1)]  # the 20 returns ending at t
    sigma = np.std(lr, ddof=1)
    expected = {
        "ret_1": np.log(c[t] / c[t - 1]) / sigma,
        "ret_5": np.log(c[t] / c[t - 5]) / (sigma * np.sqrt(5)),
        "ret_20": np.log(c[t] / c[t - 20]) / (sigma * np.sqrt(20)),
        "log_vol_20": np.log(sigma),
        "hl_range": (h[t] - low[t]) / c[t] / sigma,
        "clv": (2 * c[t] - h[t] - low[t]) / (h[t] - low[t]),
        "volume_z_20": (np.log1p(v[t]) - np.mean(np.log1p(v[t - 19 : t + 1])))
        / np.std(np.log1p(v[t - 19 : t + 1]), ddof=1),
        "gap": np.log(o[t] / c[t - 1]) / sigma,
    }
    for name, value in expected.items():
        got = fs.features[t, k, fs.names.index(name)]
        np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(fs.bar_returns[t, k], c[t] / c[t - 1] - 1.0, rtol=1e-12)
    assert fs.bar_returns[0, k] == 0.0


def test_time_gaps_are_in_units_of_the_past_median_gap() -> None:
    fs = make_features(synthetic_bars(n_bars=60, start="2020-01-01", freq="B"))
    assert fs.time_gaps[0] == 1.0
    # 2020-01-03 (Fri) -> 01-06 (Mon) is 3 days; the median gap so far is 1 day.
    monday = int(np.flatnonzero(fs.timestamps == np.datetime64("2020-01-06"))[0])
    assert fs.time_gaps[monday] == 3.0
    assert fs.time_gaps[monday + 1] == 1.0
    assert sorted(set(fs.time_gaps[5:].tolist())) == [1.0, 3.0]


def test_argument_errors() -> None:
    bars = synthetic_bars(n_bars=21)
    with pytest.raises(ValueError, match="need more than 21 bars"):
        make_features(bars)
    with pytest.raises(ValueError, match="strictly increasing integers >= 2"):
        make_features(synthetic_bars(n_bars=100), windows=(20, 5))
    with pytest.raises(ValueError, match="strictly increasing integers >= 2"):
        make_features(synthetic_bars(n_bars=100), windows=(1, 5))
