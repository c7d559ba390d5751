"""Positions for new bars from a checkpoint, on whatever device is present.

The checkpoint's newest good epoch is loaded into the family module of its last fold (the
model trained on the most data) under the ``auto`` policy for this device (bf16 on an
Ampere-or-newer GPU, f32 elsewhere), features of the new bars are scaled with the
training statistics saved in the checkpoint, and every bar with a full window gets a
position. The backtest of those positions over the same bars is returned alongside. An ensemble
directory (``hpo ensemble``) is served the same way, with a confidence per asset and bar.
A model whose positions are not finite is refused with an error (never served as flat).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from models import get_family
from models.base import Batch, DataShape, RLLearner
from trainables.backtest import BacktestResult, backtest
from trainables.checkpoint import Checkpoint, CheckpointError, latest_good_checkpoint
from trainables.config import TrainConfig
from trainables.data import load_ohlcv, make_features
from trainables.dataset import normalize_features
from trainables.env import greedy_positions
from trainables.precision import F32, default_device, get_policy

if TYPE_CHECKING:
    from trainables.ensemble import EnsemblePrediction


@dataclass(frozen=True)
class Prediction:
    timestamps: np.ndarray  # (N,) decision bars
    assets: tuple[str, ...]
    positions: np.ndarray  # (N, A) in [-1, 1]
    backtest: BacktestResult
    checkpoint: Path
    precision: str

    def write_csv(self, path: Path) -> None:
        """Long format: timestamp, asset, position (one row per bar and asset)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as fh:
            fh.write("timestamp,asset,position\n")
            for t, row in zip(self.timestamps, self.positions, strict=True):
                stamp = np.datetime_as_string(t, unit="s")
                for asset, w in zip(self.assets, row, strict=True):
                    fh.write(f"{stamp},{asset},{w:.6f}\n")


def load_for_inference(source: Path, device: torch.device) -> Checkpoint:
    from trainables.local import checkpoint_source

    ckpt, errors = latest_good_checkpoint(checkpoint_source(source), device="cpu")
    if ckpt is None:
        reasons = "; ".join(str(e) for e in errors) or "no epoch_NNNN checkpoints found"
        raise CheckpointError(Path(source), f"no loadable checkpoint ({reasons})")
    return ckpt


@torch.no_grad()
def predict(
    checkpoint_dir: Path,
    data: Path | str,
    device: torch.device | None = None,
    precision: str = "auto",
) -> Prediction | EnsemblePrediction:
    """Positions for ``data``'s bars from a trial checkpoint, or from an ensemble directory
    (``hpo ensemble``), whose prediction adds a confidence per asset and bar."""
    from trainables.ensemble import is_ensemble_dir, predict_ensemble

    if is_ensemble_dir(checkpoint_dir):
        return predict_ensemble(Path(checkpoint_dir), data, device=device, precision=precision)
    device = device or default_device()
    ckpt = load_for_inference(Path(checkpoint_dir), device)
    meta = ckpt.meta
    config = TrainConfig.from_dict(meta["config"])
    family = get_family(meta["family"])
    shape = DataShape(**meta["data_shape"])
    bars = load_ohlcv(Path(data)) if str(data) != "synthetic" else None
    if bars is None:
        from trainables.dataset import load_bars_source

        bars = load_bars_source(config.data)
    fs = make_features(bars)
    if fs.features.shape[2] != shape.n_features:
        raise ValueError(
            f"{data}: {fs.features.shape[2]} features, the checkpoint expects {shape.n_features}"
        )
    if len(fs.assets) != shape.n_assets:
        raise ValueError(
            f"{data}: {len(fs.assets)} assets {list(fs.assets)}, the checkpoint was trained on "
            f"{shape.n_assets} {meta.get('assets')}"
        )
    last = _last_fold(ckpt)
    policy = get_policy(precision, device)
    model = policy.convert_module(family.build(family.make_config(config.model_config), shape))
    prefix = f"fold{last}."
    state = model.state_dict()
    for name, target in state.items():
        key = prefix + name
        if key not in ckpt.weights:
            raise CheckpointError(ckpt.path / "model.safetensors", f"has no tensor {key!r}")
        target.copy_(ckpt.weights[key].to(target.dtype))
    model.eval()

    mean = ckpt.state[f"{prefix}feature_mean"].numpy()
    std = ckpt.state[f"{prefix}feature_std"].numpy()
    lookback = config.lookback
    features = policy.convert_input(
        torch.as_tensor(normalize_features(fs.features, mean, std), dtype=F32)
    )
    first = fs.first_valid + lookback - 1
    span = (first, features.shape[0])
    if span[1] - span[0] < 2:
        raise ValueError(
            f"{data}: {features.shape[0]} bars, need more than {first + 1} for one full window"
        )
    with policy.autocast():
        if family.kind == "rl":
            learner: RLLearner = model  # type: ignore[assignment]
            positions = greedy_positions(learner.positions, features, lookback, span)
        else:
            windows = features.unfold(0, lookback, 1)  # (T-L+1, A, F, L)
            gaps = torch.as_tensor(fs.time_gaps, dtype=F32, device=device).unfold(0, lookback, 1)
            chunks = []
            for t in torch.arange(*span, device=device).split(512):
                start = t - (lookback - 1)
                batch = Batch(
                    x=windows[start].permute(0, 1, 3, 2), y=torch.zeros(0), gaps=gaps[start]
                )
                chunks.append(model.positions(batch).float())  # type: ignore[operator]
            positions = torch.cat(chunks)
    host = positions.double().cpu().numpy()  # (N, A)
    bad = ~np.isfinite(host)
    if bad.any():
        t, a = (int(i) for i in np.argwhere(bad)[0])
        stamp = np.datetime_as_string(fs.timestamps[span[0] + t], unit="s")
        raise ValueError(
            f"{ckpt.path}: the model gives non-finite positions (NaN or inf) on "
            f"{int(bad.sum())} of {bad.size} bars x assets of {data}, first at {stamp} for "
            f"{fs.assets[a]}; its weights are unusable (a diverged trial?), no positions written"
        )
    host = np.clip(host, -1.0, 1.0)
    result = backtest(
        host,
        fs.bar_returns[span[0] : span[1]],
        cost=config.cost,
        periods_per_year=config.periods_per_year,
    )
    return Prediction(
        timestamps=fs.timestamps[span[0] : span[1]],
        assets=tuple(fs.assets),
        positions=host,
        backtest=result,
        checkpoint=ckpt.path,
        precision=policy.name,
    )


def _last_fold(ckpt: Checkpoint) -> int:
    folds = {
        int(k.split(".", 1)[0].removeprefix("fold")) for k in ckpt.weights if k.startswith("fold")
    }
    return max(folds)
