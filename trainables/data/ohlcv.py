"""OHLCV bars: the one in-memory form of market data, and the validating file loader.

Every model, feature and backtest reads ``Bars``; files enter only through ``load_ohlcv``,
which refuses bad data with an ``OHLCVError`` naming the file, the row and the column, so a
sweep never trains on a silently repaired price series.

Accepted layouts (CSV, ``.csv.gz`` or Parquet, chosen by suffix):

- one file per asset: a directory of files or a list of files; the asset is the file name
  without its suffix (``AAPL.csv`` -> ``AAPL``);
- one long table with an asset column (``asset``, ``symbol`` or ``ticker``);
- one single-asset file (the asset is its name).

Column names are matched case-insensitively, ignoring spaces, underscores and punctuation
at the ends, with common aliases (see ``_ALIASES``); ``Adj Close`` and other extra columns
are ignored. Timestamp formats are described in ``trainables.data._timestamps``.

Row numbers in errors count data rows from 1, header excluded: row 1 is the first line
after the header (line 2 of a CSV file).

Several assets are aligned on the timestamps they all share. Alignment may drop at most
half of any asset's bars; more than that means the files cover different periods or
calendars, which is reported rather than trained on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainables.data._timestamps import TimestampError, parse_timestamps

__all__ = ["Bars", "OHLCVError", "load_ohlcv"]

_PRICE_FIELDS = ("open", "high", "low", "close")
_FIELDS = (*_PRICE_FIELDS, "volume")
# Canonical field -> accepted normalized column names, in order of preference.
_ALIASES: dict[str, tuple[str, ...]] = {
    "timestamp": ("timestamp", "datetime", "date_time", "date", "time", "ts", "open_time"),
    "open": ("open", "o", "open_price"),
    "high": ("high", "h", "high_price"),
    "low": ("low", "l", "low_price"),
    "close": ("close", "c", "close_price", "last"),
    "volume": ("volume", "vol", "v"),
}
_ASSET_ALIASES = ("asset", "symbol", "ticker")
_SUFFIXES = (".csv.gz", ".csv", ".parquet", ".pq")


class OHLCVError(ValueError):
    """Invalid OHLCV input, located as precisely as the problem allows.

    Attributes:
        file: the file as given (None when the problem spans several files).
        row: 1-based data row number, header excluded (None for whole-column problems).
        column: the column name as written in the file (None for whole-file problems).
        reason: the message without the location prefix.
    """

    def __init__(
        self,
        reason: str,
        *,
        file: str | os.PathLike[str] | None = None,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        self.reason = reason
        self.file = None if file is None else str(file)
        self.row = row
        self.column = column
        where = []
        if self.file is not None:
            where.append(self.file)
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column!r}")
        super().__init__(f"{', '.join(where)}: {reason}" if where else reason)

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray ships a trial's exception to the driver by value; keep the location fields.
        return (_rebuild_error, (self.reason, self.file, self.row, self.column))


def _rebuild_error(
    reason: str, file: str | None, row: int | None, column: str | None
) -> OHLCVError:
    return OHLCVError(reason, file=file, row=row, column=column)


@dataclass(frozen=True, eq=False)
class Bars:
    """Aligned OHLCV bars of several assets on one shared time axis.

    Arrays are stored as read-only views (not copies), so a ``Bars`` passed to many trials
    cannot be changed by one of them. Price relations (high >= low, ...) are checked by
    ``load_ohlcv`` and guaranteed by ``synthetic_bars``; the constructor checks structure.
    """

    timestamps: np.ndarray
    """(T,) datetime64[ns], UTC-naive, strictly increasing."""
    assets: tuple[str, ...]
    """(A,) unique asset names; column k of every price array belongs to assets[k]."""
    open: np.ndarray
    """(T, A) float64."""
    high: np.ndarray
    """(T, A) float64."""
    low: np.ndarray
    """(T, A) float64."""
    close: np.ndarray
    """(T, A) float64."""
    volume: np.ndarray
    """(T, A) float64."""

    def __post_init__(self) -> None:
        ts = np.asarray(self.timestamps)
        if ts.ndim != 1 or not np.issubdtype(ts.dtype, np.datetime64):
            raise ValueError(
                f"Bars.timestamps must be a 1-D datetime64 array, got {ts.dtype} with shape "
                f"{ts.shape}"
            )
        ts = ts.astype("datetime64[ns]")
        if ts.size == 0:
            raise ValueError("Bars needs at least one bar")
        steps = np.diff(ts.astype(np.int64))
        if np.any(steps <= 0):
            i = int(np.argmax(steps <= 0)) + 1
            raise ValueError(
                f"Bars.timestamps must be strictly increasing; index {i} ({ts[i]}) does not "
                f"come after index {i - 1} ({ts[i - 1]})"
            )
        assets = tuple(str(a) for a in self.assets)
        if not assets:
            raise ValueError("Bars needs at least one asset")
        if len(set(assets)) != len(assets):
            dups = sorted({a for a in assets if assets.count(a) > 1})
            raise ValueError(f"Bars.assets must be unique; repeated: {dups}")
        shape = (ts.size, len(assets))
        for name in _FIELDS:
            arr = np.asarray(getattr(self, name), dtype=np.float64)
            if arr.shape != shape:
                raise ValueError(
                    f"Bars.{name} has shape {arr.shape}, expected (n_bars, n_assets) = {shape}"
                )
            object.__setattr__(self, name, _readonly(arr))
        object.__setattr__(self, "timestamps", _readonly(ts))
        object.__setattr__(self, "assets", assets)

    @property
    def n_bars(self) -> int:
        """T, the number of bars on the shared time axis."""
        return int(self.timestamps.shape[0])

    @property
    def n_assets(self) -> int:
        """A, the number of assets."""
        return len(self.assets)

    def slice(self, start: int | None, stop: int | None) -> Bars:
        """Bars ``[start, stop)`` along time (Python slice semantics; views, no copy)."""
        s = slice(start, stop)
        return Bars(
            timestamps=self.timestamps[s],
            assets=self.assets,
            open=self.open[s],
            high=self.high[s],
            low=self.low[s],
            close=self.close[s],
            volume=self.volume[s],
        )

    def to_frame(self) -> pd.DataFrame:
        """Long table (timestamp, asset, open, high, low, close, volume), time-major.

        Writing it with ``to_csv(index=False)`` or ``to_parquet`` gives a file that
        ``load_ohlcv`` reads back to equal bars.
        """
        t, a = self.n_bars, self.n_assets
        data: dict[str, Any] = {
            "timestamp": np.repeat(self.timestamps, a),
            "asset": np.tile(np.asarray(self.assets, dtype=object), t),
        }
        for name in _FIELDS:
            data[name] = getattr(self, name).reshape(-1)
        return pd.DataFrame(data)


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


@dataclass
class _AssetTable:
    """One asset's rows from one file, before alignment."""

    asset: str
    file: str
    rows: np.ndarray  # (n,) 1-based data row numbers in the file
    timestamps: np.ndarray  # (n,) datetime64[ns]
    values: dict[str, np.ndarray]  # field -> (n,) float64
    timestamp_column: str


def load_ohlcv(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Bars:
    """Load and validate OHLCV bars from CSV/Parquet files (see the module docstring).

    Args:
        source: a file, a directory of per-asset files, or a list of files.

    Raises:
        OHLCVError: on any invalid input, naming the file, row and column.
    """
    tables: list[_AssetTable] = []
    seen: dict[str, str] = {}
    for path in _expand_source(source):
        for table in _load_file(path):
            if table.asset in seen:
                raise OHLCVError(
                    f"asset {table.asset!r} appears in more than one file (also in "
                    f"{seen[table.asset]})",
                    file=table.file,
                )
            seen[table.asset] = table.file
            tables.append(table)
    return _align(tables)


def _expand_source(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and _has_data_suffix(p))
            if not files:
                raise OHLCVError(
                    f"directory has no data files (expected {', '.join(_SUFFIXES)})",
                    file=path,
                )
            return files
        paths = [path]
    else:
        paths = [Path(p) for p in source]
        if not paths:
            raise ValueError("load_ohlcv: source is an empty list; give at least one file")
    for path in paths:
        if not path.is_file():
            raise OHLCVError("file not found", file=path)
        if not _has_data_suffix(path):
            raise OHLCVError(
                f"unsupported file type; expected one of {', '.join(_SUFFIXES)}", file=path
            )
    return paths


def _has_data_suffix(path: Path) -> bool:
    return path.name.lower().endswith(_SUFFIXES)


def _asset_from_name(path: Path) -> str:
    name = path.name
    for suffix in _SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _read_table(path: Path) -> pd.DataFrame:
    try:
        if path.name.lower().endswith((".parquet", ".pq")):
            df = pd.read_parquet(path)
            if not isinstance(df.index, pd.RangeIndex):
                df = df.reset_index()  # a timestamp saved as the index becomes a column
        else:
            df = pd.read_csv(path)
    except pd.errors.EmptyDataError as exc:
        raise OHLCVError("file is empty", file=path) from exc
    except Exception as exc:  # any reader failure is a bad file, reported with its name
        raise OHLCVError(f"cannot read file: {exc}", file=path) from exc
    if len(df) == 0:
        raise OHLCVError("file has no data rows", file=path)
    return df.reset_index(drop=True)


def _normalize(name: object) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(name).strip().lower()).strip("_")


def _resolve_columns(
    columns: Sequence[object], path: Path
) -> tuple[dict[str, str], str | None, str | None]:
    """Map canonical fields to file columns; returns (fields, extra time column, asset column)."""
    by_norm: dict[str, str] = {}
    for col in columns:
        norm, name = _normalize(col), str(col)
        if norm in by_norm and any(norm in a for a in (*_ALIASES.values(), _ASSET_ALIASES)):
            raise OHLCVError(
                f"columns {by_norm[norm]!r} and {name!r} both name the same field; keep one",
                file=path,
                column=name,
            )
        by_norm.setdefault(norm, name)
    fields: dict[str, str] = {}
    for field, aliases in _ALIASES.items():
        for alias in aliases:
            if alias in by_norm:
                fields[field] = by_norm[alias]
                break
    missing = [f for f in _ALIASES if f not in fields]
    if missing:
        found = ", ".join(repr(str(c)) for c in columns)
        hint = "" if "timestamp" not in missing else " (timestamp may be named date/datetime/time)"
        raise OHLCVError(
            f"missing required column(s) {', '.join(repr(m) for m in missing)}{hint}; "
            f"found columns: {found}",
            file=path,
            column=missing[0],
        )
    # Separate "date" and "time" columns (intraday exports) are joined into one timestamp.
    extra_time = None
    if _normalize(fields["timestamp"]) == "date" and "time" in by_norm:
        extra_time = by_norm["time"]
    asset = next((by_norm[a] for a in _ASSET_ALIASES if a in by_norm), None)
    return fields, extra_time, asset


def _load_file(path: Path) -> list[_AssetTable]:
    df = _read_table(path)
    fields, extra_time, asset_col = _resolve_columns(list(df.columns), path)
    ts_col = fields["timestamp"]
    raw_ts = df[ts_col]
    if extra_time is not None:
        raw_ts = raw_ts.astype(str).str.strip() + " " + df[extra_time].astype(str).str.strip()
    try:
        timestamps = parse_timestamps(raw_ts)
    except TimestampError as exc:
        row = None if exc.index is None else exc.index + 1
        raise OHLCVError(str(exc), file=path, row=row, column=ts_col) from exc
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a 30-digit number
        raise OHLCVError(f"cannot parse timestamps: {exc}", file=path, column=ts_col) from exc

    rows = np.arange(1, len(df) + 1)
    values = {f: _numeric(df[fields[f]], path, fields[f]) for f in _FIELDS}
    _check_values(values, fields, rows, path)

    if asset_col is None:
        groups = [(_asset_from_name(path), np.arange(len(df)))]
    else:
        names = df[asset_col]
        empty = names.isna().to_numpy() | (names.astype(str).str.strip() == "").to_numpy()
        if empty.any():
            raise OHLCVError(
                "empty asset name", file=path, row=int(rows[np.argmax(empty)]), column=asset_col
            )
        codes, uniques = pd.factorize(names.astype(str).str.strip())
        groups = [(str(name), np.flatnonzero(codes == k)) for k, name in enumerate(uniques)]

    tables = []
    for asset, idx in groups:
        table = _AssetTable(
            asset=asset,
            file=str(path),
            rows=rows[idx],
            timestamps=timestamps[idx],
            values={f: v[idx] for f, v in values.items()},
            timestamp_column=ts_col,
        )
        _check_order(table, in_long_table=asset_col is not None)
        tables.append(table)
    return tables


def _numeric(raw: pd.Series, path: Path, column: str) -> np.ndarray:
    """Column as float64; anything that is not a finite number is an error at its row."""
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    missing = raw.isna().to_numpy()
    text = np.isnan(values) & ~missing
    for mask, what in (
        (missing, lambda i: "missing value (empty or NaN)"),
        (text, lambda i: f"not a number: {raw.iloc[i]!r}"),
        (np.isinf(values), lambda i: f"infinite value ({raw.iloc[i]!r})"),
    ):
        if mask.any():
            i = int(np.argmax(mask))
            raise OHLCVError(_with_count(what(i), mask), file=path, row=i + 1, column=column)
    return values


def _with_count(reason: str, mask: np.ndarray) -> str:
    n = int(mask.sum())
    return reason if n == 1 else f"{reason} ({n} rows have this problem)"


def _check_values(
    values: dict[str, np.ndarray], fields: dict[str, str], rows: np.ndarray, path: Path
) -> None:
    """Row-wise rules, each reported at its first violating row."""

    def fail(field: str, mask: np.ndarray, reason: str) -> None:
        i = int(np.argmax(mask))
        raise OHLCVError(
            _with_count(reason, mask), file=path, row=int(rows[i]), column=fields[field]
        )

    for field in _PRICE_FIELDS:
        bad = values[field] <= 0
        if bad.any():
            v = values[field][int(np.argmax(bad))]
            fail(field, bad, f"{field} must be positive, got {_num(v)}")
    volume = values["volume"]
    if (neg := volume < 0).any():
        fail("volume", neg, f"volume must be >= 0, got {_num(volume[int(np.argmax(neg))])}")

    o, h, low, c = (values[f] for f in _PRICE_FIELDS)
    if (bad := h < low).any():
        i = int(np.argmax(bad))
        fail("high", bad, f"high ({_num(h[i])}) is below low ({_num(low[i])})")
    if (bad := h < np.maximum(o, c)).any():
        i = int(np.argmax(bad))
        other = "open" if o[i] >= c[i] else "close"
        fail("high", bad, f"high ({_num(h[i])}) is below {other} ({_num(values[other][i])})")
    if (bad := low > np.minimum(o, c)).any():
        i = int(np.argmax(bad))
        other = "open" if o[i] <= c[i] else "close"
        fail("low", bad, f"low ({_num(low[i])}) is above {other} ({_num(values[other][i])})")


def _check_order(table: _AssetTable, in_long_table: bool) -> None:
    """Timestamps must strictly increase in file order (per asset in a long table)."""
    steps = np.diff(table.timestamps.astype(np.int64))
    bad = steps <= 0
    if not bad.any():
        return
    i = int(np.argmax(bad))
    prev_row, row = int(table.rows[i]), int(table.rows[i + 1])
    ts, prev_ts = _ts(table.timestamps[i + 1]), _ts(table.timestamps[i])
    whose = f" for asset {table.asset!r}" if in_long_table else ""
    if steps[i] == 0:
        reason = f"duplicate timestamp {ts}{whose} (same as row {prev_row})"
    else:
        reason = (
            f"timestamp {ts}{whose} is earlier than {prev_ts} in row {prev_row}; rows must "
            "be in increasing time order"
        )
    raise OHLCVError(
        _with_count(reason, bad), file=table.file, row=row, column=table.timestamp_column
    )


def _align(tables: list[_AssetTable]) -> Bars:
    """Keep the timestamps every asset has; refuse if that loses over half of any asset."""
    common = reduce(np.intersect1d, [t.timestamps for t in tables])
    if common.size == 0:
        spans = "; ".join(
            f"{t.asset!r} ({t.file}) {_ts(t.timestamps[0])}..{_ts(t.timestamps[-1])}"
            for t in tables
        )
        raise OHLCVError(f"the assets share no timestamps, so they cannot be aligned: {spans}")
    columns: dict[str, list[np.ndarray]] = {f: [] for f in _FIELDS}
    for t in tables:
        keep = np.isin(t.timestamps, common, assume_unique=True)
        n = t.timestamps.size
        if 2 * common.size < n:
            first_dropped = _ts(t.timestamps[int(np.argmax(~keep))])
            raise OHLCVError(
                f"aligning assets on their common timestamps keeps only {common.size} of "
                f"{n} bars of asset {t.asset!r} (first dropped: {first_dropped}); the files "
                "must cover the same period and calendar",
                file=t.file,
                column=t.timestamp_column,
            )
        for f in _FIELDS:
            columns[f].append(t.values[f][keep])
    return Bars(
        timestamps=common,
        assets=tuple(t.asset for t in tables),
        **{f: np.stack(cols, axis=1) for f, cols in columns.items()},
    )


def _num(x: float) -> str:
    return repr(float(x))


def _ts(x: np.datetime64) -> str:
    t = pd.Timestamp(x)
    return t.strftime("%Y-%m-%d") if t == t.normalize() else t.isoformat()
