"""Walk-forward splits: pinned layout, invariants over random settings, clear errors."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trainables.data import Fold, Splits, walk_forward


def test_default_layout_is_pinned() -> None:
    # 2000 bars, first_valid 20: decision times [20, 1999), N = 1979.
    # test = ceil(0.2 N) = 396, val = floor(0.15 N) = 296, gap = purge 1 + embargo 5 = 6.
    splits = walk_forward(2000, 20)
    assert splits == Splits(
        folds=(
            Fold(train=(20, 703), val=(709, 1005)),
            Fold(train=(20, 999), val=(1005, 1301)),
            Fold(train=(20, 1295), val=(1301, 1597)),
        ),
        test=(1603, 1999),
    )


def test_rolling_windows_keep_the_first_folds_length() -> None:
    splits = walk_forward(2000, 20, expanding=False)
    assert [f.train for f in splits.folds] == [(20, 703), (316, 999), (612, 1295)]
    assert [f.val for f in splits.folds] == [f.val for f in walk_forward(2000, 20).folds]


def test_zero_gap_lets_train_touch_validation() -> None:
    splits = walk_forward(500, 0, n_folds=2, purge=0, embargo=0, min_train=10)
    for fold in splits.folds:
        assert fold.train[1] == fold.val[0]
    assert splits.folds[-1].val[1] == splits.test[0]


@settings(max_examples=300, deadline=None)
@given(
    n_bars=st.integers(50, 5000),
    first_valid=st.integers(0, 40),
    n_folds=st.integers(1, 6),
    test_fraction=st.floats(0.01, 0.4),
    val_fraction=st.floats(0.01, 0.2),
    purge=st.integers(0, 3),
    embargo=st.integers(0, 20),
    min_train=st.integers(1, 300),
    expanding=st.booleans(),
)
def test_invariants_hold_for_any_valid_setting(
    n_bars: int,
    first_valid: int,
    n_folds: int,
    test_fraction: float,
    val_fraction: float,
    purge: int,
    embargo: int,
    min_train: int,
    expanding: bool,
) -> None:
    assume(test_fraction + n_folds * val_fraction < 1 and first_valid <= n_bars - 2)
    try:
        splits = walk_forward(
            n_bars,
            first_valid,
            n_folds,
            test_fraction,
            val_fraction,
            purge,
            embargo,
            min_train,
            expanding,
        )
    except ValueError as exc:
        assert "not enough data" in str(exc) or "gives validation windows of 0" in str(exc)
        return
    gap = purge + embargo
    n_decisions = n_bars - 1 - first_valid
    assert len(splits.folds) == n_folds
    # Test: the last decision times, at least test_fraction of them, after every fold + gap.
    assert splits.test[1] == n_bars - 1
    assert splits.test[1] - splits.test[0] >= test_fraction * n_decisions - 1e-9
    assert splits.folds[-1].val[1] + gap == splits.test[0]
    for i, fold in enumerate(splits.folds):
        assert first_valid <= fold.train[0] < fold.train[1]
        assert fold.train[1] - fold.train[0] >= min_train
        assert fold.val[0] - fold.train[1] == gap  # purge + embargo unused decision times
        assert fold.val[1] <= splits.test[0] - gap  # never touches the test period
        if expanding:
            assert fold.train[0] == first_valid
        else:
            assert (
                fold.train[1] - fold.train[0] == splits.folds[0].train[1] - splits.folds[0].train[0]
            )
        if i > 0:  # validation windows are consecutive, equal, non-overlapping blocks
            prev = splits.folds[i - 1]
            assert fold.val[0] == prev.val[1]
            assert fold.val[1] - fold.val[0] == prev.val[1] - prev.val[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_bars": 1}, "n_bars must be >= 2, got 1"),
        ({"first_valid": -1}, "first_valid must be >= 0, got -1"),
        ({"first_valid": 999}, r"first_valid must be in [0, n_bars - 2] = [0, 998], got 999"),
        ({"n_folds": 0}, "n_folds must be >= 1, got 0"),
        ({"n_folds": 2.0}, "n_folds must be an integer >= 1, got 2.0"),
        ({"test_fraction": 0.0}, "test_fraction must be in (0, 1), got 0.0"),
        ({"val_fraction": 1.5}, "val_fraction must be in (0, 1), got 1.5"),
        ({"purge": -1}, "purge must be >= 0, got -1"),
        ({"embargo": -2}, "embargo must be >= 0, got -2"),
        ({"min_train": 0}, "min_train must be >= 1, got 0"),
        ({"n_folds": 4, "val_fraction": 0.2}, "test_fraction + n_folds * val_fraction must be < 1"),
        ({"val_fraction": 0.0005}, "val_fraction=0.0005 gives validation windows of 0"),
    ],
)
def test_argument_errors_name_argument_and_range(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"n_bars": 1000, "first_valid": 20, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        walk_forward(**args)  # type: ignore[arg-type]


def test_not_enough_data_says_how_many_bars_are_needed() -> None:
    with pytest.raises(ValueError) as info:
        walk_forward(300, 20)
    message = str(info.value)
    assert "first fold would train on 88 decision times but min_train=100" in message
    needed = int(re.search(r"need n_bars >= (\d+)", message).group(1))  # type: ignore[union-attr]
    assert needed == 334
    assert walk_forward(needed, 20).folds[0].train == (20, 120)
    with pytest.raises(ValueError, match="not enough data"):
        walk_forward(needed - 1, 20)
