"""Liquid (closed-form continuous-time) recurrent network over irregularly spaced bars: the
settings, search space and record (no torch: the spec and a sweep's driver read them).
Its network: :mod:`models.nets.liquid`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from models.family import (
    Choice,
    Family,
    Float,
    Int,
    LossKind,
    Network,
    SearchSpace,
    check_choices,
    check_head,
    check_int,
)

__all__ = [
    "ACTIVATIONS",
    "FAMILY",
    "MODES",
    "SEARCH_SPACE",
    "CfCMode",
    "LiquidConfig",
]

MODES = ("gated", "no_gate")
ACTIVATIONS = ("lecun_tanh", "tanh", "silu", "gelu", "relu")
CfCMode = Literal["gated", "no_gate"]


@dataclass(frozen=True)
class LiquidConfig:
    """Size and output mapping of one CfC network. Defaults: 10,977 parameters at F=8
    (no parameter depends on L or A)."""

    hidden: int = 32
    """State size H of the CfC cell."""

    backbone_units: int = 64
    """Width U of the backbone MLP over [bar input, previous state]."""

    backbone_layers: int = 1
    """Layers of the backbone MLP (>= 1; the reference's default is 1)."""

    backbone_activation: str = "lecun_tanh"
    """Backbone nonlinearity: lecun_tanh (1.7159 tanh(2x/3), the reference's default),
    tanh, silu, gelu or relu."""

    backbone_dropout: float = 0.0
    """Dropout after each backbone activation."""

    mode: CfCMode = "gated"
    """``gated``: h = sigma(-(f t + b)) g + sigma(f t + b) h_alt (the paper's CfC);
    ``no_gate``: h = g + sigma(f t + b) h_alt (the authors' ablation without the
    complementary gate)."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * forecast), the forecast in standardized-return
    units (a forecast of 0.25 sigma trades at tanh(1) = 0.76 by default)."""

    loss: LossKind = "huber"
    """Training loss on the standardized next-bar return: ``huber`` (robust to the fat
    tails of returns) or ``mse``."""

    huber_delta: float = 1.0
    """Huber loss threshold in standardized-return units: squared error within it, linear
    beyond, so fat-tailed bars in the volatile regime do not dominate the gradient."""

    def __post_init__(self) -> None:
        for name in ("hidden", "backbone_units", "backbone_layers"):
            check_int(name, getattr(self, name))
        check_choices("backbone_activation", self.backbone_activation, ACTIVATIONS)
        check_choices("mode", self.mode, MODES)
        if not 0.0 <= self.backbone_dropout < 1.0:
            raise ValueError(f"backbone_dropout must be in [0, 1), got {self.backbone_dropout}")
        check_head(self)


# Ranges from the paper's per-task hyperparameters (Supplementary tables: state sizes
# 64-256, backbone units 64-256, backbone layers 1-3, backbone dropout 0-0.3, activations
# silu / relu / gelu / lecun_tanh, the gated and the no-gate CfC), widened down to 16 so
# that small, fast networks are in reach. lr, batch size and weight decay belong to the
# trainer's space.
SEARCH_SPACE: SearchSpace = {
    "hidden": Int(16, 256, log=True),
    "backbone_units": Int(16, 256, log=True),
    "backbone_layers": Int(1, 3),
    "backbone_activation": Choice(ACTIVATIONS),
    "backbone_dropout": Float(0.0, 0.3),
    "mode": Choice(MODES),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="liquid",
    confidence="the point forecast relative to its validation RMSE: erf(|f| / (sqrt(2) RMSE_val))",
    kind="forecast",
    config_cls=LiquidConfig,
    build=Network("models.nets.liquid:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Hasani, Lechner, Amini, Liebenwein, Ray, Tschaikowski, Teschl & Rus (2022), "
        "Closed-form continuous-time neural networks, Nature Machine Intelligence 4"
    ),
    tiny={"hidden": 8, "backbone_units": 16},
    # The position scale is read by positions only; the dropout rate per slot.
    per_trial_settings=frozenset({"position_scale", "backbone_dropout"}),
    shape_settings=frozenset(
        {
            "hidden",
            "backbone_units",
            "backbone_layers",
            "backbone_activation",
            "backbone_dropout",
            "mode",
            "loss",
        }
    ),
    keeps_f32=(
        "the time gate sigma(+-(f t + b)) and the interpolation of the two branches (t is "
        "an f32 gap; 1 - gate would quantize to 2^-8 in bf16), the recurrent state carried "
        "across the L bars (an accumulator), the loss and the position mapping"
    ),
    summary=(
        "CfC cells (gated or no-gate) stepped over the L bars with the bar gaps as elapsed "
        "time; linear head on the final state -> next-bar forecast; position = "
        "tanh(scale * forecast)"
    ),
)
