"""Walk-forward splits with purging, an embargo, and a held-out test period.

Indices are decision times t: at the close of bar t a model sees features[t] (bars <= t)
and is scored on the next bar's return bar_returns[t + 1]. Decision times run from
``first_valid`` to ``n_bars - 2``; the last bar has no next return. All windows are
half-open ``[start, stop)`` ranges of decision times.

Layout (expanding, n_folds = 3; G = purge + embargo decision times left unused):

    first_valid                                                            n_bars - 1
    |-- train 0 --|G|- val 0 -|
    |------- train 1 --------|G|- val 1 -|
    |------------ train 2 -------------|G|- val 2 -|G|------ test ------|

- test: the final ``test_fraction`` of decision times (rounded up), never inside a fold:
  hyperparameter selection uses the folds only, the test is reported.
- validation windows: ``n_folds`` consecutive blocks of ``floor(val_fraction * N)``
  decision times each (N = all decision times), ending G before the test period.
- purge: training decision times whose label interval (t, t+1] reaches into the
  validation window's first bar are dropped (``purge`` = label horizon in bars, 1 here).
- embargo: ``embargo`` further decision times are dropped between train and validation.
- expanding (default): every fold trains from ``first_valid``; rolling: every fold trains
  on the same number of decision times as fold 0, ending G before its validation window.
Why the gaps: docs/data.md#splits
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Fold", "Splits", "walk_forward"]


@dataclass(frozen=True)
class Fold:
    """One walk-forward fold: half-open [start, stop) ranges of decision times."""

    train: tuple[int, int]
    val: tuple[int, int]

    def __post_init__(self) -> None:
        for name, (start, stop) in (("train", self.train), ("val", self.val)):
            if not 0 <= start < stop:
                raise ValueError(f"Fold.{name} must satisfy 0 <= start < stop, got {(start, stop)}")
        if self.train[1] > self.val[0]:
            raise ValueError(f"Fold.train {self.train} must end before Fold.val {self.val} starts")


@dataclass(frozen=True)
class Splits:
    """Walk-forward folds for selection and the test period reserved for reporting."""

    folds: tuple[Fold, ...]
    test: tuple[int, int]


def walk_forward(
    n_bars: int,
    first_valid: int,
    n_folds: int = 3,
    test_fraction: float = 0.2,
    val_fraction: float = 0.15,
    purge: int = 1,
    embargo: int = 5,
    min_train: int = 100,
    expanding: bool = True,
) -> Splits:
    """Split decision times [first_valid, n_bars - 1) as in the module docstring.

    Raises:
        ValueError: naming the argument and its allowed range, or saying how many bars
            are needed when the first fold would train on fewer than ``min_train``.
    """
    _check_int("n_bars", n_bars, 2)
    _check_int("first_valid", first_valid, 0)
    _check_int("n_folds", n_folds, 1)
    _check_int("purge", purge, 0)
    _check_int("embargo", embargo, 0)
    _check_int("min_train", min_train, 1)
    if first_valid > n_bars - 2:
        raise ValueError(
            f"walk_forward: first_valid must be in [0, n_bars - 2] = [0, {n_bars - 2}], got "
            f"{first_valid}"
        )
    for name, value in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"walk_forward: {name} must be in (0, 1), got {value}")
    if test_fraction + n_folds * val_fraction >= 1.0:
        raise ValueError(
            "walk_forward: test_fraction + n_folds * val_fraction must be < 1 to leave room "
            f"for training, got {test_fraction} + {n_folds} * {val_fraction} = "
            f"{test_fraction + n_folds * val_fraction:g}"
        )

    layout = _layout(n_bars, first_valid, n_folds, test_fraction, val_fraction, purge + embargo)
    n_val, first_train = layout[1], layout[2]
    if n_val < 1:
        raise ValueError(
            f"walk_forward: val_fraction={val_fraction} gives validation windows of 0 "
            f"decision times with n_bars={n_bars}; raise val_fraction or n_bars"
        )
    if first_train < min_train:
        needed = _bars_needed(
            n_bars, first_valid, n_folds, test_fraction, val_fraction, purge + embargo, min_train
        )
        raise ValueError(
            f"walk_forward: not enough data: the first fold would train on {first_train} "
            f"decision times but min_train={min_train}; these settings need n_bars >= "
            f"{needed} (got {n_bars}), or use fewer folds or smaller val/test fractions"
        )

    test_start, gap = layout[0], purge + embargo
    val_end = test_start - gap
    folds = []
    for i in range(n_folds):
        val_start = val_end - (n_folds - i) * n_val
        train_stop = val_start - gap
        train_start = first_valid if expanding else train_stop - first_train
        folds.append(Fold(train=(train_start, train_stop), val=(val_start, val_start + n_val)))
    return Splits(folds=tuple(folds), test=(test_start, n_bars - 1))


def _layout(
    n_bars: int, first_valid: int, n_folds: int, test_fraction: float, val_fraction: float, gap: int
) -> tuple[int, int, int]:
    """(test_start, validation window length, fold 0 train length) for these settings."""
    n_decisions = n_bars - 1 - first_valid
    n_test = max(1, math.ceil(test_fraction * n_decisions - 1e-9))
    n_val = math.floor(val_fraction * n_decisions + 1e-9)
    test_start = n_bars - 1 - n_test
    first_train = test_start - gap - n_folds * n_val - gap - first_valid
    return test_start, n_val, first_train


def _bars_needed(
    n_bars: int,
    first_valid: int,
    n_folds: int,
    test_fraction: float,
    val_fraction: float,
    gap: int,
    min_train: int,
) -> int:
    """Smallest n_bars >= the given one whose fold-0 train and val windows are large enough."""
    # first_train >= min_train needs slope * N + n_folds - 2 * gap >= min_train (N decision
    # times), and is guaranteed once slope * N - 1 - 2 * gap >= min_train, so a short scan
    # upward from the lower bound finds the answer.
    slope = 1.0 - test_fraction - n_folds * val_fraction
    lower = math.floor((min_train + 2 * gap - n_folds) / slope) + 1 + first_valid
    n = max(n_bars, first_valid + 2, lower)
    while True:
        _, n_val, first_train = _layout(n, first_valid, n_folds, test_fraction, val_fraction, gap)
        if first_train >= min_train and n_val >= 1:
            return n
        n += 1


def _check_int(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"walk_forward: {name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"walk_forward: {name} must be >= {minimum}, got {value}")
