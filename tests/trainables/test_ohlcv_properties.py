"""Property-based tests of the OHLCV loader (issue 8, "Bad input").

Promise: any file, list of files or directory either loads into ``Bars`` whose invariants
hold (strictly increasing timestamps, high >= max(open, close), low <= min(open, close),
positive finite prices, finite volume >= 0) or fails with ``OHLCVError`` naming the file
(and the row and column where one is at fault). No other exception type escapes. Inputs
that are valid by construction must load to exactly the bars they were written from, so a
loader that silently changes data (a wrapped-around date, a rounded timestamp) fails too.

The number of inputs each property tried is counted in ``TRIED`` and printed at the end of
the module (``pytest -s``); docs/reliability.md quotes those counts.
"""

from __future__ import annotations

import gzip
import io
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st

from trainables.data import Bars, OHLCVError, load_ohlcv

TRIED: Counter[str] = Counter()
SETTINGS = settings(
    deadline=None,
    derandomize=True,  # the same inputs in every CI run; a failure reproduces as is
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FIELDS = ("open", "high", "low", "close", "volume")
SUFFIXES = (".csv.gz", ".csv", ".parquet", ".pq")
# The datetime64[ns] range, in whole seconds: beyond it the loader must refuse, not wrap.
NS_MIN_S, NS_MAX_S = -9_223_372_036, 9_223_372_036
DAY = 86_400
# Column spellings the loader accepts (matched case-insensitively, with aliases).
NAMES = {
    "timestamp": ["timestamp", "Date", "datetime", "Time", "ts", "open_time"],
    "open": ["open", "Open", "o", "OPEN_PRICE"],
    "high": ["high", "High", "h"],
    "low": ["low", "Low", "l"],
    "close": ["close", "Close", "c", "last"],
    "volume": ["volume", "Volume", "vol", "v"],
}
# Timestamp encodings, with the range of unix seconds each can express.
FORMATS = {
    "iso_date": (-7_000_000_000, 9_000_000_000),  # daily; years ~1748-2255, and beyond
    "iso_datetime": (-7_000_000_000, 9_000_000_000),
    "iso_z": (0, 4_000_000_000),
    "iso_offset": (0, 4_000_000_000),
    "yyyymmdd": (-2_208_988_800, 4_133_894_400),  # 1900-2100, daily
    "unix_s": (100_000_000, 99_999_000_000),  # [1e8, 1e11): up to year 5138 -> some refused
    "unix_ms": (100_000_000, 99_999_000_000),
    "unix_ns": (100_000_000, 9_223_000_000),
    "native": (-7_000_000_000, 9_000_000_000),  # parquet datetime64 (CSV writes it as text)
    "far": (9_300_000_000, 253_402_000_000),  # years 2264-9999: must be refused
}
DAILY = {"iso_date", "yyyymmdd"}


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Iterator[None]:
    yield
    print(f"\nOHLCV properties, inputs tried: {dict(sorted(TRIED.items()))}")


@dataclass
class Table:
    """One asset's bars as written: unix seconds (+ ns part) and the price columns."""

    seconds: np.ndarray  # int64 unix seconds
    nanos: np.ndarray  # int64 sub-second part (only unix_ns uses it)
    values: dict[str, np.ndarray]

    def expected_ns(self) -> np.ndarray | None:
        """datetime64[ns] timestamps, or None when they do not fit (the loader must refuse)."""
        if self.seconds.min() < NS_MIN_S or self.seconds.max() > NS_MAX_S:
            return None
        return (self.seconds.astype("datetime64[s]").astype("datetime64[ns]")) + self.nanos.astype(
            "timedelta64[ns]"
        )


@dataclass
class Case:
    """Files to write (name -> bytes), what to pass to load_ohlcv, and the expected bars."""

    files: dict[str, bytes]
    source: list[str] | str  # "." = the directory; names = a file or a list of files
    expected: tuple[tuple[str, ...], dict[str, Table]] | None  # None: corrupted
    n_rows: dict[str, int]  # data rows per file (for row-number checks)


# -- strategies --------------------------------------------------------------------------
@st.composite
def tables(draw: st.DrawFn, n: int, fmt: str) -> Table:
    lo, hi = FORMATS[fmt]
    daily = fmt in DAILY
    step = st.integers(1, 40) if daily else st.integers(1, 3 * DAY)
    steps = np.array(draw(st.lists(step, min_size=n - 1, max_size=n - 1)), dtype=np.int64)
    span = int(steps.sum()) * (DAY if daily else 1)
    start = draw(st.integers(lo, max(lo, hi - span)))
    if daily:
        start -= start % DAY
        seconds = start + DAY * np.concatenate([[0], np.cumsum(steps)])
    else:
        seconds = start + np.concatenate([[0], np.cumsum(steps)])
    nanos = (
        np.array(draw(st.lists(st.integers(0, 999_999_999), min_size=n, max_size=n)))
        if fmt == "unix_ns"
        else np.zeros(n, dtype=np.int64)
    )
    price = st.floats(1e-6, 1e9, allow_nan=False, allow_infinity=False)
    unit = st.floats(0.0, 1.0)
    close = np.array(draw(st.lists(price, min_size=n, max_size=n)))
    open_ = np.array(draw(st.lists(price, min_size=n, max_size=n)))
    up = np.array(draw(st.lists(unit, min_size=n, max_size=n)))
    down = np.array(draw(st.lists(unit, min_size=n, max_size=n)))
    top, bottom = np.maximum(open_, close), np.minimum(open_, close)
    high = top * (1.0 + up)
    low = bottom * (1.0 - 0.5 * down)
    volume = np.array(
        draw(
            st.lists(
                st.floats(0.0, 1e12) | st.integers(0, 10**9).map(float), min_size=n, max_size=n
            )
        )
    )
    return Table(
        seconds.astype(np.int64),
        nanos.astype(np.int64),
        {"open": open_, "high": high, "low": low, "close": close, "volume": volume},
    )


def _timestamp_column(table: Table, fmt: str, parquet: bool) -> pd.Series:
    s, ns = table.seconds, table.nanos
    if fmt == "unix_s":
        return pd.Series(s)
    if fmt == "unix_ms":
        return pd.Series(s * 1000)
    if fmt == "unix_ns":
        return pd.Series(s * 1_000_000_000 + ns)
    if fmt == "yyyymmdd":
        return pd.Series([int(_iso(x)[:10].replace("-", "")) for x in s])
    if fmt == "native" and parquet and table.expected_ns() is not None:
        return pd.Series(table.expected_ns())
    if fmt == "iso_date":
        return pd.Series([_iso(x)[:10] for x in s])
    if fmt == "iso_z":
        return pd.Series([_iso(x).replace(" ", "T") + "Z" for x in s])
    if fmt == "iso_offset":
        return pd.Series([_iso(x + 2 * 3600).replace(" ", "T") + "+02:00" for x in s])
    return pd.Series([_iso(x) for x in s])  # iso_datetime, far, native in CSV


def _iso(seconds: int) -> str:
    """'YYYY-MM-DD HH:MM:SS' for any year 1-9999 (numpy's datetime64[s] has the range)."""
    return str(np.datetime64(int(seconds), "s")).replace("T", " ")


def _frame(table: Table, fmt: str, names: dict[str, str], parquet: bool) -> pd.DataFrame:
    data = {names["timestamp"]: _timestamp_column(table, fmt, parquet)}
    for field in FIELDS:
        data[names[field]] = table.values[field]
    return pd.DataFrame(data)


# Timestamps that broke the parser before: beyond int64, beyond datetime64[ns], words.
TS_JUNK = st.sampled_from(
    [
        "9" * 25,
        str(2**63),
        str(2**64 - 1),
        "9500000000000000000",
        "9999-12-31",
        "0001-01-01",
        "2262-04-12",
        "1677-09-21",
        "now",
        "today",
        "2020-13-45",
        "01/02/2020",
        "-1",
        "0",
        "1e300",
        "NaT",
        "",
        "٢٠٢٠٠١٠١",
        "2020-01-01T00:00:00+25:00",
        "12:30",
    ]
)
# A whole timestamp column of one odd kind, increasing (so only the values are at fault).
TS_COLUMNS = {
    "digits_beyond_int64": lambda k: "9" * 25 + str(k),
    "ns_beyond_int64": lambda k: 9_300_000_000_000_000_000 + k,
    "year_2300": lambda k: f"2300-01-{k + 1:02d}",
    "year_1600": lambda k: f"1600-01-{k + 1:02d}",
    "year_9999": lambda k: f"9999-12-{k + 1:02d}",
    "time_of_day": lambda k: f"10:{k:02d}",
    "day_first": lambda k: f"{k + 13}/01/2020",
}
CELL_JUNK = st.sampled_from(
    ["", "nan", "NaN", "inf", "-inf", "abc", "1,5", "0", "-1", "-0.0", "1e400", "0x10", "€", "true"]
) | st.text(max_size=5)


@st.composite
def corrupt_frame(draw: st.DrawFn, df: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """Frame-level corruptions: columns, row order, cell values, price relations."""
    df = df.astype(object).copy()
    kind = draw(
        st.sampled_from(
            [
                "ts_cell",
                "ts_column",
                "drop_col",
                "rename_col",
                "dup_col",
                "shuffle",
                "dup_row",
                "reverse",
                "cell",
                "cell",
                "swap_hl",
                "non_positive",
                "extra_col",
            ]
        )
    )
    note(f"frame corruption {kind}")
    event(f"corruption: {kind}")
    cols = list(df.columns)
    row = draw(st.integers(0, len(df) - 1))
    numeric = [names[f] for f in FIELDS if names[f] in cols]
    if kind == "drop_col":
        df = df.drop(columns=draw(st.sampled_from(cols)))
    elif kind == "rename_col":
        df = df.rename(columns={draw(st.sampled_from(cols)): draw(st.text(max_size=8))})
    elif kind == "dup_col":  # the same field twice, spelled differently
        col = str(draw(st.sampled_from(cols)))
        df[col.upper() if col.upper() != col else col.lower() + " "] = df[col]
    elif kind == "shuffle":
        df = df.iloc[list(draw(st.permutations(range(len(df)))))].reset_index(drop=True)
    elif kind == "dup_row":
        df = pd.concat([df.iloc[: row + 1], df.iloc[row:]]).reset_index(drop=True)
    elif kind == "reverse":
        df = df.iloc[::-1].reset_index(drop=True)
    elif kind == "cell":
        value = draw(CELL_JUNK | st.floats() | st.integers(-(10**30), 10**30))
        df.iloc[row, draw(st.integers(0, len(cols) - 1))] = value
    elif kind == "swap_hl" and names["high"] in cols and names["low"] in cols:
        high, low = df.loc[row, names["high"]], df.loc[row, names["low"]]
        df.loc[row, names["high"]], df.loc[row, names["low"]] = low, high
    elif kind == "non_positive" and numeric:
        df.loc[row, draw(st.sampled_from(numeric))] = draw(
            st.sampled_from([0.0, -0.0, -1.0, -1e-300])
        )
    elif kind == "ts_cell" and names["timestamp"] in cols:
        df.loc[row, names["timestamp"]] = draw(TS_JUNK)
    elif kind == "ts_column" and names["timestamp"] in cols:
        make = TS_COLUMNS[draw(st.sampled_from(sorted(TS_COLUMNS)))]
        df[names["timestamp"]] = [make(k) for k in range(len(df))]
    elif kind == "extra_col":
        df[draw(st.text(min_size=1, max_size=6))] = draw(CELL_JUNK)
    return df


@st.composite
def corrupt_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """Byte-level corruptions: empty, header only, BOM, re-encoding, truncation, noise."""
    kind = draw(
        st.sampled_from(
            [
                "empty",
                "header_only",
                "bom",
                "utf16",
                "latin1",
                "truncate",
                "splice",
                "random",
                "blank_lines",
            ]
        )
    )
    note(f"byte corruption {kind}")
    event(f"corruption: {kind}")
    if kind == "empty":
        return b""
    if kind == "header_only":
        return data.split(b"\n", 1)[0] + b"\n"
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind in ("utf16", "latin1"):
        text = data.decode("utf-8", errors="replace") + draw(st.text(max_size=3))
        return text.encode("utf-16" if kind == "utf16" else "latin-1", errors="replace")
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if kind == "splice":
        pos = draw(st.integers(0, len(data)))
        return data[:pos] + draw(st.binary(max_size=8)) + data[pos + draw(st.integers(0, 4)) :]
    if kind == "blank_lines":
        return b"\n\n  \n" + data.replace(b",", b" , ")
    return draw(st.binary(max_size=300))


def _suffix(name: str) -> str:
    return next((s for s in SUFFIXES if name.endswith(s)), "")


def _serialize(df: pd.DataFrame, suffix: str) -> bytes:
    if suffix in (".parquet", ".pq"):
        for frame in (df, df.astype(str)):  # mixed-type columns after corruption: as text
            buffer = io.BytesIO()
            try:
                frame.to_parquet(buffer, index=False)
            except Exception:  # e.g. duplicate column names: then it is a CSV in disguise
                continue
            return buffer.getvalue()
        return df.to_csv(index=False).encode()
    text = df.to_csv(index=False).encode()
    return gzip.compress(text, mtime=0) if suffix == ".csv.gz" else text


@st.composite
def cases(draw: st.DrawFn, corrupt: bool) -> Case:
    layout = draw(st.sampled_from(["single", "long", "directory", "list"]))
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    n = draw(st.integers(1, 8))
    n_assets = 1 if layout == "single" else draw(st.integers(1, 3))
    assets = draw(
        st.lists(
            st.from_regex(r"[A-Z]{1,4}[0-9]?", fullmatch=True),
            min_size=n_assets,
            max_size=n_assets,
            unique=True,
        )
    )
    base = draw(tables(n, fmt))
    # Every asset on the same time axis (the loader keeps the timestamps all assets share).
    by_asset = {
        asset: base if k == 0 else Table(base.seconds, base.nanos, draw(tables(n, fmt)).values)
        for k, asset in enumerate(assets)
    }
    names = {f: draw(st.sampled_from(options)) for f, options in NAMES.items()}
    note(f"layout={layout} fmt={fmt} n={n} assets={assets} names={names}")
    event(f"layout: {layout}")
    event(f"timestamps: {fmt}")

    files: dict[str, pd.DataFrame | bytes] = {}
    source: str | list[str]
    if layout in ("single", "long"):
        suffix = draw(st.sampled_from([".csv", ".csv", ".csv.gz", ".parquet", ".pq"]))
        parquet = suffix in (".parquet", ".pq")
        asset_column = draw(st.sampled_from(["asset", "Symbol", "ticker"]))
        frames = []
        for asset, table in by_asset.items():
            df = _frame(table, fmt, names, parquet)
            if layout == "long":
                df.insert(1, asset_column, asset)
            frames.append(df)
        if layout == "long" and draw(st.booleans()):  # time-major: row t of every asset
            df = pd.concat(frames, keys=range(len(frames))).swaplevel().sort_index()
        else:
            df = pd.concat(frames)
        source = (assets[0] if layout == "single" else "bars") + suffix
        files[source] = df.reset_index(drop=True)
        order = list(assets)
    else:
        for asset, table in by_asset.items():
            suffix = draw(st.sampled_from([".csv", ".csv.gz", ".parquet", ".pq"]))
            files[asset + suffix] = _frame(table, fmt, names, suffix in (".parquet", ".pq"))
        if layout == "directory":
            source = "."
            listed = sorted(files)  # a directory is read in file-name order
        else:
            listed = list(draw(st.permutations(sorted(files))))
            source = listed
        order = [_stem(f) for f in listed]

    corrupted = False
    if corrupt:
        for _ in range(draw(st.integers(1, 2))):
            target = draw(st.sampled_from(sorted(files)))
            item = files[target]
            if isinstance(item, pd.DataFrame) and draw(st.integers(0, 3)) > 0:
                files[target] = draw(corrupt_frame(item, names))
            else:
                raw = item if isinstance(item, bytes) else _serialize(item, _suffix(target))
                files[target] = draw(corrupt_bytes(raw))
            corrupted = True
        if layout == "directory" and draw(st.booleans()):
            junk = draw(st.sampled_from(["notes.txt", "junk.csv", "X.pq", "Y.csv.gz"]))
            files[junk] = draw(st.binary(max_size=64))
    out: dict[str, bytes] = {}
    n_rows: dict[str, int] = {}
    for name, item in files.items():
        if isinstance(item, pd.DataFrame):
            n_rows[name] = len(item)
            out[name] = _serialize(item, _suffix(name))
        else:
            out[name] = item
    expected = None if corrupted else (tuple(order), by_asset)
    return Case(out, source, expected, n_rows)


def _stem(name: str) -> str:
    return name[: -len(_suffix(name))]


# -- the property's checks ---------------------------------------------------------------
def check_bars(bars: Bars) -> None:
    ts = bars.timestamps
    assert ts.dtype == np.dtype("datetime64[ns]") and not np.isnat(ts).any()
    assert np.all(np.diff(ts.astype(np.int64)) > 0), "timestamps must strictly increase"
    o, h, low, c, v = (getattr(bars, f) for f in FIELDS)
    for arr in (o, h, low, c, v):
        assert arr.shape == (bars.n_bars, bars.n_assets) and np.isfinite(arr).all()
    assert (o > 0).all() and (h > 0).all() and (low > 0).all() and (c > 0).all()
    assert (v >= 0).all()
    assert (h >= np.maximum(o, c)).all() and (low <= np.minimum(o, c)).all()


def check_error(error: OHLCVError, root: Path, case: Case) -> None:
    written = {str(root / name) for name in case.files} | {str(root)}
    if error.file is None:
        # Only the multi-asset alignment error spans several files; it lists them.
        assert "share no timestamps" in error.reason and any(f in str(error) for f in written)
    else:
        assert error.file in written, f"error names {error.file}, not one of the inputs"
        assert error.file in str(error)
    if error.row is not None:
        assert error.row >= 1 and error.column is not None, "a bad row comes with its column"
        name = Path(error.file or "").name
        if name in case.n_rows:
            assert error.row <= case.n_rows[name]
    if error.column is not None:
        assert isinstance(error.column, str) and repr(error.column) in str(error)


def run_case(case: Case, kind: str) -> None:
    TRIED[kind] += 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, data in case.files.items():
            (root / name).write_bytes(data)
        if isinstance(case.source, list):
            source: Path | list[Path] = [root / s for s in case.source]
        else:
            source = root if case.source == "." else root / case.source
        try:
            bars = load_ohlcv(source)
        except OHLCVError as exc:
            note(f"OHLCVError: {exc}")
            event(f"{kind}: OHLCVError")
            check_error(exc, root, case)
            if case.expected is not None:
                first = next(iter(case.expected[1].values()))
                assert first.expected_ns() is None, f"valid input refused: {exc}"
            return
        event(f"{kind}: loaded")
        check_bars(bars)
        if case.expected is not None:
            assets, by_asset = case.expected
            expected_ts = next(iter(by_asset.values())).expected_ns()
            assert expected_ts is not None, "timestamps outside datetime64[ns] were accepted"
            assert bars.assets == assets
            np.testing.assert_array_equal(bars.timestamps, expected_ts)
            for k, asset in enumerate(assets):
                for field in FIELDS:
                    np.testing.assert_array_equal(
                        getattr(bars, field)[:, k], by_asset[asset].values[field], err_msg=field
                    )


# -- properties --------------------------------------------------------------------------
def _one_csv(text: str, name: str = "X.csv") -> Case:
    return Case({name: text.encode()}, name, None, {name: text.count("\n") - 1})


HEADER = "timestamp,open,high,low,close,volume\n"


def _exact_case(fmt: str, seconds: list[int], nanos: list[int] | None = None) -> Case:
    """A valid single-asset CSV whose bars are known: it must load to exactly them (or be
    refused when the timestamps do not fit datetime64[ns])."""
    n = len(seconds)
    ones = np.ones(n)
    table = Table(
        np.array(seconds, dtype=np.int64),
        np.array(nanos or [0] * n, dtype=np.int64),
        {"open": ones, "high": 2 * ones, "low": 0.5 * ones, "close": ones, "volume": ones},
    )
    names = {f: f for f in NAMES}
    df = _frame(table, fmt, names, parquet=False)
    return Case({"X.csv": _serialize(df, ".csv")}, "X.csv", (("X",), {"X": table}), {"X.csv": n})


@settings(SETTINGS, max_examples=80)
@given(case=cases(corrupt=False))
# Pinned: years beyond datetime64[ns] wrapped around silently (9999-12-31 -> 1816-03-29);
# nanosecond epochs went through float64 and lost up to 256 ns.
@example(case=_exact_case("iso_date", [253_402_041_600, 253_402_128_000]))
@example(case=_exact_case("unix_ns", [1_600_000_000, 1_600_000_000], [123_456_789, 123_456_790]))
def test_valid_files_load_exactly(case: Case) -> None:
    run_case(case, "valid by construction")


@settings(SETTINGS, max_examples=150)
@given(case=cases(corrupt=True))
# Inputs that escaped as other exception types before the fixes, pinned:
@example(case=_one_csv(HEADER + "99999999999999999999999,1,2,0.5,1,1\n"))  # OverflowError
@example(case=_one_csv(HEADER + "9500000000000000000,1,2,0.5,1,1\n" * 2))  # AttributeError
@example(case=_one_csv(HEADER + "9223372036854775807,1,2,0.5,1,1\n"))  # Bars ValueError
def test_corrupted_files_load_or_name_file_row_column(case: Case) -> None:
    run_case(case, "corrupted")


@settings(SETTINGS, max_examples=50)
@given(
    data=st.binary(max_size=400) | st.text(max_size=200).map(str.encode),
    suffix=st.sampled_from([".csv", ".csv.gz", ".parquet", ".pq"]),
)
def test_arbitrary_bytes_load_or_name_the_file(data: bytes, suffix: str) -> None:
    run_case(Case({"x" + suffix: data}, "x" + suffix, None, {}), "arbitrary bytes")
