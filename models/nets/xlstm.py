"""xLSTM: a stack of mLSTM and sLSTM blocks forecasting the next-bar return.

Beck, Pöppel, Spanring, Auer, Prudnikova, Kopp, Klambauer, Brandstetter & Hochreiter
(2024), "xLSTM: Extended Long Short-Term Memory", NeurIPS 2024 (arXiv:2405.04517).

Each asset's window of ``L`` past bars is one sequence (assets are folded into the batch).
``blocks`` spells the stack, one letter per residual block ("ms": an mLSTM block, then an
sLSTM block; the paper's xLSTM[a:b] ratios are strings like "mmms"):

    Linear(F -> d_model) -> blocks -> LayerNorm -> Linear(d_model -> 1) on the decision bar

mLSTM: the paper's pre up-projection block; its matrix-memory cell is computed in parallel
form by :func:`mlstm_parallel` (:func:`mlstm_recurrent` is the step-by-step reference and
gives the same h). sLSTM: the paper's post up-projection block, recurrent weights
block-diagonal by heads. Loss: f32 Huber (or MSE) against the standardized next-bar
return; position ``tanh(position_scale * forecast)``.

Stays f32 under ``bf16``: the gate biases (``gate_bias`` of both block kinds, in
``keep_f32``), the mLSTM cell (inputs upcast with ``models.ops.f32``, result cast back with
``models.ops.like``), the sLSTM cell state (c, n, m, and h until cast back for R h), the
loss and the position mapping. Everything else, R h included, runs in bf16.
Equations, initialization and the reasons: docs/models.md#xlstm

Run ``.venv/bin/python -m pytest tests/models/test_xlstm.py -q`` to check this file.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DataShape, fold_assets, unfold_assets
from models.heads import RegressionHead
from models.ops import Dropout, conv1d, f32, like, segsum
from models.xlstm import XLSTMConfig

__all__ = [
    "CELL_EPS",
    "FORGET_BIAS_RANGE",
    "XLSTM",
    "BlockDiagonalLinear",
    "CausalConv1d",
    "MLSTMBlock",
    "SLSTMBlock",
    "build",
    "mlstm_parallel",
    "mlstm_recurrent",
    "slstm_scan",
]


FORGET_BIAS_RANGE = (3.0, 6.0)  # sigmoid(3..6) = 0.95..0.998: memory of ~20-400 bars
CELL_EPS = 1e-6  # added to the mLSTM normalizer, as in the authors' code


# --------------------------------------------------------------------------------------
# mLSTM cell: parallel form and its recurrent reference. Callers pass f32 tensors.


def mlstm_parallel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i_pre: torch.Tensor,
    f_pre: torch.Tensor,
    eps: float = CELL_EPS,
) -> torch.Tensor:
    """Stabilized parallel mLSTM. q, k, v (N, H, L, D); i_pre, f_pre (N, H, L) -> h (N, H, L, D)."""
    log_d = segsum(F.logsigmoid(f_pre)) + i_pre.unsqueeze(-2)  # (N, H, L, L): [t, j]
    m = log_d.amax(dim=-1, keepdim=True)  # (N, H, L, 1): finite (the diagonal is)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(k.shape[-1]) * torch.exp(log_d - m)
    normalizer = torch.maximum(scores.sum(dim=-1, keepdim=True).abs(), torch.exp(-m))
    return (scores / (normalizer + eps)) @ v


def mlstm_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    i_pre: torch.Tensor,
    f_pre: torch.Tensor,
    eps: float = CELL_EPS,
) -> torch.Tensor:
    """The same cell one step at a time (matrix memory C, normalizer n, stabilizer m)."""
    n, h, length, d = q.shape
    c_state = q.new_zeros(n, h, v.shape[-1], d)  # (N, H, Dv, Dk)
    n_state = q.new_zeros(n, h, d)  # (N, H, Dk)
    m_state = q.new_full((n, h), -math.inf)  # (N, H)
    out = []
    for t in range(length):
        log_f = F.logsigmoid(f_pre[..., t])
        m_new = torch.maximum(log_f + m_state, i_pre[..., t])
        f_act = torch.exp(log_f + m_state - m_new)[..., None]  # (N, H, 1)
        i_act = torch.exp(i_pre[..., t] - m_new)[..., None]
        k_t = k[:, :, t] / math.sqrt(d)
        c_state = f_act[..., None] * c_state + i_act[..., None] * (
            v[:, :, t, :, None] * k_t[:, :, None, :]
        )
        n_state = f_act * n_state + i_act * k_t
        q_t = q[:, :, t]
        numerator = (c_state @ q_t.unsqueeze(-1)).squeeze(-1)  # (N, H, Dv)
        qn = (n_state * q_t).sum(-1, keepdim=True).abs()  # (N, H, 1)
        out.append(numerator / (torch.maximum(qn, torch.exp(-m_new)[..., None]) + eps))
        m_state = m_new
    return torch.stack(out, dim=2)


def slstm_scan(pre: torch.Tensor, recurrent: torch.Tensor) -> torch.Tensor:
    """Stabilized sLSTM over a window.

    pre (L, H, N, 4 * D) f32 input pre-activations W x + b, gates ordered [i, f, z, o];
    recurrent (H, D, 4 * D) block-diagonal R (any dtype; h is cast to it for R h)
    -> h (L, H, N, D) f32.
    """
    first, *rest = pre.unbind(0)  # each (H, N, 4D); unbind: one stack in backward
    i_raw, _, z_raw, o_raw = first.chunk(4, dim=-1)  # each (H, N, D)
    # Empty memory: m_1 = i~_1, so i'_1 = 1, c_1 = tanh(z~_1), n_1 = 1 (f is irrelevant).
    m_state = i_raw
    c_state = torch.tanh(z_raw)
    n_state = torch.ones_like(c_state)
    h_state = torch.sigmoid(o_raw) * c_state
    out = [h_state]
    for step in rest:
        raw = step + f32(torch.bmm(like(h_state, recurrent), recurrent))  # + R h_{t-1}
        i_raw, f_raw, z_raw, o_raw = raw.chunk(4, dim=-1)
        log_f_m = F.logsigmoid(f_raw) + m_state
        m_state = torch.maximum(log_f_m, i_raw)
        f_act = torch.exp(log_f_m - m_state)
        i_act = torch.exp(i_raw - m_state)
        c_state = f_act * c_state + i_act * torch.tanh(z_raw)
        n_state = f_act * n_state + i_act
        h_state = torch.sigmoid(o_raw) * c_state / n_state
        out.append(h_state)
    return torch.stack(out)


# --------------------------------------------------------------------------------------
# Modules


class BlockDiagonalLinear(nn.Module):
    """G = ``n_blocks`` independent linear maps: (..., G * d_in) -> (..., G * d_out), no bias."""

    def __init__(self, n_blocks: int, d_in: int, d_out: int) -> None:
        super().__init__()
        self.n_blocks = n_blocks
        bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default init, per block
        self.weight = nn.Parameter(torch.empty(n_blocks, d_in, d_out).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = x.unflatten(-1, (self.n_blocks, -1))  # (..., G, d_in)
        return torch.einsum("...gi,gio->...go", blocks, self.weight).flatten(-2)


class CausalConv1d(nn.Module):
    """Depthwise convolution over time that sees bars <= t only: (N, L, C) -> (N, L, C)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, groups=channels, padding=kernel - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv1d(self.conv, x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


class MLSTMBlock(nn.Module):
    """Pre-up-projection residual block around the mLSTM cell (parallel form)."""

    # The gate biases set the memory timescales; added in f32 (see the module docstring).
    keep_f32 = ("gate_bias",)

    def __init__(self, config: XLSTMConfig) -> None:
        super().__init__()
        d, inner, h = config.d_model, config.inner, config.n_heads
        self.n_heads = h
        self.norm = nn.LayerNorm(d, bias=False)
        self.up = nn.Linear(d, 2 * inner, bias=False)  # [x_m | z]
        self.conv = CausalConv1d(inner, config.conv_kernel)
        qkv_blocks = inner // config.qkv_block_size
        bs = config.qkv_block_size
        self.q = BlockDiagonalLinear(qkv_blocks, bs, bs)
        self.k = BlockDiagonalLinear(qkv_blocks, bs, bs)
        self.v = BlockDiagonalLinear(qkv_blocks, bs, bs)
        self.gates = nn.Linear(3 * inner, 2 * h, bias=False)  # [i~ | f~] per head
        nn.init.zeros_(self.gates.weight)
        gate_bias = torch.cat([torch.randn(h) * 0.1, torch.linspace(*FORGET_BIAS_RANGE, h)])
        self.gate_bias = nn.Parameter(f32(gate_bias))  # (2H,): [i | f]
        self.out_norm = nn.Parameter(torch.ones(inner))  # per-head LayerNorm gain
        self.skip = nn.Parameter(torch.ones(inner))
        self.down = nn.Linear(inner, d, bias=False)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, L, d) -> (N, L, d) in x's dtype."""
        x_m, z = self.up(self.norm(x)).chunk(2, dim=-1)  # (N, L, inner) each
        x_c = F.silu(self.conv(x_m))
        q, k, v = self.q(x_c), self.k(x_c), self.v(x_m)
        gates = f32(self.gates(torch.cat([q, k, v], dim=-1))) + self.gate_bias  # (N, L, 2H)
        i_pre, f_pre = gates.transpose(1, 2).chunk(2, dim=1)  # (N, H, L) each

        def heads(t: torch.Tensor) -> torch.Tensor:  # (N, L, inner) -> (N, H, L, D) f32
            return f32(t).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)

        cell = mlstm_parallel(heads(q), heads(k), heads(v), i_pre, f_pre)  # (N, H, L, D)
        cell = F.layer_norm(cell, cell.shape[-1:])  # per head
        hidden = like(cell.transpose(1, 2).flatten(-2), x) * self.out_norm  # (N, L, inner)
        hidden = (hidden + self.skip * x_c) * F.silu(z)
        return x + self.dropout(self.down(hidden))


class SLSTMBlock(nn.Module):
    """Post-up-projection residual block: sLSTM cell, then a gated feed-forward."""

    # The gate biases set the memory timescales; added in f32 (see the module docstring).
    keep_f32 = ("gate_bias",)

    def __init__(self, config: XLSTMConfig) -> None:
        super().__init__()
        d, h = config.d_model, config.n_heads
        hd = d // h
        self.n_heads = h
        self.norm = nn.LayerNorm(d, bias=False)
        self.conv = CausalConv1d(d, config.conv_kernel)
        self.w_if = BlockDiagonalLinear(h, hd, 2 * hd)  # from the conv path
        self.w_zo = BlockDiagonalLinear(h, hd, 2 * hd)  # from the normed input
        self.recurrent = nn.Parameter(torch.zeros(h, hd, 4 * hd))  # R, block-diagonal
        gate_bias = torch.zeros(h, 1, 4, hd)
        gate_bias[..., 1, :] = torch.linspace(*FORGET_BIAS_RANGE, hd)
        self.gate_bias = nn.Parameter(f32(gate_bias.flatten(-2)))  # (H, 1, 4D): [i|f|z|o]
        self.out_norm = nn.Parameter(torch.ones(d))  # GroupNorm-by-heads gain
        self.ffn_norm = nn.LayerNorm(d, bias=False)
        self.ffn_up = nn.Linear(d, 2 * config.ffn_width, bias=False)  # [gate | value]
        self.ffn_down = nn.Linear(config.ffn_width, d, bias=False)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, L, d) -> (N, L, d) in x's dtype."""
        h = self.n_heads
        normed = self.norm(x)
        x_c = F.silu(self.conv(normed))
        i_f = self.w_if(x_c).unflatten(-1, (h, -1))  # (N, L, H, 2D)
        z_o = self.w_zo(normed).unflatten(-1, (h, -1))
        pre = f32(torch.cat([i_f, z_o], dim=-1)).permute(1, 2, 0, 3) + self.gate_bias
        cell = slstm_scan(pre, self.recurrent)  # pre (L, H, N, 4D) -> (L, H, N, D) f32
        cell = F.layer_norm(cell, cell.shape[-1:])  # GroupNorm with one group per head
        cell = cell.permute(2, 0, 1, 3).flatten(-2)  # (N, L, d)
        x = x + self.dropout(like(cell, x) * self.out_norm)
        gate, value = self.ffn_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.dropout(self.ffn_down(F.gelu(gate) * value))


class XLSTM(RegressionHead[XLSTMConfig]):
    """Stack of mLSTM/sLSTM blocks over (B, A, L, F) windows; assets folded into the batch."""

    def __init__(self, config: XLSTMConfig, shape: DataShape) -> None:
        super().__init__()
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        self.embed = nn.Linear(shape.n_features, config.d_model)
        self.blocks = nn.ModuleList(
            MLSTMBlock(config) if kind == "m" else SLSTMBlock(config) for kind in config.blocks
        )
        self.norm_f = nn.LayerNorm(config.d_model, bias=False)
        self.head = nn.Linear(config.d_model, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A) forecast of the next standardized return, in x's dtype."""
        _, a, _, f = x.shape
        if a != self.n_assets or f != self.n_features:
            raise ValueError(
                f"XLSTM was built for A={self.n_assets} assets and F={self.n_features} "
                f"features, got x of shape {tuple(x.shape)}"
            )
        hidden = self.embed(fold_assets(x))  # (N, L, d)
        for block in self.blocks:
            hidden = block(hidden)
        forecast = self.head(self.norm_f(hidden[:, -1]))  # (N, 1), from the decision bar
        return unfold_assets(forecast.squeeze(-1), self.n_assets)


def build(config: XLSTMConfig, shape: DataShape) -> XLSTM:
    return XLSTM(config, shape)
