"""Tests of the TLOB family (models/tlob.py, models/nets/tlob.py).

Run: .venv/bin/python -m pytest tests/models/test_tlob.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from models.base import Batch, Choice, DataShape, ForecastModel, inverse_softplus
from models.heads import regression_loss
from models.nets.tlob import TLOB, BiN, DualAttentionLayer, build, sinusoidal_embedding
from models.ops import f32
from models.tlob import SEARCH_SPACE, TLOBConfig
from trainables.precision import BF16, F32, get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
# TLOB's feature attention and BiN have weights per bar, so test windows are SHAPE.lookback
# long; SMALL keeps the CPU bf16 tests fast.
SMALL = DataShape(n_features=8, lookback=16, n_assets=2)
B = 4


def _model(config: TLOBConfig | None = None, shape: DataShape = SMALL, seed: int = 0) -> TLOB:
    torch.manual_seed(seed)
    return build(config or TLOBConfig(), shape).eval()


def _batch(shape: DataShape = SMALL, seed: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, shape.n_assets, shape.lookback, shape.n_features, generator=g)
    y = torch.randn(B, shape.n_assets, generator=g)
    return Batch(x=x, y=y, gaps=torch.ones(B, shape.lookback))


@pytest.mark.parametrize(
    "config", [TLOBConfig(), TLOBConfig(n_layers=3, n_heads=2, sinusoidal=False, loss="mse")]
)
def test_shapes_loss_and_positions(config: TLOBConfig) -> None:
    model = _model(config)
    assert isinstance(model, ForecastModel)
    batch = _batch()
    forecast = model(batch.x)
    assert forecast.shape == (B, SMALL.n_assets) and forecast.dtype == F32
    loss = model.loss(batch)
    assert loss.shape == () and loss.dtype == F32
    torch.testing.assert_close(loss, regression_loss(forecast, batch.y, config.loss))
    pos = model.positions(batch)
    assert pos.shape == (B, SMALL.n_assets) and pos.dtype == F32 and not pos.requires_grad
    torch.testing.assert_close(pos, torch.tanh(config.position_scale * forecast.detach()))


def test_bin_normalizes_as_documented_by_hand() -> None:
    # One window, L=3 bars x F=2 features.
    x = torch.tensor([[[1.0, 3.0], [2.0, 5.0], [3.0, 7.0]]])
    # Temporal (each feature over the 3 bars, unbiased std): feature 0 is 1,2,3 (mean 2,
    # std 1), feature 1 is 3,5,7 (mean 5, std 2): both give -1, 0, 1 down the bars.
    # Feature (each bar over its 2 features): (1,3), (2,5), (3,7) all give (-s, +s) with
    # s = 1/sqrt(2) (two values a, b: (a-b)/2 / (|a-b|/sqrt(2))).
    s = 1 / math.sqrt(2)
    bin_ = BiN(lookback=3, n_features=2)
    with torch.no_grad():
        bin_.time_scale.copy_(torch.tensor([2.0, 3.0]))  # per feature
        bin_.time_bias.copy_(torch.tensor([0.5, -0.5]))
        bin_.feature_scale.copy_(torch.tensor([[1.0], [2.0], [4.0]]))  # per bar
        bin_.feature_bias.copy_(torch.tensor([[0.0], [1.0], [0.0]]))
        bin_.mix.copy_(torch.tensor([inverse_softplus(0.25), inverse_softplus(0.75)]))
    temporal = torch.tensor([[-2 + 0.5, -3 - 0.5], [0.5, -0.5], [2 + 0.5, 3 - 0.5]])
    featural = torch.tensor([[-s, s], [-2 * s + 1, 2 * s + 1], [-4 * s, 4 * s]])
    expected = 0.25 * featural + 0.75 * temporal
    torch.testing.assert_close(bin_(x), expected.unsqueeze(0), atol=1e-6, rtol=0)

    # At init (scales 1, biases 0, weights 0.5 each) it is the mean of the two z-scores.
    fresh = BiN(lookback=3, n_features=2)
    z_time = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]])
    z_feat = torch.tensor([[-s, s]] * 3)
    torch.testing.assert_close(fresh(x)[0], 0.5 * (z_time + z_feat), atol=1e-6, rtol=0)

    # A constant slice (std 0 < 1e-4) is centred, not divided by zero.
    flat = torch.tensor([[[4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]])
    assert torch.equal(fresh(flat), torch.zeros(1, 3, 2))


def test_bin_statistics_stay_f32_under_bf16() -> None:
    # Book sizes near 1024 on a grid of 8 (exact in bf16, whose spacing there is 8): their
    # means and deviations need more than bf16's 8 bits, so BiN upcasts the window first.
    g = torch.Generator().manual_seed(0)
    sizes = 1024.0 + 8.0 * torch.randint(0, 16, (2, 6, 4), generator=g).float()
    bf_sizes = get_policy("bf16").convert_input(sizes)
    assert torch.equal(f32(bf_sizes), sizes)  # the data cast lost nothing
    bf_bin = get_policy("bf16").convert_module(BiN(lookback=6, n_features=4))
    with torch.no_grad():
        out = bf_bin(bf_sizes)
    assert out.dtype == BF16
    # Exactly the f32 normalization (with the same, bf16-held weights) of the same window,
    # rounded to bf16 once at the end.
    reference = BiN(lookback=6, n_features=4)
    reference.load_state_dict({k: f32(v) for k, v in bf_bin.state_dict().items()})
    with torch.no_grad():
        torch.testing.assert_close(out, reference(sizes).to(BF16), atol=0, rtol=0)
    assert bool(torch.isfinite(out).all()) and float(f32(out).std()) > 0.5


def test_sinusoidal_embedding_formula() -> None:
    table = sinusoidal_embedding(5, 6)
    p, i = 3, 2  # dims 4 (sin) and 5 (cos) share the frequency 10000^(-4/6)
    freq = 10000 ** (-2 * i / 6)
    assert abs(table[p, 2 * i].item() - math.sin(p * freq)) < 1e-6
    assert abs(table[p, 2 * i + 1].item() - math.cos(p * freq)) < 1e-6
    assert sinusoidal_embedding(4, 5).shape == (4, 5)  # odd widths work too


def test_dual_attention_layer_attends_among_the_tokens_of_axis_one() -> None:
    torch.manual_seed(0)
    layer = DualAttentionLayer(dim=6, out_dim=6, n_heads=2, dropout=0.0).eval()
    x = torch.randn(3, 5, 6)  # (N, T tokens, dim)
    with torch.no_grad():
        out, attn = layer(x)
        assert out.shape == (3, 5, 6) and attn.shape == (3, 2, 5, 5)
        torch.testing.assert_close(attn.sum(-1), torch.ones(3, 2, 5), atol=1e-6, rtol=0)
        # Permuting the tokens permutes the output (self-attention has no token order) ...
        perm = torch.tensor([3, 0, 4, 1, 2])
        out_p, _ = layer(x[:, perm])
        torch.testing.assert_close(out_p, out[:, perm], atol=1e-5, rtol=0)
        # ... and every token reads the others: moving token 2 moves all five outputs.
        moved = x.clone()
        moved[:, 2] += 1.0
        out_m, _ = layer(moved)
        assert bool(((out_m - out).abs().amax(dim=(0, 2)) > 1e-4).all())
    shrink = DualAttentionLayer(dim=8, out_dim=2, n_heads=1, dropout=0.0)
    assert shrink(torch.randn(2, 3, 8))[0].shape == (2, 3, 2)


def test_time_layers_attend_over_bars_and_feature_layers_over_features() -> None:
    config = TLOBConfig(hidden_dim=12, n_layers=2, n_heads=2)
    model = _model(config)  # L = 16 bars, d = 12: the two axes have different sizes
    seen: dict[str, tuple[int, ...]] = {}
    for name, module in model.named_modules():
        if isinstance(module, DualAttentionLayer):
            module.register_forward_hook(
                lambda mod, args, out, name=name: seen.__setitem__(name, tuple(args[0].shape))
            )
    x = _batch().x
    explanation = model.explain(x)
    n = B * SMALL.n_assets
    bars, d = SMALL.lookback, config.hidden_dim
    assert seen["time_layers.0"] == (n, bars, d)  # tokens = bars, each a d-vector
    assert seen["feature_layers.0"] == (n, d, bars)  # tokens = features, each an L-vector
    assert seen["time_layers.1"] == (n, bars, d)
    assert seen["feature_layers.1"] == (n, d // 4, bars)  # the last time layer shrank d
    time_maps, feature_maps = explanation.time_attention, explanation.feature_attention
    assert [m.shape for m in time_maps] == [(B, 2, 2, bars, bars)] * 2
    assert [m.shape for m in feature_maps] == [(B, 2, 2, d, d), (B, 2, 2, d // 4, d // 4)]
    for m in time_maps + feature_maps:
        torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(explanation.forecast, model(x))


def _order_book(n: int, length: int, levels: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Raw book snapshots (n, length, 4 * levels): per level ask price, ask size, bid price,
    bid size (the paper's LOBSTER / FI-2010 layout), and the last snapshot's level-1 size
    imbalance (bid - ask) / (bid + ask), the classic short-horizon predictor."""
    mid = 100.0 + 0.01 * torch.randn(n, length, 1, generator=g).cumsum(1)  # (n, L, 1)
    offset = 0.01 * (torch.arange(levels) + 0.5)  # (levels,) ticks from the mid
    ask_size = torch.exp(6.0 + 0.5 * torch.randn(n, length, levels, generator=g))
    bid_size = torch.exp(6.0 + 0.5 * torch.randn(n, length, levels, generator=g))
    book = torch.stack([mid + offset, ask_size, mid - offset, bid_size], dim=-1)
    imbalance = (bid_size - ask_size) / (bid_size + ask_size)  # (n, L, levels)
    return book.reshape(n, length, 4 * levels), imbalance[:, -1, 0]


def test_reads_order_book_shaped_windows() -> None:
    # F = 40: 10 levels x (ask price, ask size, bid price, bid size) at raw scales (prices
    # ~100, sizes ~400), L = 16 snapshots; BiN does the normalization. The target is 2 x
    # the last snapshot's level-1 imbalance, to be found among 40 features x 16 snapshots.
    torch.manual_seed(0)
    shape = DataShape(n_features=40, lookback=16, n_assets=1)
    model = build(TLOBConfig(hidden_dim=32, n_layers=1), shape)
    g = torch.Generator().manual_seed(0)

    def sample(n: int) -> Batch:
        book, imbalance = _order_book(n, shape.lookback, 10, g)
        y = 2 * imbalance.unsqueeze(1)  # (n, 1); variance ~0.4
        return Batch(x=book.unsqueeze(1), y=y, gaps=torch.ones(n, shape.lookback))

    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = model.loss(sample(256)).item()
    for _ in range(80):
        optimizer.zero_grad()
        model.loss(sample(32)).backward()
        optimizer.step()
    model.eval()
    held_out = sample(512)
    with torch.no_grad():
        forecast = model(held_out.x)
        last = model.loss(held_out).item()
    assert forecast.shape == (512, 1) and bool(torch.isfinite(forecast).all())
    corr = torch.corrcoef(torch.stack([forecast.flatten(), held_out.y.flatten()]))[0, 1].item()
    # Measured: correlation 0.955, MSE 0.63 -> 0.035 (0.92-0.96 over seeds 0-2).
    assert corr > 0.8, corr
    assert last < 0.3 * first, (first, last)


def test_attention_softmax_runs_in_f32_under_bf16() -> None:
    policy = get_policy("bf16")
    model = policy.convert_module(_model())
    assert isinstance(model, TLOB)
    with torch.no_grad():
        attention = model.explain(policy.convert_input(_batch().x)).time_attention[0]
    assert attention.dtype == BF16
    # Rows sum to 1 up to one bf16 rounding of each weight.
    assert float((f32(attention).sum(-1) - 1).abs().max()) < 2e-2


def test_searched_widths_are_multiples_of_four() -> None:
    # The last layer pair keeps d // 4: a multiple of 4 wastes nothing.
    widths = SEARCH_SPACE["hidden_dim"]
    assert isinstance(widths, Choice) and all(d % 4 == 0 for d in widths.options)
