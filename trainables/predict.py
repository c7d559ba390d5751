"""Positions for new bars from a checkpoint or an ensemble, on whatever device is present.

``hpo predict``: a trial checkpoint is served by :func:`trainables.inference.predict_checkpoint`
at the ``auto`` precision for this device (bf16 on an Ampere-or-newer GPU, f32 elsewhere);
an ensemble directory (``hpo ensemble``) by :func:`trainables.ensemble.predict_ensemble`,
which adds a confidence per asset and bar. Either way the backtest of the positions over
the same bars comes with them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainables.ensemble import is_ensemble_dir, predict_ensemble
from trainables.inference import Prediction, predict_checkpoint

__all__ = ["Prediction", "predict"]


def predict(
    checkpoint_dir: Path,
    data: Path | str,
    device: torch.device | None = None,
    precision: str = "auto",
) -> Prediction:
    """Positions for ``data``'s bars from a trial checkpoint, or from an ensemble directory,
    whose prediction adds a confidence per asset and bar, run in ``precision`` (``auto``:
    bf16 on Ampere-or-newer GPUs, else f32)."""
    if is_ensemble_dir(checkpoint_dir):
        return predict_ensemble(Path(checkpoint_dir), data, device=device, precision=precision)
    return predict_checkpoint(Path(checkpoint_dir), data, device=device, precision=precision)
