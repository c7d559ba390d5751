"""Liquid (closed-form continuous-time) recurrent network over irregularly spaced bars.

Hasani, Lechner, Amini, Liebenwein, Ray, Tschaikowski, Teschl & Rus (2022),
"Closed-form continuous-time neural networks", Nature Machine Intelligence 4, 992-1003.

A CfC cell moves the state across an elapsed time ``t`` in one step. With
``z = backbone([I_k, h_{k-1}])`` and four heads on ``z``, the gated cell is

    h_k = sigma(-(f t + b)) * g + sigma(f t + b) * h_alt
    g = tanh(W_g z),  h_alt = tanh(W_h z),  f, b = W_f z, W_b z

(``b`` is the authors' ``time_b``; ``mode="no_gate"`` is their ``no_gate`` variant,
``h_k = g + sigma(f t + b) * h_alt``). ``t`` is ``batch.gaps``: the time since the
previous bar in units of the median bar spacing. Assets are folded into the batch, the
recurrence runs over the L bars from a zero state, and a linear head on the final state
predicts the next standardized return. Loss and position: the shared regression head
(:mod:`models.heads`), Huber (default) or MSE in f32, ``tanh(position_scale * forecast)``.

Stays f32 under ``bf16``: the time gate and the interpolation (both weights are sigmoids
of opposite-signed f32 arguments, never ``1 - gate``), the carried state ``h`` (rounded
only as the next step's matmul input), the loss and the position mapping. The backbone and
heads run in the parameter dtype. Gate semantics and the reasons: docs/models.md#liquid

Run ``.venv/bin/python -m pytest tests/models/test_liquid.py -q`` to check this file.
"""

from __future__ import annotations

import torch
from torch import nn

from models.base import Batch, DataShape, fold_assets, unfold_assets
from models.heads import RegressionHead
from models.liquid import CfCMode, LiquidConfig
from models.ops import Dropout, f32, like

__all__ = [
    "CfCCell",
    "LeCunTanh",
    "LiquidNet",
    "build",
]


class LeCunTanh(nn.Module):
    """1.7159 tanh(2x/3): unit gain near 0 and f(+-1) = +-1 (LeCun et al. 1998)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1.7159 * torch.tanh(0.666 * x)


def _activation(name: str) -> nn.Module:
    if name == "lecun_tanh":
        return LeCunTanh()
    return {"tanh": nn.Tanh, "silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}[name]()


class CfCCell(nn.Module):
    """One CfC step: (projected bar input, previous state, elapsed time) -> new state.

    The bar's share of the first backbone layer, ``W_in I_k + b_in``, is computed outside
    (for all bars at once, see :meth:`project_inputs`); the cell adds ``W_r h``.
    """

    def __init__(
        self,
        n_inputs: int,
        hidden: int,
        units: int,
        layers: int,
        activation: str,
        dropout: float,
        mode: CfCMode,
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.mode = mode
        self.input_proj = nn.Linear(n_inputs, units)  # W_in: the input columns of layer 1
        self.recurrent_proj = nn.Linear(hidden, units, bias=False)  # W_r: the state columns
        self.act = _activation(activation)
        self.drop = Dropout(dropout)
        self.backbone = nn.ModuleList(nn.Linear(units, units) for _ in range(layers - 1))
        # Fused heads, in order: g, h_alt, f (time_a), b (time_b).
        self.heads = nn.Linear(units, 4 * hidden)
        # The reference initialises every weight matrix Xavier-uniform, biases as nn.Linear.
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.xavier_uniform_(p)

    def project_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, L, F) -> (N, L, U): the input part of the first backbone layer, all bars."""
        return self.input_proj(x)

    def branches(
        self, projected: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """projected (N, U), h (N, H) -> g, h_alt, f, b, each (N, H) in the compute dtype."""
        z = self.drop(self.act(projected + self.recurrent_proj(like(h, projected))))
        for layer in self.backbone:
            z = self.drop(self.act(layer(z)))
        # split, not heads[:, :2H]: its backward is one cat, where each slice's would
        # zero-fill a copy of the whole (N, 4H) per bar.
        squashed, timing = self.heads(z).split(2 * self.hidden, dim=-1)  # (N, 2H) each
        g, h_alt = torch.tanh(squashed).chunk(2, dim=-1)
        f, b = timing.chunk(2, dim=-1)
        return g, h_alt, f, b

    def forward(self, projected: torch.Tensor, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """projected (N, U), h (N, H) f32, t (N, 1) f32 -> new state (N, H) f32."""
        g, h_alt, f, b = self.branches(projected, h)
        arg = f32(f) * t + f32(b)  # (N, H), f32 island: see the module docstring
        leak = torch.sigmoid(arg)  # weight of h_alt; sigmoid(-arg) = 1 - leak, exactly
        if self.mode == "no_gate":
            return f32(g) + leak * f32(h_alt)
        return torch.sigmoid(-arg) * f32(g) + leak * f32(h_alt)


class LiquidNet(RegressionHead[LiquidConfig]):
    """CfC recurrence over (B, A, L, F) windows timed by ``gaps``; assets folded."""

    def __init__(self, config: LiquidConfig, shape: DataShape) -> None:
        super().__init__()
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        self.cell = CfCCell(
            shape.n_features,
            config.hidden,
            config.backbone_units,
            config.backbone_layers,
            config.backbone_activation,
            config.backbone_dropout,
            config.mode,
        )
        self.head = nn.Linear(config.hidden, 1)

    def final_state(self, x: torch.Tensor, gaps: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F), gaps (B, L) -> (B*A, H) f32 state after the decision bar."""
        b, a, length, f = x.shape
        if a != self.n_assets or f != self.n_features:
            raise ValueError(
                f"LiquidNet was built for A={self.n_assets} assets and F={self.n_features} "
                f"features, got x of shape {tuple(x.shape)}"
            )
        if gaps.shape != (b, length):
            raise ValueError(
                f"gaps must have shape (B, L) = {(b, length)}, got {tuple(gaps.shape)}"
            )
        projected = self.cell.project_inputs(fold_assets(x))  # (N, L, U)
        # Every asset of a window shares its bar times: (B, L) -> (N, L, 1), N = B*A.
        t = f32(gaps).repeat_interleave(a, dim=0).unsqueeze(-1)
        h = projected.new_zeros(b * a, self.config.hidden, dtype=t.dtype)  # f32 carried state
        # unbind, not projected[:, k]: its backward is one stack, where indexing would
        # build a zero-filled copy of the whole sequence per bar.
        for projected_k, t_k in zip(projected.unbind(1), t.unbind(1), strict=True):
            h = self.cell(projected_k, h, t_k)
        return h

    def forward(self, x: torch.Tensor, gaps: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F), gaps (B, L) -> (B, A) forecast of the next standardized return."""
        h = self.final_state(x, gaps)  # (N, H) f32
        pred = self.head(like(h, self.head.weight)).squeeze(-1)  # (N,)
        return unfold_assets(pred, self.n_assets)

    def forecast(self, batch: Batch) -> torch.Tensor:
        """(B, A) forecast timed by the batch's bar gaps."""
        out: torch.Tensor = self(batch.x, batch.gaps)
        return out


def build(config: LiquidConfig, shape: DataShape) -> LiquidNet:
    return LiquidNet(config, shape)
