"""What one walk-forward fold trains with, and the error that ends a trial's training:
the ground the trial loop (:mod:`trainables.trainer`) and fold fusion
(:mod:`trainables.fusion`) share.

The trainer builds a :class:`FoldRun` per fold and steps it; fusion swaps the run's data,
optimizer, guard and scaler for its views of the fused ones (its slot) and back, so a
checkpoint reads a fold the same way fused or not. Both raise or catch
:class:`TrialDiverged`. These live below both modules because the trainer builds its
fusion: fusion does not import the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from trainables.cuda_graphs import StepRunner
from trainables.dataset import FoldData
from trainables.env import TradingEnv
from trainables.optim import GuardedAdamW
from trainables.precision import LossScaler, StepGuard

EPOCH_START_SAMPLE = 512  # windows shown to on_epoch_start hooks


class TrialDiverged(RuntimeError):
    """Training cannot continue: non-finite steps persist after every mitigation."""


class FoldOptimizer(Protocol):
    """What is read of a fold's optimizer outside its step (a checkpoint, fusing and
    unfusing): its own :class:`GuardedAdamW`, or its slot's view of a fused one."""

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...

    @property
    def state(self) -> Mapping[torch.Tensor, Mapping[str, torch.Tensor]]: ...


@dataclass
class FoldRun:
    """Everything one walk-forward fold trains with. When the folds train fused, the
    fold's model, data, optimizer state, guard and scaler are views of the fused ones."""

    index: int
    data: FoldData
    model: nn.Module
    optimizer: GuardedAdamW | FoldOptimizer  # a GuardedAdamW while the fold trains alone
    guard: StepGuard
    scaler: LossScaler | None
    generator: torch.Generator  # minibatch order
    env: TradingEnv | None = None  # rl families only
    step: StepRunner | None = None  # forecast families: built on the first training step
