"""Tests of the Mamba-2 family (models/mamba2.py, models/nets/mamba2.py).

Run: .venv/bin/python -m pytest tests/models/test_mamba2.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models.base import Batch, DataShape, Float, ForecastModel
from models.mamba2 import FAMILY, SEARCH_SPACE, Mamba2Config
from models.nets import mamba2
from models.nets.mamba2 import Mamba2, Mamba2Block, Mamba2Mixer, build, ssd_chunked, ssd_sequential
from trainables.precision import get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
B, L = 4, SHAPE.lookback
KEEP_F32 = ("A_log", "D", "dt_bias")


def _model(config: Mamba2Config | None = None, seed: int = 0) -> Mamba2:
    torch.manual_seed(seed)
    return build(config or Mamba2Config(), SHAPE).eval()


def _converted(policy_name: str) -> Mamba2:
    model = get_policy(policy_name).convert_module(_model())
    assert isinstance(model, Mamba2)
    return model


def _mixers(model: Mamba2) -> list[Mamba2Mixer]:
    mixers = [block.mixer for block in model.blocks if isinstance(block, Mamba2Block)]
    assert len(mixers) == len(model.blocks)
    return mixers


def _batch(seed: int = 1, length: int = L) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, SHAPE.n_assets, length, SHAPE.n_features, generator=g)
    y = torch.randn(B, SHAPE.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(B, length))


def _ssd_inputs(length: int, seed: int = 0, shared_bc: bool = False) -> tuple[torch.Tensor, ...]:
    """x (N, L, H, P), a (N, L, H) <= 0, b and c (N, L, H or 1, S), in the model's ranges."""
    g = torch.Generator().manual_seed(seed)
    n, h, p, s = 3, 4, 5, 6
    dt = F.softplus(torch.randn(n, length, h, generator=g) - 2.0)  # ~0.13, in (0, 1)
    a_head = -torch.empty(h).uniform_(1.0, 16.0, generator=g)
    x = torch.randn(n, length, h, p, generator=g) * dt.unsqueeze(-1)
    bc_heads = 1 if shared_bc else h
    b = torch.randn(n, length, bc_heads, s, generator=g)
    c = torch.randn(n, length, bc_heads, s, generator=g)
    return x, a_head * dt, b, c


# --------------------------------------------------------------------------------------
# The SSD scan


@pytest.mark.parametrize("chunk_size", [1, 4, 8, 32, 5, 7, 12, 48])
@pytest.mark.parametrize("shared_bc", [False, True])
def test_chunked_ssd_equals_the_sequential_recurrence(chunk_size: int, shared_bc: bool) -> None:
    # L = 32: chunks 1, 4, 8, 32 divide it; 5, 7, 12 and 48 (longer than L) pad it.
    x, a, b, c = _ssd_inputs(32, shared_bc=shared_bc)
    y_ref, state_ref = ssd_sequential(x, a, b, c)
    y, state = ssd_chunked(x, a, b, c, chunk_size)
    assert y.shape == x.shape and state.shape == (3, 4, 5, 6)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)  # measured <= 1.6e-6
    torch.testing.assert_close(state, state_ref, atol=1e-5, rtol=1e-5)


def test_chunked_ssd_continues_from_an_initial_state() -> None:
    x, a, b, c = _ssd_inputs(20, seed=2)
    y_full, s_full = ssd_sequential(x, a, b, c)
    _, s_half = ssd_chunked(x[:, :9], a[:, :9], b[:, :9], c[:, :9], chunk_size=4)
    y_rest, s_rest = ssd_chunked(
        x[:, 9:], a[:, 9:], b[:, 9:], c[:, 9:], chunk_size=4, initial_state=s_half
    )
    torch.testing.assert_close(y_rest, y_full[:, 9:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_rest, s_full, atol=1e-5, rtol=1e-5)


def test_model_output_does_not_depend_on_chunk_size() -> None:
    x = _batch().x
    with torch.no_grad():
        outs = [_model(Mamba2Config(chunk_size=q))(x) for q in (32, 8, 5, 3)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


def test_mixer_is_causal() -> None:
    torch.manual_seed(0)
    mixer = Mamba2Mixer(Mamba2Config(chunk_size=5))
    u = torch.randn(3, 17, 32)
    j = 8
    u2 = u.clone()
    u2[:, j] += 1.0
    with torch.no_grad():
        out, out2 = mixer(u), mixer(u2)
    torch.testing.assert_close(out2[:, :j], out[:, :j], atol=1e-6, rtol=0)
    assert float((out2[:, j:] - out[:, j:]).abs().amax(dim=-1).amin()) > 1e-4


def test_parameter_initialization_follows_the_paper() -> None:
    config = Mamba2Config(n_layers=4, d_model=64, head_dim=8, dt_min=1e-3, dt_max=0.1)
    mixers = _mixers(_model(config))
    dt = torch.cat([F.softplus(m.dt_bias) for m in mixers])  # 4 layers x 16 heads
    a = torch.cat([torch.exp(m.A_log) for m in mixers])
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    log_dt = dt.log()  # log-uniform: the log's mean sits mid-range, ~0.33 of the range each side
    assert abs(log_dt.mean().item() - math.log(1e-2)) < 0.6
    assert a.min() >= 1.0 and a.max() <= 16.0 and a.max() - a.min() > 8.0
    assert all(torch.equal(m.D, torch.ones_like(m.D)) for m in mixers)


# --------------------------------------------------------------------------------------
# The model contract


def test_output_shape_loss_and_positions() -> None:
    model = _model()
    assert isinstance(model, ForecastModel)
    batch = _batch()
    forecast = model(batch.x)
    assert forecast.shape == (B, SHAPE.n_assets) and forecast.dtype == torch.float32
    # loss and position mapping: the shared head's, pinned in tests/models/test_heads.py
    pos = model.positions(batch)
    assert pos.shape == (B, SHAPE.n_assets) and pos.dtype == torch.float32
    assert not pos.requires_grad
    assert bool((pos.abs() <= 1).all())


def test_search_space_leaves_out_chunk_size_and_its_dt_ends_are_valid_together() -> None:
    assert "chunk_size" not in SEARCH_SPACE  # changes speed, never the result
    lo, hi = SEARCH_SPACE["dt_min"], SEARCH_SPACE["dt_max"]
    assert isinstance(lo, Float) and isinstance(hi, Float)
    FAMILY.make_config({"dt_min": lo.high, "dt_max": hi.low})


def test_the_documented_bf16_errors_of_the_decay_parameters_are_the_measured_ones() -> None:
    # Over the init ranges (|A| in [1, 16], dt in [1e-3, 0.1]): bf16 rounding of A_log and
    # dt_bias moves A and dt by these relative amounts; the docstring and FAMILY.keeps_f32
    # (shown by `hpo families` and in models/README.md) quote the same numbers.
    a_log = torch.linspace(0.0, math.log(16.0), 100_001, dtype=torch.float64)
    a_err = ((a_log.to(torch.bfloat16).double().exp() / a_log.exp()) - 1).abs().max()
    dt = torch.logspace(-3, -1, 100_001, dtype=torch.float64)
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    dt_err = (F.softplus(dt_bias.to(torch.bfloat16).double()) / dt - 1).abs().max()
    a_pct, dt_pct = f"{100 * float(a_err):.1f}", f"{100 * float(dt_err):.1f}"
    assert (a_pct, dt_pct) == ("0.8", "1.6")  # measured 0.78 %, 1.57 %
    assert f"A off by up to {a_pct}% and dt by {dt_pct}%" in FAMILY.keeps_f32
    doc = " ".join((mamba2.__doc__ or "").split())
    assert f"moves A by up to {a_pct} %" in doc and f"dt by up to {dt_pct} %" in doc
