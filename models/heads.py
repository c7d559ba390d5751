"""The regression head shared by the forecast families that predict the next standardized
return directly (Mamba2, xLSTM, TGGN, TLOB, Liquid, KAN): the loss names, its validation,
the loss and how a forecast becomes a position (the loss names and the settings' check
are torch-free, in :mod:`models.family`, for the families' records). Loss and position
run in f32 whatever the model's dtype: the loss is what backward starts from, and the
position is a ratio read off a small number.

A family's network (``models/nets/``) subclasses :class:`RegressionHead`, keeps its
config (with the fields of :class:`HeadConfig`) in ``self.config``, and returns the
(B, A) forecast from :meth:`RegressionHead.forecast` (by default ``self(batch.x)``).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from models.base import Batch, ForecastSignal

# The head's settings and their check, torch-free for the families' modules.
from models.family import LOSS_KINDS as LOSS_KINDS
from models.family import HeadConfig as HeadConfig
from models.family import LossKind as LossKind
from models.family import check_head as check_head
from models.ops import f32

C = TypeVar("C", bound=HeadConfig)


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


class RegressionHead(nn.Module, Generic[C]):
    """``loss`` and ``positions`` of a module that forecasts the next standardized return."""

    config: C

    def forecast(self, batch: Batch) -> torch.Tensor:
        """(B, A) forecast in the module's dtype, in units of the target's std."""
        out: torch.Tensor = self(batch.x)
        return out

    def fit_loss(self, forecast: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The f32 Huber/MSE loss of ``forecast`` against the standardized target."""
        return regression_loss(forecast, target, self.config.loss, self.config.huber_delta)

    def loss(self, batch: Batch) -> torch.Tensor:
        """f32 Huber/MSE loss of the forecast against the standardized next-bar return."""
        return self.fit_loss(self.forecast(batch), batch.y)

    @torch.no_grad()
    def positions(self, batch: Batch) -> torch.Tensor:
        """(B, A) f32 positions tanh(position_scale * forecast) in [-1, 1]."""
        return forecast_positions(self.forecast(batch), self.config.position_scale)

    @torch.no_grad()
    def forecast_signal(self, batch: Batch) -> ForecastSignal:
        """Position and the point forecast; confidence = the forecast relative to its
        validation RMSE (no predicted spread: ``spread`` is None)."""
        forecast = self.forecast(batch)
        positions = forecast_positions(forecast, self.config.position_scale)
        return ForecastSignal(positions, f32(forecast), None)
