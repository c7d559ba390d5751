"""Tests of the Temporal Fusion Transformer family (models/tft.py, models/nets/tft.py).

Run: .venv/bin/python -m pytest tests/models/test_tft.py -q
"""

from __future__ import annotations

import math
from statistics import NormalDist

import torch

from models.base import Batch, Choice, DataShape, ForecastModel, count_parameters
from models.nets.tft import (
    TFT,
    InterpretableMultiHeadAttention,
    QuantileHead,
    build,
    pinball_loss,
    quantiles_to_positions,
)
from models.tft import SEARCH_SPACE, TFTConfig
from trainables.precision import get_policy

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


def test_searched_widths_span_16_to_160_and_run_without_the_asset_embedding() -> None:
    d_dim = SEARCH_SPACE["d_model"]
    assert isinstance(d_dim, Choice)
    assert min(d_dim.options) == 16 and max(d_dim.options) == 160
    no_static = _model(TFTConfig(static_embedding=False))
    assert no_static(_batch().x).shape == (B, SHAPE.n_assets, 3)
