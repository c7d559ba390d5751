"""Timestamp parsing for the OHLCV loader.

Accepted, per column (one interpretation for the whole column, never per cell):

- datetime columns (Parquet timestamps, tz-aware or naive);
- ISO 8601 strings: ``2020-01-02``, ``2020-01-02 15:30``, ``2020-01-02T15:30:00Z``,
  ``2020-01-02T15:30:00-05:00`` (offsets may differ between rows, e.g. across DST);
- ``YYYYMMDD`` integers or digit strings (``20200102``);
- unix epoch integers (or floats) in seconds, milliseconds, microseconds or nanoseconds,
  the unit chosen from the magnitude of the first value and required of every value;
- day/month strings such as ``01/02/2020`` (separators ``/``, ``-``, ``.``) only when
  exactly one of month-first and day-first fits every row: a column that both readings fit
  is refused, because silently picking one shifts every date that has day <= 12;
- other formats pandas infers from the first value and then applies to every row
  (``Jan 02, 2020``); per-row guessing is refused.

Everything is returned as UTC-naive ``datetime64[ns]``: tz-aware values are converted to
UTC, naive values are taken as already UTC.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pandas as pd

__all__ = ["TimestampError", "parse_timestamps"]


class TimestampError(ValueError):
    """A timestamp column could not be parsed.

    ``index`` is the 0-based position of the first offending value, or None when the
    whole column is at fault (for example an ambiguous day/month order). The loader turns
    it into an ``OHLCVError`` naming file, row and column.
    """

    def __init__(self, message: str, index: int | None) -> None:
        super().__init__(message)
        self.index = index


# dd/mm/yyyy or mm/dd/yyyy (or yy), with an optional time part after a space or "T".
_DAY_MONTH = re.compile(r"^\d{1,2}([/.\-])\d{1,2}\1(\d{4}|\d{2})(?:[ T].*)?$")
_TIME_SUFFIXES = (
    "",
    " %H:%M",
    " %H:%M:%S",
    " %H:%M:%S.%f",
    " %I:%M %p",
    " %I:%M:%S %p",
    "T%H:%M",
    "T%H:%M:%S",
)
# Unix epoch units by the magnitude of the value: seconds since 1973, etc. Any value in
# [1e8, 2**63) is a unix timestamp of exactly one unit between 1973 and 2262 (the end of
# datetime64[ns]: larger nanosecond counts do not fit in int64).
_EPOCH_UNITS: tuple[tuple[str, float, float], ...] = (
    ("s", 1e8, 1e11),
    ("ms", 1e11, 1e14),
    ("us", 1e14, 1e17),
    ("ns", 1e17, 2.0**63),
)
_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def parse_timestamps(values: pd.Series) -> np.ndarray:
    """Parse one timestamp column into UTC-naive ``datetime64[ns]`` of the same length."""
    values = values.reset_index(drop=True)
    missing = values.isna().to_numpy()
    if missing.any():
        raise TimestampError("empty timestamp", int(np.argmax(missing)))
    dtype = values.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        return _to_ns(values.dt.tz_convert("UTC").dt.tz_localize(None))
    if pd.api.types.is_datetime64_dtype(dtype):
        return _to_ns(values)
    if pd.api.types.is_bool_dtype(dtype):
        raise TimestampError("true/false values are not timestamps", 0)
    if pd.api.types.is_numeric_dtype(dtype):
        return _parse_numbers(values)
    return _parse_strings(values.astype(str).str.strip())


def _to_ns(parsed: pd.Series) -> np.ndarray:
    try:
        # as_unit raises when a value does not fit; to_numpy(dtype=...) alone wraps around
        # silently (9999-12-31 in datetime64[us] became 1816-03-29).
        return parsed.dt.as_unit("ns").to_numpy(dtype="datetime64[ns]")
    except (OverflowError, pd.errors.OutOfBoundsDatetime) as exc:
        raise TimestampError(f"timestamp out of range: {exc}", None) from exc


def _parse_numbers(values: pd.Series) -> np.ndarray:
    x = values.to_numpy(dtype=np.float64)
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.argmax(bad))
        raise TimestampError(f"not a timestamp: {values.iloc[i]!r}", i)
    integral = bool(np.all(x == np.floor(x)))
    if integral and np.all((x >= 1900_01_01) & (x <= 2100_12_31)):
        text = pd.Series(x.astype(np.int64).astype(str))
        parsed = pd.to_datetime(text, format="%Y%m%d", errors="coerce")
        nat = parsed.isna().to_numpy()
        if nat.any():
            i = int(np.argmax(nat))
            raise TimestampError(f"{text.iloc[i]} is not a valid YYYYMMDD date", i)
        return _to_ns(parsed)
    first = abs(x[0])
    for unit, lo, hi in _EPOCH_UNITS:
        if lo <= first < hi:
            outside = (np.abs(x) < lo) | (np.abs(x) >= hi) | (x < 0)
            if outside.any():
                i = int(np.argmax(outside))
                raise TimestampError(
                    f"{values.iloc[i]!r} is not unix {_UNIT_NAMES[unit]} like the first "
                    f"value ({values.iloc[0]!r})",
                    i,
                )
            if pd.api.types.is_integer_dtype(values.dtype):
                # exact: through float64, nanosecond epochs (~1.6e18) lose up to 256 ns
                numbers = values.to_numpy(dtype=np.int64)
            else:
                numbers = x.astype(np.int64) if integral else x
            return _to_ns(pd.Series(pd.to_datetime(numbers, unit=unit)))
    raise TimestampError(
        f"cannot read the number {values.iloc[0]!r} as a timestamp (expected YYYYMMDD or "
        "unix seconds/milliseconds/microseconds/nanoseconds)",
        0,
    )


def _parse_strings(text: pd.Series) -> np.ndarray:
    if text.str.fullmatch(r"\d+").all():
        return _parse_numbers(pd.Series(text.astype(np.int64)))
    if _DAY_MONTH.match(text.iloc[0]):
        return _parse_day_month(text)
    try:
        return _utc_naive(pd.to_datetime(text, format="ISO8601", utc=True))
    except (ValueError, TypeError, OverflowError):
        pass
    try:
        # Without a format pandas infers one from the first value and applies it to all
        # rows; if it cannot, it warns and guesses per row, which we refuse.
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            return _utc_naive(pd.to_datetime(text, utc=True))
    except (ValueError, TypeError, OverflowError, UserWarning):
        pass
    iso = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
    nat = iso.isna().to_numpy()
    i = int(np.argmax(nat)) if nat.any() else 0
    raise TimestampError(
        f"cannot parse timestamp {text.iloc[i]!r} (expected ISO 8601 such as 2020-01-02 or "
        "2020-01-02T15:30:00Z, YYYYMMDD, or unix epoch numbers)",
        i,
    )


def _parse_day_month(text: pd.Series) -> np.ndarray:
    sample = text.iloc[0]
    match = _DAY_MONTH.match(sample)
    assert match is not None
    sep, year = match.group(1), "%Y" if len(match.group(2)) == 4 else "%y"
    readings: dict[str, pd.Series] = {}
    best_count, best_nat = -1, np.zeros(len(text), dtype=bool)
    for name, date_format in (
        ("month/day/year", f"%m{sep}%d{sep}{year}"),
        ("day/month/year", f"%d{sep}%m{sep}{year}"),
    ):
        for suffix in _TIME_SUFFIXES:
            parsed = pd.to_datetime(text, format=date_format + suffix, errors="coerce")
            nat = parsed.isna().to_numpy()
            if not nat.any():
                readings[name] = parsed
                break
            if (~nat).sum() > best_count:
                best_count, best_nat = int((~nat).sum()), nat
    if len(readings) == 2:
        raise TimestampError(
            f"dates like {sample!r} are ambiguous: both month/day/year and day/month/year "
            "fit every row; write them as ISO 8601 (YYYY-MM-DD)",
            None,
        )
    if len(readings) == 1:
        return _to_ns(next(iter(readings.values())))
    i = int(np.argmax(best_nat))
    raise TimestampError(
        f"cannot parse timestamp {text.iloc[i]!r} as month/day/year or day/month/year "
        f"like {sample!r}",
        i,
    )


def _utc_naive(parsed: pd.Series) -> np.ndarray:
    return _to_ns(parsed.dt.tz_localize(None))
