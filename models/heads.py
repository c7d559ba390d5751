"""The regression head shared by the forecast families that predict the next standardized
return directly (Mamba2, xLSTM, TGGN, TLOB): its loss and how a forecast becomes a
position. Both run in f32 whatever the model's dtype: the loss is what backward starts
from, and the position is a ratio read off a small number."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.ops import f32


def regression_loss(
    forecast: torch.Tensor, target: torch.Tensor, kind: str, delta: float = 1.0
) -> torch.Tensor:
    """Mean MSE (``kind="mse"``) or Huber loss (``"huber"``: 0.5 e^2 for |e| <= delta,
    delta (|e| - 0.5 delta) beyond) of ``forecast`` (any dtype) against ``target`` (f32)."""
    pred = f32(forecast)
    if kind == "mse":
        return F.mse_loss(pred, target)
    return F.huber_loss(pred, target, delta=delta)


def forecast_positions(forecast: torch.Tensor, scale: float) -> torch.Tensor:
    """Forecasts in units of the target's std -> f32 positions tanh(scale * forecast)."""
    return torch.tanh(scale * f32(forecast))
