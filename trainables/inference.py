"""Serving a trial checkpoint on new bars: what predict and ensembles share.

The checkpoint's newest good epoch is loaded into the family module of a fold (for a
trial, the last fold: the model trained on the most data) in a precision for this device,
features of the new bars are scaled with the training statistics saved in the checkpoint,
and every bar with a full window gets a position (:func:`span_positions`, the evaluation
loop the trainer runs too). A model whose positions are not finite is refused with an
error (never served as flat).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models import get_family
from models.base import DataShape, Family, RLLearner
from trainables.backtest import BacktestResult, backtest
from trainables.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_source,
    latest_good_checkpoint,
)
from trainables.config import TrainConfig
from trainables.data import FeatureSet, load_ohlcv, make_features
from trainables.dataset import FoldData, normalize_features
from trainables.env import greedy_positions
from trainables.precision import F32, PrecisionPolicy, default_device, get_policy

EVAL_CHUNK = 512  # decision bars per forward pass (validation, test, predict, ensembles)


@dataclass(frozen=True)
class Prediction:
    timestamps: np.ndarray  # (N,) decision bars
    assets: tuple[str, ...]
    positions: np.ndarray  # (N, A) in [-1, 1]
    backtest: BacktestResult
    checkpoint: Path
    precision: str  # the precision it ran in
    confidence: np.ndarray | None = None  # (N, A) in [0, 1]: ensembles only

    def write_csv(self, path: Path) -> None:
        """Long format: timestamp, asset, position[, confidence] (one row per bar and asset)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        confidence = self.confidence
        with open(path, "w") as fh:
            fh.write("timestamp,asset,position" + (",confidence" if confidence is not None else ""))
            fh.write("\n")
            for i, (t, row) in enumerate(zip(self.timestamps, self.positions, strict=True)):
                stamp = np.datetime_as_string(t, unit="s")
                for a, (asset, w) in enumerate(zip(self.assets, row, strict=True)):
                    extra = f",{confidence[i, a]:.6f}" if confidence is not None else ""
                    fh.write(f"{stamp},{asset},{w:.6f}{extra}\n")


def load_for_inference(source: Path, device: torch.device) -> Checkpoint:
    ckpt, errors = latest_good_checkpoint(checkpoint_source(source), device="cpu")
    if ckpt is None:
        reasons = "; ".join(str(e) for e in errors) or "no epoch_NNNN checkpoints found"
        raise CheckpointError(Path(source), f"no loadable checkpoint ({reasons})")
    return ckpt


# --------------------------------------------------------------------------------------
# One trial checkpoint on new bars (also each member of an ensemble)


def fold_indices(ckpt: Checkpoint) -> list[int]:
    return sorted(
        {int(k.split(".", 1)[0].removeprefix("fold")) for k in ckpt.weights if k.startswith("fold")}
    )


def load_fold_model(
    ckpt: Checkpoint, fold: int, policy: PrecisionPolicy
) -> tuple[Family, nn.Module, TrainConfig, DataShape]:
    """Fold ``fold``'s module of a checkpoint, cast to ``policy``, in eval mode."""
    meta = ckpt.meta
    config = TrainConfig.from_dict(meta["config"])
    family = get_family(config.family)  # its name or import reference, as trained
    shape = DataShape(**meta["data_shape"])
    model = policy.convert_module(family.build(family.make_config(config.model_config), shape))
    prefix = f"fold{fold}."
    with torch.no_grad():
        for name, target in model.state_dict().items():
            key = prefix + name
            if key not in ckpt.weights:
                raise CheckpointError(ckpt.path / "model.safetensors", f"has no tensor {key!r}")
            target.copy_(ckpt.weights[key].to(target.dtype))
    model.eval()
    return family, model, config, shape


def read_features(data: Path | str, config: TrainConfig) -> FeatureSet:
    """Features of the bars in ``data``, or of the trial's own data source for 'synthetic'."""
    if str(data) != "synthetic":
        return make_features(load_ohlcv(Path(data)))
    from trainables.market import load_bars_source

    return make_features(load_bars_source(config.data))


def check_fits(fs: FeatureSet, ckpt: Checkpoint, data: Path | str, who: str) -> None:
    """Refuse bars whose assets or features differ from what ``ckpt`` was trained on."""
    shape = DataShape(**ckpt.meta["data_shape"])
    if fs.features.shape[2] != shape.n_features or len(fs.assets) != shape.n_assets:
        raise ValueError(
            f"{data}: {len(fs.assets)} assets {list(fs.assets)} x {fs.features.shape[2]} "
            f"features, {who} was trained on {shape.n_assets} {ckpt.meta.get('assets')} x "
            f"{shape.n_features}"
        )


def inference_data(
    fs: FeatureSet,
    ckpt: Checkpoint,
    fold: int,
    lookback: int,
    policy: PrecisionPolicy,
    data: Path | str,
) -> tuple[FoldData, tuple[int, int]]:
    """The new bars scaled with fold ``fold``'s training statistics, as the evaluation loops
    read them (no labels: targets are 0), and the decision bars with a full window."""
    mean = ckpt.state[f"fold{fold}.feature_mean"].numpy()
    std = ckpt.state[f"fold{fold}.feature_std"].numpy()
    features = policy.convert_input(
        torch.as_tensor(normalize_features(fs.features, mean, std), dtype=F32)
    )
    n, n_assets = features.shape[0], features.shape[1]
    device = features.device
    bars = FoldData(
        features=features,
        targets=torch.zeros(n, n_assets, dtype=F32, device=device),
        bar_returns=torch.zeros(n, n_assets, dtype=F32, device=device),
        gaps=torch.as_tensor(fs.time_gaps, dtype=F32, device=device),
        lookback=lookback,
        train=(0, 1),
        val=(0, 1),
        test=(0, 1),
        feature_mean=mean,
        feature_std=std,
    )
    first = fs.first_valid + lookback - 1
    if n - first < 2:
        raise ValueError(f"{data}: {n} bars, need more than {first + 1} for one full window")
    return bars, (first, n)


def span_positions(
    family: Family, model: nn.Module, bars: FoldData, span: tuple[int, int]
) -> torch.Tensor:
    """(T_span, A) positions the model takes at decision bars ``span``: the evaluation loop
    of the trainer (validation, test) and of predict (ensembles add a confidence per bar
    in their own). Run it inside the policy's autocast, under ``torch.no_grad``, with the
    model in eval mode."""
    if family.kind == "rl":
        learner: RLLearner = model  # type: ignore[assignment]
        return greedy_positions(learner.positions, bars.features, bars.lookback, span)
    chunks = []
    for t in bars.decision_times(span).split(EVAL_CHUNK):
        chunks.append(model.positions(bars.batch(t)).float())  # type: ignore[operator]
    return torch.cat(chunks)


def clipped_positions(
    positions: torch.Tensor,
    who: str,
    stamps: np.ndarray | None = None,
    assets: Sequence[str] = (),
) -> np.ndarray:
    """Positions as float64 on the host, clipped to [-1, 1]; non-finite ones refuse the
    model (never served as flat), naming the first bar and asset when ``stamps`` are given."""
    host = positions.double().cpu().numpy()  # (N, A)
    bad = ~np.isfinite(host)
    if bad.any():
        where = ""
        if stamps is not None:
            t, a = (int(i) for i in np.argwhere(bad)[0])
            where = f", first at {np.datetime_as_string(stamps[t], unit='s')} for {assets[a]}"
        raise ValueError(
            f"{who} gives non-finite positions (NaN or inf) on {int(bad.sum())} of {bad.size} "
            f"bars x assets{where}; its weights are unusable (a diverged trial?), no positions "
            "written"
        )
    return np.clip(host, -1.0, 1.0)


def bars_backtest(
    positions: np.ndarray, fs: FeatureSet, stamps: np.ndarray, config: TrainConfig
) -> BacktestResult:
    """One backtest of ``positions`` held at the decision bars ``stamps`` of ``fs``."""
    index = np.searchsorted(fs.timestamps, stamps)
    return backtest(
        positions,
        fs.bar_returns[index],
        cost=config.cost,
        periods_per_year=config.periods_per_year,
    )


@torch.no_grad()
def predict_checkpoint(
    checkpoint_dir: Path,
    data: Path | str,
    device: torch.device | None = None,
    precision: str = "auto",
) -> Prediction:
    """Positions for ``data``'s bars from a trial checkpoint (its last fold's model)."""
    device = device or default_device()
    ckpt = load_for_inference(Path(checkpoint_dir), device)
    config = TrainConfig.from_dict(ckpt.meta["config"])
    fs = read_features(data, config)
    check_fits(fs, ckpt, data, "the checkpoint")
    last = fold_indices(ckpt)[-1]
    policy = get_policy(precision, device)
    family, model, _, _ = load_fold_model(ckpt, last, policy)
    bars, span = inference_data(fs, ckpt, last, config.lookback, policy, data)
    stamps = fs.timestamps[span[0] : span[1]]
    with policy.autocast():
        positions = span_positions(family, model, bars, span)
    host = clipped_positions(positions, f"{ckpt.path}: the model on {data}", stamps, fs.assets)
    return Prediction(
        timestamps=stamps,
        assets=tuple(fs.assets),
        positions=host,
        backtest=bars_backtest(host, fs, stamps, config),
        checkpoint=ckpt.path,
        precision=policy.name,
    )
