"""Tests of the regression head shared by six forecast families (models/heads.py).

Run: .venv/bin/python -m pytest tests/models/test_heads.py -q
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from models import get_family
from models.base import Batch, DataShape
from models.heads import (
    LOSS_KINDS,
    RegressionHead,
    check_head,
    forecast_positions,
    regression_loss,
)

REGRESSION_FAMILIES = ("mamba2", "tggn", "tlob", "liquid", "kan", "xlstm")
SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)


def test_regression_loss_and_positions_by_hand() -> None:
    forecast = torch.tensor([[0.5, -2.0], [3.0, 0.0]])
    y = torch.tensor([[0.0, 0.0], [0.0, 0.5]])
    # errors 0.5, -2, 3, -0.5; Huber(delta=1): 0.125, 1.5, 2.5, 0.125; (delta=2): 0.125, 2, 4, 0.125
    assert abs(regression_loss(forecast, y, "huber").item() - 4.25 / 4) < 1e-6
    assert abs(regression_loss(forecast, y, "mse").item() - 13.5 / 4) < 1e-6
    assert abs(regression_loss(forecast, y, "huber", delta=2.0).item() - 6.25 / 4) < 1e-6
    pos = forecast_positions(torch.tensor([0.25, -10.0]), scale=2.0)
    torch.testing.assert_close(pos, torch.tensor([math.tanh(0.5), -1.0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("loss", "l1"),
        ("huber_delta", 0.0),
        ("huber_delta", math.nan),
        ("position_scale", -1.0),
        ("position_scale", math.inf),
        ("position_scale", True),
    ],
)
def test_check_head_names_the_field(field: str, bad: Any) -> None:
    config = SimpleNamespace(loss="huber", huber_delta=1.0, position_scale=4.0)
    check_head(config)
    setattr(config, field, bad)
    with pytest.raises(ValueError, match=field):
        check_head(config)


@pytest.mark.parametrize("kind", LOSS_KINDS)
@pytest.mark.parametrize("model", REGRESSION_FAMILIES)
def test_every_regression_family_trains_and_trades_through_the_head(model: str, kind: str) -> None:
    family = get_family(model)
    values: dict[str, Any] = {"loss": kind, "huber_delta": 0.5, "position_scale": 2.0}
    if model == "kan":
        values["reg_lambda"] = 0.0  # the regularization adds to the head's loss
    torch.manual_seed(0)
    module = family.build(family.make_config(values), SHAPE).eval()
    assert isinstance(module, RegressionHead)
    g = torch.Generator().manual_seed(1)
    length = SHAPE.lookback  # TLOB has weights per bar
    x = torch.randn(3, SHAPE.n_assets, length, SHAPE.n_features, generator=g)
    y = torch.randn(3, SHAPE.n_assets, generator=g)
    batch = Batch(x=x, y=y, gaps=torch.rand(3, length, generator=g) + 0.5)
    forecast = module.forecast(batch)
    assert forecast.shape == (3, SHAPE.n_assets)
    torch.testing.assert_close(module.loss(batch), regression_loss(forecast, y, kind, 0.5))
    torch.testing.assert_close(module.positions(batch), torch.tanh(2.0 * forecast.detach()))
