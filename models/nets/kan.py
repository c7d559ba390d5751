"""Kolmogorov-Arnold Network over the last bars of each window.

Liu, Wang, Vaidya, Ruehle, Halverson, Soljačić, Hou & Tegmark (2024), "KAN:
Kolmogorov-Arnold Networks", arXiv:2404.19756 (ICLR 2025).

A KAN layer puts a learnable univariate function on every edge and sums at the nodes,
``y_j = sum_i phi_ji(x_i) + bias_j``, with the paper's residual activation
``phi_ji(x) = w_b[j, i] * silu(x) + w_s[j, i] * sum_c c[j, i, c] B_c(x)`` (``B_c``: the
B-splines of order ``k`` on a per-input grid of ``G`` intervals; pykan's initialisation).
:meth:`KAN.on_epoch_start` runs the paper's grid update (:meth:`KANLayer.update_grid`) in
the first ``grid_update_epochs`` epochs; the counter is a buffer, so a resumed trial does
not repeat updates. ``reg_lambda > 0`` adds the paper's L1 + entropy sparsification.

Input: the last ``window`` bars of each asset's window, flattened (``window * F`` inputs;
assets folded into the batch). Output: the next standardized return. Loss and position
come from the shared regression head (:mod:`models.heads`): Huber (default) or MSE in f32,
plus the regularization; ``tanh(position_scale * forecast)``.

Stays f32 under ``bf16``: the knot grid (``grid`` in ``keep_f32``), the B-spline bases
(cast to the input's dtype for the matmul), the grid update (quantiles, least-squares
refit; coefficients rounded once at the end), the regularization, the loss and the
position mapping. Grid update, regularization and the reasons: docs/models.md#kan

Run ``.venv/bin/python -m pytest tests/models/test_kan.py -q`` to check this file.
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from models.base import Batch, DataShape, fold_assets, unfold_assets
from models.heads import RegressionHead
from models.kan import KANConfig
from models.ops import f32, like, per_slot, setting_tensor

__all__ = [
    "GRID_MARGIN",
    "KAN",
    "MIN_KNOT_GAP",
    "REFIT_RIDGE",
    "SPLINE_INIT_NOISE",
    "KANLayer",
    "build",
    "edge_regularization",
    "uniform_grid",
]


# Initial spline coefficients: uniform noise of this total width (pykan's noise at its
# defaults, noise_scale / G = 0.5 / 5; the spline starts near 0, as in the paper).
SPLINE_INIT_NOISE = 0.1
# The refit grid reaches this share of the sample's range (plus the same absolute amount)
# beyond the smallest and largest sample, so every sample is strictly inside the grid.
GRID_MARGIN = 0.01
# Adjacent knots are kept at least this share of a uniform interval apart: ties in the
# sample (clipped or constant features) would otherwise collapse intervals.
MIN_KNOT_GAP = 0.01
# Ridge per sample in the coefficient refit: keeps the least-squares system full rank
# (CUDA's lstsq driver needs it) when a basis function sees few samples; its bias on the
# refit is ~1e-5 of the coefficients at the edges of the sample.
REFIT_RIDGE = 1e-8


def uniform_grid(
    n_in: int, grid_size: int, spline_order: int, lo: float, hi: float
) -> torch.Tensor:
    """(n_in, G + 2k + 1) f32 knots: G uniform intervals on [lo, hi], k more each side."""
    h = (hi - lo) / grid_size
    knots = torch.arange(-spline_order, grid_size + spline_order + 1) * h + lo
    return f32(knots).expand(n_in, -1).contiguous()


class KANLayer(nn.Module):
    """n_in -> n_out KAN layer: a base + B-spline function on every edge, summed at nodes."""

    # The knots stay f32 under every policy (see the module docstring).
    keep_f32 = ("grid",)
    grid: torch.Tensor  # (n_in, G + 2k + 1) f32

    def __init__(
        self, n_in: int, n_out: int, grid_size: int, spline_order: int, grid_range: float
    ) -> None:
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.grid_size, self.spline_order = grid_size, spline_order
        n_coef = grid_size + spline_order
        self.register_buffer(
            "grid", uniform_grid(n_in, grid_size, spline_order, -grid_range, grid_range)
        )
        bound = 1.0 / math.sqrt(n_in)
        self.base_weight = nn.Parameter(torch.empty(n_out, n_in).uniform_(-bound, bound))
        self.spline_weight = nn.Parameter(
            (torch.rand(n_out, n_in, n_coef) - 0.5) * SPLINE_INIT_NOISE
        )
        self.spline_scale = nn.Parameter(torch.full((n_out, n_in), bound))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def b_splines(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, n_in) -> (N, n_in, G + k) f32 B-spline bases (Cox-de Boor recursion).

        On [knot k, knot G+k) of each input the bases are >= 0 and sum to 1; outside the
        extended grid they are 0 (only the base branch speaks there).
        """
        x = f32(x).unsqueeze(-1)  # (N, n_in, 1)
        t = self.grid  # (n_in, K), K = G + 2k + 1 strictly increasing knots
        bases = f32((x >= t[:, :-1]) & (x < t[:, 1:]))  # (N, n_in, K - 1): order 0
        for p in range(1, self.spline_order + 1):
            left = (x - t[:, : -(p + 1)]) / (t[:, p:-1] - t[:, : -(p + 1)])
            right = (t[:, p + 1 :] - x) / (t[:, p + 1 :] - t[:, 1:-p])
            bases = left * bases[..., :-1] + right * bases[..., 1:]  # (N, n_in, K - 1 - p)
        return bases

    def scaled_spline_weight(self) -> torch.Tensor:
        """(n_out, n_in, G + k) coefficients times the spline scale w_s."""
        return self.spline_weight * self.spline_scale.unsqueeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, n_in) -> (N, n_out): the node sums, as two matmuls."""
        bases = like(self.b_splines(x), x).flatten(1)  # (N, n_in * (G + k))
        spline = F.linear(bases, self.scaled_spline_weight().flatten(1))
        return F.linear(F.silu(x), self.base_weight) + spline + self.bias

    def edge_activations(self, x: torch.Tensor) -> torch.Tensor:
        """x (N, n_in) -> (N, n_out, n_in): phi_ji(x_i) for every edge (no node bias)."""
        bases = like(self.b_splines(x), x)  # (N, n_in, G + k)
        spline = torch.einsum("nic,oic->noi", bases, self.spline_weight) * self.spline_scale
        return F.silu(x).unsqueeze(1) * self.base_weight + spline

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor, grid_eps: float = 0.02) -> None:
        """Refit the knots to the quantiles of ``x`` (N, n_in) and re-solve the spline
        coefficients so that every edge's spline keeps its values on ``x``."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            x32 = f32(x)
            # Unscaled spline of every edge on the sample, by input: (n_in, N, n_out).
            old = torch.einsum("nic,oic->ino", self.b_splines(x32), f32(self.spline_weight))
            self.grid.copy_(self._grid_from_samples(x32, grid_eps))
            coef = self._least_squares(self.b_splines(x32).transpose(0, 1), old)  # (n_in, C, n_out)
            self.spline_weight.copy_(like(coef.permute(2, 0, 1), self.spline_weight))

    def _grid_from_samples(self, x: torch.Tensor, grid_eps: float) -> torch.Tensor:
        """x (N, n_in) f32 -> (n_in, G + 2k + 1) knots: quantiles blended with uniform."""
        g, k = self.grid_size, self.spline_order
        xs = x.sort(dim=0).values  # (N, n_in)
        n = xs.shape[0]
        quantiles = xs[[round(i * (n - 1) / g) for i in range(g + 1)]]  # (G + 1, n_in)
        margin = GRID_MARGIN * (xs[-1] - xs[0]) + GRID_MARGIN  # (n_in,)
        lo, hi = xs[0] - margin, xs[-1] + margin
        h = (hi - lo) / g  # (n_in,) uniform interval
        steps = torch.arange(g + 1, device=x.device).unsqueeze(1)  # (G + 1, 1)
        uniform = lo + h * steps
        interior = grid_eps * uniform + (1.0 - grid_eps) * quantiles
        interior[0], interior[-1] = lo, hi  # every sample strictly inside
        widths = torch.maximum(interior.diff(dim=0), MIN_KNOT_GAP * h)  # (G, n_in)
        interior = torch.cat([interior[:1], interior[:1] + widths.cumsum(dim=0)])
        ext = torch.arange(1, k + 1, device=x.device).unsqueeze(1) * h  # (k, n_in)
        knots = torch.cat([interior[:1] - ext.flip(0), interior, interior[-1:] + ext])
        return knots.T.contiguous()

    @staticmethod
    def _least_squares(design: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """design (n_in, N, C), target (n_in, N, n_out) -> (n_in, C, n_out), ridge-augmented."""
        n_in, n, c = design.shape
        ridge = math.sqrt(REFIT_RIDGE * n) * torch.eye(c, device=design.device)
        design = torch.cat([design, ridge.expand(n_in, c, c)], dim=1)
        target = torch.cat([target, target.new_zeros(n_in, c, target.shape[-1])], dim=1)
        # Solved in float64 and rounded back: LAPACK's f32 result can differ in the last
        # bits between runs (blocking depends on memory alignment), which would make a
        # resumed trial drift from an uninterrupted one; f64 differences round away.
        solution = torch.linalg.lstsq(design.double(), target.double()).solution
        return solution.to(design.dtype)


def edge_regularization(phi: torch.Tensor, entropy_weight: float | torch.Tensor) -> torch.Tensor:
    """The paper's regularization of one layer: |Phi|_1 + entropy_weight * S(Phi), f32.

    phi (N, n_out, n_in) edge activations over a batch; |phi|_1 = mean_s |phi(x_s)|.
    """
    l1 = f32(phi).abs().mean(dim=0)  # (n_out, n_in)
    total = l1.sum()
    p = l1 / (total + 1e-12)
    entropy = -torch.special.xlogy(p, p).sum()
    return total + entropy_weight * entropy


class KAN(RegressionHead[KANConfig]):
    """KAN over the last ``window`` bars of (B, A, L, F) windows; assets folded. The
    regularization weights are also tensors, so fused slots may differ in them."""

    grid_updates: torch.Tensor  # () int64: grid updates done (saved with checkpoints)
    reg_lambda: torch.Tensor  # () f32: config.reg_lambda, read per fused slot
    reg_entropy: torch.Tensor  # () f32: config.reg_entropy, likewise
    keep_f32 = ("reg_lambda", "reg_entropy")
    setting_buffers = ("reg_lambda", "reg_entropy")

    def __init__(self, config: KANConfig, shape: DataShape) -> None:
        super().__init__()
        if config.window > shape.lookback:
            raise ValueError(
                f"window must be <= the lookback L={shape.lookback}, got {config.window}"
            )
        self.config = config
        self.n_assets = shape.n_assets
        self.n_features = shape.n_features
        widths = [config.window * shape.n_features, *[config.width] * config.n_layers, 1]
        self.layers = nn.ModuleList(
            KANLayer(n_in, n_out, config.grid_size, config.spline_order, config.grid_range)
            for n_in, n_out in itertools.pairwise(widths)
        )
        self.register_buffer("grid_updates", torch.tensor(0))
        for name in self.setting_buffers:
            self.register_buffer(name, setting_tensor(getattr(config, name)), persistent=False)

    @property
    def kan_layers(self) -> list[KANLayer]:
        return [cast(KANLayer, layer) for layer in self.layers]

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B*A, window*F): each asset's last bars, flattened."""
        _, a, length, f = x.shape
        if a != self.n_assets or f != self.n_features or length < self.config.window:
            raise ValueError(
                f"KAN was built for A={self.n_assets} assets, F={self.n_features} features "
                f"and windows of >= {self.config.window} bars, got x of shape {tuple(x.shape)}"
            )
        return fold_assets(x)[:, -self.config.window :].flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, A, L, F) -> (B, A) forecast of the next standardized return."""
        h = self.inputs(x)
        for layer in self.layers:
            h = layer(h)
        return unfold_assets(h.squeeze(-1), self.n_assets)

    def forward_regularized(
        self, x: torch.Tensor, entropy_weight: float | torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, A, L, F) -> forecast (B, A) and the f32 sum of the layers' regularization,
        evaluating every edge (the same forecast as :meth:`forward`). The entropy weight
        is ``reg_entropy`` unless given."""
        if entropy_weight is None:
            entropy_weight = self.config.reg_entropy
        h = self.inputs(x)
        reg = f32(torch.zeros((), device=x.device))
        for layer in self.kan_layers:
            phi = layer.edge_activations(h)  # (N, n_out, n_in)
            reg = reg + edge_regularization(phi, entropy_weight)
            h = phi.sum(dim=-1) + layer.bias
        return unfold_assets(h.squeeze(-1), self.n_assets), reg

    def loss(self, batch: Batch) -> torch.Tensor:
        """f32 Huber/MSE loss of the forecast + reg_lambda * the paper's regularization
        (each fused slot with its own weights where the slots' differ)."""
        weight = per_slot(self.config.reg_lambda, self.reg_lambda)
        if not isinstance(weight, torch.Tensor) and weight == 0:
            return super().loss(batch)
        entropy_weight = per_slot(self.config.reg_entropy, self.reg_entropy)
        pred, reg = self.forward_regularized(batch.x, entropy_weight)
        return self.fit_loss(pred, batch.y) + weight * reg

    @torch.no_grad()
    def update_grid(self, x: torch.Tensor) -> bool:
        """Refit every layer's grid to the activations ``x`` (B, A, L, F) produces there.

        Returns False, changing nothing, when any layer's activations are not finite (a
        diverging trial): knots cannot be fitted to inf, and the trainer's step guard is
        what handles divergence. The check is one host read per epoch.
        """
        h = self.inputs(x)
        inputs = []
        for layer in self.kan_layers:
            inputs.append(h)
            h = layer(h)
        if not all(bool(torch.isfinite(a).all()) for a in (*inputs, h)):
            return False
        h = self.inputs(x)
        for layer in self.kan_layers:
            layer.update_grid(h, self.config.grid_eps)
            h = layer(h)
        return True

    @torch.no_grad()
    def on_epoch_start(self, batch: Batch) -> None:
        """Trainer hook: refit the grids to ``batch`` during the first grid_update_epochs."""
        if int(self.grid_updates) < self.config.grid_update_epochs and self.update_grid(batch.x):
            self.grid_updates += 1


def build(config: KANConfig, shape: DataShape) -> KAN:
    return KAN(config, shape)
