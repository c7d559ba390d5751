"""A family's record and the words its module is written in, without torch.

What the spec, a sweep's driver and ``hpo families`` read of a family is its record
(:class:`Family`): its settings dataclass, search space and facts. The settings
dataclass is checked with the helpers here, and the network is built through
:class:`Network`, which imports the family's network module (and torch) on the first
build. So a family's own module (``models/kan.py``) holds no torch and reading it is
cheap; its network lives in ``models/nets/`` (docs/families.md, "Files").
:mod:`models.base` re-exports everything here beside the torch half of the contract.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

if TYPE_CHECKING:
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


# --------------------------------------------------------------------------------------
# The family record


FamilyKind = Literal["forecast", "rl"]


IMPORTABLE_WHERE = (
    "it must be importable where the sweep runs (an installed package, PYTHONPATH, or "
    "`hpo submit`'s working directory)"
)
"""What a family's module, or its network's, must be: said when either cannot be found."""


@dataclass(frozen=True)
class Network:
    """A family's ``build`` named by import reference (``"models.nets.kan:build"``),
    imported on the first call: a record holding one reads without torch, and only a
    process that builds a network (a trial's worker, ``hpo train``) imports it."""

    reference: str

    def __call__(self, config: Any, shape: DataShape) -> nn.Module:
        module, _, attribute = self.reference.partition(":")
        build: Callable[[Any, DataShape], nn.Module] = getattr(
            importlib.import_module(module), attribute
        )
        return build(config, shape)

    def problem(self) -> str | None:
        """Why the reference cannot resolve, found without running the network's module
        (that would import torch into whoever reads the record): not ``module:ATTR``, a
        module that cannot be found or read, or one whose source binds no ``ATTR``
        anywhere. None when it looks right. Finding the module runs its parent packages'
        ``__init__``, as any import would. A module that fails as it runs (a missing
        dependency) still fails at the first build; ``hpo check-family`` builds it."""
        module, _, attribute = self.reference.partition(":")
        if not module or not attribute.isidentifier():
            return f"network {self.reference!r} is not 'package.module:ATTR'"
        where = f"; {IMPORTABLE_WHERE}"
        try:
            spec = importlib.util.find_spec(module)
        except Exception as exc:  # a parent package missing, or failing to import
            return (
                f"network module {module!r} cannot be found, or its package fails to import "
                f"({type(exc).__name__}: {exc}){where}"
            )
        if spec is None:
            return f"network module {module!r} cannot be found{where}"
        get_source = getattr(spec.loader, "get_source", None)
        try:
            source = get_source(module) if get_source is not None else None
            if source is None:  # compiled, or a loader without source: the build will tell
                return None
            names = _bound_names(ast.parse(source, filename=spec.origin or module))
        except (ImportError, SyntaxError, ValueError) as exc:
            return (
                f"network module {module!r} ({spec.origin}) cannot be read "
                f"({type(exc).__name__}: {exc})"
            )
        if names is None or attribute in names:
            return None
        return f"network module {module!r} ({spec.origin}) defines no {attribute!r}"


# Calls through which a module may bind names the source does not spell as bindings.
_DYNAMIC_BINDERS = frozenset({"globals", "vars", "setattr", "exec"})


def _bound_names(tree: ast.Module) -> set[str] | None:
    """Every name the module's source binds anywhere (a function's locals too: a refusal
    must never be wrong, so this over-collects and a typo, bound nowhere, is still
    caught); None when its names cannot be known from the source (``import *``, a module
    ``__getattr__``, ``globals()`` and its kin, ``sys.modules``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif node.id in _DYNAMIC_BINDERS:
                return None
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.partition(".")[0])
        elif isinstance(node, ast.Global):
            names.update(node.names)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "modules"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            return None  # sys.modules[__name__] = ...: a module replacing itself
    return None if "__getattr__" in names else names


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


# The regression head's settings (models.heads trains with them): shared by the forecast
# families that predict the next standardized return directly.
LossKind = Literal["huber", "mse"]
LOSS_KINDS: tuple[LossKind, ...] = ("huber", "mse")


class HeadConfig(Protocol):
    """The config fields the head reads (every regression family's config has them)."""

    @property
    def loss(self) -> str:
        """ "huber" (robust to fat tails) or "mse"."""
        ...

    @property
    def huber_delta(self) -> float:
        """Huber threshold in standard deviations of the target."""
        ...

    @property
    def position_scale(self) -> float:
        """Position = tanh(position_scale * forecast)."""
        ...


def check_head(config: HeadConfig) -> None:
    """Validate the head's fields of ``config`` (for a family's ``__post_init__``)."""
    check_choices("loss", config.loss, LOSS_KINDS)
    check_positive("huber_delta", config.huber_delta)
    check_positive("position_scale", config.position_scale)
