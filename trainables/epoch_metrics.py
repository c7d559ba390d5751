"""The metrics an epoch reports from its training losses and out-of-sample backtests.

``train_loss`` is the folds' mean loss over the steps each took. ``val_sharpe`` is the
annualised Sharpe of the *joined* validation returns (the folds' windows concatenated in
time order); ``val_sharpe_per_period``, ``val_skew``, ``val_kurtosis`` and ``val_n_obs``
describe the same series, so selection and the PSR / DSR use one quantity. Per-fold
Sharpes are ``val_sharpe_fold{k}``, their mean ``val_sharpe_fold_mean``. ``test_*`` are
the last fold's backtest of the held-out test period, never used for selection. Pure
functions of their arguments; the trial loop (:mod:`trainables.trainer`) adds its own
counters (steps, skips, memory, fallback). Why: docs/statistics.md#one-quantity
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trainables.backtest import BacktestResult, sharpe_ratio
from trainables.sharpe_moments import sharpe_moments


@dataclass(frozen=True)
class OutOfSample:
    """One epoch's out-of-sample backtests: one per fold's validation window, and test."""

    val: list[BacktestResult]
    test: BacktestResult


def epoch_metrics(
    loss_sums: Sequence[tuple[torch.Tensor, torch.Tensor]],
    evaluated: OutOfSample,
    periods_per_year: float,
) -> dict[str, float | int]:
    """``train_loss``, the ``val_*`` and the ``test_*`` metrics of one epoch, from each
    fold's (loss sum, steps taken) and the epoch's backtests (one host read per fold).
    ``train_loss`` is the mean over folds of each fold's mean loss; a fold that took no
    step counts as loss 0."""
    losses = [float(s) / max(float(n), 1.0) for s, n in loss_sums]
    test = evaluated.test
    return {
        "train_loss": float(np.mean(losses)),
        **validation_metrics(evaluated.val, periods_per_year),
        "test_sharpe": test.sharpe,
        "test_sortino": test.sortino,
        "test_max_drawdown": test.max_drawdown,
    }


def validation_metrics(
    val: Sequence[BacktestResult], periods_per_year: float
) -> dict[str, float | int]:
    """The ``val_*`` metrics of one epoch from the folds' validation backtests.

    ``val_sharpe`` is the annualised Sharpe of the joined validation returns (the folds'
    windows in fold order, which is time order), and ``val_sharpe_per_period``,
    ``val_skew``, ``val_kurtosis``, ``val_n_obs`` are that series' moments for the PSR /
    DSR: selection and deflation use one quantity. ``val_sharpe_fold{k}`` are the folds'
    own Sharpes and ``val_sharpe_fold_mean`` their mean; Sortino, turnover and hit rate
    are fold means, the drawdown the worst fold's.
    """
    joined = np.concatenate([v.returns for v in val])
    metrics: dict[str, float | int] = {
        "val_sharpe": sharpe_ratio(joined, periods_per_year),
        "val_sharpe_fold_mean": float(np.mean([v.sharpe for v in val])),
        "val_sortino": float(np.mean([v.sortino for v in val])),
        "val_max_drawdown": float(np.max([v.max_drawdown for v in val])),
        "val_turnover": float(np.mean([v.turnover for v in val])),
        "val_hit_rate": float(np.mean([v.hit_rate for v in val])),
        **{f"val_{k}": v for k, v in _return_moments(joined).items()},
    }
    for k, v in enumerate(val):
        metrics[f"val_sharpe_fold{k}"] = v.sharpe
    return metrics


def _return_moments(returns: np.ndarray) -> dict[str, float]:
    """Per-period Sharpe, skew and raw kurtosis of validation returns (for PSR / DSR):
    :func:`~trainables.sharpe_moments.sharpe_moments`'s, and its neutral values (Sharpe 0,
    skew 0, kurtosis 3) where it has none to give (fewer than 2 returns, or a non-finite
    one: a diverged fold's metrics must still be written)."""
    r = np.asarray(returns, dtype=np.float64)
    if r.size < 2 or not np.isfinite(r).all():
        return {"sharpe_per_period": 0.0, "skew": 0.0, "kurtosis": 3.0, "n_obs": int(r.size)}
    moments = sharpe_moments(r)
    return {
        "sharpe_per_period": moments.sr,
        "skew": moments.skew,
        "kurtosis": moments.kurtosis,
        "n_obs": moments.n_obs,
    }
