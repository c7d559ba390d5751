"""Temporal graph network over assets: a learned graph, graph propagation, a temporal
module: the settings, search space and record (no torch: the spec and a sweep's driver
read them). Its network: :mod:`models.nets.tggn`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from models.family import (
    LOSS_KINDS,
    Choice,
    Family,
    Float,
    Int,
    LossKind,
    Network,
    SearchSpace,
    check_choices,
    check_head,
    check_int,
)

__all__ = [
    "FAMILY",
    "PROPAGATIONS",
    "SEARCH_SPACE",
    "TEMPORAL_MODULES",
    "TGGNConfig",
]

TEMPORAL_MODULES = ("tcn", "gru")
PROPAGATIONS = ("mixhop", "diffusion")


@dataclass(frozen=True)
class TGGNConfig:
    """Size and output mapping of one TGGN. Defaults: 9,089 parameters at F=8, L=32, A=4
    (``temporal="gru"``: 17,537); only the node embeddings (2 A node_dim) depend on A."""

    channels: int = 16
    """Residual channels C carried by every temporal layer and graph propagation."""

    skip_channels: int = 32
    """Channels of the skip connections summed over layers at the decision bar."""

    end_channels: int = 32
    """Hidden width of the output MLP (skip -> end -> forecast)."""

    node_dim: int = 8
    """Dimension of the two node embeddings E1, E2 the adjacency is learned from."""

    top_k: int = 8
    """Neighbours each asset keeps (nonzeros per adjacency row, self included); values
    above the number of assets A mean A (a dense graph, the default for up to 8 assets).
    A neighbour outside a row's top-k gets no gradient, so a sparse row can miss its
    leader: on a pure lead-lag target with A=4 (tests), top_k=3 stalls at MSE ~0.3 where
    the dense graph reaches ~0.005 and recovers the lead-lag ring. MTGNN keeps 20 of
    137-862 nodes."""

    temporal: Literal["tcn", "gru"] = "tcn"
    """``tcn``: gated dilated causal convolutions + graph propagation (Graph WaveNet,
    MTGNN); ``gru``: a graph GRU stepped over the window (DCRNN / AGCRN style)."""

    n_layers: int = 3
    """Temporal layers: TCN layer i has dilation 2^i (receptive field
    1 + (kernel_size - 1)(2^n_layers - 1) bars); or stacked graph-GRU layers."""

    kernel_size: int = 2
    """Taps of each dilated causal convolution (``tcn`` only; the papers use 2)."""

    propagation: Literal["mixhop", "diffusion"] = "mixhop"
    """Graph propagation: MTGNN mix-hop (keeps beta of the input at every hop) or Graph
    WaveNet diffusion (powers of the adjacency)."""

    hops: int = 2
    """Hops K of each graph propagation."""

    beta: float = 0.05
    """Mix-hop retain ratio: share of the layer input kept at every hop (MTGNN's alpha)."""

    dropout: float = 0.1
    """Dropout on the output of every graph propagation."""

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
        for name in ("channels", "skip_channels", "end_channels", "node_dim", "top_k"):
            check_int(name, getattr(self, name))
        check_choices("temporal", self.temporal, TEMPORAL_MODULES)
        check_choices("propagation", self.propagation, PROPAGATIONS)
        check_int("n_layers", self.n_layers)
        check_int("kernel_size", self.kernel_size, low=2)
        check_int("hops", self.hops)
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {self.beta}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        check_head(self)


# Ranges from the papers' settings and ablations: Graph WaveNet (32 residual / 256 skip /
# 512 end channels, node embedding 10, 8 layers of kernel 2, diffusion K=2, dropout 0.3),
# MTGNN (32 residual / 64 skip / 128 end channels, node dim 40, subgraph k 20, propagation depth 2,
# retain ratio 0.05, 3-5 layers, dropout 0.3), scaled down to the handful of assets a
# trading universe has here. lr, batch size and weight decay belong to the trainer's space.
SEARCH_SPACE: SearchSpace = {
    "channels": Choice((8, 16, 32, 64)),
    "skip_channels": Choice((16, 32, 64, 128, 256)),
    "end_channels": Choice((16, 32, 64, 128, 256)),
    "node_dim": Int(4, 40, log=True),
    "top_k": Int(1, 20),
    "temporal": Choice(TEMPORAL_MODULES),
    "n_layers": Int(1, 5),
    "kernel_size": Choice((2, 3)),
    "propagation": Choice(PROPAGATIONS),
    "hops": Int(1, 3),
    "beta": Float(0.0, 0.5),
    "dropout": Float(0.0, 0.3),
    "loss": Choice(LOSS_KINDS),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="tggn",
    confidence="the point forecast relative to its validation RMSE: erf(|f| / (sqrt(2) RMSE_val))",
    kind="forecast",
    config_cls=TGGNConfig,
    build=Network("models.nets.tggn:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Wu, Pan, Long, Jiang & Zhang (2019), Graph WaveNet for Deep Spatial-Temporal Graph "
        "Modeling, IJCAI; Wu, Pan, Long, Jiang, Chang & Zhang (2020), Connecting the Dots: "
        "Multivariate Time Series Forecasting with Graph Neural Networks (MTGNN), KDD"
    ),
    tiny={"channels": 8, "skip_channels": 16, "end_channels": 16, "node_dim": 4, "n_layers": 1},
    # The position scale is read by positions only; the dropout rate and mix-hop's beta
    # per slot.
    per_trial_settings=frozenset({"position_scale", "dropout", "beta"}),
    shape_settings=frozenset(
        {
            "channels",
            "skip_channels",
            "end_channels",
            "node_dim",
            "top_k",
            "temporal",
            "n_layers",
            "kernel_size",
            "propagation",
            "hops",
            "loss",
        }
    ),
    keeps_f32=(
        "the learned adjacency (logits, top-k selection and row softmax: bf16 near-ties "
        "would flip the top-k), the graph-GRU hidden state (carried across bars like a scan "
        "accumulator), the loss and the position mapping"
    ),
    summary=(
        "learned top-k asset graph, gated dilated TCN or graph GRU with mix-hop / diffusion "
        "propagation, skip connections -> next-bar forecast per asset; position = "
        "tanh(scale * forecast)"
    ),
)
