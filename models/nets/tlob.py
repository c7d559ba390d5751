"""TLOB: a transformer with dual attention (over time, then over features) for price trends.

Berti & Kasneci (2025), "TLOB: A Novel Transformer Model with Dual Attention for Stock
Price Trend Prediction with Limit Order Book Data", arXiv:2502.15757. Input normalization:
Tran, Kanniainen, Gabbouj & Iosifidis (2021), "Data Normalization for Bilinear Structures
in High-Frequency Financial Time-series", ICPR (BiN).

TLOB reads one window of L bars x F features per sample (OHLCV features, F = 8, or an
order-book snapshot per bar, F = 4 * levels); assets are folded into the batch:

    BiN over the (L, F) window -> linear embedding F -> d per bar -> + positional embedding
    n_layers x [ time attention over the L bars, feature attention over the d features ]
    (the last pair shrinks d -> d // 4 and L -> L // 4) -> flatten -> MLP -> next-return forecast
    position = tanh(position_scale * forecast)

BiN mixes a temporal z-score (each feature over time) and a feature z-score (each bar over
features) with weights ``softplus(mix) >= 0``; a standard deviation below 1e-4 counts as 1.

Stays f32 under ``bf16``: BiN's statistics and normalization (cast back once normalized),
the softmax of every attention map, the loss and the position mapping; every other weight
and activation is bf16. Data is cast to bf16 once, so feed order-book prices as offsets
from the mid or as returns, not raw. Formulas, deviations and reasons: docs/models.md#tlob

Run ``.venv/bin/python -m pytest tests/models/test_tlob.py -q`` to check this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DataShape, fold_assets, inverse_softplus, unfold_assets
from models.heads import RegressionHead
from models.ops import Dropout, f32, like
from models.tlob import TLOBConfig

__all__ = [
    "BIN_MIN_STD",
    "TLOB",
    "BiN",
    "DualAttentionLayer",
    "TLOBExplanation",
    "build",
    "sinusoidal_embedding",
]


# A standard deviation below this is replaced by 1 in BiN (the reference code's guard).
BIN_MIN_STD = 1e-4


# --------------------------------------------------------------------------------------
# Building blocks


class BiN(nn.Module):
    """Bilinear normalization of (N, L, F) windows (formulas in the module docstring)."""

    def __init__(self, lookback: int, n_features: int) -> None:
        super().__init__()
        self.time_scale = nn.Parameter(torch.ones(n_features))  # per feature
        self.time_bias = nn.Parameter(torch.zeros(n_features))
        self.feature_scale = nn.Parameter(torch.ones(lookback, 1))  # per bar
        self.feature_bias = nn.Parameter(torch.zeros(lookback, 1))
        self.mix = nn.Parameter(torch.full((2,), inverse_softplus(0.5)))  # [feature, time]

    @staticmethod
    def standardize(x: torch.Tensor, dim: int) -> torch.Tensor:
        """(x - mean) / std along ``dim`` (unbiased std; below 1e-4 it counts as 1)."""
        std = x.std(dim=dim, keepdim=True)
        std = torch.where(std < BIN_MIN_STD, torch.ones_like(std), std)
        return (x - x.mean(dim=dim, keepdim=True)) / std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, L, F) -> (N, L, F) in x's dtype; statistics and mixing in f32."""
        x32 = f32(x)
        temporal = f32(self.time_scale) * self.standardize(x32, dim=1) + f32(self.time_bias)
        featural = f32(self.feature_scale) * self.standardize(x32, dim=2) + f32(self.feature_bias)
        w_feature, w_time = F.softplus(f32(self.mix)).unbind()
        return like(w_feature * featural + w_time * temporal, x)


def sinusoidal_embedding(length: int, dim: int) -> torch.Tensor:
    """(length, dim) f32 Vaswani et al. positional embedding: sin on even, cos on odd dims."""
    position = f32(torch.arange(length)).unsqueeze(1)  # (L, 1)
    freq = torch.exp(f32(torch.arange(0, dim, 2)) * (-math.log(10000.0) / dim))  # (ceil(d/2),)
    table = f32(torch.zeros(length, dim))
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class DualAttentionLayer(nn.Module):
    """One TLOB transformer layer: self-attention among the T tokens of (N, T, dim).

    Used as time attention on (N, L, d) (tokens = bars) and as feature attention on
    (N, d, L) (tokens = embedded features); ``out_dim`` < dim shrinks the token width.
    """

    def __init__(self, dim: int, out_dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.dim, self.out_dim, self.n_heads = dim, out_dim, n_heads
        self.qkv = nn.Linear(dim, 3 * n_heads * dim)
        self.w0 = nn.Linear(n_heads * dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, out_dim)
        self.mlp_norm = nn.LayerNorm(out_dim)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, T, dim) -> (N, T, out_dim), attention (N, H, T, T) rows summing to 1."""
        n, t, _ = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.n_heads, self.dim).unbind(2)  # (N, T, H, dim)
        scores = torch.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(self.dim)  # (N, H, T, T)
        attn = like(torch.softmax(f32(scores), dim=-1), scores)
        heads = torch.einsum("nhqk,nkhd->nqhd", self.dropout(attn), v)  # (N, T, H, dim)
        h = self.norm(self.w0(heads.reshape(n, t, -1)) + x)  # (N, T, dim)
        out = self.fc2(F.gelu(self.fc(h)))  # (N, T, out_dim)
        if self.out_dim == self.dim:
            out = out + h
        out = self.mlp_norm(F.gelu(out))
        if self.out_dim == self.dim:
            out = out + x
        return out, attn


# --------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class TLOBExplanation:
    """Attention maps of every layer pair, per asset (head dimension kept)."""

    forecast: torch.Tensor  # (B, A)
    time_attention: list[torch.Tensor]  # per pair (B, A, H, L, L): bar attends to bar
    feature_attention: list[torch.Tensor]  # per pair (B, A, H, d_i, d_i): feature to feature


class TLOB(RegressionHead[TLOBConfig]):
    """TLOB over (B, A, L, F) windows; assets folded into the batch."""

    pos_embedding: torch.Tensor  # (L, d) buffer when sinusoidal

    def __init__(self, config: TLOBConfig, shape: DataShape) -> None:
        super().__init__()
        length, d = shape.lookback, config.hidden_dim
        if length < 8:
            raise ValueError(
                f"TLOB needs a lookback of >= 8 bars (the last layers keep L // 4), got {length}"
            )
        if shape.n_features < 2:
            raise ValueError(
                f"TLOB needs >= 2 features (BiN standardizes each bar over its features), "
                f"got {shape.n_features}"
            )
        self.config = config
        self.n_assets, self.n_features, self.lookback = shape.n_assets, shape.n_features, length
        self.bin = BiN(length, shape.n_features)
        self.embed = nn.Linear(shape.n_features, d)
        if config.sinusoidal:
            # Derived from the shape, so not saved in checkpoints.
            self.register_buffer("pos_embedding", sinusoidal_embedding(length, d), persistent=False)
        else:
            self.pos_embedding = nn.Parameter(torch.randn(length, d))
        self.time_layers = nn.ModuleList()
        self.feature_layers = nn.ModuleList()
        for i in range(config.n_layers):
            shrink = 4 if i == config.n_layers - 1 else 1
            self.time_layers.append(
                DualAttentionLayer(d, d // shrink, config.n_heads, config.dropout)
            )
            self.feature_layers.append(
                DualAttentionLayer(length, length // shrink, config.n_heads, config.dropout)
            )
        width = (d // 4) * (length // 4)
        head: list[nn.Module] = []
        while width > 128:
            head += [nn.Linear(width, width // 4), nn.GELU()]
            width //= 4
        head.append(nn.Linear(width, 1))
        self.head = nn.Sequential(*head)

    def _run(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """x (B, A, L, F) -> forecast (N,), time maps (N, H, L, L), feature maps (N, H, d, d)."""
        _, a, length, f = x.shape
        if (a, length, f) != (self.n_assets, self.lookback, self.n_features):
            raise ValueError(
                f"TLOB was built for A={self.n_assets} assets, L={self.lookback} bars and "
                f"F={self.n_features} features, got x of shape {tuple(x.shape)}"
            )
        flat = fold_assets(x)  # (N, L, F)
        h = self.embed(self.bin(flat))  # (N, L, d)
        h = h + like(self.pos_embedding, h)
        time_maps, feature_maps = [], []
        for time_layer, feature_layer in zip(self.time_layers, self.feature_layers, strict=True):
            h, a_time = time_layer(h)  # (N, L, d'): bars attend to bars
            h, a_feature = feature_layer(h.transpose(1, 2))  # (N, d', L'): features to features
            h = h.transpose(1, 2)  # (N, L', d')
            time_maps.append(a_time)
            feature_maps.append(a_feature)
        return self.head(h.flatten(1)).squeeze(-1), time_maps, feature_maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A) forecast of the next standardized return (x's dtype)."""
        forecast, _, _ = self._run(x)
        return unfold_assets(forecast, self.n_assets)

    def explain(self, x: torch.Tensor) -> TLOBExplanation:
        forecast, time_maps, feature_maps = self._run(x)
        a = self.n_assets
        return TLOBExplanation(
            forecast=unfold_assets(forecast, a),
            time_attention=[unfold_assets(m, a) for m in time_maps],
            feature_attention=[unfold_assets(m, a) for m in feature_maps],
        )


def build(config: TLOBConfig, shape: DataShape) -> TLOB:
    return TLOB(config, shape)
