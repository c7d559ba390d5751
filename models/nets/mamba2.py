"""Mamba-2: a stack of SSD (state space duality) blocks forecasting the next-bar return.

Dao & Gu (2024), "Transformers are SSMs: Generalized Models and Efficient Algorithms
Through Structured State Space Duality", ICML 2024 (arXiv:2405.21060).

Each asset's window of ``L`` past bars is one sequence (assets are folded into the batch),
through the paper's Mamba-2 architecture (the "parallel" block) at a small size:

    Linear(F -> d_model) -> n_layers x [ x + Dropout(Mixer(RMSNorm(x))) ]
    -> RMSNorm -> Linear(d_model -> 1) on the decision bar -> forecast

The SSD layer uses the paper's chunked algorithm (Listing 1); :func:`ssd_sequential` is
the plain recurrence, kept as the reference. ``chunk_size`` changes only the speed, not
the function, so it is not searched. Loss: f32 Huber (or MSE) against the standardized
next-bar return; position ``tanh(position_scale * forecast)``.

Stays f32 under ``bf16``: ``A_log``, ``dt_bias`` and ``D`` (each mixer's ``keep_f32``;
bf16 rounding moves A by up to 0.8 % and dt by up to 1.6 %), the whole SSD (inputs upcast
with ``models.ops.f32``, result cast back with ``models.ops.like``), the loss and the
position mapping. Weight decay applies to every parameter, these three included: keep it
small when searching it for this family.
Mixer equations, initialization and the reasons: docs/models.md#mamba2

Run ``.venv/bin/python -m pytest tests/models/test_mamba2.py -q`` to check this file.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DataShape, fold_assets, unfold_assets
from models.heads import RegressionHead
from models.mamba2 import Mamba2Config
from models.ops import Dropout, conv1d, f32, like, segsum

__all__ = [
    "A_INIT_RANGE",
    "DT_INIT_FLOOR",
    "NORM_EPS",
    "Mamba2",
    "Mamba2Block",
    "Mamba2Mixer",
    "RMSNorm",
    "build",
    "ssd_chunked",
    "ssd_sequential",
]


A_INIT_RANGE = (1.0, 16.0)  # A = -exp(A_log), |A| uniform in this range at init
DT_INIT_FLOOR = 1e-4  # smallest initial dt (mamba_ssm's dt_init_floor)
NORM_EPS = 1e-5  # explicit: the bf16 default eps of rms_norm would be 2^-7


# --------------------------------------------------------------------------------------
# The SSD layer (the paper's Listing 1, ssd_minimal). Callers pass f32 tensors.


def ssd_chunked(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD scan by chunks (the paper's ``ssd_minimal_discrete``).

    x (N, L, H, P) inputs already scaled by dt, a (N, L, H) log-decays dt * A (<= 0),
    b, c (N, L, H or 1, S) (a head dim of 1 is shared by every head),
    initial_state (N, H, P, S) or None (zeros) -> y (N, L, H, P), final state (N, H, P, S).
    """
    n, length, h, p = x.shape
    pad = (-length) % chunk_size
    if pad:  # zero input and zero log-decay: earlier outputs and the final state unchanged
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        a = F.pad(a, (0, 0, 0, pad))
        b = F.pad(b, (0, 0, 0, 0, 0, pad))
        c = F.pad(c, (0, 0, 0, 0, 0, pad))
    k, q = (length + pad) // chunk_size, chunk_size

    def chunked(t: torch.Tensor) -> torch.Tensor:  # (N, K*Q, H, D) -> (N, H, K, Q, D)
        return t.reshape(n, k, q, t.shape[2], t.shape[3]).permute(0, 3, 1, 2, 4)

    x, b, c = chunked(x), chunked(b), chunked(c)
    a = a.reshape(n, k, q, h).permute(0, 3, 1, 2)  # (N, H, K, Q)
    a_cumsum = a.cumsum(dim=-1)  # (N, H, K, Q)
    a_chunk = a_cumsum[..., -1]  # (N, H, K): log-decay across each whole chunk

    # 1. Within each chunk: the masked quadratic form (C_i . B_j) exp(segsum)_ij x_j.
    decay = torch.exp(segsum(a))  # (N, H, K, Q, Q)
    y_diag = ((c @ b.transpose(-1, -2)) * decay) @ x  # (N, H, K, Q, P)

    # 2. Each chunk's final state from its own inputs, decayed to the chunk's end.
    decay_to_end = torch.exp(a_chunk.unsqueeze(-1) - a_cumsum)  # (N, H, K, Q)
    states = (x * decay_to_end.unsqueeze(-1)).transpose(-1, -2) @ b  # (N, H, K, P, S)

    # 3. Pass states between chunks: the recurrence over K chunk boundaries, as one product.
    if initial_state is None:
        initial_state = x.new_zeros(n, h, p, b.shape[-1])
    states = torch.cat([initial_state.unsqueeze(2), states], dim=2)  # (N, H, K+1, P, S)
    chunk_decay = torch.exp(segsum(F.pad(a_chunk, (1, 0))))  # (N, H, K+1, K+1)
    states = (chunk_decay @ states.flatten(-2)).unflatten(-1, (p, -1))  # (N, H, K+1, P, S)
    states, final_state = states[:, :, :-1], states[:, :, -1]  # entering each chunk; final

    # 4. The state entering each chunk, read out by C and decayed to each position.
    y_off = (c @ states.transpose(-1, -2)) * torch.exp(a_cumsum).unsqueeze(-1)  # (N, H, K, Q, P)
    y = (y_diag + y_off).permute(0, 2, 3, 1, 4).reshape(n, k * q, h, p)
    return y[:, :length], final_state


def ssd_sequential(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence one bar at a time (the reference for :func:`ssd_chunked`).

    state_t = exp(a_t) state_{t-1} + x_t b_t^T,  y_t = state_t c_t; shapes as there.
    """
    n, length, h, p = x.shape
    state = (
        initial_state
        if initial_state is not None
        else x.new_zeros(n, h, p, b.shape[-1])  # (N, H, P, S)
    )
    ys = []
    for t in range(length):
        decay = torch.exp(a[:, t])[..., None, None]  # (N, H, 1, 1)
        state = decay * state + x[:, t, :, :, None] * b[:, t, :, None, :]  # (N, H, P, S)
        ys.append((state * c[:, t, :, None, :]).sum(-1))  # (N, H, P)
    return torch.stack(ys, dim=1), state


# --------------------------------------------------------------------------------------
# Modules


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain, optionally gated first: RMSNorm(x * SiLU(gate)) * w.

    The gain multiplies outside ``F.rms_norm`` so that under autocast a bf16 input and the
    f32 gain meet in a plain product (the fused kernel wants one dtype for both).
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is not None:
            x = x * F.silu(gate)
        return F.rms_norm(x, x.shape[-1:], eps=NORM_EPS) * self.weight


class Mamba2Mixer(nn.Module):
    """The Mamba-2 mixer (SSD layer with its projections, conv and gated norm): (N, L, d)."""

    # Decay parameters stay f32 under every policy (see the module docstring).
    keep_f32 = ("A_log", "D", "dt_bias")

    def __init__(self, config: Mamba2Config) -> None:
        super().__init__()
        d, di, s, h = config.d_model, config.d_inner, config.d_state, config.n_heads
        self.d_inner, self.d_state, self.n_heads = di, s, h
        self.head_dim, self.chunk_size = config.head_dim, config.chunk_size
        conv_dim = di + 2 * s  # x, B, C go through the conv together
        self.in_proj = nn.Linear(d, 2 * di + 2 * s + h, bias=False)  # [z | x B C | dt]
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, config.d_conv, groups=conv_dim, padding=config.d_conv - 1
        )
        log_lo, log_hi = math.log(config.dt_min), math.log(config.dt_max)
        dt = torch.exp(torch.rand(h) * (log_hi - log_lo) + log_lo).clamp(min=DT_INIT_FLOOR)
        self.dt_bias = nn.Parameter(f32(dt + torch.log(-torch.expm1(-dt))))  # softplus^-1
        self.A_log = nn.Parameter(f32(torch.empty(h).uniform_(*A_INIT_RANGE).log()))
        self.D = nn.Parameter(f32(torch.ones(h)))
        self.norm = RMSNorm(di)  # gated: normalizes y * SiLU(z)
        self.out_proj = nn.Linear(di, d, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u (N, L, d) -> (N, L, d) in u's dtype."""
        n, length, _ = u.shape
        di, s, h, p = self.d_inner, self.d_state, self.n_heads, self.head_dim
        z, xbc, dt = self.in_proj(u).split([di, di + 2 * s, h], dim=-1)
        xbc = conv1d(self.conv1d, xbc.transpose(1, 2))[..., :length].transpose(1, 2)  # causal
        x, b, c = F.silu(xbc).split([di, s, s], dim=-1)  # (N, L, di), (N, L, S) x2

        dt32 = F.softplus(f32(dt) + self.dt_bias)  # (N, L, H)
        a = -torch.exp(self.A_log)  # (H,) f32, in [-16, -1] at init
        x32 = f32(x).reshape(n, length, h, p)  # (N, L, H, P)
        b32 = f32(b).unsqueeze(2)  # (N, L, 1, S): shared by every head
        c32 = f32(c).unsqueeze(2)
        y, _ = ssd_chunked(x32 * dt32.unsqueeze(-1), a * dt32, b32, c32, self.chunk_size)
        y = y + self.D[:, None] * x32  # (N, L, H, P)
        y = like(y.reshape(n, length, di), u)
        return self.out_proj(self.norm(y, gate=z))


class Mamba2Block(nn.Module):
    """Pre-norm residual block: x + Dropout(Mixer(RMSNorm(x)))."""

    def __init__(self, config: Mamba2Config) -> None:
        super().__init__()
        self.norm = RMSNorm(config.d_model)
        self.mixer = Mamba2Mixer(config)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.mixer(self.norm(x)))


class Mamba2(RegressionHead[Mamba2Config]):
    """Stack of Mamba-2 blocks over (B, A, L, F) windows; assets folded into the batch."""

    def __init__(self, config: Mamba2Config, shape: DataShape) -> None:
        super().__init__()
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        self.embed = nn.Linear(shape.n_features, config.d_model)
        self.blocks = nn.ModuleList(Mamba2Block(config) for _ in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A) forecast of the next standardized return, in x's dtype."""
        _, a, _, f = x.shape
        if a != self.n_assets or f != self.n_features:
            raise ValueError(
                f"Mamba2 was built for A={self.n_assets} assets and F={self.n_features} "
                f"features, got x of shape {tuple(x.shape)}"
            )
        hidden = self.embed(fold_assets(x))  # (N, L, d)
        for block in self.blocks:
            hidden = block(hidden)
        forecast = self.head(self.norm_f(hidden[:, -1]))  # (N, 1), from the decision bar
        return unfold_assets(forecast.squeeze(-1), self.n_assets)


def build(config: Mamba2Config, shape: DataShape) -> Mamba2:
    return Mamba2(config, shape)
