"""The trainer's RL loop in miniature, for learner tests (DQN, PPO): collect, then one
guarded optimizer step per loss the learner yields, each followed by ``after_step``;
the tiny environment and learners they run on. :class:`NoHostReads` (the CPU stand-in for
a CUDA sync check) is the family contract's (trainables/contract.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch

from models.base import DataShape
from trainables.contract import NoHostReads
from trainables.env import TradingEnv
from trainables.precision import StepGuard, get_policy

SHAPE = DataShape(n_features=3, lookback=4, n_assets=2)
T = TypeVar("T", bound=torch.nn.Module)

__all__ = ["SHAPE", "NoHostReads", "tiny_env", "tiny_learner", "train_learner"]


def train_learner(
    learner: Any,
    env: TradingEnv,
    policy_name: str,
    collects: int,
    monkeypatch: pytest.MonkeyPatch | None = None,
    max_grad_norm: float = 1.0,
) -> list[torch.Tensor]:
    """Run ``collects`` cycles; with ``monkeypatch``, every cycle (collect, the losses,
    the guarded optimizer steps, ``after_step``) runs under :class:`NoHostReads`.
    Asserts no step was skipped; returns the step losses."""
    guard = NoHostReads() if monkeypatch is not None else contextlib.nullcontext()
    policy = get_policy(policy_name)
    optimizer = policy.make_optimizer(learner.trainable_parameters(), lr=1e-3)
    step_guard = StepGuard(torch.device("cpu"))
    losses: list[torch.Tensor] = []
    for i in range(collects):
        with guard:
            learner.collect(env, i / collects)
            for loss in learner.losses():
                result = policy.backward_and_step(
                    loss, optimizer, step_guard, max_grad_norm=max_grad_norm
                )
                losses.append(result.loss)
                learner.after_step()
    assert step_guard.skipped.item() == 0
    return losses


def tiny_env(config: Any, policy: str = "f32", seed: int = 0) -> TradingEnv:
    """80 bars of fixed random features and returns for ``SHAPE``, with the learner
    config's ``num_envs`` and ``episode_len``; features in ``policy``'s input dtype."""
    gen = torch.Generator().manual_seed(123)
    bars, lookback = 80, SHAPE.lookback
    features = torch.randn(bars, SHAPE.n_assets, SHAPE.n_features, generator=gen)
    returns = 0.01 * torch.randn(bars, SHAPE.n_assets, generator=gen)
    return TradingEnv(
        get_policy(policy).convert_input(features),
        returns,
        lookback,
        (lookback - 1, bars - 1),
        config.num_envs,
        config.episode_len,
        cost=1e-3,
        seed=seed,
    )


def tiny_learner(
    build: Callable[[Any, DataShape], T], config: Any, policy: str = "f32", seed: int = 0
) -> T:
    """``build(config, SHAPE)`` with torch seeded by ``seed``, converted to ``policy``."""
    torch.manual_seed(seed)
    learner = build(config, SHAPE)
    get_policy(policy).convert_module(learner)
    return learner
