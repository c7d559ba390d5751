"""The ``returns.csv`` format: a trial's out-of-sample returns of one epoch, one writer and
one parser.

    split,fold,timestamp,return
    val,0,2021-01-04T00:00:00Z,0.0013
    ...
    test,2,2021-06-01T00:00:00Z,-0.0008

The trainer writes it into every checkpoint it saves after an evaluation
(:func:`returns_csv`, through :func:`trainables.checkpoint.save_checkpoint`), the
tracking callback logs the newest one as a trial run's artifact
(``hpo.tracking.RETURNS_ARTIFACT``) and ``hpo compare`` reads it back from there
(:func:`parse_returns`); :func:`trainables.checkpoint.read_returns` reads it from a
checkpoint, verified against the checkpoint's checksum.

Contract: one row per (split, fold, bar); ``split`` is one of :data:`SPLITS`, ``fold`` an
integer, ``timestamp`` the bar the return was earned over in ISO-8601 UTC (``...Z``),
``return`` a float64 that round-trips exactly. Validation rows come fold by fold, which is
time order (walk-forward validation windows follow each other); test rows belong to the
last fold's model. The parser takes what the writer writes and rejects anything else with
a ValueError naming the line (or the split that lists a bar twice).

numpy only: reading a sweep's returns from MLflow must not import torch.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RETURNS_FILE = "returns.csv"
"""Its name in a checkpoint directory."""
RETURNS_COLUMNS = ("split", "fold", "timestamp", "return")
"""The header, in this order."""
SPLITS = ("val", "test")
"""The splits a row may belong to: validation (what selection uses) and held-out test
(reported only)."""
BAR = np.dtype([("timestamp", "i8"), ("fold", "i8")])
"""A bar of a return series: its timestamp (ns since the epoch, UTC) and fold. Sorted,
these keys are time order (walk-forward validation windows follow each other)."""


@dataclass(frozen=True)
class ReturnSeries:
    """The rows of one ``returns.csv`` as columns, in the file's order: validation rows
    fold by fold (concatenated, the joined validation track whose Sharpe is
    ``val_sharpe``), then the test rows."""

    split: np.ndarray  # (N,) str: "val" or "test"
    fold: np.ndarray  # (N,) int64
    timestamp: np.ndarray  # (N,) datetime64[ns], UTC: the bar the return was earned over
    returns: np.ndarray  # (N,) float64

    def select(self, split: str) -> np.ndarray:
        """(T,) returns of ``split`` in the file's order."""
        return self.returns[self.split == split]

    def in_time_order(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """``split``'s (T,) :data:`BAR` keys sorted by timestamp then fold (stably), and
        the (T,) returns in their order."""
        mine = np.flatnonzero(self.split == split)
        when, fold = self.timestamp[mine].astype(np.int64), self.fold[mine]
        order = np.lexsort((fold, when))
        keys = np.empty(order.size, dtype=BAR)
        keys["timestamp"], keys["fold"] = when[order], fold[order]
        return keys, self.returns[mine[order]]


def returns_csv(segments: Sequence[tuple[str, int, np.ndarray, np.ndarray]]) -> str:
    """The text of ``(split, fold, timestamps (T,) datetime64, returns (T,))`` segments.

    Timestamps are ISO-8601 UTC (``...Z``) at the coarsest unit that keeps them exact;
    returns are written with ``repr``, which round-trips float64 exactly.
    """
    out = io.StringIO()
    out.write(",".join(RETURNS_COLUMNS) + "\n")
    for split, fold, stamps, values in segments:
        if len(stamps) != len(values):
            raise ValueError(
                f"{split} fold {fold}: {len(stamps)} timestamps, {len(values)} returns"
            )
        stamps = np.asarray(stamps, dtype="datetime64[ns]")
        unit: Any = _exact_unit(stamps)  # one of numpy's unit literals
        text = np.datetime_as_string(stamps, unit=unit, timezone="UTC")
        for stamp, value in zip(text, np.asarray(values, dtype=np.float64), strict=True):
            out.write(f"{split},{fold},{stamp},{float(value)!r}\n")
    return out.getvalue()


def parse_returns(text: str) -> ReturnSeries:
    """The rows of a ``returns.csv``'s text.

    Raises:
        ValueError: a bad header, a bad row (the message names its line), or a split that
            lists a bar (timestamp and fold) twice.
    """
    lines = text.splitlines()
    if not lines or tuple(lines[0].split(",")) != RETURNS_COLUMNS:
        raise ValueError(f"expected the header {','.join(RETURNS_COLUMNS)}")
    series = _parse_columns(lines[1:])
    if series is None:
        series = _parse_rows(lines[1:])
    for split in SPLITS:
        keys, _ = series.in_time_order(split)
        if keys.size > 1 and np.any(keys[1:] == keys[:-1]):
            raise ValueError(f"{split} returns list a bar twice")
    return series


def _parse_columns(lines: list[str]) -> ReturnSeries | None:
    """The rows parsed as arrays, column by column (row by row, the timestamps took most of
    a trial's read in ``hpo compare``); None for any text this does not take, which
    :func:`_parse_rows` then parses or names the line of."""
    rows = [line.split(",") for line in lines]
    if any(len(row) != len(RETURNS_COLUMNS) for row in rows):
        return None
    columns = tuple(zip(*rows, strict=True)) or ((), (), (), ())
    if not set(columns[0]) <= set(SPLITS):
        return None
    try:
        return ReturnSeries(
            split=np.array(columns[0], dtype=str),
            fold=np.fromiter(map(int, columns[1]), np.int64, len(rows)),
            timestamp=np.array(
                [stamp.removesuffix("Z") for stamp in columns[2]], dtype="datetime64[ns]"
            ),
            returns=np.fromiter(map(float, columns[3]), np.float64, len(rows)),
        )
    except (ValueError, TypeError, OverflowError):
        return None


def _parse_rows(lines: list[str]) -> ReturnSeries:
    """The rows parsed one at a time; a ValueError names the first bad line."""
    rows: list[tuple[str, int, np.datetime64, float]] = []
    for number, line in enumerate(lines, start=2):
        try:
            split, fold, stamp, value = line.split(",")
            when = np.datetime64(stamp.removesuffix("Z"), "ns")
            if split not in SPLITS:
                raise KeyError(split)
            rows.append((split, int(fold), when, float(value)))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"line {number}: {line!r} ({exc})") from None
    return ReturnSeries(
        split=np.array([row[0] for row in rows], dtype=str),
        fold=np.array([row[1] for row in rows], dtype=np.int64),
        timestamp=np.array([row[2] for row in rows], dtype="datetime64[ns]"),
        returns=np.array([row[3] for row in rows], dtype=np.float64),
    )


def _exact_unit(stamps: np.ndarray) -> str:
    for unit in ("s", "ms", "us"):
        if np.array_equal(stamps.astype(f"datetime64[{unit}]").astype(stamps.dtype), stamps):
            return unit
    return "ns"
