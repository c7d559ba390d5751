"""Mamba-2: a stack of SSD (state space duality) blocks forecasting the next-bar return: the
settings, search space and record (no torch: the spec and a sweep's driver read them).
Its network: :mod:`models.nets.mamba2`."""

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
    "Mamba2Config",
]


@dataclass(frozen=True)
class Mamba2Config:
    """Size and output mapping of one Mamba-2 stack. Defaults: 16,121 parameters at F=8."""

    d_model: int = 32
    """Width of the residual stream (the paper's D)."""

    n_layers: int = 2
    """Mamba-2 blocks in the stack."""

    d_state: int = 16
    """SSM state size N per head (the paper uses 64-256 for language; 16 suits short
    windows of a few features)."""

    expand: int = 2
    """Inner width d_inner = expand * d_model (the paper's E = 2)."""

    head_dim: int = 16
    """Channels P per SSM head; n_heads = d_inner / head_dim (must divide). Each head has its
    own dt and A; B and C are shared by all heads (the paper's multi-value pattern)."""

    d_conv: int = 4
    """Kernel width of the causal depthwise convolution over x, B, C."""

    chunk_size: int = 16
    """Bars per chunk of the SSD algorithm. Changes speed and memory, never the result
    (windows are padded to a multiple of it)."""

    dt_min: float = 1e-3
    """Lower end of the log-uniform range of initial step sizes dt."""

    dt_max: float = 0.1
    """Upper end of the log-uniform range of initial step sizes dt."""

    dropout: float = 0.0
    """Dropout on each block's output before the residual add."""

    loss: LossKind = "huber"
    """Training loss on the standardized next-bar return: ``huber`` (robust to the fat
    tails of returns) or ``mse``."""

    huber_delta: float = 1.0
    """Huber threshold, in standard deviations of the target (``loss="huber"`` only)."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * forecast); the forecast is in target std units."""

    def __post_init__(self) -> None:
        for name in (
            "d_model",
            "n_layers",
            "d_state",
            "expand",
            "head_dim",
            "d_conv",
            "chunk_size",
        ):
            check_int(name, getattr(self, name))
        if self.d_inner % self.head_dim:
            raise ValueError(
                f"head_dim must divide d_inner = expand * d_model = {self.d_inner}, "
                f"got {self.head_dim}"
            )
        if not 0.0 < self.dt_min < self.dt_max:
            raise ValueError(
                f"dt_min and dt_max must satisfy 0 < dt_min < dt_max, "
                f"got dt_min={self.dt_min}, dt_max={self.dt_max}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_head(self)

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def n_heads(self) -> int:
        return self.d_inner // self.head_dim


# Ranges from the paper and mamba_ssm's defaults, scaled down to short windows of a few
# features: expand stays 2 (the paper's E), head dims 8-32 (the paper's 64 is for widths
# of 768+), state sizes 8-64 (the paper's 64-256 are for language), conv 2-4 (mamba_ssm
# uses 4), and the dt range around mamba_ssm's default [1e-3, 1e-1]. d_model is a Choice
# of multiples of 16 so that every sampled head_dim divides d_inner = 2 * d_model.
# chunk_size changes no result and is left out; lr, batch size and weight decay belong
# to the trainer's space.
SEARCH_SPACE: SearchSpace = {
    "d_model": Choice((16, 32, 48, 64, 96, 128)),
    "n_layers": Int(1, 4),
    "d_state": Choice((8, 16, 32, 64)),
    "head_dim": Choice((8, 16, 32)),
    "d_conv": Int(2, 4),
    "dt_min": Float(1e-4, 1e-2, log=True),
    "dt_max": Float(0.05, 0.5, log=True),
    "dropout": Float(0.0, 0.3),
    "loss": Choice(LOSS_KINDS),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="mamba2",
    confidence="the point forecast relative to its validation RMSE: erf(|f| / (sqrt(2) RMSE_val))",
    kind="forecast",
    config_cls=Mamba2Config,
    build=Network("models.nets.mamba2:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Dao & Gu (2024), Transformers are SSMs: Generalized Models and Efficient "
        "Algorithms Through Structured State Space Duality, ICML"
    ),
    fuse_on_cpu=False,  # fused slower on a CPU: bench/README.md, Fused slots
    tiny={"d_model": 16, "n_layers": 1, "d_state": 8, "head_dim": 8},
    # Read by positions and by initialization only; the dropout rate per slot.
    per_trial_settings=frozenset({"position_scale", "dt_min", "dt_max", "dropout"}),
    shape_settings=frozenset(
        {"d_model", "n_layers", "d_state", "expand", "head_dim", "d_conv", "chunk_size", "loss"}
    ),
    keeps_f32=(
        "A_log, dt_bias and D (they set the decay exp(dt*A) multiplied along the window; "
        "bf16 would put A off by up to 0.8% and dt by 1.6%), the whole SSD scan (dt, segsum "
        "cumulative sums, decays, chunk states: accumulators), the loss and the position "
        "mapping"
    ),
    summary=(
        "Mamba-2 blocks (in_proj, causal conv, input-dependent dt, chunked SSD scan, gated "
        "RMSNorm) with residual RMSNorm -> next-bar forecast; position = tanh(scale * forecast)"
    ),
)
