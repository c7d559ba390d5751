"""A desk's own forecaster, outside foxhunt-hpo: a GRU over each asset's window.

Swept beside a built-in family in ``examples/custom_family/compare.toml``, named there by
import reference, ``"desk_gru:FAMILY"``. Checked by ``hpo check-family desk_gru:FAMILY``
(this folder on PYTHONPATH). The contract: docs/families.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.base import Choice, DataShape, Family, Float, Int, fold_assets, unfold_assets
from models.heads import RegressionHead, check_head
from models.ops import GRU, like


@dataclass(frozen=True)
class DeskGRUConfig:
    hidden: int = 16
    """GRU state size."""
    layers: int = 1
    """Stacked GRU layers."""
    loss: str = "huber"
    """huber or mse."""
    huber_delta: float = 1.0
    """Huber threshold, in the target's standard deviations."""
    position_scale: float = 4.0
    """Position = tanh(position_scale * forecast)."""

    def __post_init__(self) -> None:
        check_head(self)


class DeskGRU(RegressionHead[DeskGRUConfig]):
    def __init__(self, config: DeskGRUConfig, shape: DataShape) -> None:
        super().__init__()
        self.config, self.n_assets = config, shape.n_assets
        # models.ops.GRU: torch's GRU, which fused folds (torch.func.vmap) can batch too.
        self.gru = GRU(shape.n_features, config.hidden, config.layers, batch_first=True)
        self.out = nn.Linear(config.hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A) forecast of the next standardized return."""
        _, h = self.gru(fold_assets(x))  # h (layers, B*A, hidden)
        return unfold_assets(self.out(like(h[-1], self.out.weight)).squeeze(-1), self.n_assets)


FAMILY = Family(
    name="desk_gru",
    kind="forecast",
    config_cls=DeskGRUConfig,
    build=DeskGRU,
    search_space={
        "hidden": Choice((8, 16, 32)),
        "layers": Int(1, 2),
        "position_scale": Float(0.5, 16.0, log=True),
    },
    paper="Cho et al. (2014), the GRU; the desk's own adaptation",
    keeps_f32="the loss and the position mapping (the regression head's)",
    summary="GRU over each asset's window -> linear -> next-bar forecast; position tanh(scale * f)",
    confidence="the point forecast relative to its validation RMSE",
    shape_settings=frozenset({"hidden", "layers", "loss"}),
    tiny={"hidden": 8},
)
