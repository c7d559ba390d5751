"""Kolmogorov-Arnold Network over the last bars of each window: the settings, search space
and record (no torch: the spec and a sweep's driver read them). Its network:
:mod:`models.nets.kan`."""

from __future__ import annotations

from dataclasses import dataclass

from models.family import Family, Float, Int, LossKind, Network, SearchSpace, check_head, check_int

__all__ = [
    "FAMILY",
    "SEARCH_SPACE",
    "KANConfig",
]


@dataclass(frozen=True)
class KANConfig:
    """Shape, grid and regularization of one KAN. Defaults: 2,649 parameters at F=8
    (no parameter depends on L or A)."""

    window: int = 4
    """Last bars of the window fed to the network, flattened: window * F inputs
    (at most the trainer's lookback)."""

    width: int = 8
    """Nodes in each hidden KAN layer."""

    n_layers: int = 1
    """Hidden KAN layers: the shape is [window * F, width x n_layers, 1] (0: one layer)."""

    grid_size: int = 5
    """Grid intervals G per input dimension (G + spline_order coefficients per edge)."""

    spline_order: int = 3
    """B-spline order k (3: cubic, the paper's choice)."""

    grid_range: float = 2.0
    """The initial grid is uniform on [-grid_range, grid_range] (inputs are z-scores);
    grid updates then fit it to the data."""

    grid_eps: float = 0.02
    """Grid update: knots = grid_eps * uniform + (1 - grid_eps) * sample quantiles
    (pykan's default; 1 keeps the grid uniform over the sample's range)."""

    grid_update_epochs: int = 3
    """Epochs at whose start ``on_epoch_start`` refits the grids (0: never)."""

    reg_lambda: float = 1e-4
    """Weight lambda of the paper's regularization in the loss (0: none)."""

    reg_entropy: float = 1.0
    """mu_2 / mu_1: weight of the edge entropy relative to the L1 term (the paper's 1)."""

    position_scale: float = 4.0
    """Position = tanh(position_scale * forecast), the forecast in standardized-return
    units (a forecast of 0.25 sigma trades at tanh(1) = 0.76 by default)."""

    loss: LossKind = "huber"
    """Training loss on the standardized next-bar return: ``huber`` (robust to the fat
    tails of returns) or ``mse``."""

    huber_delta: float = 1.0
    """Huber loss threshold in standardized-return units: squared error within it, linear
    beyond, so fat-tailed bars in the volatile regime do not dominate the gradient."""

    def __post_init__(self) -> None:
        for name in ("window", "width", "grid_size", "spline_order"):
            check_int(name, getattr(self, name))
        for name in ("n_layers", "grid_update_epochs"):
            check_int(name, getattr(self, name), low=0)
        if not self.grid_range > 0:
            raise ValueError(f"grid_range must be > 0, got {self.grid_range}")
        if not 0.0 <= self.grid_eps <= 1.0:
            raise ValueError(f"grid_eps must be in [0, 1], got {self.grid_eps}")
        for name in ("reg_lambda", "reg_entropy"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        check_head(self)


# Ranges from the paper and pykan: cubic splines (k = 3; 1-3 tried), grids of 3-20
# intervals before extension, narrow shallow networks ([n, 2n+1, 1] and smaller), grid
# updates during the first few dozen steps (pykan stops at step 50), lambda 1e-4 to 1e-2
# with mu_2 / mu_1 of 1-2 (pykan's default 2). The window is this adapter's own choice
# (inputs = window * F). lr, batch size and weight decay belong to the trainer's space.
SEARCH_SPACE: SearchSpace = {
    "window": Int(1, 8),
    "width": Int(2, 32, log=True),
    "n_layers": Int(1, 3),
    "grid_size": Int(3, 20),
    "spline_order": Int(1, 3),
    "grid_eps": Float(0.0, 1.0),
    "grid_update_epochs": Int(0, 5),
    "reg_lambda": Float(1e-5, 1e-2, log=True),
    "reg_entropy": Float(0.0, 2.0),
    "position_scale": Float(0.5, 32.0, log=True),
}


FAMILY = Family(
    name="kan",
    confidence="the point forecast relative to its validation RMSE: erf(|f| / (sqrt(2) RMSE_val))",
    kind="forecast",
    config_cls=KANConfig,
    build=Network("models.nets.kan:build"),
    search_space=SEARCH_SPACE,
    paper=(
        "Liu, Wang, Vaidya, Ruehle, Halverson, Soljacic, Hou & Tegmark (2024), KAN: "
        "Kolmogorov-Arnold Networks, arXiv:2404.19756"
    ),
    # Read by positions or by each trial's own grid refit only; the regularization
    # weights per slot.
    per_trial_settings=frozenset(
        {"position_scale", "grid_eps", "grid_update_epochs", "reg_lambda", "reg_entropy"}
    ),
    shape_settings=frozenset({"window", "width", "n_layers", "grid_size", "spline_order", "loss"}),
    keeps_f32=(
        "the spline knot grids (refit quantiles can be closer than a bf16 ulp), the "
        "Cox-de Boor bases, the grid update and its least-squares refit, the L1 + entropy "
        "regularization, the loss and the position mapping"
    ),
    summary=(
        "last `window` bars flattened -> KAN layers (SiLU base + B-spline per edge, grids "
        "refit to quantiles in the first epochs) -> next-bar forecast; position = "
        "tanh(scale * forecast)"
    ),
)
