"""Tests of the Kolmogorov-Arnold Network family (models/kan.py, models/nets/kan.py).

Run: .venv/bin/python -m pytest tests/models/test_kan.py -q
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from models.base import Batch, DataShape, ForecastModel
from models.kan import FAMILY, KANConfig
from models.nets.kan import KAN, KANLayer, build, edge_regularization
from models.ops import f32
from trainables.precision import BF16, F32, get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
B, L = 16, 12  # windows shorter than SHAPE.lookback: the KAN reads only the last `window` bars


def _model(config: KANConfig | None = None, seed: int = 0) -> KAN:
    torch.manual_seed(seed)
    return build(config or KANConfig(), SHAPE).eval()


def _batch(seed: int = 1, n: int = B) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, SHAPE.n_assets, L, SHAPE.n_features, generator=g)
    y = torch.randn(n, SHAPE.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(n, L))


def _rel(new: torch.Tensor, old: torch.Tensor) -> float:
    return float((f32(new) - f32(old)).norm() / f32(old).norm())


def test_output_shapes_dtypes_and_positions() -> None:
    model = _model()
    assert isinstance(model, ForecastModel)
    batch = _batch()
    pred = model(batch.x)
    assert pred.shape == (B, SHAPE.n_assets) and pred.dtype == F32
    assert model.inputs(batch.x).shape == (B * SHAPE.n_assets, 4 * SHAPE.n_features)
    loss = model.loss(batch)
    assert loss.shape == () and loss.dtype == F32
    pos = model.positions(batch)
    assert pos.shape == (B, SHAPE.n_assets) and not pos.requires_grad
    torch.testing.assert_close(pos, torch.tanh(4.0 * pred.detach()))
    # Only the last `window` bars matter.
    x2 = batch.x.clone()
    x2[:, :, :-4] = 0.0
    with torch.no_grad():
        assert torch.equal(model(x2), model(batch.x))


def test_b_spline_bases_are_a_partition_of_unity_on_the_grid_interior() -> None:
    torch.manual_seed(0)
    layer = KANLayer(3, 2, grid_size=5, spline_order=3, grid_range=2.0)
    # Move the knots to uneven quantiles first: the property holds for any increasing grid.
    layer.update_grid(torch.randn(500, 3) ** 3)
    for grid in (KANLayer(3, 2, 5, 3, 2.0).grid, layer.grid):
        layer.grid.copy_(grid)
        lo, hi = grid[:, 3], grid[:, 8]  # knots k and G + k
        u = torch.linspace(0, 1, 2001)[:-1].unsqueeze(1)  # [0, 1)
        x = lo + u * (hi - lo)  # (2000, 3) points of [knot k, knot G+k)
        bases = layer.b_splines(x)
        assert bases.shape == (2000, 3, 8) and bases.dtype == F32
        assert float(bases.min()) >= 0.0
        torch.testing.assert_close(bases.sum(-1), torch.ones(2000, 3), atol=1e-6, rtol=0)
    outside = layer.b_splines(layer.grid[:, -1].unsqueeze(0) + 1.0)
    assert float(outside.abs().max()) == 0.0  # beyond the extended grid: no spline at all


def test_uniform_cubic_b_splines_at_a_knot_are_one_sixth_two_thirds_one_sixth() -> None:
    layer = KANLayer(1, 1, grid_size=5, spline_order=3, grid_range=2.0)
    torch.testing.assert_close(layer.grid[0], torch.linspace(-4.4, 4.4, 12))  # h = 0.8
    bases = layer.b_splines(torch.tensor([[-0.4], [0.0]]))[:, 0]  # a knot, and mid-interval
    expected_at_knot = torch.tensor([0, 0, 1 / 6, 2 / 3, 1 / 6, 0, 0, 0])
    expected_mid = torch.tensor([0, 0, 1 / 48, 23 / 48, 23 / 48, 1 / 48, 0, 0])
    torch.testing.assert_close(bases[0], expected_at_knot, atol=1e-6, rtol=0)
    torch.testing.assert_close(bases[1], expected_mid, atol=1e-6, rtol=0)


def test_edge_activations_sum_to_the_layer_output_and_match_the_formula() -> None:
    torch.manual_seed(0)
    layer = KANLayer(5, 3, grid_size=4, spline_order=2, grid_range=1.5)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(7, 5)
    phi = layer.edge_activations(x)  # (7, 3, 5)
    torch.testing.assert_close(phi.sum(-1) + layer.bias, layer(x), atol=1e-6, rtol=0)
    spline = torch.einsum("nic,oic->noi", layer.b_splines(x), layer.spline_weight)
    by_hand = layer.base_weight * F.silu(x).unsqueeze(1) + layer.spline_scale * spline
    torch.testing.assert_close(phi, by_hand, atol=1e-6, rtol=0)
    model = _model(KANConfig(n_layers=2))
    batch = _batch()
    pred, reg = model.forward_regularized(batch.x)
    torch.testing.assert_close(pred, model(batch.x), atol=1e-6, rtol=0)
    assert reg.dtype == F32 and float(reg.detach()) > 0


def test_regularization_is_l1_plus_entropy_of_mean_edge_magnitudes() -> None:
    # Two samples, edges (out=1, in=2) with |phi| means 3 and 1: L1 = 4, p = (3/4, 1/4).
    phi = torch.tensor([[[2.0, -1.0]], [[-4.0, 1.0]]])
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert abs(edge_regularization(phi, 0.0).item() - 4.0) < 1e-6
    assert abs(edge_regularization(phi, 2.0).item() - (4.0 + 2.0 * entropy)) < 1e-6
    # A dead edge adds nothing to either term (0 log 0 = 0).
    dead = torch.cat([phi, torch.zeros(2, 1, 2)], dim=1)
    assert abs(edge_regularization(dead, 2.0).item() - (4.0 + 2.0 * entropy)) < 1e-6
    model = _model(KANConfig(reg_lambda=1e-2, reg_entropy=0.5))
    batch = _batch()
    pred, reg = model.forward_regularized(batch.x)
    expected = F.huber_loss(pred, batch.y) + 1e-2 * reg
    torch.testing.assert_close(model.loss(batch), expected)
    plain = _model(KANConfig(reg_lambda=0.0))
    torch.testing.assert_close(plain.loss(batch), F.huber_loss(plain(batch.x), batch.y))


def test_grid_update_preserves_a_function_the_new_grid_can_represent() -> None:
    # Cubic polynomials lie in every cubic spline space: refit onto moved knots is exact
    # up to f32 least squares, everywhere in the sample's range, not only on the sample.
    torch.manual_seed(0)
    layer = KANLayer(3, 2, grid_size=5, spline_order=3, grid_range=2.0)
    poly = torch.randn(2, 3, 4)  # (out, in, power) coefficients of each edge's cubic

    def cubic(x: torch.Tensor) -> torch.Tensor:  # (N, in) -> (N, out, in)
        powers = torch.stack([x**p for p in range(4)], dim=-1)
        return torch.einsum("nip,oip->noi", powers, poly)

    with torch.no_grad():
        fit_x = torch.linspace(-2, 2, 401)[:-1].unsqueeze(1).expand(-1, 3)
        design = layer.b_splines(fit_x).transpose(0, 1)  # (in, N, C)
        target = cubic(fit_x).permute(2, 0, 1) / layer.spline_scale.T.unsqueeze(1)
        layer.spline_weight.copy_(torch.linalg.lstsq(design, target).solution.permute(2, 0, 1))
        sample = (torch.rand(500, 3) * 3 - 1.5) ** 3 / 2  # skewed, inside the old interior
        dense = torch.linspace(float(sample.min()), float(sample.max()), 300)
        dense = dense.unsqueeze(1).expand(-1, 3)
        base = F.silu(dense) @ layer.base_weight.T + layer.bias
        torch.testing.assert_close(layer(dense), base + cubic(dense).sum(-1), atol=1e-5, rtol=0)
        before_sample, before_dense, old_grid = layer(sample), layer(dense), layer.grid.clone()
        layer.update_grid(sample, grid_eps=0.02)
        assert float((layer.grid - old_grid).abs().max()) > 0.5  # the knots really moved
        assert _rel(layer(sample), before_sample) < 1e-4  # measured 8e-6
        assert _rel(layer(dense), before_dense) < 1e-4  # measured 9e-6
    # The new interior knots are the sample's quantiles, 2 % blended with a uniform grid.
    xs = sample.sort(dim=0).values
    q = xs[[round(i * 499 / 5) for i in range(1, 5)]]  # the inner 4 of the G + 1 quantiles
    lo, hi = layer.grid[:, 3], layer.grid[:, 8]
    uniform = lo + (hi - lo) * torch.arange(1, 5).unsqueeze(1) / 5
    torch.testing.assert_close(layer.grid[:, 4:8], (0.02 * uniform + 0.98 * q).T)


def test_grid_update_refits_the_coefficients_of_a_model() -> None:
    # A spline that is not in the new spline space (the paper's noisy init here) is
    # projected by least squares: the output moves by ~0.5 % on the sample, where keeping
    # the old coefficients on the new grid would move it by 10-17 % (measured, 3 seeds).
    for seed in range(3):
        model = _model(seed=seed)
        x = _batch(seed=seed, n=64).x
        naive = copy.deepcopy(model)
        with torch.no_grad():
            before = model(x)
            h = naive.inputs(x)
            for layer in naive.kan_layers:
                layer.grid.copy_(layer._grid_from_samples(h, 0.02))
                h = layer(h)
            model.update_grid(x)
            after, kept_coefficients = model(x), naive(x)
        assert _rel(after, before) < 1e-2, seed  # measured <= 0.0053
        assert _rel(after, before) < 0.1 * _rel(kept_coefficients, before), seed


def test_grid_update_survives_ties_and_constant_inputs() -> None:
    model = _model()
    x = _batch(n=32).x
    x[..., 0] = 0.0  # a constant feature: all quantiles tie
    x[..., 1] = x[..., 1].clamp(-0.5, 0.5)  # a clipped one: many ties at both ends
    model.update_grid(x)
    for layer in model.kan_layers:
        assert bool((layer.grid.diff(dim=-1) > 0).all())
    pred = model(x)
    assert bool(torch.isfinite(pred).all())


def test_on_epoch_start_updates_only_during_the_first_grid_update_epochs() -> None:
    model = _model(KANConfig(grid_update_epochs=2)).train()
    grids = [model.kan_layers[0].grid.clone()]
    for epoch in range(4):
        model.on_epoch_start(_batch(seed=10 + epoch, n=32))
        grids.append(model.kan_layers[0].grid.clone())
    assert not torch.equal(grids[1], grids[0]) and not torch.equal(grids[2], grids[1])
    assert torch.equal(grids[3], grids[2]) and torch.equal(grids[4], grids[2])
    assert int(model.grid_updates) == 2
    state = model.state_dict()  # the counter and the grids travel with checkpoints
    assert int(state["grid_updates"]) == 2 and torch.equal(state["layers.0.grid"], grids[-1])
    resumed = _model(KANConfig(grid_update_epochs=2), seed=5)
    resumed.load_state_dict(state)
    resumed.on_epoch_start(_batch(seed=20, n=32))  # a resumed trial does not update again
    assert torch.equal(resumed.kan_layers[0].grid, grids[-1])
    never = _model(KANConfig(grid_update_epochs=0))
    initial = never.kan_layers[0].grid.clone()
    never.on_epoch_start(_batch(n=32))
    assert torch.equal(never.kan_layers[0].grid, initial)


def test_grid_update_under_bf16_keeps_grids_f32_and_moves_the_function_little() -> None:
    # Grids stay f32, the function moves as much as in f32 plus one bf16 rounding of the
    # new coefficients.
    batch = _batch(n=64)
    policy = get_policy("bf16")
    model = policy.convert_module(_model())
    assert isinstance(model, KAN)
    x = policy.convert_input(batch.x)
    with torch.no_grad():
        before = model(x)
        model.update_grid(x)
        after = model(x)
    assert all(layer.grid.dtype == F32 for layer in model.kan_layers)
    assert all(layer.spline_weight.dtype == BF16 for layer in model.kan_layers)
    assert bool(torch.isfinite(after).all())
    assert _rel(after, before) < 2e-2  # measured <= 0.007 (5 seeds)


def test_grid_refit_turns_autocast_off_for_its_f32_solve() -> None:
    model = _model()
    batch = _batch()
    with get_policy("bf16-mixed").autocast():
        model.update_grid(batch.x)
    assert model.kan_layers[0].grid.dtype == F32
    assert model.kan_layers[0].spline_weight.dtype == F32


def test_search_space_corners_build_and_run() -> None:
    for values in (
        {"window": 1, "width": 2, "n_layers": 1, "grid_size": 3, "spline_order": 1},
        {"window": 8, "width": 32, "n_layers": 3, "grid_size": 20, "spline_order": 3},
    ):
        model = build(FAMILY.make_config(values), SHAPE)
        assert model.loss(_batch(n=4)).shape == ()
