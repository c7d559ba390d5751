"""Market data for trials: OHLCV bars, the synthetic default, features and splits.

Flow: ``load_ohlcv(path)`` or ``synthetic_bars()`` -> ``Bars`` -> ``make_features`` ->
``FeatureSet`` (features[t] from bars <= t, label bar_returns[t + 1]) -> ``walk_forward``
-> ``Splits`` (train/validation folds for selection, a test period for reporting only).
"""

from trainables.data.features import FeatureSet, make_features
from trainables.data.ohlcv import Bars, OHLCVError, load_ohlcv
from trainables.data.splits import Fold, Splits, walk_forward
from trainables.data.synthetic import synthetic_bars

__all__ = [
    "Bars",
    "FeatureSet",
    "Fold",
    "OHLCVError",
    "Splits",
    "load_ohlcv",
    "make_features",
    "synthetic_bars",
    "walk_forward",
]
