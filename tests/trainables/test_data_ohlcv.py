"""Loader contract: layouts round-trip exactly, and every bad input is located precisely."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainables.data import Bars, OHLCVError, load_ohlcv, synthetic_bars


def _frame(n: int = 6, start: str = "2020-01-01") -> pd.DataFrame:
    """A valid single-asset table in the capitalized layout of common vendor exports."""
    close = 100.0 + np.arange(n, dtype=float)
    return pd.DataFrame(
        {
            "Date": pd.date_range(start, periods=n, freq="D").strftime("%Y-%m-%d"),
            "Open": close - 0.5,
            "High": close + 1.0,
            "Low": close - 1.0,
            "Close": close,
            "Adj Close": close * 0.5,
            "Volume": 1000.0 + np.arange(n),
        }
    )


def _write_csv(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False)
    return path


def _assert_same_bars(a: Bars, b: Bars) -> None:
    assert a.assets == b.assets
    np.testing.assert_array_equal(a.timestamps, b.timestamps)
    for field in ("open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


@pytest.mark.parametrize("name", ["bars.csv", "bars.csv.gz", "bars.parquet", "bars.pq"])
def test_long_table_round_trip_is_exact(tmp_path: Path, name: str) -> None:
    bars = synthetic_bars(n_assets=3, n_bars=40, seed=1)
    path = tmp_path / name
    frame = bars.to_frame()
    if name.endswith((".parquet", ".pq")):
        frame.to_parquet(path)
    else:
        frame.to_csv(path, index=False)
    _assert_same_bars(load_ohlcv(path), bars)


def test_directory_of_per_asset_files_names_assets_by_file_stem(tmp_path: Path) -> None:
    bars = synthetic_bars(n_assets=3, n_bars=30, seed=2)
    frame = bars.to_frame().drop(columns="asset")
    per_asset = {a: frame.iloc[k :: bars.n_assets] for k, a in enumerate(bars.assets)}
    per_asset["SYN0"].to_csv(tmp_path / "SYN0.csv", index=False)
    per_asset["SYN1"].to_csv(tmp_path / "SYN1.csv.gz", index=False)
    per_asset["SYN2"].to_parquet(tmp_path / "SYN2.parquet")
    (tmp_path / "README.txt").write_text("not data")
    _assert_same_bars(load_ohlcv(tmp_path), bars)
    # An explicit list keeps the caller's asset order.
    listed = load_ohlcv([tmp_path / "SYN2.parquet", str(tmp_path / "SYN0.csv")])
    assert listed.assets == ("SYN2", "SYN0")
    np.testing.assert_array_equal(listed.close[:, 0], bars.close[:, 2])


def test_single_file_without_asset_column_uses_file_name(tmp_path: Path) -> None:
    bars = load_ohlcv(_write_csv(_frame(), tmp_path / "BRK.B.csv"))
    assert bars.assets == ("BRK.B",)
    assert (bars.n_bars, bars.n_assets) == (6, 1)


def test_adj_close_and_extra_columns_are_ignored(tmp_path: Path) -> None:
    df = _frame()
    df["Dividends"] = 0.0
    bars = load_ohlcv(_write_csv(df, tmp_path / "x.csv"))
    np.testing.assert_array_equal(bars.close[:, 0], 100.0 + np.arange(6))


def test_column_aliases_are_case_insensitive(tmp_path: Path) -> None:
    df = _frame().rename(
        columns={"Date": "DATETIME", "Open": "o", "High": "HIGH", "Low": "low", "Volume": "Vol"}
    )
    df.insert(0, "Ticker", ["AAA"] * 3 + ["BBB"] * 3)
    df["DATETIME"] = list(df["DATETIME"][:3]) * 2
    bars = load_ohlcv(_write_csv(df, tmp_path / "x.csv"))
    assert bars.assets == ("AAA", "BBB")
    np.testing.assert_array_equal(bars.open[:, 1], [102.5, 103.5, 104.5])
    np.testing.assert_array_equal(bars.volume[:, 0], [1000.0, 1001.0, 1002.0])


def test_separate_date_and_time_columns_are_joined(tmp_path: Path) -> None:
    df = _frame(n=3)
    df["Date"] = "2020-01-02"
    df.insert(1, "Time", ["09:30", "09:31", "09:32"])
    bars = load_ohlcv(_write_csv(df, tmp_path / "x.csv"))
    assert bars.timestamps[2] == np.datetime64("2020-01-02T09:32")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["2020-01-02", "2020-01-03"], ["2020-01-02", "2020-01-03"]),
        (["2020-01-02 09:30:00", "2020-01-02 09:31:00"], ["2020-01-02T09:30", "2020-01-02T09:31"]),
        # tz-aware -> UTC naive; offsets may differ between rows (DST).
        (
            ["2020-03-06T10:00-05:00", "2020-03-09T10:00-04:00"],
            ["2020-03-06T15:00", "2020-03-09T14:00"],
        ),
        (
            ["2020-01-02T10:00:00Z", "2020-01-02T11:00:00Z"],
            ["2020-01-02T10:00", "2020-01-02T11:00"],
        ),
        ([20200102, 20200103], ["2020-01-02", "2020-01-03"]),
        ([1577923200, 1578009600], ["2020-01-02", "2020-01-03"]),  # unix seconds
        ([1577923200000, 1577923260000], ["2020-01-02T00:00", "2020-01-02T00:01"]),  # ms
        (["01/02/2020", "01/13/2020"], ["2020-01-02", "2020-01-13"]),  # only month-first fits
        (["Jan 02, 2020", "Jan 03, 2020"], ["2020-01-02", "2020-01-03"]),
    ],
)
def test_date_formats(tmp_path: Path, values: list[object], expected: list[str]) -> None:
    df = _frame(n=2)
    df["Date"] = values
    bars = load_ohlcv(_write_csv(df, tmp_path / "x.csv"))
    assert bars.timestamps.dtype == np.dtype("datetime64[ns]")
    np.testing.assert_array_equal(bars.timestamps, np.array(expected, dtype="datetime64[ns]"))


def test_parquet_tz_aware_timestamps_become_utc_naive(tmp_path: Path) -> None:
    df = _frame(n=3)
    df["Date"] = pd.date_range("2020-01-02 09:30", periods=3, freq="h", tz="America/New_York")
    df.to_parquet(tmp_path / "x.parquet")
    bars = load_ohlcv(tmp_path / "x.parquet")
    assert bars.timestamps[0] == np.datetime64("2020-01-02T14:30")


def test_ambiguous_day_month_is_refused_naming_the_column(tmp_path: Path) -> None:
    df = _frame(n=2)
    df["Date"] = ["01/02/2020", "01/03/2020"]  # Jan 2 or Feb 1? Both readings fit.
    with pytest.raises(OHLCVError, match="ambiguous") as info:
        load_ohlcv(_write_csv(df, tmp_path / "x.csv"))
    assert (info.value.row, info.value.column) == (None, "Date")


def _set(column: str, row: int, value: object) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """Mutation setting one cell; ``row`` is 1-based like the error's row."""

    def mutate(df: pd.DataFrame) -> pd.DataFrame:
        df[column] = df[column].astype(object)
        df.loc[row - 1, column] = value
        return df

    return mutate


@pytest.mark.parametrize(
    ("mutate", "row", "column", "reason"),
    [
        (_set("Date", 3, "not a date"), 3, "Date", "cannot parse timestamp 'not a date'"),
        (_set("Date", 4, None), 4, "Date", "empty timestamp"),
        (_set("Date", 3, "2019-12-31"), 3, "Date", "earlier than 2020-01-02 in row 2"),
        (
            _set("Date", 3, "2020-01-02"),
            3,
            "Date",
            "duplicate timestamp 2020-01-02 (same as row 2)",
        ),
        (_set("Close", 2, np.nan), 2, "Close", "missing value"),
        (_set("Open", 5, np.inf), 5, "Open", "infinite value"),
        (_set("Low", 2, "abc"), 2, "Low", "not a number: 'abc'"),
        (_set("Open", 4, 0.0), 4, "Open", "open must be positive, got 0.0"),
        (_set("Volume", 6, -1.0), 6, "Volume", "volume must be >= 0, got -1.0"),
        (_set("Close", 2, 102.5), 2, "High", "high (102.0) is below close (102.5)"),
        (_set("Open", 3, 103.5), 3, "High", "high (103.0) is below open (103.5)"),
        (_set("Low", 5, 104.0), 5, "Low", "low (104.0) is above open (103.5)"),
    ],
)
def test_each_rule_reports_file_row_and_column(
    tmp_path: Path,
    mutate: Callable[[pd.DataFrame], pd.DataFrame],
    row: int,
    column: str,
    reason: str,
) -> None:
    path = _write_csv(mutate(_frame()), tmp_path / "prices.csv")
    with pytest.raises(OHLCVError) as info:
        load_ohlcv(path)
    err = info.value
    assert (err.file, err.row, err.column) == (str(path), row, column)
    assert reason in err.reason
    assert str(err) == f"{path}, row {row}, column {column!r}: {err.reason}"


def test_high_below_low_message_matches_documented_form(tmp_path: Path) -> None:
    df = _frame()
    df.loc[3, ["Open", "High", "Low", "Close"]] = [99.5, 99.1, 100.2, 99.8]
    path = _write_csv(df, tmp_path / "prices.csv")
    with pytest.raises(OHLCVError) as info:
        load_ohlcv(path)
    assert str(info.value) == f"{path}, row 4, column 'High': high (99.1) is below low (100.2)"


def test_error_counts_further_violations(tmp_path: Path) -> None:
    df = _frame()
    df["Volume"] = -5.0
    with pytest.raises(OHLCVError, match=r"\(6 rows have this problem\)") as info:
        load_ohlcv(_write_csv(df, tmp_path / "x.csv"))
    assert info.value.row == 1


def test_missing_columns_are_listed_with_the_columns_found(tmp_path: Path) -> None:
    path = _write_csv(_frame().drop(columns=["Volume", "Low"]), tmp_path / "x.csv")
    with pytest.raises(OHLCVError) as info:
        load_ohlcv(path)
    err = info.value
    assert (err.file, err.row, err.column) == (str(path), None, "low")
    assert "missing required column(s) 'low', 'volume'" in err.reason
    assert "found columns: 'Date', 'Open', 'High', 'Close', 'Adj Close'" in err.reason


def test_long_table_errors_use_the_file_row_of_that_asset(tmp_path: Path) -> None:
    a, b = _frame(n=4), _frame(n=4)
    a["Symbol"], b["Symbol"] = "AAA", "BBB"
    b.loc[3, "Date"] = b.loc[2, "Date"]  # BBB repeats a date in its 4th row
    # Interleave rows: AAA, BBB, AAA, BBB, ... so BBB's 4th row is file row 8.
    long = pd.concat([a, b]).sort_index(kind="stable").reset_index(drop=True)
    path = _write_csv(long, tmp_path / "long.csv")
    with pytest.raises(OHLCVError, match="duplicate timestamp 2020-01-03 for asset 'BBB'") as info:
        load_ohlcv(path)
    assert (info.value.row, info.value.column) == (8, "Date")


def test_alignment_keeps_common_timestamps(tmp_path: Path) -> None:
    a = _frame(n=6)
    b = _frame(n=6).drop(index=[2, 4])  # keeps 4 of 6 for A: allowed (<= half dropped)
    paths = [_write_csv(a, tmp_path / "A.csv"), _write_csv(b, tmp_path / "B.csv")]
    bars = load_ohlcv(paths)
    assert bars.n_bars == 4
    np.testing.assert_array_equal(bars.close[:, 0], [100.0, 101.0, 103.0, 105.0])
    np.testing.assert_array_equal(bars.close[:, 0], bars.close[:, 1])


def test_alignment_that_drops_over_half_names_the_asset(tmp_path: Path) -> None:
    a = _write_csv(_frame(n=10), tmp_path / "A.csv")
    b = _write_csv(_frame(n=4), tmp_path / "B.csv")
    bars_ok = load_ohlcv([a, _write_csv(_frame(n=5), tmp_path / "C.csv")])  # exactly half
    assert bars_ok.n_bars == 5
    with pytest.raises(OHLCVError, match="keeps only 4 of 10 bars of asset 'A'") as info:
        load_ohlcv([a, b])
    assert (info.value.file, info.value.column) == (str(a), "Date")


def test_disjoint_assets_cannot_be_aligned(tmp_path: Path) -> None:
    a = _write_csv(_frame(n=3), tmp_path / "A.csv")
    b = _write_csv(_frame(n=3, start="2021-01-01"), tmp_path / "B.csv")
    with pytest.raises(OHLCVError, match="share no timestamps"):
        load_ohlcv([a, b])


def test_source_problems_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(OHLCVError, match="file not found") as info:
        load_ohlcv(tmp_path / "nope.csv")
    assert info.value.file == str(tmp_path / "nope.csv")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(OHLCVError, match="unsupported file type"):
        load_ohlcv(tmp_path / "x.json")
    with pytest.raises(OHLCVError, match="no data files"):
        load_ohlcv(tmp_path)
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(OHLCVError, match="file is empty"):
        load_ohlcv(tmp_path / "empty.csv")
    a = _write_csv(_frame(), tmp_path / "A.csv")
    sub = tmp_path / "sub"
    sub.mkdir()
    with pytest.raises(OHLCVError, match="asset 'A' appears in more than one file"):
        load_ohlcv([a, _write_csv(_frame(), sub / "A.csv")])


def test_error_survives_copy_with_its_location() -> None:
    # Ray moves exceptions between processes by value; the location must travel with it.
    err = OHLCVError("bad", file="f.csv", row=3, column="High")
    clone = copy.deepcopy(err)
    assert (clone.file, clone.row, clone.column, str(clone)) == (
        "f.csv",
        3,
        "High",
        "f.csv, row 3, column 'High': bad",
    )


def test_bars_structure_is_checked_and_read_only() -> None:
    bars = synthetic_bars(n_assets=2, n_bars=10)
    part = bars.slice(2, 5)
    assert (part.n_bars, part.n_assets) == (3, 2)
    np.testing.assert_array_equal(part.close, bars.close[2:5])
    assert part.timestamps[0] == bars.timestamps[2]
    with pytest.raises(ValueError, match="read-only"):
        bars.close[0, 0] = 1.0
    ts = bars.timestamps
    ones = np.ones((10, 2))
    with pytest.raises(ValueError, match=r"Bars.high has shape \(10, 3\)"):
        Bars(ts, ("a", "b"), ones, np.ones((10, 3)), ones, ones, ones)
    with pytest.raises(ValueError, match="strictly increasing; index 1"):
        Bars(ts[::-1], ("a", "b"), ones, ones, ones, ones, ones)
    with pytest.raises(ValueError, match="unique"):
        Bars(ts, ("a", "a"), ones, ones, ones, ones, ones)
