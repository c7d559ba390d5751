"""The contract every model family meets: what the trainer hands a network and what it
calls on it, with the torch-free half (the family record, the search-space vocabulary,
the settings checks: :mod:`models.family`) re-exported.

A family is two files (nanoGPT / cleanrl style, split where torch begins): its module in
``models/`` holds its config dataclass, its search space and its record, read without
torch by the spec and a sweep's driver; its network in ``models/nets/`` holds the
``nn.Module`` and how its output becomes a position in [-1, 1]. ``models/__init__.py``
registers each one explicitly.

Two kinds of family share the trainer:

* ``forecast`` families are supervised: the trainer feeds :class:`Batch` es of
  past-bar windows and standardized next-bar returns, calls ``model.loss(batch)`` for
  the training step and ``model.positions(batch)`` for validation.
* ``rl`` families learn in the trainer's trading environment; their module is a
  :class:`RLLearner` that collects experience, yields losses for gradient steps and acts
  greedily for validation.

Shapes follow one convention: ``B`` batch, ``A`` assets, ``L`` lookback bars, ``F``
features per bar. Every family accepts the multi-asset window ``(B, A, L, F)``; the
single-asset ones fold ``A`` into the batch, the cross-asset ones (TGGN) use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

import torch
from torch import nn

# The torch-free half of the contract, re-exported: a family's record, its search-space
# vocabulary and the checks of its settings (models.family, which the driver reads).
from models.family import CONTRACT_VERSION as CONTRACT_VERSION
from models.family import Choice as Choice
from models.family import DataShape as DataShape
from models.family import Dim as Dim
from models.family import Family as Family
from models.family import FamilyKind as FamilyKind
from models.family import Float as Float
from models.family import Int as Int
from models.family import Network as Network
from models.family import SearchSpace as SearchSpace
from models.family import check_choices as check_choices
from models.family import check_int as check_int
from models.family import check_positive as check_positive
from models.family import describe_dim as describe_dim
from models.family import is_integer as is_integer

# --------------------------------------------------------------------------------------
# What the trainer hands a model


@dataclass(frozen=True)
class Batch:
    """One supervised minibatch. Floating inputs are already in the policy's data dtype.

    x:       (B, A, L, F) features of the L bars up to and including the decision bar
    y:       (B, A) f32 next-bar return, standardized by the training split's std
    gaps:    (B, L) f32 time since the previous bar in units of the median gap (CfC)
    """

    x: torch.Tensor
    y: torch.Tensor
    gaps: torch.Tensor


@runtime_checkable
class ForecastModel(Protocol):
    """A supervised family's module."""

    def loss(self, batch: Batch) -> torch.Tensor:
        """Scalar training loss (any dtype; the precision policy casts it to f32)."""
        ...

    def positions(self, batch: Batch) -> torch.Tensor:
        """(B, A) positions in [-1, 1] for each window's decision bar (no gradients needed)."""
        ...


# RL observation: the (N, L, F) window of one asset per environment and its current
# position (N,), both in the policy's data dtype.
Obs: TypeAlias = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Transition:
    """One vectorized environment step, as the environment hands it to a learner."""

    obs: Obs
    action: torch.Tensor  # (N,) int64
    reward: torch.Tensor  # (N,) f32
    done: torch.Tensor  # (N,) bool, episode ended after this step
    next_obs: Obs  # observation after the step (a fresh episode's when done)
    final_obs: Obs | None = None
    """The observation this step led to, before any reset (equal to ``next_obs`` where not
    done). An environment sets it when its episodes end by a time limit (truncation, not a
    terminal state): learners then bootstrap from it instead of treating ``done`` as
    terminal (Pardo et al. 2018, "Time Limits in Reinforcement Learning"). ``None``: every
    ``done`` is terminal."""


class TradingEnvLike(Protocol):
    """The part of ``trainables.env.TradingEnv`` a learner uses while collecting."""

    num_envs: int
    n_actions: int

    def observe(self) -> Obs: ...

    def step(self, action: torch.Tensor) -> Transition: ...


@runtime_checkable
class RLLearner(Protocol):
    """An rl family's module: an ``nn.Module`` that owns its networks and its buffer.

    The trainer drives it: ``collect`` runs the current policy in the environment and
    stores what it saw (no gradients); ``losses`` yields the losses of the gradient steps
    due now (the trainer steps the optimizer after each one, then calls ``after_step``);
    ``act`` is the greedy policy used for validation and prediction.
    Parameters that are not trained by the optimizer (target networks) are buffers or
    have ``requires_grad=False``; the trainer optimizes ``trainable_parameters()``.
    """

    def collect(self, env: TradingEnvLike, progress: float) -> None:
        """Step ``env``; ``progress`` in [0, 1] is the share of training done (schedules)."""
        ...

    def losses(self) -> Iterator[torch.Tensor]: ...

    def after_step(self) -> None: ...

    def act(self, obs: Obs) -> torch.Tensor:
        """(N,) greedy action indices."""
        ...

    def positions(self, obs: Obs) -> torch.Tensor:
        """(N,) f32 greedy positions (:func:`greedy_position`: NaN where a score is not finite)."""
        ...

    def trainable_parameters(self) -> Iterator[nn.Parameter]: ...

    def buffer_state(self) -> dict[str, torch.Tensor]:
        """Tensors (replay contents, counters) a checkpoint must keep to resume exactly."""
        ...

    def load_buffer_state(self, state: dict[str, torch.Tensor]) -> None: ...


# --------------------------------------------------------------------------------------
# Confidence (ensembles): what each family already computes, as a number in [0, 1]


@dataclass(frozen=True)
class ForecastSignal:
    """A forecaster's position with what its confidence is read from, for one batch.

    Confidence = erf(|move| / (sqrt(2) sigma)) = 2 Phi(|move| / sigma) - 1, with sigma the
    predicted ``spread`` or, for point forecasts (``spread`` None), the forecast's RMSE on
    validation windows (trainables.ensemble measures it).
    """

    positions: torch.Tensor  # (B, A) f32, exactly ``positions(batch)``
    move: torch.Tensor  # (B, A) f32 predicted next move, units of the target's std
    spread: torch.Tensor | None  # (B, A) f32 predicted std of the move; None: point forecast


@runtime_checkable
class ConfidentForecaster(Protocol):
    """A forecast family's module that reports its confidence (every one here does)."""

    def forecast_signal(self, batch: Batch) -> ForecastSignal: ...


@runtime_checkable
class ConfidentLearner(Protocol):
    """An rl family's module that reports its confidence (every one here does)."""

    def act_and_confidence(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) greedy actions, exactly ``act(obs)`` (one call advances a recurrent state
        once, as ``act`` does), and (N,) f32 confidences in [0, 1]."""
        ...


def action_to_position(action: torch.Tensor, n_actions: int) -> torch.Tensor:
    """Action index -> position: n_actions evenly spaced points of [-1, 1] (3: short/flat/long)."""
    return action.to(torch.float32) * (2.0 / (n_actions - 1)) - 1.0


def greedy_position(scores: torch.Tensor) -> torch.Tensor:
    """(N, n_actions) action scores (Q-values, policy logits) -> (N,) f32 greedy positions.

    A row with a non-finite score gives a NaN position rather than an argmax, which would
    turn a NaN model into a valid-looking strategy; the trainer then ends the trial as
    diverged. Masked on the device (no host sync)."""
    position = action_to_position(scores.argmax(-1), scores.shape[-1])
    return torch.where(torch.isfinite(scores).all(-1), position, torch.nan)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def fold_assets(x: torch.Tensor) -> torch.Tensor:
    """(B, A, L, F) -> (B*A, L, F): treat each asset's window as its own sample."""
    b, a, length, f = x.shape
    return x.reshape(b * a, length, f)


def unfold_assets(y: torch.Tensor, n_assets: int) -> torch.Tensor:
    """(B*A, ...) -> (B, A, ...)."""
    return y.reshape(-1, n_assets, *y.shape[1:])


def inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))
