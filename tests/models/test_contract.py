"""One contract over every model family x every precision policy (in the spirit of
optuna's BasicSamplerTestCase and Lightning's test_all): the invariants every family
promises, checked the same way for all ten.

Per (family, policy), on tiny shapes:
* parameter dtypes are the policy's (bf16 weights under bf16, except the family's
  documented ``keep_f32`` tensors; f32 master weights under every other policy);
* outputs have the contract's shapes: forecast positions (B, A) in [-1, 1], rl actions (N,)
  in [0, n_actions);
* a short run is finite: no NaN/inf metric, no skipped step;
* a checkpoint round trip is bit-exact, and training resumed from it gives the same
  numbers as an uninterrupted run (so: same seed, same numbers).
Learning the planted signal is asserted for each family in f32 and bf16 by
``test_learns_the_planted_signal`` below, with each family's measured budget.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from models import family_names, get_family
from models.base import ForecastModel, RLLearner
from tests.models.learning import LEARNING
from tests.trainables.helpers import tiny_config, untrained_and_trained_sharpe
from trainables.checkpoint import load_checkpoint
from trainables.config import DataConfig
from trainables.precision import BF16, F32, KEEP_F32_ATTR
from trainables.trainer import Trainer

POLICIES = ("f32", "bf16", "bf16-mixed", "fp16-mixed")

# Small configurations of every family (a few thousand parameters), fast on one CPU thread.
TINY: dict[str, dict[str, Any]] = {
    "dqn": {"hidden": 32, "learning_starts": 64, "num_envs": 8, "buffer_capacity": 2048},
    "ppo": {"hidden": 32, "num_envs": 8, "n_steps": 8, "minibatches": 2, "ppo_epochs": 1},
    "tft": {"d_model": 8, "n_heads": 1, "dropout": 0.0},
    "mamba2": {"d_model": 16, "n_layers": 1, "d_state": 8, "head_dim": 8},
    "tggn": {"channels": 8, "skip_channels": 16, "end_channels": 16, "node_dim": 4, "n_layers": 1},
    "tlob": {"hidden_dim": 16, "n_layers": 1},
    "liquid": {"hidden": 8, "backbone_units": 16},
    "kan": {},
    "xlstm": {"d_model": 16, "blocks": "ms", "n_heads": 2, "dropout": 0.0},
    "diffusion": {"hidden": 16, "n_samples": 8, "sampling_steps": 5},
}


def _config(model: str, precision: str, epochs: int) -> Any:
    return tiny_config(
        model=model,
        precision=precision,
        epochs=epochs,
        max_steps_per_epoch=4,
        rl_iterations=6,
        model_config=TINY[model],
        data=DataConfig(n_bars=600, n_assets=2),
    )


def _keep_f32(module: torch.nn.Module) -> set[str]:
    names = set()
    for prefix, sub in module.named_modules():
        for name in getattr(sub, KEEP_F32_ATTR, ()):
            names.add(f"{prefix}.{name}" if prefix else name)
    return names


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        f"{r.index}.{k}": v.clone() for r in trainer.folds for k, v in r.model.state_dict().items()
    }


def test_every_family_is_registered_and_covered() -> None:
    assert set(family_names()) == set(TINY) == set(LEARNING)
    assert len(family_names()) == 10


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", family_names())
def test_family_contract(model: str, policy: str, tmp_path: Path) -> None:
    family = get_family(model)
    probe = Trainer(_config(model, policy, epochs=2))  # shape checks may draw random numbers
    run = probe.folds[0]

    # dtypes the policy promises
    keep = _keep_f32(run.model)
    for name, p in run.model.named_parameters():
        expected = BF16 if policy == "bf16" and name not in keep else F32
        assert p.dtype == expected, (name, p.dtype)

    # output shapes
    with torch.no_grad():
        if family.kind == "forecast":
            assert isinstance(run.model, ForecastModel)
            batch = run.data.batch(run.data.decision_times(run.data.val)[:5])
            with probe.policy.autocast():
                positions = run.model.positions(batch).float()
            assert positions.shape == (5, probe.shape.n_assets)
            assert bool(((positions >= -1) & (positions <= 1)).all())
        else:
            assert isinstance(run.model, RLLearner)
            assert run.env is not None
            with probe.policy.autocast():
                actions = run.model.act(run.env.observe())
            assert actions.shape == (run.env.num_envs,) and actions.dtype == torch.int64
            assert bool(((actions >= 0) & (actions < probe.shape.n_actions)).all())

    # a short run is finite and skips nothing
    straight = Trainer(_config(model, policy, epochs=2))
    history = straight.fit()
    for metrics in history:
        assert metrics["skipped_steps"] == 0
        for key in ("train_loss", "val_sharpe", "test_sharpe"):
            assert math.isfinite(metrics[key]), (key, metrics[key])

    # checkpoint round trip bit-exact; resumed == uninterrupted
    # Stop after one of the same two epochs (schedules such as epsilon depend on the total).
    first = Trainer(_config(model, policy, epochs=2))
    first.train_epoch()
    first.save(tmp_path / "ckpt")
    ckpt = load_checkpoint(tmp_path / "ckpt")
    restored = Trainer(_config(model, policy, epochs=2), checkpoint=ckpt)
    for name, tensor in _weights(first).items():
        assert torch.equal(_weights(restored)[name], tensor), name
    restored.fit()
    for name, tensor in _weights(straight).items():
        assert torch.equal(_weights(restored)[name], tensor), name
    assert restored.history[-1]["val_sharpe"] == history[-1]["val_sharpe"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("model", family_names())
def test_learns_the_planted_signal(model: str, precision: str) -> None:
    check = LEARNING[model]
    config = tiny_config(model=model, precision=precision, **check.config)
    untrained, trained = untrained_and_trained_sharpe(config, seeds=check.seeds)
    mean_untrained = sum(untrained) / len(untrained)
    mean_trained = sum(trained) / len(trained)
    assert mean_trained > check.min_mean, (untrained, trained)
    assert mean_trained - mean_untrained > check.min_gain, (untrained, trained)
    assert min(trained) > check.min_each, (untrained, trained)
