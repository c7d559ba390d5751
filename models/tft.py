"""Temporal Fusion Transformer for one-step-ahead return quantiles: the settings, search
space and record (no torch: the spec and a sweep's driver read them). Its network:
:mod:`models.nets.tft`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from models.family import (
    Choice,
    Family,
    Float,
    Int,
    Network,
    SearchSpace,
    check_int,
    check_positive,
)

__all__ = [
    "FAMILY",
    "SEARCH_SPACE",
    "TFTConfig",
]


@dataclass(frozen=True)
class TFTConfig:
    """Size and output mapping of one TFT. Defaults: 92,339 parameters at F=8, L=32, A=4."""

    d_model: int = 32
    """Hidden state size d_model shared by every GRN, the LSTM and the attention."""

    n_heads: int = 4
    """Attention heads m_H; each head has d_model // n_heads dimensions (must divide)."""

    dropout: float = 0.1
    """Dropout rate in every GLU, on the attention weights and between LSTM layers."""

    lstm_layers: int = 1
    """Stacked layers of the LSTM encoder (the paper uses 1)."""

    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9)
    """Quantile levels predicted for the next bar: increasing, in (0, 1), containing 0.5
    and at least one level on each side of it (the outermost two give the spread)."""

    static_embedding: bool = True
    """Learn an embedding per asset (index = position along A) and derive the paper's four
    static contexts from it; False drops the contexts (zero LSTM state, no conditioning)."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * q50 / (q_hi - q_lo + eps)): the median forecast
    measured in units of the predicted spread, then squashed into [-1, 1]."""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "lstm_layers"):
            check_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads must divide d_model={self.d_model}, got {self.n_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        qs = tuple(float(q) for q in self.quantiles)
        if (
            not all(0.0 < q < 1.0 for q in qs)
            or any(a >= b for a, b in itertools.pairwise(qs))
            or 0.5 not in qs
            or qs[0] >= 0.5
            or qs[-1] <= 0.5
        ):
            raise ValueError(
                "quantiles must be strictly increasing levels in (0, 1) that contain 0.5 "
                f"and at least one level on each side of it, got {self.quantiles}"
            )
        object.__setattr__(self, "quantiles", qs)
        check_positive("position_scale", self.position_scale)

    @property
    def median_index(self) -> int:
        return self.quantiles.index(0.5)


# Ranges from the paper's search (state size 10-240, heads 1/4, dropout 0.1-0.9, where
# dropout above 0.3 suits its larger datasets) and pytorch-forecasting's tuner (hidden
# 8-128, 1-4 heads, dropout 0.1-0.3, 1-2 LSTM layers). d_model is a Choice of multiples
# of 4 so that every sampled n_heads divides it. lr, batch size and weight decay belong to
# the trainer's space.
SEARCH_SPACE: SearchSpace = {
    "d_model": Choice((16, 32, 48, 64, 96, 128, 160)),
    "n_heads": Choice((1, 2, 4)),
    "dropout": Float(0.0, 0.3),
    "lstm_layers": Int(1, 2),
    "static_embedding": Choice((True, False)),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="tft",
    confidence="the median forecast relative to the spread of its quantiles as a normal std: erf(|q50| / (sqrt(2) (q_hi - q_lo) / (z_hi - z_lo)))",
    kind="forecast",
    config_cls=TFTConfig,
    build=Network("models.nets.tft:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Lim, Arik, Loeff & Pfister (2021), Temporal Fusion Transformers for interpretable "
        "multi-horizon time series forecasting, Int. J. Forecasting 37(4)"
    ),
    fuse_on_cpu=False,  # fused slower on a CPU: bench/README.md, Fused slots
    tiny={"d_model": 8, "n_heads": 1, "dropout": 0.0},
    # The position scale is read by positions only; the dropout rate per slot.
    per_trial_settings=frozenset({"position_scale", "dropout"}),
    shape_settings=frozenset(
        {"d_model", "n_heads", "lstm_layers", "quantiles", "static_embedding"}
    ),
    keeps_f32=(
        "quantile levels (0.1 is not exact in bf16), the non-crossing quantile construction, "
        "the pinball loss and the position mapping (a ratio to a difference of nearby "
        "quantiles); the LSTM runs in bf16 (checked within one bf16 rounding of f32)"
    ),
    summary=(
        "asset embedding -> static contexts, variable selection, LSTM encoder, static "
        "enrichment, interpretable causal attention -> next-bar quantiles; position = "
        "tanh(scale * median / spread)"
    ),
)
