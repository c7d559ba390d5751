"""Backtest arithmetic pinned to hand-computed numbers, plus edge cases and input errors.

The expected values below were worked out by hand (arithmetic in the comments) and
cross-checked with 40-digit decimal arithmetic; the implementation must match every field
to 1e-12.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainables.backtest import BacktestResult, backtest

TOL = 1e-12
SQRT_252 = math.sqrt(252.0)


def assert_fields(result: BacktestResult, expected: dict[str, float]) -> None:
    for name, value in expected.items():
        assert getattr(result, name) == pytest.approx(value, rel=0, abs=TOL), name


def test_five_bars_one_asset_hand_computed() -> None:
    w = np.array([0.5, 1.0, -0.5, -0.5, 0.0])
    bar = np.array([0.01, 0.02, -0.01, 0.03, -0.02])
    result = backtest(w, bar, cost=1e-3, periods_per_year=252.0)

    # w_{t-1}          = [0, 0.5, 1.0, -0.5, -0.5]
    # |w_t - w_{t-1}|  = [0.5, 0.5, 1.5, 0.0, 0.5]            -> turnover 3.0 / 5 = 0.6
    # w_{t-1} * R_t    = [0, 0.01, -0.01, -0.015, 0.01]
    # cost * |dw|      = [0.0005, 0.0005, 0.0015, 0, 0.0005]
    # r                = [-0.0005, 0.0095, -0.0115, -0.015, 0.0095]
    expected_r = [-0.0005, 0.0095, -0.0115, -0.015, 0.0095]
    np.testing.assert_allclose(result.returns, expected_r, rtol=0, atol=TOL)

    # mean = -0.008 / 5 = -0.0016
    # r - mean = [0.0011, 0.0111, -0.0099, -0.0134, 0.0111]
    # squares sum to (1.21 + 123.21 + 98.01 + 179.56 + 123.21)e-6 = 525.2e-6
    # var(ddof=1) = 525.2e-6 / 4 = 1.313e-4, std = 0.011458621208504974...
    # Sharpe = -0.0016 / sqrt(1.313e-4) * sqrt(252) = -2.21660286382168904...
    # downside squares: (0.25 + 132.25 + 225)e-6 = 357.5e-6, mean over 5 = 7.15e-5
    # Sortino = -0.0016 / sqrt(7.15e-5) * sqrt(252) = -3.00377385011877062...
    # equity: 0.9995, peak 1 -> dd 0.0005; then new peak E1 = 0.9995 * 1.0095;
    # dd2 = 1 - 0.9885 = 0.0115, dd3 = 1 - 0.9885 * 0.985 = 0.0263275,
    # dd4 = 1 - 0.9885 * 0.985 * 1.0095 = 0.01707761125 -> max drawdown 0.0263275
    # hit rate: held at t = 1..4, gross > 0 at t = 1 and t = 4 -> 2 / 4 = 0.5
    assert_fields(
        result,
        {
            "sharpe": -2.216602863821689040,
            "sortino": -3.003773850118770619,
            "max_drawdown": 0.0263275,
            "turnover": 0.6,
            "hit_rate": 0.5,
            "mean_return": -0.0016,
            "volatility": 0.011458621208504974,
        },
    )
    assert result.sharpe == pytest.approx(-0.0016 / math.sqrt(1.313e-4) * SQRT_252, abs=TOL)
    assert result.n_periods == 5


def test_four_bars_two_assets_hand_computed() -> None:
    w = np.array([[1.0, -1.0], [0.5, -1.0], [0.5, 0.0], [-1.0, 0.5]])
    bar = np.array([[0.02, -0.01], [0.01, 0.03], [-0.02, 0.01], [0.04, -0.02]])
    result = backtest(w, bar, cost=2e-3, periods_per_year=252.0)

    # asset 0: w_{t-1} = [0, 1, 0.5, 0.5], |dw| = [1, 0.5, 0, 1.5]
    #          gross = [0, 0.01, -0.01, 0.02], cost = [0.002, 0.001, 0, 0.003]
    #          r0 = [-0.002, 0.009, -0.01, 0.017]
    # asset 1: w_{t-1} = [0, -1, -1, 0], |dw| = [1, 0, 1, 0.5]
    #          gross = [0, -0.03, -0.01, 0], cost = [0.002, 0, 0.002, 0.001]
    #          r1 = [-0.002, -0.03, -0.012, -0.001]
    # portfolio (equal-weight mean) r = [-0.002, -0.0105, -0.011, 0.008]
    expected_r = [-0.002, -0.0105, -0.011, 0.008]
    np.testing.assert_allclose(result.returns, expected_r, rtol=0, atol=TOL)

    # mean = -0.0155 / 4 = -0.003875
    # r - mean = [0.001875, -0.006625, -0.007125, 0.011875]
    # squares: (3.515625 + 43.890625 + 50.765625 + 141.015625)e-6 = 239.1875e-6
    # var(ddof=1) = 239.1875e-6 / 3, std = 0.008929119030826426...
    # Sharpe = -0.003875 / std * sqrt(252) = -6.88911389465018512...
    # downside squares: (4 + 110.25 + 121)e-6 = 235.25e-6, mean over 4 = 58.8125e-6
    # Sortino = -0.003875 / sqrt(58.8125e-6) * sqrt(252) = -8.02115958342054532...
    # equity never regains 1: dd_t = 1 - E_t, deepest at t = 2:
    # 1 - 0.998 * 0.9895 * 0.989 = 1 - 0.976658269 = 0.023341731
    # turnover: per-bar mean |dw| = [1, 0.25, 0.5, 1.0] -> 2.75 / 4 = 0.6875
    # hit rate: held cells: asset 0 at t = 1, 2, 3 and asset 1 at t = 1, 2 (5 cells);
    #           positive gross: asset 0 at t = 1 and t = 3 -> 2 / 5 = 0.4
    assert_fields(
        result,
        {
            "sharpe": -6.889113894650185123,
            "sortino": -8.021159583420545318,
            "max_drawdown": 0.023341731,
            "turnover": 0.6875,
            "hit_rate": 0.4,
            "mean_return": -0.003875,
            "volatility": 0.008929119030826427,
        },
    )
    assert result.n_periods == 4


def test_matches_reference_loop_on_random_data() -> None:
    """The vectorised code equals the formula written as an explicit per-bar loop."""
    rng = np.random.default_rng(7)
    t_len, n_assets, cost = 200, 3, 5e-4
    w = np.clip(rng.normal(0.0, 0.7, size=(t_len, n_assets)), -1.0, 1.0)
    w[rng.random((t_len, n_assets)) < 0.2] = 0.0
    bar = rng.normal(0.0005, 0.01, size=(t_len, n_assets))

    r = np.zeros(t_len)
    held = hits = 0
    prev = np.zeros(n_assets)
    for t in range(t_len):
        for k in range(n_assets):
            r[t] += (prev[k] * bar[t, k] - cost * abs(w[t, k] - prev[k])) / n_assets
            if prev[k] != 0.0:
                held += 1
                hits += prev[k] * bar[t, k] > 0.0
        prev = w[t]
    equity, peak, max_dd = 1.0, 1.0, 0.0
    for value in r:
        equity *= 1.0 + value
        peak = max(peak, equity)
        max_dd = max(max_dd, 1.0 - equity / peak)

    result = backtest(w, bar, cost=cost, periods_per_year=252.0)
    np.testing.assert_allclose(result.returns, r, rtol=0, atol=TOL)
    assert result.sharpe == pytest.approx(r.mean() / r.std(ddof=1) * SQRT_252, abs=1e-10)
    downside = math.sqrt(np.mean(np.minimum(r, 0.0) ** 2))
    assert result.sortino == pytest.approx(r.mean() / downside * SQRT_252, abs=1e-10)
    assert result.max_drawdown == pytest.approx(max_dd, abs=TOL)
    assert result.hit_rate == pytest.approx(hits / held, abs=TOL)


def test_one_dimensional_equals_single_column() -> None:
    w = np.array([0.2, -0.4, 1.0, 0.0, -1.0, 0.3])
    bar = np.array([0.01, -0.02, 0.005, 0.03, -0.01, 0.02])
    flat = backtest(w, bar)
    column = backtest(w[:, None], bar[:, None])
    assert flat.to_dict() == column.to_dict()
    np.testing.assert_array_equal(flat.returns, column.returns)


def test_zero_positions_score_zero_everywhere() -> None:
    bar = np.array([0.01, -0.02, 0.03, 0.0, -0.01])
    result = backtest(np.zeros(5), bar, cost=1e-3)
    np.testing.assert_array_equal(result.returns, np.zeros(5))
    assert result.to_dict() == {
        "sharpe": 0.0,
        "sortino": 0.0,
        "max_drawdown": 0.0,
        "turnover": 0.0,
        "hit_rate": 0.0,
        "mean_return": 0.0,
        "volatility": 0.0,
        "n_periods": 5,
    }


def test_constant_strategy_returns_give_zero_sharpe_not_a_blow_up() -> None:
    # Long 1 throughout; each bar loses exactly the entry cost: r = -0.001 on every bar.
    # The rounding of mean() would give std ~1e-19 and Sharpe ~-1e16 without the guard.
    cost = 0.001
    bar = np.array([0.1, -cost, -cost, -cost, -cost, -cost, -cost])
    result = backtest(np.ones(7), bar, cost=cost)
    np.testing.assert_array_equal(result.returns, np.full(7, -cost))
    assert result.volatility == 0.0
    assert result.sharpe == 0.0
    # Every period is a loss of the same size, so the downside deviation is |r|.
    assert result.sortino == pytest.approx(-SQRT_252, rel=1e-12)
    assert result.max_drawdown == pytest.approx(1.0 - (1.0 - cost) ** 7, abs=TOL)
    assert result.hit_rate == 0.0


def test_constant_bar_returns_with_constant_position() -> None:
    # cost 0, long 1: r = [0, 0.002, 0.002, 0.002]; no losing period -> Sortino 0.0 by
    # convention (not inf), Sharpe finite, no drawdown, every held bar a hit.
    result = backtest(np.ones(4), np.full(4, 0.002), cost=0.0)
    np.testing.assert_allclose(result.returns, [0.0, 0.002, 0.002, 0.002], rtol=0, atol=TOL)
    assert result.sortino == 0.0
    # mean 0.0015, std(ddof=1) = sqrt(3 * 0.0005**2 + 0.0015**2) / sqrt(3) = 0.001
    assert result.volatility == pytest.approx(0.001, abs=TOL)
    assert result.sharpe == pytest.approx(1.5 * SQRT_252, abs=1e-10)
    assert result.max_drawdown == 0.0
    assert result.turnover == pytest.approx(0.25, abs=TOL)
    assert result.hit_rate == 1.0
    json.dumps(result.to_dict(), allow_nan=False)


def test_periods_per_year_scales_ratios_only() -> None:
    w = np.array([0.5, 1.0, -0.5, -0.5, 0.0])
    bar = np.array([0.01, 0.02, -0.01, 0.03, -0.02])
    daily = backtest(w, bar, cost=1e-3, periods_per_year=252.0)
    hourly = backtest(w, bar, cost=1e-3, periods_per_year=252.0 * 24)
    assert hourly.sharpe == pytest.approx(daily.sharpe * math.sqrt(24), abs=TOL)
    assert hourly.sortino == pytest.approx(daily.sortino * math.sqrt(24), abs=TOL)
    assert hourly.max_drawdown == daily.max_drawdown
    assert hourly.mean_return == daily.mean_return


def test_to_dict_is_scalars_only_and_json_safe() -> None:
    result = backtest(np.array([0.5, -0.5, 0.25]), np.array([0.01, 0.02, -0.01]))
    as_dict = result.to_dict()
    assert "returns" not in as_dict
    assert all(type(v) in (float, int) for v in as_dict.values())
    json.dumps(as_dict, allow_nan=False)
    assert not result.returns.flags.writeable


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        (np.array([0.0, 1.5, 0.2]), r"index 1 has value 1\.5"),
        (np.array([0.0, 0.5, -1.0000001]), r"index 2 has value -1\.0000001"),
        (np.array([0.0, np.nan, 0.2]), r"index 1 has value nan"),
    ],
)
def test_positions_out_of_bounds_or_nan_are_rejected(positions: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        backtest(positions, np.zeros(3))


def test_bound_error_names_time_and_asset_for_2d_input() -> None:
    w = np.zeros((4, 3))
    w[2, 1] = -2.0
    with pytest.raises(ValueError, match=r"t=2, asset=1\) has value -2\.0"):
        backtest(w, np.zeros((4, 3)))


def test_bounds_are_inclusive() -> None:
    result = backtest(np.array([1.0, -1.0, 1.0]), np.array([0.0, 0.01, 0.01]), cost=0.0)
    np.testing.assert_allclose(result.returns, [0.0, 0.01, -0.01], rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("positions", "bar", "kwargs", "message"),
    [
        (np.zeros(3), np.zeros(4), {}, "same shape"),
        (np.zeros((3, 2)), np.zeros((3, 3)), {}, "same shape"),
        (np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), {}, r"shape \(T,\) or \(T, A\)"),
        (np.zeros(1), np.zeros(1), {}, "at least 2 bars"),
        (np.zeros(3), np.array([0.0, np.inf, 0.0]), {}, "bar_returns must be finite; index 1"),
        (np.zeros(3), np.zeros(3), {"cost": -1e-4}, "cost"),
        (np.zeros(3), np.zeros(3), {"periods_per_year": 0.0}, "periods_per_year"),
    ],
)
def test_invalid_inputs_raise(
    positions: np.ndarray, bar: np.ndarray, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        backtest(positions, bar, **kwargs)
