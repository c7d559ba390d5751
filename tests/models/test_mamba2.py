"""Tests of the Mamba-2 family (models/mamba2.py).

Run: .venv/bin/python -m pytest tests/models/test_mamba2.py -q
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from models.base import Batch, Choice, DataShape, ForecastModel, count_parameters
from models.mamba2 import (
    FAMILY,
    SEARCH_SPACE,
    Mamba2,
    Mamba2Block,
    Mamba2Config,
    Mamba2Mixer,
    build,
    segsum,
    ssd_chunked,
    ssd_sequential,
)
from trainables.precision import POLICY_NAMES, StepGuard, f32, floating_dtypes, get_policy

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


def test_segsum_is_the_masked_segment_sum() -> None:
    a = torch.tensor([0.5, -1.0, 2.0, -0.25])
    out = segsum(a)
    for i, j in itertools.product(range(4), range(4)):
        expected = float(a[j + 1 : i + 1].sum()) if j <= i else -math.inf
        assert out[i, j].item() == pytest.approx(expected, abs=1e-7), (i, j)
    decay = torch.exp(segsum(-torch.rand(2, 7)))
    assert torch.equal(decay.diagonal(dim1=-2, dim2=-1), torch.ones(2, 7))
    assert float(decay.triu(1).abs().max()) == 0.0


def test_segsum_stays_accurate_where_cumsum_differences_cancel() -> None:
    # 2000 log-decays of -5: the cumulative sum reaches -1e4, where f32 resolves ~1e-3, so
    # differences of cumulative sums lose the short segments; segsum sums them directly.
    a = torch.full((2000,), -5.0) + 1e-3 * torch.randn(2000)
    exact = segsum(a.double())
    stable = segsum(a)
    cum = a.cumsum(0)
    naive = cum[:, None] - cum[None, :]
    rows, cols = torch.tril_indices(2000, 2000)
    err_stable = (stable[rows, cols].double() - exact[rows, cols]).abs().max().item()
    err_naive = (naive[rows, cols].double() - exact[rows, cols]).abs().max().item()
    near_diag = torch.arange(1, 2000)
    err_naive_short = (naive[near_diag, near_diag - 1].double() - a[1:].double()).abs().max()
    assert err_stable < 1e-3  # measured 4.9e-4: half an f32 spacing at 1e4, rounding only
    assert float((stable[near_diag, near_diag - 1] - a[1:]).abs().max()) == 0.0
    assert float(err_naive_short) > 1e-4 and err_naive > err_stable  # measured 9.2e-4, 1.0e-3


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
    torch.testing.assert_close(model.loss(batch), F.huber_loss(forecast, batch.y, delta=1.0))
    mse = _model(Mamba2Config(loss="mse"))
    torch.testing.assert_close(mse.loss(batch), F.mse_loss(mse(batch.x), batch.y))
    pos = model.positions(batch)
    assert pos.shape == (B, SHAPE.n_assets) and pos.dtype == torch.float32
    assert not pos.requires_grad
    torch.testing.assert_close(pos, torch.tanh(4.0 * forecast.detach()))
    assert bool((pos.abs() <= 1).all())


def test_parameter_count_at_default_size() -> None:
    # Per block: in_proj 32 x (64 + 64 + 32 + 4), depthwise conv 96 x (4 + 1), dt_bias,
    # A_log, D (4 each), gated-norm gain 64, out_proj 64 x 32, block norm 32.
    block = 32 * 164 + 96 * 5 + 3 * 4 + 64 + 64 * 32 + 32
    assert count_parameters(_model()) == (8 * 32 + 32) + 2 * block + 32 + 33 == 16_121


def test_bf16_cast_model_keeps_decay_parameters_f32() -> None:
    batch = _batch()
    with torch.no_grad():
        reference = _model()(batch.x)
    policy = get_policy("bf16")
    model = _converted("bf16")
    dtypes = floating_dtypes(model)
    kept = {name for name, dt in dtypes.items() if dt == torch.float32}
    assert kept == {f"blocks.{i}.mixer.{p}" for i in range(2) for p in KEEP_F32}
    assert dtypes["blocks.0.mixer.in_proj.weight"] == torch.bfloat16
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    with torch.no_grad():
        forecast = model(bf_batch.x)
    assert forecast.dtype == torch.bfloat16 and bool(torch.isfinite(forecast).all())
    assert float((f32(forecast) - reference).abs().max()) < 0.05  # measured 0.011
    model.train()
    loss = model.loss(bf_batch)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.dtype == param.dtype, name
        assert bool(torch.isfinite(param.grad).all()), name
    pos = model.positions(bf_batch)
    assert pos.dtype == torch.float32 and bool((pos.abs() <= 1).all())


def test_bf16_guarded_step_keeps_f32_parameters_f32() -> None:
    policy = get_policy("bf16")
    model = _converted("bf16").train()
    batch = _batch()
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    optimizer = policy.make_optimizer(model.parameters(), lr=1e-3)
    mixer = _mixers(model)[0]
    before = mixer.A_log.detach().clone(), mixer.in_proj.weight.detach().clone()
    result = policy.backward_and_step(
        model.loss(bf_batch), optimizer, StepGuard(policy.device), max_grad_norm=1.0
    )
    assert bool(result.ok)
    assert not torch.equal(mixer.A_log, before[0]) and mixer.A_log.dtype == torch.float32
    assert not torch.equal(mixer.in_proj.weight, before[1])
    assert mixer.in_proj.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", [p for p in POLICY_NAMES if p != "auto"])
def test_every_policy_gives_a_finite_loss_close_to_f32(name: str) -> None:
    batch = _batch(length=12)
    reference = _model().loss(batch).item()
    policy = get_policy(name)
    model = _converted(name)
    run_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    with policy.autocast():
        loss = model.loss(run_batch)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - reference) < 0.02  # measured <= 0.002 (bf16-mixed)
    loss.backward()
    for param in model.parameters():
        assert param.grad is not None and bool(torch.isfinite(param.grad).all())


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        Mamba2Config(d_model=20, head_dim=16)
    with pytest.raises(ValueError, match="dt_min"):
        Mamba2Config(dt_min=0.2, dt_max=0.1)
    with pytest.raises(ValueError, match="chunk_size"):
        Mamba2Config(chunk_size=0)
    with pytest.raises(ValueError, match="loss"):
        Mamba2Config(loss="mae")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dropout"):
        Mamba2Config(dropout=1.0)
    with pytest.raises(ValueError, match="position_scale"):
        Mamba2Config(position_scale=0.0)
    with pytest.raises(ValueError, match="built for A=4"):
        _model()(torch.zeros(1, 3, L, SHAPE.n_features))


def test_search_space_and_family_record() -> None:
    assert FAMILY.name == "mamba2" and FAMILY.kind == "forecast"
    assert set(SEARCH_SPACE) <= set(FAMILY.config_fields())
    assert not {"lr", "batch_size", "weight_decay", "chunk_size"} & set(SEARCH_SPACE)
    default = FAMILY.default_config()
    for name, dim in SEARCH_SPACE.items():
        assert dim.contains(getattr(default, name)), name
    d_dim, p_dim = SEARCH_SPACE["d_model"], SEARCH_SPACE["head_dim"]
    assert isinstance(d_dim, Choice) and isinstance(p_dim, Choice)
    for d, p in itertools.product(d_dim.options, p_dim.options):
        FAMILY.make_config({"d_model": d, "head_dim": p})
    lo, hi = SEARCH_SPACE["dt_min"], SEARCH_SPACE["dt_max"]
    FAMILY.make_config({"dt_min": lo.high, "dt_max": hi.low})  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------
# Learning through the shared trainer

TINY = {"d_model": 16, "n_layers": 1, "d_state": 8, "head_dim": 8}
