"""The contract every model family meets, and the search-space vocabulary of its adapter.

A family is one file in ``models/`` holding four things (nanoGPT / cleanrl style):
its config dataclass, its ``nn.Module``, its search space, and how its output becomes a
position in [-1, 1]. ``models/__init__.py`` registers each one explicitly.

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

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import torch
from torch import nn

CONTRACT_VERSION = 1
"""The family contract this release implements (``Family.contract``). A family written
against an earlier version keeps working, or is refused with the change it needs; one
written against a later version is refused (docs/families.md, "Versions")."""

# --------------------------------------------------------------------------------------
# Search-space vocabulary (searcher-neutral; hpo.search turns it into Tune/Optuna spaces)


@dataclass(frozen=True)
class Float:
    """A real-valued hyperparameter in [low, high], log-uniform when ``log``."""

    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"Float needs low < high, got [{self.low}, {self.high}]")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scaled Float needs low > 0, got {self.low}")

    def contains(self, value: Any) -> bool:
        return isinstance(value, int | float) and self.low <= float(value) <= self.high


@dataclass(frozen=True)
class Int:
    """An integer hyperparameter in [low, high] (inclusive), log-uniform when ``log``."""

    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"Int needs low <= high, got [{self.low}, {self.high}]")
        if self.log and self.low <= 0:
            raise ValueError(f"a log-scaled Int needs low > 0, got {self.low}")

    def contains(self, value: Any) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
        )


@dataclass(frozen=True)
class Choice:
    """A categorical hyperparameter."""

    options: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError("Choice needs at least one option")

    def contains(self, value: Any) -> bool:
        return value in self.options


Dim: TypeAlias = Float | Int | Choice
SearchSpace: TypeAlias = Mapping[str, Dim]


def describe_dim(dim: Dim) -> str:
    if isinstance(dim, Choice):
        return "one of " + ", ".join(repr(o) for o in dim.options)
    scale = " (log)" if dim.log else ""
    kind = "float" if isinstance(dim, Float) else "int"
    return f"{kind} in [{dim.low:g}, {dim.high:g}]{scale}"


# --------------------------------------------------------------------------------------
# What the trainer hands a model


@dataclass(frozen=True)
class DataShape:
    """The sizes a family needs to build its module for a dataset."""

    n_features: int  # F
    lookback: int  # L
    n_assets: int  # A
    n_actions: int = 3  # rl families: actions map to positions linspace(-1, 1, n_actions)


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


# --------------------------------------------------------------------------------------
# The family record


FamilyKind = Literal["forecast", "rl"]


@dataclass(frozen=True)
class Family:
    """Registry entry of one model family."""

    name: str
    kind: FamilyKind
    config_cls: type
    build: Callable[[Any, DataShape], nn.Module]
    search_space: SearchSpace
    paper: str
    keeps_f32: str  # what stays f32 under bf16, and why (shown by `hpo families`)
    summary: str = ""
    confidence: str = ""
    """How its confidence in [0, 1] (ensembles, ``forecast_signal`` / ``act_and_confidence``)
    is read off what it computes; beside the position mapping in ``summary``."""
    static_step: bool | None = None
    """Whether one training step runs the same kernels on same-shaped tensors every time:
    no host read, no data-dependent shape, no Python branch on a tensor value. Such a step
    can be captured in a CUDA graph (``trainer.cuda_graphs = "auto"``). None: True for
    forecast families (their step is ``model.loss`` on a fixed-size :class:`Batch`,
    checked for every family by tests/models/test_step_contract.py), False for rl families
    (their steps come from a Python generator over replay or rollouts)."""
    shape_settings: frozenset[str] = frozenset()
    """Settings that change the module's shapes or structure (a width, a depth, a kernel,
    a layer kind, the loss): models that differ in one cannot share a fused stack. Every
    other setting (rates, loss weights, position scale, initialization) leaves one module
    the same shape; checked by tests/models/test_contract.py."""
    per_trial_settings: frozenset[str] = frozenset()
    """Settings the trials of a group trial may differ in: ones the fused training step
    never reads (the position scale, read only where positions are taken, by each trial's
    own module; an initialization range, read only when a trial's module is built) and
    ones it reads per slot, as a tensor: a dropout rate (every dropout the setting feeds
    is a :class:`models.ops.Dropout`), a loss weight the module also holds as a 0-d buffer
    named in ``setting_buffers`` and reads through :func:`models.ops.per_slot`, a buffer
    derived from the setting (a noise schedule). Each trial evaluates and saves with its
    own values. Empty: the trials share every model setting. Checked per family by
    tests/trainables/test_group.py (trials that differ in them train as they would
    alone; a trial without dropout beside one with it, as it would alone)."""
    fusable: bool | None = None
    """Whether same-shape models of the family can train fused (one vmapped model, see
    ``trainables.stacked``). None: True for forecast families, False for rl families
    (their environments and replay buffers have no slot dimension yet)."""
    fuse_on_cpu: bool = True
    """Whether ``trainer.fuse = "auto"`` fuses on a CPU: False where ``bench/step_ops.py
    --slots`` measured the fused step slower there than the folds one by one (a
    GPU, launch-bound for these sizes, fuses every fusable family)."""
    tiny: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Settings of a small build (a few thousand parameters) that ``hpo check-family``
    and the tests train in seconds; empty: the defaults are small enough."""
    contract: int = CONTRACT_VERSION
    """The version of the family contract (:data:`CONTRACT_VERSION`) it was written for."""

    def default_config(self) -> Any:
        return self.config_cls()

    @property
    def fuses(self) -> bool:
        """:attr:`fusable`, with its default resolved by kind."""
        return self.kind == "forecast" if self.fusable is None else self.fusable

    @property
    def step_is_static(self) -> bool:
        """:attr:`static_step`, with its default resolved by kind."""
        return self.kind == "forecast" if self.static_step is None else self.static_step

    def config_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.config_cls))

    def make_config(self, values: Mapping[str, Any]) -> Any:
        """Config dataclass from ``values``; unknown keys are an error naming them."""
        known = set(self.config_fields())
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"family {self.name!r} has no setting(s) {unknown}; known: {sorted(known)}"
            )
        return self.config_cls(**values)


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


def check_choices(name: str, value: Any, options: Sequence[Any]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")


def is_integer(value: Any) -> bool:
    """An integer setting: ints and numpy integers (what some searchers sample), no bools."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int = 1, high: int | None = None, why: str = "") -> None:
    """``value`` must be an integer in [low, high] (no upper end when ``high`` is None);
    ``why``, when given, is added to the error in parentheses."""
    if is_integer(value) and low <= value and (high is None or value <= high):
        return
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    reason = f" ({why})" if why else ""
    raise ValueError(f"{name} must be an integer {allowed}{reason}, got {value!r}")


def check_positive(name: str, value: Any) -> None:
    """``value`` must be a positive, finite number."""
    if isinstance(value, bool) or not (
        isinstance(value, numbers.Real) and float(value) > 0 and math.isfinite(value)
    ):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
