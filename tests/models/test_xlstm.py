"""Tests of the xLSTM family (models/xlstm.py, models/nets/xlstm.py).

Run: .venv/bin/python -m pytest tests/models/test_xlstm.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models.base import Batch, DataShape, ForecastModel
from models.nets.xlstm import (
    XLSTM,
    MLSTMBlock,
    SLSTMBlock,
    build,
    mlstm_parallel,
    mlstm_recurrent,
    slstm_scan,
)
from models.xlstm import XLSTMConfig
from trainables.precision import get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
B, L = 4, 16  # xLSTM has no parameter tied to L; short windows keep CPU bf16 fast


def _model(config: XLSTMConfig | None = None, seed: int = 0) -> XLSTM:
    torch.manual_seed(seed)
    return build(config or XLSTMConfig(), SHAPE).eval()


def _converted(policy_name: str, config: XLSTMConfig | None = None) -> XLSTM:
    model = get_policy(policy_name).convert_module(_model(config))
    assert isinstance(model, XLSTM)
    return model


def _batch(seed: int = 1, length: int = L) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, SHAPE.n_assets, length, SHAPE.n_features, generator=g)
    y = torch.randn(B, SHAPE.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(B, length))


Cell = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _cell_inputs(seed: int, i_scale: float, f_mean: float, length: int = 32) -> Cell:
    """q, k, v (N, H, L, D) and gate pre-activations i~, f~ (N, H, L)."""
    g = torch.Generator().manual_seed(seed)
    n, h, d = 3, 2, 8
    q, k, v = (torch.randn(n, h, length, d, generator=g) for _ in range(3))
    i_pre = i_scale * torch.randn(n, h, length, generator=g)
    f_pre = f_mean + torch.randn(n, h, length, generator=g)
    return q, k, v, i_pre, f_pre


def _double(inputs: Cell) -> Cell:
    q, k, v, i_pre, f_pre = (t.double() for t in inputs)
    return q, k, v, i_pre, f_pre


def _mlstm_unstabilized(inputs: Cell, eps: float = 1e-6) -> torch.Tensor:
    """The paper's parallel form without the stabilizer; f64 only."""
    q, k, v, i_pre, f_pre = inputs
    log_f = F.logsigmoid(f_pre)
    length = q.shape[2]
    cum = torch.cumsum(log_f, dim=-1)
    d = torch.exp(cum[..., :, None] - cum[..., None, :] + i_pre[..., None, :])
    d = d * torch.ones(length, length, dtype=torch.bool).tril()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) * d
    normalizer = torch.clamp(scores.sum(-1, keepdim=True).abs(), min=1.0)
    return scores @ v / (normalizer + eps)


# --------------------------------------------------------------------------------------
# mLSTM cell


@pytest.mark.parametrize(
    ("i_scale", "f_mean"),
    [(0.1, 4.0), (1.0, 3.0), (2.0, 1.0)],
    ids=["init-like", "typical", "sharp-gates"],
)
def test_mlstm_parallel_form_equals_recurrent_form(i_scale: float, f_mean: float) -> None:
    for seed in range(3):
        inputs = _cell_inputs(seed, i_scale, f_mean)
        parallel = mlstm_parallel(*inputs)
        recurrent = mlstm_recurrent(*inputs)
        assert parallel.shape == inputs[0].shape
        # |h| reaches ~30 where |n . q| is small; measured max |diff| / (1 + |h|) = 2.2e-6.
        torch.testing.assert_close(parallel, recurrent, atol=1e-5, rtol=1e-5)
        exact = mlstm_parallel(*_double(inputs))
        torch.testing.assert_close(parallel.double(), exact, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(recurrent.double(), exact, atol=1e-5, rtol=1e-5)


def test_mlstm_stabilizer_survives_input_gates_that_overflow_exp() -> None:
    # i~ up to 100: exp(100) overflows f32 (max ~3.4e38), so only the stabilized form can
    # run in f32; it must equal the unstabilized formula evaluated in f64.
    q, k, v, _, f_pre = _cell_inputs(0, 1.0, 2.0, length=24)
    i_pre = torch.linspace(0.0, 100.0, 24).expand(3, 2, 24).contiguous()
    assert not bool(torch.isfinite(torch.exp(i_pre)).all())
    # eps = 0: the cell's eps is added in stabilized units (scaled by exp(-m)), so with
    # m ~ 100 it is not the eps of the unstabilized formula.
    h = mlstm_parallel(q, k, v, i_pre, f_pre, eps=0.0)
    assert bool(torch.isfinite(h).all())
    inputs64 = _double((q, k, v, i_pre, f_pre))
    reference = _mlstm_unstabilized(inputs64, eps=0.0)
    # The stabilizer is exact algebra: in f64 both forms agree to rounding.
    torch.testing.assert_close(mlstm_parallel(*inputs64, eps=0.0), reference, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(h.double(), reference, atol=1e-5, rtol=1e-5)  # measured 2e-6


# --------------------------------------------------------------------------------------
# sLSTM cell


def _slstm_unstabilized(pre: torch.Tensor, recurrent: torch.Tensor) -> torch.Tensor:
    """The sLSTM recurrence with raw exponential input gates (no m); f64 only."""
    length, h, n, _ = pre.shape
    d = recurrent.shape[1]
    h_state = pre.new_zeros(h, n, d)
    c_state, n_state, out = torch.zeros_like(h_state), torch.zeros_like(h_state), []
    for t in range(length):
        raw = pre[t] + torch.bmm(h_state, recurrent)
        i_raw, f_raw, z_raw, o_raw = raw.chunk(4, dim=-1)
        i_gate, f_gate = torch.exp(i_raw), torch.sigmoid(f_raw)
        c_state = f_gate * c_state + i_gate * torch.tanh(z_raw)
        n_state = f_gate * n_state + i_gate
        h_state = torch.sigmoid(o_raw) * c_state / n_state
        out.append(h_state)
    return torch.stack(out)


def test_slstm_scan_equals_the_unstabilized_recurrence() -> None:
    g = torch.Generator().manual_seed(0)
    length, h, n, d = 24, 2, 5, 4
    pre = torch.randn(length, h, n, 4 * d, generator=g) * 2.0
    pre[..., :d] += 20.0  # exp(i~) ~ e^20-e^30: large, yet representable in f64
    recurrent = torch.randn(h, d, 4 * d, generator=g) / math.sqrt(d)
    out = slstm_scan(pre, recurrent)
    assert out.shape == (length, h, n, d) and out.dtype == torch.float32
    reference = _slstm_unstabilized(pre.double(), recurrent.double())
    torch.testing.assert_close(out.double(), reference, atol=1e-5, rtol=1e-5)  # measured 8e-7


def test_slstm_recurrence_is_block_diagonal_by_heads() -> None:
    g = torch.Generator().manual_seed(1)
    pre = torch.randn(10, 3, 2, 4 * 4, generator=g)
    recurrent = torch.randn(3, 4, 16, generator=g)
    pre2 = pre.clone()
    pre2[:, 1] += 1.0  # change every input of head 1 only
    out, out2 = slstm_scan(pre, recurrent), slstm_scan(pre2, recurrent)
    assert torch.equal(out[:, [0, 2]], out2[:, [0, 2]])
    assert float((out[:, 1] - out2[:, 1]).abs().max()) > 1e-2


@pytest.mark.parametrize("block_cls", [MLSTMBlock, SLSTMBlock])
def test_blocks_are_causal(block_cls: type[torch.nn.Module]) -> None:
    torch.manual_seed(0)
    block = block_cls(XLSTMConfig(d_model=16, n_heads=2, dropout=0.0)).eval()
    x = torch.randn(3, 12, 16)
    j = 6
    x2 = x.clone()
    x2[:, j] += torch.randn(16)  # not a constant shift: the pre-norm would remove it
    with torch.no_grad():
        out, out2 = block(x), block(x2)
    torch.testing.assert_close(out2[:, :j], out[:, :j], atol=1e-6, rtol=0)
    assert float((out2[:, j:] - out[:, j:]).abs().amax(dim=-1).amin()) > 1e-4


# --------------------------------------------------------------------------------------
# The model contract


def test_output_shape_loss_positions_and_stack_pattern() -> None:
    model = _model()
    assert isinstance(model, ForecastModel)
    assert [type(b) for b in model.blocks] == [MLSTMBlock, SLSTMBlock]
    assert [type(b) for b in _model(XLSTMConfig(blocks="smm")).blocks] == [
        SLSTMBlock,
        MLSTMBlock,
        MLSTMBlock,
    ]
    batch = _batch()
    forecast = model(batch.x)
    assert forecast.shape == (B, SHAPE.n_assets) and forecast.dtype == torch.float32
    # loss and position mapping: the shared head's, pinned in tests/models/test_heads.py
    pos = model.positions(batch)
    assert pos.shape == (B, SHAPE.n_assets) and pos.dtype == torch.float32
    assert not pos.requires_grad


@torch.no_grad()
def test_gate_initialization() -> None:
    model = _model(XLSTMConfig(blocks="ms", n_heads=4))
    m_block, s_block = model.blocks
    assert isinstance(m_block, MLSTMBlock) and isinstance(s_block, SLSTMBlock)
    assert float(m_block.gates.weight.abs().max()) == 0.0
    torch.testing.assert_close(m_block.gate_bias[4:], torch.linspace(3.0, 6.0, 4))
    assert 0 < float(m_block.gate_bias[:4].abs().max()) < 0.5  # N(0, 0.1)
    assert float(s_block.recurrent.abs().max()) == 0.0
    gate_bias = s_block.gate_bias.unflatten(-1, (4, -1))[:, 0]  # (H, 4, D): [i, f, z, o]
    torch.testing.assert_close(gate_bias[:, 1], torch.linspace(3.0, 6.0, 8).expand(4, 8))
    assert float(gate_bias[:, [0, 2, 3]].abs().max()) == 0.0
