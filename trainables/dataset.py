"""From a trial's market to device tensors for each walk-forward fold.

The host side (:class:`trainables.market.Market`) is built once per trial: bars, past-only
features and the walk-forward splits. Each fold then gets its own :class:`FoldData` on the training device:
features normalized with statistics of *that fold's training bars only* (so validation and
test bars never leak into the scaling) and cast once to the policy's data dtype, and
next-bar targets standardized by the training split's standard deviation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.base import Batch
from trainables.market import Market
from trainables.precision import F32

FEATURE_CLIP = 10.0  # z-scores beyond +-10 are data errors or crashes; clip, don't explode


@dataclass
class FoldData:
    """Device tensors of one fold. Decision time t uses bars (t-L, t]; its label is bar t+1."""

    features: torch.Tensor  # (T, A, F) data dtype, normalized with training statistics
    targets: torch.Tensor  # (T, A) f32: R_{t+1} / std_train (0 on the last bar)
    bar_returns: torch.Tensor  # (T, A) f32: R_t = close_t / close_{t-1} - 1
    gaps: torch.Tensor  # (T,) f32 bar spacing in median gaps
    lookback: int
    train: tuple[int, int]
    val: tuple[int, int]
    test: tuple[int, int]
    feature_mean: np.ndarray  # (F,) training statistics, kept so predictions scale new bars alike
    feature_std: np.ndarray  # (F,)

    def __post_init__(self) -> None:
        self._windows = self.features.unfold(0, self.lookback, 1)  # (T-L+1, A, F, L) view
        self._gap_windows = self.gaps.unfold(0, self.lookback, 1)  # (T-L+1, L) view

    def batch(self, t: torch.Tensor) -> Batch:
        """Windows whose decision bars are ``t`` (a (B,) int64 tensor on the device)."""
        start = t - (self.lookback - 1)
        x = self._windows[start].permute(0, 1, 3, 2)  # (B, A, L, F)
        return Batch(x=x, y=self.targets[t], gaps=self._gap_windows[start])

    def decision_times(self, span: tuple[int, int]) -> torch.Tensor:
        return torch.arange(span[0], span[1], device=self.features.device)


def build_fold(
    market: Market, fold_index: int, lookback: int, device: torch.device, data_dtype: torch.dtype
) -> FoldData:
    fs = market.features
    fold = market.splits.folds[fold_index]
    train_start, train_stop = fold.train
    # Statistics from the bars the training windows can see, pooled over assets.
    seen = fs.features[max(train_start - lookback + 1, 0) : train_stop]  # (t, A, F)
    mean = seen.reshape(-1, seen.shape[-1]).mean(axis=0)
    std = seen.reshape(-1, seen.shape[-1]).std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    normalized = normalize_features(fs.features, mean, std)

    next_returns = np.zeros_like(fs.bar_returns)
    next_returns[:-1] = fs.bar_returns[1:]
    target_std = float(next_returns[train_start:train_stop].std())
    target_std = target_std if target_std > 1e-12 else 1.0

    def to_device(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

    return FoldData(
        features=to_device(normalized, data_dtype),
        targets=to_device(next_returns / target_std, F32),
        bar_returns=to_device(fs.bar_returns, F32),
        gaps=to_device(fs.time_gaps, F32),
        lookback=lookback,
        train=fold.train,
        val=fold.val,
        test=market.splits.test,
        feature_mean=mean,
        feature_std=std,
    )


def normalize_features(features: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    return np.clip((features - mean) / std, -FEATURE_CLIP, FEATURE_CLIP)
