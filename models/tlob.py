"""TLOB: a transformer with dual attention (over time, then over features) for price trends:
the settings, search space and record (no torch: the spec and a sweep's driver read
them). Its network: :mod:`models.nets.tlob`."""

from __future__ import annotations

from dataclasses import dataclass

from models.family import (
    LOSS_KINDS,
    Choice,
    Family,
    Float,
    Int,
    LossKind,
    Network,
    SearchSpace,
    check_head,
    check_int,
)

__all__ = [
    "FAMILY",
    "SEARCH_SPACE",
    "TLOBConfig",
]


@dataclass(frozen=True)
class TLOBConfig:
    """Size and output mapping of one TLOB. Defaults: 44,963 parameters at F=8, L=32, A=4
    (the feature-attention layers and BiN's per-bar weights grow with the lookback L)."""

    hidden_dim: int = 32
    """Width d of each bar's embedding (the paper uses 40 to 46 on order books). The last
    layer pair shrinks it to d // 4 and ends in a LayerNorm over that width, so d >= 8: a
    LayerNorm over 1 value is a constant and over 2 keeps only their order (the same holds
    for the lookback: L >= 8, and L // 4 >= 4 reads far better, see the order-book test)."""

    n_layers: int = 2
    """Pairs of (time attention, feature attention) layers (the paper uses 4)."""

    n_heads: int = 1
    """Attention heads; each head has the full layer width, as in the paper (which uses 1)."""

    sinusoidal: bool = True
    """Sinusoidal positional embedding of the bars (the paper's default); False: learned."""

    dropout: float = 0.0
    """Dropout on the attention weights (the paper uses none)."""

    loss: LossKind = "mse"
    """Regression loss on the standardized next-bar return: MSE, or Huber with
    ``huber_delta``. MSE by default: the volatile regime's large returns carry the signal
    too, and Huber at delta 1 clips them (measured on the synthetic data, 8 seeds of the
    tiny learning test: MSE trained Sharpe 3.1 (TLOB) / 3.2 (TGGN), Huber 1.1 / 2.9)."""

    huber_delta: float = 1.0
    """Huber threshold in units of the target's training standard deviation."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * forecast), forecast in target std units."""

    def __post_init__(self) -> None:
        check_int("hidden_dim", self.hidden_dim, low=8, why="the last layers keep d // 4")
        check_int("n_layers", self.n_layers)
        check_int("n_heads", self.n_heads)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_head(self)


# Ranges around the paper's settings (hidden 40-46, 4 layer pairs, 1 head, sinusoidal
# embedding, no dropout) and the transformer-for-LOB literature it compares against
# (widths 32-128, 2-6 layers, 1-4 heads); hidden_dim is a multiple of 4 so that the last
# pair's d // 4 wastes nothing. lr, batch size and weight decay belong to the trainer.
SEARCH_SPACE: SearchSpace = {
    "hidden_dim": Choice((16, 32, 40, 48, 64, 128)),
    "n_layers": Int(1, 6),
    "n_heads": Choice((1, 2, 4)),
    "sinusoidal": Choice((True, False)),
    "dropout": Float(0.0, 0.3),
    "loss": Choice(LOSS_KINDS),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="tlob",
    confidence="the point forecast relative to its validation RMSE: erf(|f| / (sqrt(2) RMSE_val))",
    kind="forecast",
    config_cls=TLOBConfig,
    build=Network("models.nets.tlob:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Berti & Kasneci (2025), TLOB: A Novel Transformer Model with Dual Attention for "
        "Stock Price Trend Prediction with Limit Order Book Data, arXiv:2502.15757"
    ),
    fuse_on_cpu=False,  # fused slower on a CPU: bench/README.md, Fused slots
    tiny={"hidden_dim": 16, "n_layers": 1},
    # The position scale is read by positions only; the dropout rate per slot.
    per_trial_settings=frozenset({"position_scale", "dropout"}),
    shape_settings=frozenset({"hidden_dim", "n_layers", "n_heads", "sinusoidal", "loss"}),
    keeps_f32=(
        "BiN's means, standard deviations and normalized window (sums over L or F; "
        "order-book prices and sizes would keep 3 digits), the softmax of every time and "
        "feature attention map, the loss and the position mapping"
    ),
    summary=(
        "BiN input normalization, alternating self-attention over bars and over embedded "
        "features, MLP head on the flattened map -> next-bar forecast per asset; position "
        "= tanh(scale * forecast)"
    ),
)
