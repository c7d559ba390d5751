"""Temporal graph network over assets: a learned graph, graph propagation, a temporal module.

Wu, Pan, Long, Jiang & Zhang (2019), "Graph WaveNet for Deep Spatial-Temporal Graph
Modeling", IJCAI; and Wu, Pan, Long, Jiang, Chang & Zhang (2020), "Connecting the Dots:
Multivariate Time Series Forecasting with Graph Neural Networks" (MTGNN), KDD.

Unlike the single-asset families, TGGN reads the asset axis ``A`` of ``x (B, A, L, F)``
jointly: the A assets are the nodes of a graph whose adjacency is learned, so asset i's
forecast can use asset j's past bars (a lead-lag link). The network:

    input projection F -> C per (asset, bar)
    n_layers x temporal layer (``tcn``: gated dilated causal convolution, then graph
        propagation; ``gru``: graph GRU, propagation in its gates) + residual + LayerNorm
    skip connections at the decision bar -> ReLU -> MLP -> one forecast per asset
    position = tanh(position_scale * forecast)

Adjacency: each row keeps its ``top_k`` largest logits ``relu(E1 E2^T)`` and softmaxes
them, so row i has exactly ``top_k`` nonzeros summing to 1; ``adj[i, j] > 0`` means node i
reads node j. Propagation over ``hops`` hops: ``mixhop`` (MTGNN) or ``diffusion`` (Graph
WaveNet). Stays f32 under ``bf16``: the adjacency (cast to the activation dtype for the
propagation matmuls), the graph-GRU hidden state, the loss and the position mapping.
Equations, deviations from the papers and the reasons: docs/models.md#tggn

Run ``.venv/bin/python -m pytest tests/models/test_tggn.py -q`` to check this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.base import DataShape, check_choices
from models.heads import RegressionHead
from models.ops import Dropout, f32, like, per_slot, setting_tensor
from models.tggn import PROPAGATIONS, TGGNConfig

__all__ = [
    "TGGN",
    "GatedTemporalConv",
    "GraphGRULayer",
    "GraphLearner",
    "GraphPropagation",
    "TCNLayer",
    "build",
    "propagate",
]


# --------------------------------------------------------------------------------------
# Graph: learned adjacency and propagation


class GraphLearner(nn.Module):
    """Row-stochastic, top-k sparse adjacency softmax(topk(relu(E1 E2^T))) over A nodes."""

    def __init__(self, n_nodes: int, node_dim: int, top_k: int) -> None:
        super().__init__()
        self.top_k = min(top_k, n_nodes)
        # |N(0, std^2)| entries: every logit starts positive, in relu's linear range. A row
        # whose logits are all <= 0 gets no gradient (relu) and a tie at 0 that topk breaks
        # by index, so it would stay a uniform average of the same low-index assets.
        std = node_dim**-0.25  # E1 E2^T entries have mean (2 / pi) sqrt(node_dim)
        self.source = nn.Parameter(torch.randn(n_nodes, node_dim).abs() * std)  # E1
        self.target = nn.Parameter(torch.randn(n_nodes, node_dim).abs() * std)  # E2

    def logits(self) -> torch.Tensor:
        """(A, A) f32 relu(E1 E2^T) before sparsification."""
        return F.relu(f32(self.source) @ f32(self.target).T)

    def forward(self) -> torch.Tensor:
        """(A, A) f32 adjacency: row i has top_k nonzeros (i's neighbours) summing to 1."""
        logits = self.logits()
        kept, index = logits.topk(self.top_k, dim=-1)  # (A, k)
        masked = torch.full_like(logits, float("-inf")).scatter(-1, index, kept)
        return torch.softmax(masked, dim=-1)


def propagate(adj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One hop: node v gathers sum_w adj[v, w] h[:, w]. adj (A, A), h (B, A, ...)."""
    return torch.einsum("vw,bw...->bv...", adj, h)


class GraphPropagation(nn.Module):
    """``hops`` steps of mix-hop or diffusion propagation + information selection.

    (B, A, ..., d_in) -> (B, A, ..., d_out): a linear map of [H_0, H_1, ..., H_K]. Mix-hop's
    beta is also a tensor (``beta_t``), so fused slots may differ in it.
    """

    keep_f32 = ("beta_t",)
    setting_buffers = ("beta_t",)

    def __init__(
        self, d_in: int, d_out: int, hops: int, mode: str, beta: float, dropout: float
    ) -> None:
        super().__init__()
        check_choices("propagation", mode, PROPAGATIONS)
        self.hops, self.mode, self.beta = hops, mode, beta
        self.beta_t: torch.Tensor
        self.register_buffer("beta_t", setting_tensor(beta), persistent=False)
        self.select = nn.Linear((hops + 1) * d_in, d_out)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        """x (B, A, ..., d_in), adj (A, A) in x's dtype -> (B, A, ..., d_out)."""
        outputs = [x]
        h = x
        beta = per_slot(self.beta, self.beta_t)
        for _ in range(self.hops):
            h = propagate(adj, h)
            if self.mode == "mixhop":
                h = beta * x + (1.0 - beta) * h
            outputs.append(h)
        return self.dropout(self.select(torch.cat(outputs, dim=-1)))


# --------------------------------------------------------------------------------------
# Temporal modules


class GatedTemporalConv(nn.Module):
    """Causal dilated convolution with a tanh filter and a sigmoid gate (WaveNet).

    Tap j of output bar t reads input bar t - j * dilation (zero before the window); the
    filter and gate weights sit in one linear map over the concatenated taps.
    """

    def __init__(self, channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.kernel_size, self.dilation = kernel_size, dilation
        self.proj = nn.Linear(kernel_size * channels, 2 * channels)  # [filter | gate]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, C) -> (B, A, L, C)."""
        length = x.shape[2]
        reach = (self.kernel_size - 1) * self.dilation
        padded = F.pad(x, (0, 0, reach, 0))  # (B, A, reach + L, C), zeros before bar 0
        taps = [
            padded[:, :, reach - j * self.dilation : reach - j * self.dilation + length]
            for j in range(self.kernel_size)
        ]
        filt, gate = self.proj(torch.cat(taps, dim=-1)).chunk(2, dim=-1)
        return torch.tanh(filt) * torch.sigmoid(gate)


class TCNLayer(nn.Module):
    """Graph WaveNet block: gated temporal conv -> graph propagation -> + residual -> norm."""

    def __init__(self, config: TGGNConfig, dilation: int) -> None:
        super().__init__()
        c = config.channels
        self.conv = GatedTemporalConv(c, config.kernel_size, dilation)
        self.graph = GraphPropagation(
            c, c, config.hops, config.propagation, config.beta, config.dropout
        )
        self.skip = nn.Linear(c, config.skip_channels)
        self.norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, A, L, C) -> next layer's input (B, A, L, C), skip (B, A, S) at the last bar."""
        gated = self.conv(x)  # (B, A, L, C)
        skip = self.skip(gated[:, :, -1])  # (B, A, S)
        return self.norm(x + self.graph(gated, adj)), skip


class GraphGRULayer(nn.Module):
    """GRU whose gate and candidate maps are graph propagations of [x_t, h_{t-1}]."""

    def __init__(self, config: TGGNConfig) -> None:
        super().__init__()
        c = config.channels
        args = (config.hops, config.propagation, config.beta, config.dropout)
        self.gates = GraphPropagation(2 * c, 2 * c, *args)  # [update z | reset r]
        self.candidate = GraphPropagation(2 * c, c, *args)
        self.skip = nn.Linear(c, config.skip_channels)
        self.norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, A, L, C) -> hidden states (B, A, L, C), skip (B, A, S) at the last bar."""
        b, a, _, c = x.shape
        h = f32(x.new_zeros(b, a, c))  # (B, A, C) f32 state, carried across bars
        outputs = []
        for xt in x.unbind(2):  # (B, A, C); unbind: one stack in backward
            z, r = torch.sigmoid(self.gates(torch.cat([xt, like(h, xt)], -1), adj)).chunk(2, -1)
            c_t = torch.tanh(self.candidate(torch.cat([xt, r * like(h, xt)], -1), adj))
            z32 = f32(z)
            h = z32 * h + (1.0 - z32) * f32(c_t)
            outputs.append(like(h, x))
        states = torch.stack(outputs, dim=2)  # (B, A, L, C)
        return self.norm(x + states), self.skip(states[:, :, -1])


# --------------------------------------------------------------------------------------
# The model


class TGGN(RegressionHead[TGGNConfig]):
    """Temporal graph network over the A assets of (B, A, L, F) windows."""

    def __init__(self, config: TGGNConfig, shape: DataShape) -> None:
        super().__init__()
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        c = config.channels
        self.graph = GraphLearner(shape.n_assets, config.node_dim, config.top_k)
        self.input = nn.Linear(shape.n_features, c)
        layers: list[nn.Module]
        if config.temporal == "tcn":
            layers = [TCNLayer(config, dilation=2**i) for i in range(config.n_layers)]
        else:
            layers = [GraphGRULayer(config) for _ in range(config.n_layers)]
        self.layers = nn.ModuleList(layers)
        self.skip_out = nn.Linear(c, config.skip_channels)
        self.head = nn.Sequential(
            nn.ReLU(),
            nn.Linear(config.skip_channels, config.end_channels),
            nn.ReLU(),
            nn.Linear(config.end_channels, 1),
        )

    def adjacency(self) -> torch.Tensor:
        """(A, A) f32 learned adjacency; ``adj[i, j] > 0``: asset i reads asset j."""
        return self.graph()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A) forecast of the next standardized return (x's dtype)."""
        _, a, _, f = x.shape
        if a != self.n_assets or f != self.n_features:
            raise ValueError(
                f"TGGN was built for A={self.n_assets} assets and F={self.n_features} "
                f"features, got x of shape {tuple(x.shape)}"
            )
        h = self.input(x)  # (B, A, L, C)
        adj = like(self.adjacency(), h)  # (A, A)
        skips = []
        for layer in self.layers:
            h, skip = layer(h, adj)  # (B, A, L, C), (B, A, S)
            skips.append(skip)
        skips.append(self.skip_out(h[:, :, -1]))
        return self.head(torch.stack(skips).sum(0)).squeeze(-1)  # (B, A)


def build(config: TGGNConfig, shape: DataShape) -> TGGN:
    return TGGN(config, shape)
