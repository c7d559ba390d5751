"""Temporal Fusion Transformer for one-step-ahead return quantiles.

Lim, Arık, Loeff & Pfister (2021), "Temporal Fusion Transformers for interpretable
multi-horizon time series forecasting", International Journal of Forecasting 37(4).

Adapted to the supervised contract of :mod:`models.base`: each asset's window of ``L``
past bars is one sample (assets are folded into the batch), the only static covariate is
the asset itself (a learned embedding indexed by the position along ``A``), there are no
known-future inputs, and the horizon is the single next bar. The network follows the
paper's Fig. 2 (static contexts, per-bar variable selection, LSTM encoder, static
enrichment, causal interpretable multi-head attention, position-wise GRN) and ends in a
quantile head on the decision bar.

The quantile head is non-crossing by construction (the median plus/minus cumulative
softplus offsets, starting at the standard-normal quantile gaps), so the spread
``q_hi - q_lo`` is never negative and the position
``tanh(position_scale * q50 / (q_hi - q_lo + eps))`` has the sign of the median.

Under ``bf16`` every weight and activation is bf16, the ``nn.LSTM`` included. Stays f32:
``quantile_levels`` (a buffer in ``keep_f32``), the non-crossing construction of the
quantiles, the pinball loss and the position mapping (from the upcast outputs).
Layer by layer, and the reasons: docs/models.md#tft

Run ``.venv/bin/python -m pytest tests/models/test_tft.py -q`` to check this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import torch
import torch.nn.functional as F
from torch import nn

from models.base import (
    Batch,
    DataShape,
    ForecastSignal,
    fold_assets,
    inverse_softplus,
    unfold_assets,
)
from models.ops import LSTM, Dropout, f32, like
from models.tft import TFTConfig

__all__ = [
    "SPREAD_EPS",
    "TFT",
    "GateAddNorm",
    "GatedLinearUnit",
    "GatedResidualNetwork",
    "GroupedLayerNorm",
    "GroupedLinear",
    "InterpretableMultiHeadAttention",
    "LSTMEncoder",
    "QuantileHead",
    "StaticCovariateEncoder",
    "TFTExplanation",
    "VariableSelectionNetwork",
    "build",
    "pinball_loss",
    "quantiles_to_positions",
]


# Added to the predicted spread so a collapsed spread gives a saturated, finite position.
SPREAD_EPS = 1e-6


# --------------------------------------------------------------------------------------
# Building blocks (paper section 4.1). Linear layers act on the last dimension; the
# "grouped" variant holds one independent weight per group (feature) along dim -2, which
# is how the per-variable embeddings and GRNs of the variable selection run as one op.


class GroupedLinear(nn.Module):
    """``groups`` independent linear maps: (..., G, d_in) -> (..., G, d_out)."""

    def __init__(self, groups: int, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default init, per group
        self.weight = nn.Parameter(torch.empty(groups, d_in, d_out).uniform_(-bound, bound))
        self.bias = (
            nn.Parameter(torch.empty(groups, d_out).uniform_(-bound, bound)) if bias else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.einsum("...gi,gio->...go", x, self.weight)
        return y if self.bias is None else y + self.bias


class GroupedLayerNorm(nn.Module):
    """LayerNorm over the last dim with its own affine parameters per group (dim -2)."""

    def __init__(self, groups: int, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(groups, d))
        self.bias = nn.Parameter(torch.zeros(groups, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:]) * self.weight + self.bias


def _linear(d_in: int, d_out: int, groups: int, bias: bool = True) -> nn.Module:
    return (
        nn.Linear(d_in, d_out, bias=bias)
        if groups == 1
        else GroupedLinear(groups, d_in, d_out, bias)
    )


def _layer_norm(d: int, groups: int) -> nn.Module:
    return nn.LayerNorm(d) if groups == 1 else GroupedLayerNorm(groups, d)


class GatedLinearUnit(nn.Module):
    """GLU(g) = sigmoid(W4 g + b4) * (W5 g + b5), with dropout on g (eq. 5)."""

    def __init__(self, d_in: int, d_out: int, dropout: float, groups: int = 1) -> None:
        super().__init__()
        self.dropout = Dropout(dropout)
        self.proj = _linear(d_in, 2 * d_out, groups)  # [value | gate] in one matmul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.proj(self.dropout(x)).chunk(2, dim=-1)
        return torch.sigmoid(gate) * value


class GateAddNorm(nn.Module):
    """LayerNorm(skip + GLU(x)): the gated skip connection used around every TFT block."""

    def __init__(self, d_in: int, d_out: int, dropout: float, groups: int = 1) -> None:
        super().__init__()
        self.glu = GatedLinearUnit(d_in, d_out, dropout, groups)
        self.norm = _layer_norm(d_out, groups)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.norm(skip + self.glu(x))


class GatedResidualNetwork(nn.Module):
    """GRN(a, c) = LayerNorm(skip(a) + GLU(W1 ELU(W2 a + W3 c + b2) + b1))  (eqs. 2-4).

    ``skip`` is the identity when ``d_in == d_out`` and a linear projection otherwise.
    ``context`` (..., d_context) must broadcast against ``a``'s leading dimensions.
    """

    def __init__(
        self,
        d_in: int,
        d_hidden: int,
        d_out: int,
        dropout: float,
        d_context: int | None = None,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.skip = _linear(d_in, d_out, groups) if d_in != d_out else nn.Identity()
        self.fc_in = _linear(d_in, d_hidden, groups)  # W2, b2
        # W3 has no bias of its own (b2 already sits in fc_in), as in eq. 4.
        self.fc_context = nn.Linear(d_context, d_hidden, bias=False) if d_context else None
        self.fc_hidden = _linear(d_hidden, d_hidden, groups)  # W1, b1
        self.gate = GateAddNorm(d_hidden, d_out, dropout, groups)

    def forward(self, a: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.fc_in(a)
        if context is not None:
            if self.fc_context is None:
                raise ValueError("this GRN was built without a context input")
            hidden = hidden + self.fc_context(context)
        hidden = self.fc_hidden(F.elu(hidden))
        return self.gate(hidden, self.skip(a))


class VariableSelectionNetwork(nn.Module):
    """Per-bar soft selection over the F input features (eqs. 6-8).

    Each scalar feature gets its own linear embedding to d_model and its own GRN; the
    selection weights are a softmax over features of a GRN of the flattened embeddings,
    conditioned on the static context c_s.
    """

    def __init__(
        self, n_features: int, d_model: int, dropout: float, d_context: int | None
    ) -> None:
        super().__init__()
        self.embed = GroupedLinear(n_features, 1, d_model)
        self.selector = GatedResidualNetwork(
            n_features * d_model, d_model, n_features, dropout, d_context=d_context
        )
        self.transform = GatedResidualNetwork(d_model, d_model, d_model, dropout, groups=n_features)

    def forward(
        self, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, L, F), context (N, 1, d_context) -> selected (N, L, d), weights (N, L, F)."""
        embedded = self.embed(x.unsqueeze(-1))  # (N, L, F, d)
        logits = self.selector(embedded.flatten(-2), context)  # (N, L, F)
        weights = torch.softmax(logits, dim=-1)  # (N, L, F)
        transformed = self.transform(embedded)  # (N, L, F, d)
        selected = torch.einsum("nlf,nlfd->nld", weights, transformed)  # (N, L, d)
        return selected, weights


class StaticCovariateEncoder(nn.Module):
    """Asset embedding -> the paper's four static contexts (c_s, c_e, c_h, c_c).

    The asset is the only static variable, so the paper's static variable selection (a
    softmax over one variable) is the constant 1 and is left out.
    """

    def __init__(self, n_assets: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_assets, d_model)
        self.contexts = nn.ModuleList(
            GatedResidualNetwork(d_model, d_model, d_model, dropout) for _ in range(4)
        )

    def forward(self, asset: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """asset (N,) int64 -> (c_selection, c_enrichment, c_h, c_c), each (N, d)."""
        e = self.embedding(asset)  # (N, d)
        return tuple(grn(e) for grn in self.contexts)


class LSTMEncoder(nn.Module):
    """LSTM over the L bars, started from the static state, + gated skip + LayerNorm."""

    def __init__(self, d_model: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = layers
        self.lstm = LSTM(
            d_model,
            d_model,
            num_layers=layers,
            batch_first=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.gate = GateAddNorm(d_model, d_model, dropout)

    def forward(
        self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """x (N, L, d), state (h, c) each (N, d) or None -> (N, L, d)."""
        hx = None
        if state is not None:
            # Every layer starts from the same static state (as pytorch-forecasting does).
            hx = tuple(s.unsqueeze(0).expand(self.layers, -1, -1).contiguous() for s in state)
        out, _ = self.lstm(x, hx)  # (N, L, d)
        return self.gate(out, x)


class InterpretableMultiHeadAttention(nn.Module):
    """Multi-head attention whose heads share one value projection (eqs. 13-16).

    Each head h has its own W_Q^h, W_K^h (packed into one matmul); W_V is shared, so the
    head-averaged attention matrix applies to one set of values and reads as a single
    importance pattern over past bars.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.query = nn.Linear(d_model, n_heads * self.d_head)
        self.key = nn.Linear(d_model, n_heads * self.d_head)
        self.value = nn.Linear(d_model, self.d_head)  # ONE projection for all heads
        self.out = nn.Linear(self.d_head, d_model)  # W_H
        self.dropout = Dropout(dropout)

    def forward(
        self, q: torch.Tensor, kv: torch.Tensor, causal: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (N, Lq, d), kv (N, Lk, d) -> output (N, Lq, d), head-mean weights (N, Lq, Lk).

        ``causal`` lets query i attend to keys j <= i (queries and keys aligned at the start).
        """
        n, lq, _ = q.shape
        lk = kv.shape[1]
        qh = self.query(q).view(n, lq, self.n_heads, self.d_head)  # (N, Lq, H, dh)
        kh = self.key(kv).view(n, lk, self.n_heads, self.d_head)  # (N, Lk, H, dh)
        v = self.value(kv)  # (N, Lk, dh)
        scores = torch.einsum("nqhd,nkhd->nhqk", qh, kh) / math.sqrt(self.d_head)  # (N, H, Lq, Lk)
        if causal:
            future = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        attn = torch.softmax(scores, dim=-1)  # (N, H, Lq, Lk)
        heads = torch.einsum("nhqk,nkd->nhqd", self.dropout(attn), v)  # (N, H, Lq, dh)
        return self.out(heads.mean(dim=1)), attn.mean(dim=1)


class QuantileHead(nn.Module):
    """Decision-bar state -> non-crossing quantiles of the next standardized return.

    The median is a linear read-out; every other quantile is its neighbour towards the
    median moved out by a softplus offset. Offsets start at the standard-normal gaps.
    """

    def __init__(self, d_model: int, quantiles: tuple[float, ...]) -> None:
        super().__init__()
        self.median_index = quantiles.index(0.5)
        self.proj = nn.Linear(d_model, len(quantiles))
        z = [NormalDist().inv_cdf(q) for q in quantiles]
        with torch.no_grad():
            self.proj.weight.mul_(0.1)  # start close to the prior below
            self.proj.bias.zero_()
            for i in range(len(quantiles)):
                if i != self.median_index:
                    gap = abs(z[i] - z[i + 1 if i < self.median_index else i - 1])
                    self.proj.bias[i] = inverse_softplus(gap)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (N, d) -> (N, Q) increasing quantiles, in h's dtype."""
        raw = self.proj(h)  # (N, Q)
        raw32 = f32(raw)
        m = self.median_index
        median = raw32[:, m : m + 1]  # (N, 1)
        offsets = F.softplus(raw32)  # (N, Q)
        below = median - offsets[:, :m].flip(-1).cumsum(-1).flip(-1)  # (N, m)
        above = median + offsets[:, m + 1 :].cumsum(-1)  # (N, Q - m - 1)
        return like(torch.cat([below, median, above], dim=-1), raw)


# --------------------------------------------------------------------------------------
# Loss and position mapping (both f32)


def pinball_loss(pred: torch.Tensor, target: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Quantile loss max(tau * e, (tau - 1) * e), e = target - pred, averaged over all.

    pred (..., Q) any dtype, target (...) f32, levels (Q,) f32 -> f32 scalar.
    """
    err = target.unsqueeze(-1) - f32(pred)  # (..., Q)
    return torch.maximum(levels * err, (levels - 1.0) * err).mean()


def quantiles_to_positions(q: torch.Tensor, median_index: int, scale: float) -> torch.Tensor:
    """(..., Q) increasing quantiles -> (...) f32 positions in [-1, 1].

    The median forecast in units of the predicted spread (outermost quantiles), squashed:
    a confident forecast (median far from zero relative to the spread) trades near +-1.
    """
    q32 = f32(q)
    spread = q32[..., -1] - q32[..., 0]  # >= 0: the head is non-crossing
    return torch.tanh(scale * q32[..., median_index] / (spread + SPREAD_EPS))


# --------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class TFTExplanation:
    """What the TFT exposes for interpretation, per asset."""

    quantiles: torch.Tensor  # (B, A, Q)
    feature_weights: torch.Tensor  # (B, A, L, F) variable-selection weights, sum 1 over F
    attention: torch.Tensor  # (B, A, L, L) head-averaged causal self-attention


class TFT(nn.Module):
    """Temporal Fusion Transformer over (B, A, L, F) windows; assets folded into the batch."""

    # Quantile levels stay f32: 0.1 is not representable in bf16 (see module docstring).
    keep_f32 = ("quantile_levels",)
    quantile_levels: torch.Tensor  # (Q,) f32 buffer

    def __init__(self, config: TFTConfig, shape: DataShape) -> None:
        super().__init__()
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        d, p = config.d_model, config.dropout
        # Derived from the config, so not saved in checkpoints.
        levels = f32(torch.tensor(config.quantiles))  # (Q,)
        self.register_buffer("quantile_levels", levels, persistent=False)
        self.static = (
            StaticCovariateEncoder(shape.n_assets, d, p) if config.static_embedding else None
        )
        d_context = d if config.static_embedding else None
        self.selection = VariableSelectionNetwork(shape.n_features, d, p, d_context)
        self.encoder = LSTMEncoder(d, config.lstm_layers, p)
        self.enrichment = GatedResidualNetwork(d, d, d, p, d_context=d_context)
        self.attention = InterpretableMultiHeadAttention(d, config.n_heads, p)
        self.attention_gate = GateAddNorm(d, d, p)
        self.positionwise = GatedResidualNetwork(d, d, d, p)
        self.output_gate = GateAddNorm(d, d, p)
        self.head = QuantileHead(d, config.quantiles)

    def _run(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, A, L, F) -> quantiles (N, Q), selection (N, L, F), attention (N, L, L)."""
        b, a, _, f = x.shape
        if a != self.n_assets or f != self.n_features:
            raise ValueError(
                f"TFT was built for A={self.n_assets} assets and F={self.n_features} features, "
                f"got x of shape {tuple(x.shape)}"
            )
        flat = fold_assets(x)  # (N, L, F), row b*A + a holds asset a of window b
        c_select = c_enrich = state = None
        if self.static is not None:
            asset = torch.arange(a, device=x.device).expand(b, a).reshape(-1)  # (N,)
            c_select, c_enrich, c_h, c_c = self.static(asset)  # each (N, d)
            c_select, c_enrich = c_select.unsqueeze(1), c_enrich.unsqueeze(1)  # (N, 1, d)
            state = (c_h, c_c)
        selected, weights = self.selection(flat, c_select)  # (N, L, d), (N, L, F)
        encoded = self.encoder(selected, state)  # (N, L, d)
        enriched = self.enrichment(encoded, c_enrich)  # (N, L, d)
        attended, attn = self.attention(enriched, enriched, causal=True)  # (N, L, d), (N, L, L)
        fused = self.attention_gate(attended, enriched)  # (N, L, d)
        decoded = self.output_gate(self.positionwise(fused), encoded)  # (N, L, d)
        return self.head(decoded[:, -1]), weights, attn  # quantiles from the decision bar

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A, Q) quantiles of the next standardized return."""
        q, _, _ = self._run(x)
        return unfold_assets(q, self.n_assets)

    def explain(self, x: torch.Tensor) -> TFTExplanation:
        q, weights, attn = self._run(x)
        a = self.n_assets
        return TFTExplanation(
            unfold_assets(q, a), unfold_assets(weights, a), unfold_assets(attn, a)
        )

    def loss(self, batch: Batch) -> torch.Tensor:
        """f32 pinball loss over quantiles, batch and assets."""
        return pinball_loss(self(batch.x), batch.y, self.quantile_levels)

    @torch.no_grad()
    def positions(self, batch: Batch) -> torch.Tensor:
        """(B, A) f32 positions in [-1, 1] with the sign of the median forecast."""
        return quantiles_to_positions(
            self(batch.x), self.config.median_index, self.config.position_scale
        )

    @torch.no_grad()
    def forecast_signal(self, batch: Batch) -> ForecastSignal:
        """Position, the median forecast and the spread of the quantiles as a normal std,
        (q_hi - q_lo) / (z_hi - z_lo): confidence = the median relative to that spread."""
        cfg = self.config
        q = self(batch.x)  # (B, A, Q)
        positions = quantiles_to_positions(q, cfg.median_index, cfg.position_scale)
        q32 = f32(q)
        normal = NormalDist()
        z_width = normal.inv_cdf(cfg.quantiles[-1]) - normal.inv_cdf(cfg.quantiles[0])
        spread = (q32[..., -1] - q32[..., 0]) / z_width
        return ForecastSignal(positions, q32[..., cfg.median_index], spread)


def build(config: TFTConfig, shape: DataShape) -> TFT:
    return TFT(config, shape)
