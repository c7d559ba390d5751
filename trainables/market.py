"""A trial's market on the host: its bars, past-only features and walk-forward splits,
built once per trial with numpy (no torch: the sweep's spec checks its splits with
:func:`market_splits` in the driver). :mod:`trainables.dataset` turns each fold of it
into device tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainables.config import DataConfig, TrainConfig
from trainables.data import (
    FeatureSet,
    Splits,
    load_ohlcv,
    make_features,
    synthetic_bars,
    walk_forward,
)


@dataclass(frozen=True)
class Market:
    """Host-side data of one trial."""

    features: FeatureSet
    splits: Splits

    @property
    def n_assets(self) -> int:
        return int(self.features.features.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.features.features.shape[2])


def load_bars_source(data: DataConfig):
    if data.source == "synthetic":
        return synthetic_bars(
            n_assets=data.n_assets, n_bars=data.n_bars, seed=data.seed, signal=data.signal
        )
    path = Path(data.source)
    if not path.exists():
        raise FileNotFoundError(f"data source {str(path)!r} does not exist (or use 'synthetic')")
    return load_ohlcv(path)


def market_splits(n_bars: int, first_valid: int, config: TrainConfig) -> Splits:
    """The walk-forward splits of ``n_bars`` bars whose features are valid from bar
    ``first_valid``: the first decision needs a full ``lookback`` window of them. The one
    place this is decided (trials build it; the sweep spec checks it at parse time)."""
    return walk_forward(
        n_bars=n_bars,
        first_valid=first_valid + config.lookback - 1,
        n_folds=config.n_folds,
        test_fraction=config.test_fraction,
        val_fraction=config.val_fraction,
        purge=config.purge,
        embargo=config.embargo,
    )


def build_market(config: TrainConfig) -> Market:
    features = make_features(load_bars_source(config.data))
    splits = market_splits(features.features.shape[0], features.first_valid, config)
    return Market(features=features, splits=splits)
