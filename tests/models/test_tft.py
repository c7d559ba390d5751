"""Tests of the Temporal Fusion Transformer family (models/tft.py).

Run: .venv/bin/python -m pytest tests/models/test_tft.py -q
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest
import torch

from models.base import Batch, Choice, DataShape, ForecastModel, count_parameters
from models.tft import (
    FAMILY,
    SEARCH_SPACE,
    TFT,
    InterpretableMultiHeadAttention,
    QuantileHead,
    TFTConfig,
    build,
    pinball_loss,
    quantiles_to_positions,
)
from trainables.precision import StepGuard, f32, floating_dtypes, get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
# Test windows are shorter than SHAPE.lookback to keep CPU bf16 fast: the TFT has no
# parameter tied to L, so any window length runs through the same module.
B, L = 4, 12


def _model(config: TFTConfig | None = None, seed: int = 0) -> TFT:
    torch.manual_seed(seed)
    return build(config or TFTConfig(), SHAPE).eval()


def _bf16_model() -> TFT:
    model = get_policy("bf16").convert_module(_model())
    assert isinstance(model, TFT)
    return model


def _batch(seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, SHAPE.n_assets, L, SHAPE.n_features, generator=g)
    y = torch.randn(B, SHAPE.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(B, L))


def test_output_shape_and_non_crossing_quantiles() -> None:
    model = _model()
    assert isinstance(model, ForecastModel)
    q = model(_batch().x)
    assert q.shape == (B, SHAPE.n_assets, 3)
    assert q.dtype == torch.float32
    assert bool((q.diff(dim=-1) > 0).all())


def test_quantile_head_starts_at_standard_normal_quantiles() -> None:
    levels = (0.1, 0.25, 0.5, 0.75, 0.9)
    head = QuantileHead(8, levels)
    q = head(torch.zeros(2, 8))  # only the biases speak
    expected = torch.tensor([NormalDist().inv_cdf(p) for p in levels])
    torch.testing.assert_close(q, expected.expand(2, -1), atol=1e-6, rtol=0)


def test_variable_selection_weights_sum_to_one_over_features() -> None:
    explanation = _model().explain(_batch().x)
    w = explanation.feature_weights
    assert w.shape == (B, SHAPE.n_assets, L, SHAPE.n_features)
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-6, rtol=0)


def test_attention_module_is_causal() -> None:
    torch.manual_seed(0)
    attn = InterpretableMultiHeadAttention(d_model=16, n_heads=4, dropout=0.0)
    x = torch.randn(3, 10, 16)
    with torch.no_grad():
        out, weights = attn(x, x)
    assert float(weights.triu(1).abs().max()) == 0.0
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 10), atol=1e-6, rtol=0)
    j = 6
    x2 = x.clone()
    x2[:, j] += 1.0
    with torch.no_grad():
        out2, _ = attn(x2, x2)
    assert torch.equal(out2[:, :j], out[:, :j])  # the past does not see bar j
    assert float((out2[:, j:] - out[:, j:]).abs().amin(dim=-1).amax()) > 0  # bar j onward does


def test_whole_model_attention_is_causal() -> None:
    model = _model()
    x = _batch().x
    j = 7
    x2 = x.clone()
    x2[:, :, j] += 3.0
    with torch.no_grad():
        a, a2 = model.explain(x).attention, model.explain(x2).attention
    assert a.shape == (B, SHAPE.n_assets, L, L)
    assert float(a.triu(1).abs().max()) == 0.0
    torch.testing.assert_close(a2[:, :, :j], a[:, :, :j], atol=1e-6, rtol=0)
    assert float((a2[:, :, j:] - a[:, :, j:]).abs().max()) > 1e-3


def test_interpretable_attention_shares_one_value_projection() -> None:
    torch.manual_seed(0)
    d, h = 12, 3
    attn = InterpretableMultiHeadAttention(d_model=d, n_heads=h, dropout=0.0)
    dh = d // h
    assert attn.value.weight.shape == (dh, d)  # one value map, not h of them
    assert count_parameters(attn.value) == d * dh + dh
    x = torch.randn(2, 5, d)
    out, weights = attn(x, x)
    # By hand: per-head softmax(Q_h K_h^T / sqrt(dh)) with a causal mask, averaged over
    # heads, applied to the one shared V, then W_H.
    v = x @ attn.value.weight.T + attn.value.bias
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    per_head = []
    for i in range(h):
        rows = slice(i * dh, (i + 1) * dh)
        q = x @ attn.query.weight[rows].T + attn.query.bias[rows]
        k = x @ attn.key.weight[rows].T + attn.key.bias[rows]
        s = (q @ k.transpose(1, 2) / math.sqrt(dh)).masked_fill(mask, -math.inf)
        per_head.append(torch.softmax(s, dim=-1))
    mean_attn = torch.stack(per_head).mean(0)
    expected = (mean_attn @ v) @ attn.out.weight.T + attn.out.bias
    torch.testing.assert_close(weights, mean_attn, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_pinball_loss_matches_hand_computation() -> None:
    pred = torch.tensor([[[-1.0, 0.0, 1.0], [-0.5, 0.25, 2.0]]])  # (B=1, A=2, Q=3)
    y = torch.tensor([[0.5, -1.0]])
    levels = torch.tensor([0.1, 0.5, 0.9])
    # asset 0: e = [1.5, 0.5, -0.5] -> 0.15 + 0.25 + 0.05 = 0.45
    # asset 1: e = [-0.5, -1.25, -3.0] -> 0.45 + 0.625 + 0.3 = 1.375
    expected = (0.45 + 1.375) / 6
    loss = pinball_loss(pred, y, levels)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - expected) < 1e-6


def test_model_loss_is_pinball_of_its_quantiles() -> None:
    model = _model()
    batch = _batch()
    levels = torch.tensor(TFTConfig().quantiles)
    loss = model.loss(batch)
    assert loss.shape == ()
    torch.testing.assert_close(loss, pinball_loss(model(batch.x), batch.y, levels))


def test_positions_in_range_with_sign_of_median() -> None:
    q = torch.tensor([[-1.0, 0.5, 1.0], [-3.0, -2.0, -1.0], [-1e-3, 0.0, 1e-3]])
    pos = quantiles_to_positions(q, median_index=1, scale=2.0)
    expected = torch.tensor([math.tanh(2 * 0.5 / 2), math.tanh(2 * -2.0 / 2), 0.0])
    torch.testing.assert_close(pos, expected, atol=1e-6, rtol=0)

    model = _model(TFTConfig(position_scale=32.0))
    batch = _batch()
    pos = model.positions(batch)
    median = model(batch.x)[..., 1]
    assert pos.shape == (B, SHAPE.n_assets) and pos.dtype == torch.float32
    assert not pos.requires_grad
    assert bool((pos.abs() <= 1).all())
    assert bool((torch.sign(pos) == torch.sign(median)).all())
    assert 0 < int((median > 0).sum()) < median.numel()  # both signs were exercised


def test_bf16_cast_model_is_finite_and_close_to_f32() -> None:
    batch = _batch()
    with torch.no_grad():
        reference = _model()(batch.x)
    policy = get_policy("bf16")
    model = _bf16_model()
    dtypes = floating_dtypes(model)
    assert dtypes["quantile_levels"] == torch.float32  # keep_f32
    assert dtypes["encoder.lstm.weight_hh_l0"] == torch.bfloat16  # LSTM runs in bf16
    assert sum(dt == torch.float32 for dt in dtypes.values()) == 1
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    with torch.no_grad():
        q = model(bf_batch.x)
    assert q.dtype == torch.bfloat16
    assert bool(torch.isfinite(q).all())
    assert float((f32(q) - reference).abs().max()) < 0.05  # measured 0.007
    model.train()
    loss = model.loss(bf_batch)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.dtype == torch.bfloat16, name
        assert bool(torch.isfinite(param.grad).all()), name
    pos = model.positions(bf_batch)
    assert pos.dtype == torch.float32 and bool((pos.abs() <= 1).all())


def test_bf16_guarded_step_through_the_policy() -> None:
    policy = get_policy("bf16")
    model = _bf16_model().train()
    batch = _batch()
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    optimizer = policy.make_optimizer(model.parameters(), lr=1e-3)
    before = model.head.proj.weight.detach().clone()
    result = policy.backward_and_step(
        model.loss(bf_batch), optimizer, StepGuard(policy.device), max_grad_norm=1.0
    )
    assert bool(result.ok) and math.isfinite(result.grad_norm.item())
    assert not torch.equal(model.head.proj.weight, before)
    assert model.quantile_levels.dtype == torch.float32


def test_bf16_mixed_autocast_matches_f32() -> None:
    model = _model()
    batch = _batch()
    reference = model.loss(batch)
    with get_policy("bf16-mixed").autocast():
        loss = model.loss(batch)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - reference.item()) < 2e-3  # measured 2e-4


def test_parameter_count_at_default_size() -> None:
    assert count_parameters(_model()) == 92_339
    # Without the asset embedding: no static encoder and no context inputs (2 x 32*32).
    no_static = _model(TFTConfig(static_embedding=False))
    assert count_parameters(no_static) == 92_339 - 17_280 - 2 * 32 * 32
    assert no_static(_batch().x).shape == (B, SHAPE.n_assets, 3)


def test_few_steps_fit_a_planted_signal() -> None:
    # y = sign of the last bar's first feature: the median should learn it quickly.
    config = TFTConfig(d_model=16, n_heads=2, dropout=0.0)
    torch.manual_seed(0)
    model = build(config, SHAPE)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, SHAPE.n_assets, 8, SHAPE.n_features, generator=g)
    batch = Batch(x=x, y=torch.sign(x[:, :, -1, 0]), gaps=torch.ones(16, 8))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = model.loss(batch).item()
    for _ in range(30):
        optimizer.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        optimizer.step()
    last = model.loss(batch).item()
    assert last < 0.2 * first  # measured 0.253 -> 0.009
    hit_rate = (torch.sign(model.positions(batch)) == batch.y).float().mean().item()
    assert hit_rate > 0.95


def test_config_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="n_heads"):
        TFTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="quantiles"):
        TFTConfig(quantiles=(0.1, 0.9))
    with pytest.raises(ValueError, match="quantiles"):
        TFTConfig(quantiles=(0.5, 0.9))
    with pytest.raises(ValueError, match="dropout"):
        TFTConfig(dropout=1.0)
    with pytest.raises(ValueError, match="position_scale"):
        TFTConfig(position_scale=0.0)
    with pytest.raises(ValueError, match="built for A=4"):
        _model()(torch.zeros(1, 3, L, SHAPE.n_features))


def test_search_space_and_family_record() -> None:
    assert FAMILY.name == "tft" and FAMILY.kind == "forecast"
    assert set(SEARCH_SPACE) <= set(FAMILY.config_fields())
    assert not {"lr", "batch_size", "weight_decay"} & set(SEARCH_SPACE)
    default = FAMILY.default_config()
    for name, dim in SEARCH_SPACE.items():
        assert dim.contains(getattr(default, name)), name
    # Every (d_model, n_heads) pair the searcher can draw is a valid config.
    d_dim, h_dim = SEARCH_SPACE["d_model"], SEARCH_SPACE["n_heads"]
    assert isinstance(d_dim, Choice) and isinstance(h_dim, Choice)
    d_models, heads = d_dim.options, h_dim.options
    for d, h in itertools.product(d_models, heads):
        FAMILY.make_config({"d_model": d, "n_heads": h})
    assert min(d_models) == 16 and max(d_models) == 160
