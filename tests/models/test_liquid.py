"""Tests of the closed-form continuous-time (CfC) family (models/liquid.py, models/nets/liquid.py).

Run: .venv/bin/python -m pytest tests/models/test_liquid.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from models.base import Batch, DataShape, ForecastModel
from models.liquid import FAMILY, MODES, CfCMode, LiquidConfig
from models.nets.liquid import CfCCell, LiquidNet, build
from models.ops import f32
from trainables.precision import BF16, F32, get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
# Shorter windows than SHAPE.lookback keep CPU bf16 fast; no parameter depends on L.
B, L = 4, 12
TINY = {"hidden": 8, "backbone_units": 16}


def _model(config: LiquidConfig | None = None, seed: int = 0) -> LiquidNet:
    torch.manual_seed(seed)
    return build(config or LiquidConfig(), SHAPE).eval()


def _batch(seed: int = 1, gaps: torch.Tensor | None = None) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, SHAPE.n_assets, L, SHAPE.n_features, generator=g)
    y = torch.randn(B, SHAPE.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(B, L) if gaps is None else gaps)


def _cell(mode: CfCMode = "gated", hidden: int = 6) -> CfCCell:
    torch.manual_seed(0)
    return CfCCell(5, hidden, units=7, layers=2, activation="lecun_tanh", dropout=0.0, mode=mode)


def _set_time_heads(cell: CfCCell, f: torch.Tensor, b: torch.Tensor) -> None:
    """Make the time constant f and the gate bias b constants (zero weights, given biases)."""
    h = cell.hidden
    with torch.no_grad():
        cell.heads.weight[2 * h :] = 0.0
        cell.heads.bias[2 * h : 3 * h] = f
        cell.heads.bias[3 * h :] = b


def test_output_shapes_dtypes_and_positions() -> None:
    model = _model()
    assert isinstance(model, ForecastModel)
    batch = _batch()
    pred = model(batch.x, batch.gaps)
    assert pred.shape == (B, SHAPE.n_assets) and pred.dtype == F32
    assert model.final_state(batch.x, batch.gaps).shape == (B * SHAPE.n_assets, 32)
    loss = model.loss(batch)
    assert loss.shape == () and loss.dtype == F32
    pos = model.positions(batch)
    assert pos.shape == (B, SHAPE.n_assets) and pos.dtype == F32
    assert not pos.requires_grad
    torch.testing.assert_close(pos, torch.tanh(4.0 * pred.detach()))
    # Any window length runs through the same module.
    x = torch.randn(2, SHAPE.n_assets, SHAPE.lookback, SHAPE.n_features)
    assert model(x, torch.ones(2, SHAPE.lookback)).shape == (2, SHAPE.n_assets)


def test_gated_cell_without_gate_bias_is_the_midpoint_at_t0_and_a_branch_at_large_t() -> None:
    # The paper's eq. (10) has no gate bias: sigma(-f*0) = 1/2 for every unit.
    cell = _cell()
    f = torch.tensor([2.0, -2.0, 0.5, -0.5, 3.0, -3.0])
    _set_time_heads(cell, f, torch.zeros(6))
    torch.manual_seed(3)
    projected, h = torch.randn(3, 7), torch.randn(3, 6)
    with torch.no_grad():
        g, h_alt, _, _ = cell.branches(projected, h)
        at_zero = cell(projected, h, torch.zeros(3, 1))
        at_large = cell(projected, h, torch.full((3, 1), 100.0))
    torch.testing.assert_close(at_zero, (g + h_alt) / 2, atol=1e-7, rtol=0)
    # f > 0: the gate on g closes, the state relaxes to h_alt; f < 0: it opens fully onto g.
    expected = torch.where(f > 0, h_alt, g)
    torch.testing.assert_close(at_large, expected, atol=1e-6, rtol=0)


def test_gated_cell_by_hand_from_gate_closed_branch_to_the_other() -> None:
    # f = 1, b = -20: at t -> 0 the weight on g is sigma(20) = 1 - 2e-9 (the gate-closed
    # branch), at t = 20 both weigh 1/2, at t = 60 the state is h_alt up to sigma(-40).
    cell = _cell()
    _set_time_heads(cell, torch.ones(6), torch.full((6,), -20.0))
    torch.manual_seed(4)
    projected, h = torch.randn(3, 7), torch.randn(3, 6)
    with torch.no_grad():
        g, h_alt, f, b = cell.branches(projected, h)
        out = {t: cell(projected, h, torch.full((3, 1), t)) for t in (1e-6, 20.0, 60.0, 23.0)}
    assert torch.equal(f, torch.ones(3, 6)) and torch.equal(b, torch.full((3, 6), -20.0))
    torch.testing.assert_close(out[1e-6], g, atol=1e-7, rtol=0)
    torch.testing.assert_close(out[20.0], (g + h_alt) / 2, atol=1e-7, rtol=0)
    torch.testing.assert_close(out[60.0], h_alt, atol=1e-7, rtol=0)
    w = 1.0 / (1.0 + math.exp(-3.0))  # weight of h_alt at t = 23: sigma(23 - 20)
    torch.testing.assert_close(out[23.0], (1 - w) * g + w * h_alt, atol=1e-6, rtol=0)


def test_no_gate_cell_adds_the_time_weighted_branch() -> None:
    cell = _cell(mode="no_gate")
    _set_time_heads(cell, torch.ones(6), torch.full((6,), -20.0))
    torch.manual_seed(5)
    projected, h = torch.randn(3, 7), torch.randn(3, 6)
    with torch.no_grad():
        g, h_alt, _, _ = cell.branches(projected, h)
        early = cell(projected, h, torch.zeros(3, 1))
        late = cell(projected, h, torch.full((3, 1), 60.0))
    torch.testing.assert_close(early, g, atol=1e-7, rtol=0)  # sigma(-20) h_alt ~ 2e-9
    torch.testing.assert_close(late, g + h_alt, atol=1e-6, rtol=0)


def test_gaps_change_the_output() -> None:
    model = _model()
    regular = _batch()
    weekend = regular.gaps.clone()
    weekend[:, -1] = 3.0  # only the decision bar arrives later
    stretched = _batch(gaps=2.0 * regular.gaps)
    with torch.no_grad():
        base = model(regular.x, regular.gaps)
        late = model(regular.x, weekend)
        slow = model(stretched.x, stretched.gaps)
        again = model(regular.x, regular.gaps.clone())
    assert torch.equal(base, again)
    assert float((late - base).abs().min()) > 0  # every window and asset moved
    assert float((late - base).abs().max()) > 1e-3
    assert float((slow - base).abs().max()) > 1e-2
    # Each window is timed by its own gaps: changing window 0's gaps leaves the others.
    one = regular.gaps.clone()
    one[0] = 5.0
    with torch.no_grad():
        moved = model(regular.x, one)
    assert torch.equal(moved[1:], base[1:]) and float((moved[0] - base[0]).abs().min()) > 0


def test_interpolation_is_f32_from_bf16_branches() -> None:
    cell = get_policy("bf16").convert_module(_cell())
    assert isinstance(cell, CfCCell)
    torch.manual_seed(6)
    projected = torch.randn(4, 7).to(BF16)
    h = torch.randn(4, 6)  # the carried state is f32
    t = torch.tensor([[0.5], [1.0], [3.0], [250.0]])  # f32 gaps, one across a data hole
    with torch.no_grad():
        out = cell(projected, h, t)
        g, h_alt, f, b = (f32(v) for v in cell.branches(projected, h))
    assert out.dtype == F32
    arg = f * t + b
    expected = torch.sigmoid(-arg) * g + torch.sigmoid(arg) * h_alt
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_builds_and_runs(mode: CfCMode) -> None:
    model = build(FAMILY.make_config({"mode": mode, **TINY}), SHAPE)
    batch = _batch()
    assert model(batch.x, batch.gaps).shape == (B, SHAPE.n_assets)
