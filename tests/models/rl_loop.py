"""The trainer's RL loop in miniature, for learner tests (DQN, PPO): collect, then one
guarded optimizer step per loss the learner yields, each followed by ``after_step``."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from trainables.env import TradingEnv
from trainables.precision import StepGuard, get_policy


class NoHostReads:
    """Make every Tensor -> Python conversion raise while active (a CPU stand-in for
    ``torch.cuda.set_sync_debug_mode('error')``)."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def __enter__(self) -> None:
        def forbidden(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("host read of a tensor in the hot loop")

        for name in self.NAMES:
            self.monkeypatch.setattr(torch.Tensor, name, forbidden)

    def __exit__(self, *_exc: object) -> None:
        self.monkeypatch.undo()


def train_learner(
    learner: Any,
    env: TradingEnv,
    policy_name: str,
    collects: int,
    monkeypatch: pytest.MonkeyPatch | None = None,
    max_grad_norm: float = 1.0,
) -> list[torch.Tensor]:
    """Run ``collects`` cycles; with ``monkeypatch``, the learner's calls run under
    :class:`NoHostReads`. Asserts no step was skipped; returns the step losses."""
    guard = NoHostReads(monkeypatch) if monkeypatch is not None else contextlib.nullcontext()
    policy = get_policy(policy_name)
    optimizer = policy.make_optimizer(learner.trainable_parameters(), lr=1e-3)
    step_guard = StepGuard(torch.device("cpu"))
    losses: list[torch.Tensor] = []
    for i in range(collects):
        with guard:
            learner.collect(env, i / collects)
        pending = learner.losses()
        while True:
            with guard:
                loss = next(pending, None)
            if loss is None:
                break
            result = policy.backward_and_step(
                loss, optimizer, step_guard, max_grad_norm=max_grad_norm
            )
            losses.append(result.loss)
            with guard:
                learner.after_step()
    assert step_guard.skipped.item() == 0
    return losses
