"""The confidence protocol over every family and policy: positions identical to the
family's own ``positions`` / ``act``, confidences in [0, 1] that vary with the input, and
each family's mapping documented in its record."""

from __future__ import annotations

import pytest
import torch

from models import all_families, family_names, get_family
from models.base import Batch, ConfidentForecaster, ConfidentLearner, DataShape
from trainables.ensemble import move_confidence
from trainables.precision import get_policy

SHAPE = DataShape(n_features=6, lookback=8, n_assets=2)
CPU = torch.device("cpu")


def _model(name: str, policy_name: str) -> torch.nn.Module:
    family = get_family(name)
    policy = get_policy(policy_name, CPU)
    torch.manual_seed(0)
    model = family.build(family.default_config(), SHAPE)
    if name == "diffusion":  # untrained it is the zero-mean prior: no move, no confidence
        torch.nn.init.normal_(model.prior_mean.weight, std=0.5)  # type: ignore[arg-type]
    model = policy.convert_module(model)
    model.eval()
    return model


@pytest.mark.parametrize("policy_name", ["f32", "bf16"])
@pytest.mark.parametrize("name", family_names())
def test_confidence_keeps_positions_and_stays_in_unit_interval(name: str, policy_name: str) -> None:
    family = get_family(name)
    model = _model(name, policy_name)
    dtype = get_policy(policy_name, CPU).data_dtype
    g = torch.Generator().manual_seed(1)
    if family.kind == "forecast":
        assert isinstance(model, ConfidentForecaster)
        x = torch.randn(16, SHAPE.n_assets, SHAPE.lookback, SHAPE.n_features, generator=g)
        batch = Batch(x=x.to(dtype), y=torch.zeros(16, 2), gaps=torch.ones(16, SHAPE.lookback))
        with torch.no_grad():
            signal = model.forecast_signal(batch)
            expected = model.positions(batch)  # type: ignore[operator]
        assert torch.equal(signal.positions, expected)
        sigma = signal.spread if signal.spread is not None else 1.0
        confidence = move_confidence(signal.move, sigma)
    else:
        assert isinstance(model, ConfidentLearner)
        window = torch.randn(32, SHAPE.lookback, SHAPE.n_features, generator=g).to(dtype)
        obs = (window, torch.zeros(32, dtype=dtype))
        model.eval()  # PPO: a fresh eval-time state for each of the two calls
        action, confidence = model.act_and_confidence(obs)
        model.eval()
        assert torch.equal(action, model.act(obs))  # type: ignore[operator]
    assert confidence.dtype == torch.float32
    assert bool(((confidence >= 0) & (confidence <= 1)).all())
    assert float(confidence.max() - confidence.min()) > 0  # it varies with the input


def test_every_family_documents_its_confidence_mapping() -> None:
    for family in all_families():
        assert len(family.confidence) > 20, family.name


def test_move_confidence_is_two_phi_minus_one() -> None:
    move = torch.tensor([0.0, 1.0, -1.96, 3.0])
    out = move_confidence(move, torch.tensor([1.0, 1.0, 1.0, 0.0]))
    normal = torch.distributions.Normal(0.0, 1.0)
    assert out[0] == 0.0 and out[3] == 0.0  # no move, or no spread: no confidence
    assert out[1] == pytest.approx(float(2 * normal.cdf(torch.tensor(1.0)) - 1), abs=1e-6)
    assert out[2] == pytest.approx(0.95, abs=1e-3)
