"""xLSTM: a stack of mLSTM and sLSTM blocks forecasting the next-bar return: the settings,
search space and record (no torch: the spec and a sweep's driver read them). Its network:
:mod:`models.nets.xlstm`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from models.family import (
    LOSS_KINDS,
    Choice,
    Family,
    Float,
    LossKind,
    Network,
    SearchSpace,
    check_head,
    check_int,
)

__all__ = [
    "BLOCK_KINDS",
    "FAMILY",
    "SEARCH_SPACE",
    "XLSTMConfig",
]

BLOCK_KINDS = "ms"


@dataclass(frozen=True)
class XLSTMConfig:
    """Size and output mapping of one xLSTM stack. Defaults: 16,329 parameters at F=8."""

    d_model: int = 32
    """Width of the residual stream (the paper's embedding dimension)."""

    blocks: str = "ms"
    """The stack, one letter per residual block: 'm' mLSTM, 's' sLSTM (e.g. "mmms" is the
    paper's xLSTM[3:1] pattern, "m" its xLSTM[1:0])."""

    n_heads: int = 4
    """Heads of every mLSTM cell (dividing its inner width) and every sLSTM cell
    (dividing d_model); each head has its own gates and memory."""

    proj_factor: float = 2.0
    """mLSTM up-projection: inner width = proj_factor * d_model (the paper's 2)."""

    qkv_block_size: int = 4
    """Size of the diagonal blocks of the mLSTM's q, k, v maps (the paper's 4); must
    divide the inner width."""

    ffn_factor: float = 4.0 / 3.0
    """sLSTM feed-forward width = ffn_factor * d_model, rounded up to a multiple of 8
    (the paper's 4/3)."""

    conv_kernel: int = 4
    """Width of the causal depthwise convolutions in both block kinds (the paper's 4)."""

    dropout: float = 0.1
    """Dropout on each residual branch's output (0.1: without it the tiny test model
    over-fits the synthetic training split within 3 epochs)."""

    loss: LossKind = "huber"
    """Training loss on the standardized next-bar return: ``huber`` (robust to the fat
    tails of returns) or ``mse``."""

    huber_delta: float = 1.0
    """Huber threshold, in standard deviations of the target (``loss="huber"`` only)."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * forecast); the forecast is in target std units."""

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "qkv_block_size", "conv_kernel"):
            check_int(name, getattr(self, name))
        if not self.blocks or any(ch not in BLOCK_KINDS for ch in self.blocks):
            raise ValueError(
                f"blocks must be a non-empty string of 'm' (mLSTM) and 's' (sLSTM), "
                f"got {self.blocks!r}"
            )
        if not (self.proj_factor >= 1.0 and math.isfinite(self.proj_factor)):
            raise ValueError(f"proj_factor must be a finite number >= 1, got {self.proj_factor}")
        if not (self.ffn_factor > 0 and math.isfinite(self.ffn_factor)):
            raise ValueError(f"ffn_factor must be positive and finite, got {self.ffn_factor}")
        if "s" in self.blocks and self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads must divide d_model={self.d_model} for sLSTM blocks, got {self.n_heads}"
            )
        if "m" in self.blocks:
            inner = self.inner
            if inner % self.n_heads:
                raise ValueError(
                    f"n_heads must divide the mLSTM inner width proj_factor * d_model = "
                    f"{inner}, got {self.n_heads}"
                )
            if inner % self.qkv_block_size:
                raise ValueError(
                    f"qkv_block_size must divide the mLSTM inner width proj_factor * "
                    f"d_model = {inner}, got {self.qkv_block_size}"
                )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_head(self)

    @property
    def inner(self) -> int:
        """mLSTM inner width."""
        return round(self.proj_factor * self.d_model)

    @property
    def ffn_width(self) -> int:
        """sLSTM feed-forward width."""
        return 8 * math.ceil(self.ffn_factor * self.d_model / 8)


# Ranges from the paper (mLSTM proj factor 2, sLSTM FFN factor 4/3, conv 4, block size 4,
# 4 heads; stacks xLSTM[1:0], [1:1], [3:1], [7:1]) scaled to short windows and small
# widths. d_model is a Choice of multiples of 16 so every sampled n_heads divides both
# d_model and 2 * d_model and block size 4 divides the inner width. lr, batch size and
# weight decay belong to the trainer's space.
SEARCH_SPACE: SearchSpace = {
    "d_model": Choice((16, 32, 48, 64, 96, 128)),
    "blocks": Choice(("m", "mm", "ms", "sm", "mmm", "mms", "msm", "mmms")),
    "n_heads": Choice((1, 2, 4)),
    "conv_kernel": Choice((2, 4)),
    "dropout": Float(0.0, 0.3),
    "loss": Choice(LOSS_KINDS),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="xlstm",
    confidence="the point forecast relative to its validation RMSE: erf(|f| / (sqrt(2) RMSE_val))",
    kind="forecast",
    config_cls=XLSTMConfig,
    build=Network("models.nets.xlstm:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Beck, Pöppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter & "
        "Hochreiter (2024), xLSTM: Extended Long Short-Term Memory, NeurIPS"
    ),
    fuse_on_cpu=False,  # fused slower on a CPU: bench/README.md, Fused slots
    tiny={"d_model": 16, "blocks": "ms", "n_heads": 2, "dropout": 0.0},
    # The position scale is read by positions only; the dropout rate per slot.
    per_trial_settings=frozenset({"position_scale", "dropout"}),
    shape_settings=frozenset(
        {
            "d_model",
            "blocks",
            "n_heads",
            "proj_factor",
            "qkv_block_size",
            "ffn_factor",
            "conv_kernel",
            "loss",
        }
    ),
    keeps_f32=(
        "gate biases (they set the memory timescales; added to the upcast pre-activations), "
        "the mLSTM cell (log forget-gate cumulative sums, stabilizer max, exponential gate "
        "matrix, normalizer) and the sLSTM cell state (c, n, stabilizer m): exponential "
        "gates are exact only as exp(x - m) with both terms exact; the loss and the "
        "position mapping"
    ),
    summary=(
        "xLSTM stack of mLSTM (matrix memory, parallel stabilized form) and sLSTM "
        "(scalar memory, block-diagonal recurrence) blocks -> next-bar forecast; "
        "position = tanh(scale * forecast)"
    ),
)
