"""Tests of the TLOB family (models/tlob.py).

Run: .venv/bin/python -m pytest tests/models/test_tlob.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from models.base import Batch, Choice, DataShape, ForecastModel, count_parameters, inverse_softplus
from models.tlob import (
    FAMILY,
    SEARCH_SPACE,
    TLOB,
    BiN,
    DualAttentionLayer,
    TLOBConfig,
    build,
    regression_loss,
    sinusoidal_embedding,
)
from trainables.precision import BF16, F32, StepGuard, f32, floating_dtypes, get_policy

SHAPE = DataShape(n_features=8, lookback=32, n_assets=4)
# TLOB's feature attention and BiN have weights per bar, so test windows are SHAPE.lookback
# long; SMALL keeps the CPU bf16 tests fast.
SMALL = DataShape(n_features=8, lookback=16, n_assets=2)
B = 4
TINY = {"hidden_dim": 16, "n_layers": 1}


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


def test_bf16_cast_model_is_finite_and_close_to_f32() -> None:
    batch = _batch()
    with torch.no_grad():
        reference = _model()(batch.x)
    policy = get_policy("bf16")
    model = policy.convert_module(_model())
    assert set(floating_dtypes(model).values()) == {BF16}
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    with torch.no_grad():
        forecast = model(bf_batch.x)
        attention = model.explain(bf_batch.x).time_attention[0]
    assert forecast.dtype == BF16 and bool(torch.isfinite(forecast).all())
    assert float((f32(forecast) - reference).abs().max()) < 0.06  # measured 0.020
    # The softmax ran in f32: rows sum to 1 up to one bf16 rounding of each weight.
    assert float((f32(attention).sum(-1) - 1).abs().max()) < 2e-2
    model.train()
    loss = model.loss(bf_batch)
    assert loss.dtype == F32 and math.isfinite(loss.item())
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.dtype == BF16, name
        assert bool(torch.isfinite(param.grad).all()), name
    pos = model.positions(bf_batch)
    assert pos.dtype == F32 and bool((pos.abs() <= 1).all())


def test_bf16_guarded_step_and_bf16_mixed_autocast() -> None:
    policy = get_policy("bf16")
    model = policy.convert_module(_model()).train()
    batch = _batch()
    bf_batch = Batch(x=policy.convert_input(batch.x), y=batch.y, gaps=batch.gaps)
    optimizer = policy.make_optimizer(model.parameters(), lr=1e-3)
    before = model.bin.mix.detach().clone()
    result = policy.backward_and_step(
        model.loss(bf_batch), optimizer, StepGuard(policy.device), max_grad_norm=1.0
    )
    assert bool(result.ok) and math.isfinite(result.grad_norm.item())
    assert not torch.equal(model.bin.mix, before)

    model = _model()
    reference = model.loss(batch)
    with get_policy("bf16-mixed").autocast():
        loss = model.loss(batch)
    assert loss.dtype == F32
    assert abs(loss.item() - reference.item()) < 3e-2  # measured 0.011 (loss 1.48)


def test_parameter_counts_at_default_size() -> None:
    assert count_parameters(_model(shape=SHAPE)) == 44_963
    # A learned positional embedding adds L x d = 32 x 32.
    assert count_parameters(_model(TLOBConfig(sinusoidal=False), SHAPE)) == 44_963 + 1_024
    assert count_parameters(_model(TLOBConfig(**TINY), SMALL)) == 5_163
    # Order-book input: only BiN's per-feature weights and the embedding grow with F.
    book = DataShape(n_features=40, lookback=32, n_assets=1)
    assert count_parameters(_model(shape=book)) == 44_963 + 32 * 2 + 32 * 32


def test_config_validation_names_the_field() -> None:
    for field, bad in [
        ("hidden_dim", 7),
        ("n_layers", 0),
        ("n_heads", 0),
        ("dropout", 1.0),
        ("loss", "l1"),
        ("huber_delta", -1.0),
        ("position_scale", 0.0),
    ]:
        with pytest.raises(ValueError, match=field):
            TLOBConfig(**{field: bad})
    with pytest.raises(ValueError, match="lookback"):
        build(TLOBConfig(), DataShape(n_features=8, lookback=7, n_assets=1))
    with pytest.raises(ValueError, match="features"):
        build(TLOBConfig(), DataShape(n_features=1, lookback=8, n_assets=1))
    with pytest.raises(ValueError, match="L=16 bars"):
        _model()(torch.zeros(1, SMALL.n_assets, 12, SMALL.n_features))


def test_search_space_and_family_record() -> None:
    assert FAMILY.name == "tlob" and FAMILY.kind == "forecast"
    assert set(SEARCH_SPACE) <= set(FAMILY.config_fields())
    assert not {"lr", "batch_size", "weight_decay"} & set(SEARCH_SPACE)
    default = FAMILY.default_config()
    for name, dim in SEARCH_SPACE.items():
        assert dim.contains(getattr(default, name)), name
    widths = SEARCH_SPACE["hidden_dim"]
    assert isinstance(widths, Choice) and all(d % 4 == 0 for d in widths.options)
