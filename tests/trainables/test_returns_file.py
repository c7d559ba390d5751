"""The ``returns.csv`` format: what the writer writes the parser reads back exactly, bad
text is refused naming its line (from a checkpoint too), and reading it needs no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainables.checkpoint import CheckpointError, read_returns, save_checkpoint
from trainables.returns_file import (
    RETURNS_COLUMNS,
    RETURNS_FILE,
    parse_returns,
    returns_csv,
)

DAY = np.timedelta64(1, "D")
START = np.datetime64("2021-01-04T00:00:00", "ns")


def _segments() -> list[tuple[str, int, np.ndarray, np.ndarray]]:
    """Two validation folds, then the last fold's test bars; one fold's stamps carry
    nanoseconds, and the returns hold a NaN, an infinity and a negative zero."""
    val0 = START + np.arange(4) * DAY
    val1 = START + (4 + np.arange(3)) * DAY + np.timedelta64(123456789, "ns")
    test = START + (7 + np.arange(2)) * DAY
    return [
        ("val", 0, val0, np.array([0.1, -0.2, 1 / 3, np.nan])),
        ("val", 1, val1, np.array([np.inf, -0.0, 5e-324])),
        ("test", 1, test, np.array([2.5, -1e300])),
    ]


def test_what_the_writer_writes_reads_back_bit_for_bit() -> None:
    text = returns_csv(_segments())
    lines = text.splitlines()
    assert lines[0] == ",".join(RETURNS_COLUMNS) and len(lines) == 1 + 9
    assert lines[1] == "val,0,2021-01-04T00:00:00Z,0.1"  # the coarsest exact unit
    assert lines[5] == "val,1,2021-01-08T00:00:00.123456789Z,inf"

    series = parse_returns(text)
    assert series.split.tolist() == ["val"] * 7 + ["test"] * 2  # the file's order
    assert series.fold.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1]
    np.testing.assert_array_equal(
        series.timestamp, np.concatenate([stamps for _, _, stamps, _ in _segments()])
    )
    written = np.concatenate([values for _, _, _, values in _segments()])
    assert series.returns.tobytes() == written.tobytes()  # NaN, inf and -0.0 included
    assert series.select("test").tolist() == [2.5, -1e300]


def test_bars_in_time_order_are_sorted_by_timestamp_then_fold() -> None:
    text = "\n".join(
        [
            ",".join(RETURNS_COLUMNS),
            "val,1,2021-01-05T00:00:00Z,0.3",
            "val,1,2021-01-04T00:00:00Z,0.2",
            "val,0,2021-01-04T00:00:00Z,0.1",
            "test,1,2021-01-06T00:00:00Z,0.4",
        ]
    )
    keys, values = parse_returns(text).in_time_order("val")
    day = np.datetime64("2021-01-04", "ns").astype(np.int64)
    ns_per_day = 86_400 * 10**9
    assert keys.tolist() == [(day, 0), (day, 1), (day + ns_per_day, 1)]
    assert values.tolist() == [0.1, 0.2, 0.3]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "expected the header split,fold,timestamp,return"),
        ("fold,split,timestamp,return\n", "expected the header"),
        (
            "split,fold,timestamp,return\nval,0,2021-01-04T00:00:00Z,0.1\nval,0,2021-01-05\n",
            r"line 3: 'val,0,2021-01-05' \(not enough values to unpack",
        ),
        ("split,fold,timestamp,return\ntrain,0,2021-01-04T00:00:00Z,0.1\n", r"line 2: .*'train'"),
        ("split,fold,timestamp,return\nval,x,2021-01-04T00:00:00Z,0.1\n", r"line 2: .*'x'"),
        (
            "split,fold,timestamp,return\nval,0,2021-01-04T00:00:00Z,0.1\nval,0,2021-01-04,0.2\n",
            "val returns list a bar twice",
        ),
    ],
    ids=["nothing", "header", "short-row", "bad-split", "bad-fold", "twice"],
)
def test_bad_text_is_refused_naming_the_line(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_returns(text)


def test_the_writer_refuses_segments_of_unequal_length() -> None:
    with pytest.raises(ValueError, match="val fold 0: 2 timestamps, 1 returns"):
        returns_csv([("val", 0, START + np.arange(2) * DAY, np.array([0.1]))])


def test_a_checkpoint_with_a_bad_row_names_the_file_and_the_line(tmp_path: Path) -> None:
    text = returns_csv(_segments()).replace("val,1,", "val,one,", 1)
    save_checkpoint(tmp_path / "ckpt", {}, {}, {}, {"epoch": 1}, files={RETURNS_FILE: text})
    with pytest.raises(CheckpointError, match=r"returns\.csv: line 6: 'val,one,"):
        read_returns(tmp_path / "ckpt")


def test_reading_the_format_imports_no_torch() -> None:
    code = "import sys, trainables.returns_file; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"
