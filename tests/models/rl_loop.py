"""The trainer's RL loop in miniature, for learner tests (DQN, PPO): collect, then one
guarded optimizer step per loss the learner yields, each followed by ``after_step``;
the tiny environment and learners they run on; and :class:`NoHostReads`, the CPU stand-in
for a CUDA sync check that the step tests share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.base import DataShape
from trainables.env import TradingEnv
from trainables.precision import StepGuard, get_policy

aten = torch.ops.aten
SHAPE = DataShape(n_features=3, lookback=4, n_assets=2)
T = TypeVar("T", bound=torch.nn.Module)

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
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        reason = syncing_reason(func, args, kwargs)
        if reason is not None:
            raise AssertionError(f"host sync in the hot loop: {reason}")
        return func(*args, **kwargs)


class NoHostReads:
    """Make every Tensor -> Python conversion raise while active, and every ATen op that
    syncs a CUDA device (``_local_scalar_dense``, ``nonzero``, boolean-mask indexing, ...),
    wherever it is called from, forward or backward: a CPU stand-in for
    ``torch.cuda.set_sync_debug_mode('error')``. :meth:`allowed` lifts it for a region
    the caller documents as outside the step (a once-per-epoch refit)."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self._mode: _SyncingOps | None = None

    def __enter__(self) -> NoHostReads:
        def forbidden(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("host read of a tensor in the hot loop")

        for name in self.NAMES:
            self.monkeypatch.setattr(torch.Tensor, name, forbidden)
        self._mode = _SyncingOps()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._mode is not None
        self._mode.__exit__(*exc)
        self._mode = None
        self.monkeypatch.undo()

    @contextlib.contextmanager
    def allowed(self) -> Iterator[None]:
        self.__exit__(None, None, None)
        try:
            yield
        finally:
            self.__enter__()


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
    guard = NoHostReads(monkeypatch) if monkeypatch is not None else contextlib.nullcontext()
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
