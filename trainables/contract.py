"""The family contract, checked: what every family, built in or a desk's own, must do.

``hpo check-family REF`` runs :func:`run_checks` and prints what holds; the ten built-in
families pass the same checks in ``tests/models/test_contract.py`` and
``tests/models/test_step_contract.py``, which call these functions, so the two cannot
drift. Each check raises :class:`ContractFailure` naming what does not hold:

record        the family resolves, its contract version and records are consistent, and
              its tiny configuration builds
precision     under a precision: the weights' dtypes its policy promises, outputs
              of the right shape (positions in [-1, 1]), a short run that is finite and
              skips nothing, a checkpoint that round-trips and resumes bit for bit
host reads    the training step reads nothing on the host (it could not run at the
              speed of a GPU's kernels, nor be captured in a CUDA graph)
learning      trained, it beats its untrained self on the planted synthetic signal
fusion        its folds train fused, or it says why not (a fallback, never an error)

The contract itself: docs/families.md.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models import FamilyError, get_family
from models.base import ForecastModel, RLLearner
from trainables.checkpoint import load_checkpoint
from trainables.config import DataConfig, TrainConfig
from trainables.precision import BF16, F32, keep_f32_names
from trainables.trainer import Trainer

PRECISIONS = ("f32", "bf16", "bf16-mixed", "fp16-mixed")


class ContractFailure(AssertionError):
    """A family breaks the contract (the message says what does not hold)."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ContractFailure(message)


# --------------------------------------------------------------------------------------
# tiny trials


def tiny_config(family: str, precision: str = "f32", **overrides: Any) -> TrainConfig:
    """A trial of ``family`` at its tiny size (``Family.tiny``) on a small synthetic set:
    seconds on one CPU core."""
    values: dict[str, Any] = {
        "family": family,
        "precision": precision,
        "epochs": 2,
        "n_folds": 1,
        "lookback": 16,
        "batch_size": 32,
        "max_steps_per_epoch": 4,
        "rl_iterations": 6,
        "device": "cpu",
        "model_config": dict(get_family(family).tiny),
        "data": DataConfig(n_bars=600, n_assets=2),
    }
    values.update(overrides)
    return TrainConfig(**values)


def fold_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every fold's weights, cloned, keyed ``<fold>.<name>``."""
    return {
        f"{run.index}.{k}": v.clone()
        for run in trainer.folds
        for k, v in run.model.state_dict().items()
    }


# --------------------------------------------------------------------------------------
# the checks


def check_record(family_ref: str) -> str:
    family = get_family(family_ref)  # the contract version and records (models.get_family)
    config = family.make_config(dict(family.tiny))
    default = family.default_config()
    for name, dim in family.search_space.items():
        _require(dim.contains(getattr(default, name)), f"default {name} is outside its range")
    _require(bool(family.keeps_f32), "keeps_f32 is empty: say what stays f32 under bf16, and why")
    return f"{family.name} ({family.kind}, contract {family.contract}); tiny config {config}"


def check_precision(family_ref: str, precision: str, directory: Path | None = None) -> str:
    """dtypes, output shapes, a finite short run and a bit-exact round trip and resume."""
    family = get_family(family_ref)
    probe = Trainer(tiny_config(family_ref, precision))
    run = probe.folds[0]
    keep = keep_f32_names(run.model)
    for name, p in run.model.named_parameters():
        expected = BF16 if precision == "bf16" and name not in keep else F32
        _require(
            p.dtype == expected, f"{precision}: {name} is {p.dtype}, its policy holds {expected}"
        )
    with torch.no_grad():
        if family.kind == "forecast":
            _require(isinstance(run.model, ForecastModel), "its module has no loss/positions")
            batch = run.data.batch(run.data.decision_times(run.data.val)[:5])
            with probe.policy.autocast():
                positions = run.model.positions(batch).float()  # type: ignore[operator]
            shape = (5, probe.shape.n_assets)
            _require(
                positions.shape == shape,
                f"positions have shape {tuple(positions.shape)}, not {shape}",
            )
            inside = bool(((positions >= -1) & (positions <= 1)).all())
            _require(
                inside, f"positions outside [-1, 1]: {positions.min():.3g} to {positions.max():.3g}"
            )
        else:
            _require(isinstance(run.model, RLLearner), "its module is not an RLLearner")
            assert run.env is not None
            with probe.policy.autocast():
                actions = run.model.act(run.env.observe())  # type: ignore[operator]
            ok = actions.shape == (run.env.num_envs,) and actions.dtype == torch.int64
            _require(ok, f"actions have shape {tuple(actions.shape)} and dtype {actions.dtype}")
            valid = bool(((actions >= 0) & (actions < probe.shape.n_actions)).all())
            _require(valid, "actions outside [0, n_actions)")

    straight = Trainer(tiny_config(family_ref, precision))
    history = straight.fit()
    for metrics in history:
        _require(
            metrics["skipped_steps"] == 0, f"{precision}: {metrics['skipped_steps']} steps skipped"
        )
        for key in ("train_loss", "val_sharpe", "test_sharpe"):
            _require(math.isfinite(metrics[key]), f"{precision}: {key} is {metrics[key]}")

    # Stop after one of the same two epochs (schedules such as epsilon depend on the total).
    with contextlib.ExitStack() as stack:
        where = directory or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        first = Trainer(tiny_config(family_ref, precision))
        first.train_epoch()
        first.save(where / "ckpt")
        restored = Trainer(
            tiny_config(family_ref, precision), checkpoint=load_checkpoint(where / "ckpt")
        )
    loaded = fold_weights(restored)
    for name, tensor in fold_weights(first).items():
        _require(torch.equal(loaded[name], tensor), f"{name} does not round-trip")
    restored.fit()
    resumed = fold_weights(restored)
    for name, tensor in fold_weights(straight).items():
        _require(torch.equal(resumed[name], tensor), f"resumed {name} differs")
    same = restored.history[-1]["val_sharpe"] == history[-1]["val_sharpe"]
    _require(same, "a resumed trial ends with another validation Sharpe")
    return f"{precision}: dtypes, shapes, finite run, bit-exact round trip and resume"


def check_host_reads(family_ref: str, precision: str = "f32") -> str:
    """The trainer's training loop (forward, loss, backward, guarded step) reads nothing
    on the host; a family's once-per-epoch refit (``on_epoch_start``) is allowed to."""
    family = get_family(family_ref)
    model_config = dict(family.tiny)
    if "learning_starts" in family.config_fields():  # learning from its replay: at once
        tiny = family.make_config(model_config)
        first = 2 * getattr(tiny, "num_envs", 8)  # two collects' transitions
        model_config["learning_starts"] = max(1, min(tiny.learning_starts, first))
    config = tiny_config(
        family_ref,
        precision,
        epochs=1,
        max_steps_per_epoch=2,
        rl_iterations=2,
        log_every=10**6,  # the trainer's own divergence read is not part of the step
        model_config=model_config,
        data=DataConfig(n_bars=400, n_assets=2),
    )
    trainer = Trainer(config)
    run = trainer.folds[0]
    guard = NoHostReads()
    refit = getattr(run.model, "on_epoch_start", None)
    if refit is not None:  # once per epoch, before the first step: not part of the step

        def allowed_refit(batch: Any) -> None:
            with guard.allowed():
                refit(batch)

        run.model.on_epoch_start = allowed_refit  # type: ignore[assignment]
    train = trainer.train_fold
    try:
        with guard:
            loss_sum, n_ok = train(run)
    finally:
        if refit is not None:
            del run.model.on_epoch_start
    steps = trainer.global_step
    _require(steps >= 2, f"took {steps} steps: the check saw no step")
    skipped = int(run.guard.skipped)
    _require(float(n_ok) + skipped == steps, "a step was not counted")
    _require(skipped == 0 or precision == "fp16-mixed", f"{skipped} steps skipped")
    _require(bool(torch.isfinite(loss_sum)), "the training loss is not finite")
    return f"{steps} steps under {precision}, no host read"


@dataclass(frozen=True)
class LearningCheck:
    """A budget for the learning check and what passing means."""

    config: dict[str, Any]
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    min_mean: float = 2.0  # mean trained validation Sharpe must exceed this
    min_gain: float = 2.0  # ... and beat the mean untrained one by this much
    min_each: float = 1.0  # every seed's trained Sharpe must exceed this
    notes: str = field(default="", compare=False)


# A few hundred steps on 4 synthetic assets with the planted signal (strength 0.15): on
# this data, trading the sign of the last standardized return scores a validation Sharpe
# of about 2-3. Looser than the built-in families' tuned budgets (tests/models/learning.py).
DEFAULT_LEARNING = LearningCheck(
    {
        "epochs": 3,
        "max_steps_per_epoch": 60,
        "lr": 3e-3,
        "data": DataConfig(n_bars=1000, n_assets=4),
    },
    seeds=(0, 1, 2),
    min_mean=1.0,
    min_gain=1.0,
    min_each=0.0,
)


def untrained_and_trained_sharpe(
    config: TrainConfig, seeds: Sequence[int]
) -> tuple[list[float], list[float]]:
    """Validation Sharpe before and after training, one pair per seed. A single untrained
    model is a coin flip on this data, so learning is judged on the mean over seeds."""
    untrained, trained = [], []
    for seed in seeds:
        trainer = Trainer(config.replace(seed=seed))
        untrained.append(trainer.evaluate(trainer.folds[0], trainer.folds[0].data.val).sharpe)
        trained.append(trainer.fit()[-1]["val_sharpe"])
    return untrained, trained


def check_learning(
    family_ref: str, budget: LearningCheck = DEFAULT_LEARNING, precision: str = "f32"
) -> str:
    values = {**budget.config}
    values.setdefault("model_config", dict(get_family(family_ref).tiny))
    config = tiny_config(family_ref, precision, **values)
    untrained, trained = untrained_and_trained_sharpe(config, budget.seeds)
    mean_untrained = sum(untrained) / len(untrained)
    mean_trained = sum(trained) / len(trained)
    seen = f"validation Sharpe {mean_untrained:+.2f} untrained -> {mean_trained:+.2f} trained (mean of {len(trained)} seeds)"
    _require(mean_trained > budget.min_mean, f"{seen}; needs more than {budget.min_mean}")
    _require(
        mean_trained - mean_untrained > budget.min_gain,
        f"{seen}; needs a gain over {budget.min_gain}",
    )
    _require(min(trained) > budget.min_each, f"{seen}; each seed must exceed {budget.min_each}")
    return seen


def check_fusion(family_ref: str) -> str:
    """Two folds with ``fuse = "on"``: they train fused, or the trainer says why not (a
    fallback, never an error); either way the epoch runs."""
    family = get_family(family_ref)
    trainer = Trainer(tiny_config(family_ref, "f32", n_folds=2, fuse="on", epochs=1))
    metrics = trainer.train_epoch()
    _require(math.isfinite(metrics["train_loss"]), "the epoch's loss is not finite")
    if trainer.fused is not None:
        return f"{metrics['fused_folds']} folds fused"
    return f"trains unfused: {trainer.unfused_reason}" + (
        "" if family.fuses else " (rl families do not fuse)"
    )


def run_checks(
    family_ref: str,
    precisions: Sequence[str] = PRECISIONS,
    learning: LearningCheck | None = DEFAULT_LEARNING,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Every check on ``family_ref``; a failure is recorded with its message, and the
    checks after it still run (a family that does not resolve stops there)."""
    checks: list[tuple[str, Callable[[], str]]] = [("record", lambda: check_record(family_ref))]
    for precision in precisions:
        checks.append((f"precision {precision}", partial(check_precision, family_ref, precision)))
    checks.append(("host reads", lambda: check_host_reads(family_ref)))
    if learning is not None:
        checks.append(("learning", lambda: check_learning(family_ref, learning)))
    checks.append(("fusion", lambda: check_fusion(family_ref)))
    results = []
    for name, check in checks:
        try:
            result = CheckResult(name, True, check())
        except Exception as exc:  # the family's own failure: named, never raised
            detail = (
                str(exc)
                if isinstance(exc, ContractFailure | FamilyError)  # they say what is wrong
                else f"{type(exc).__name__}: {exc}"
            )
            result = CheckResult(name, False, detail)
        results.append(result)
        if on_result is not None:
            on_result(result)
        if name == "record" and not result.passed:
            break
    return results


# --------------------------------------------------------------------------------------
# no host reads: a CPU stand-in for torch.cuda.set_sync_debug_mode("error")

aten = torch.ops.aten
# ATen ops whose CUDA kernels wait for the device: a scalar read, or an output whose size
# depends on tensor values (which also breaks static shapes, so CUDA graph capture).
_SYNCING = {
    aten._local_scalar_dense,  # .item(), int(t), float(t), bool(t), if t: ...
    aten.is_nonzero,
    aten.equal,
    aten.nonzero,
    aten.masked_select,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.bincount,
}
_INDEXED = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


def syncing_reason(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why ``func(*args, **kwargs)`` would sync the host with a CUDA device, or None."""
    packet = func.overloadpacket
    if packet in _SYNCING:
        return f"{func} reads a tensor on the host or sizes its output by tensor values"
    if (
        packet is aten.repeat_interleave
        and func is not aten.repeat_interleave.self_int
        and kwargs.get("output_size") is None
    ):
        return f"{func} with tensor repeats and no output_size"
    if packet in _INDEXED and len(args) > 1:
        for index in args[1]:
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
                return f"{func} with a boolean mask (a nonzero inside)"
    return None


class _SyncingOps(TorchDispatchMode):
    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        reason = syncing_reason(func, args, kwargs)
        if reason is not None:
            raise ContractFailure(f"host sync in the hot loop: {reason}")
        return func(*args, **kwargs)


class NoHostReads:
    """Make every Tensor -> Python conversion raise while active, and every ATen op that
    syncs a CUDA device (``_local_scalar_dense``, ``nonzero``, boolean-mask indexing, ...),
    wherever it is called from, forward or backward. :meth:`allowed` lifts it for a region
    the caller documents as outside the step (a once-per-epoch refit)."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self) -> None:
        self._mode: _SyncingOps | None = None
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> NoHostReads:
        def forbidden(*_args: object, **_kwargs: object) -> None:
            raise ContractFailure("host read of a tensor in the hot loop")

        for name in self.NAMES:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, forbidden)
        self._mode = _SyncingOps()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._mode is not None
        self._mode.__exit__(*exc)
        self._mode = None
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        self._saved.clear()

    @contextlib.contextmanager
    def allowed(self) -> Iterator[None]:
        self.__exit__(None, None, None)
        try:
            yield
        finally:
            self.__enter__()
