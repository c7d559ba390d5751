"""The fused stack: K forecast models of one shape trained as one vmapped model.

The families are small; on a GPU a training step is hundreds of tiny kernels, launch-bound.
:class:`StackedModules` holds K same-shape modules' parameters and buffers stacked along a
leading dimension, one *slot* k per model, and computes every slot's loss in one pass
(``torch.func.functional_call`` under ``vmap``, random numbers drawn per slot), so one
backward of the summed loss and one multi-tensor optimizer step over the stacked
parameters train all K (:meth:`trainables.precision.PrecisionPolicy.backward_and_step`
clips, scales and skips each slot on its own).

The modules in the slots stay whole: their parameters and buffers are views of the
stacked tensors, so evaluation, checkpoints and restores read and write a slot's module
exactly as an unfused model, and :meth:`StackedModules.release` gives each its own storage
again. :class:`StackedFolds` stacks the slots' data (each fold its own normalization) and
gathers a minibatch of every slot in one indexing op.

A slot holds one fold of one trial: a trial's walk-forward folds fill the slots (the
trainer's ``fuse`` setting), and a group trial's slots are the folds of all its trials.
Why and what it costs: docs/precision.md, "Fused slots".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from models.base import Batch
from trainables.dataset import FoldData


class _LossOf(nn.Module):
    """``module.loss`` as a forward, for ``functional_call`` (which calls forward)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.m = module

    def forward(self, x: torch.Tensor, y: torch.Tensor, gaps: torch.Tensor) -> torch.Tensor:
        return self.m.loss(Batch(x=x, y=y, gaps=gaps))  # type: ignore[operator]


class StackedModules(nn.Module):
    """K modules of one shape as one module: each parameter ``(K, ...)``.

    Its parameters are what the optimizer steps (``n_slots=K``); :meth:`loss` is every
    slot's loss on its own minibatch. Built from the slots' modules after they are
    built, converted to their policy's dtypes and restored: the stacked tensors start as
    copies of theirs, and the modules' tensors become views of them.

    The tensors are per slot; what a module keeps only in Python (a position scale) is
    the first slot's for all of them. A trial's folds share every setting; slots that
    differ in such a setting (a group trial's trials) need it as a tensor: a buffer a
    module names in ``setting_buffers`` (:class:`models.ops.Dropout`'s rate). Such a
    buffer goes into the vmap per slot only where the slots' values differ; where they
    agree the module reads its own, unbatched, and takes its plain path (``nn.Dropout``'s).
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        if not modules:
            raise ValueError("fusing needs at least one module")
        shapes = [_layout(m) for m in modules]
        if any(s != shapes[0] for s in shapes[1:]):
            raise ValueError("fused modules must have the same parameters, shapes and dtypes")
        self._slot_layout = shapes[0]
        self.k = len(modules)
        params, buffers = stack_module_state(list(modules))
        self.names = list(params)
        self.stacked = nn.ParameterList(nn.Parameter(params[n]) for n in self.names)
        self.buffer_names = list(buffers)
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"b{i}", buffers[name])
        # The slots' modules by reference only: registering them would add their
        # parameters (views of the stacked ones) to this module's.
        self._slot_modules: tuple[nn.Module, ...] = tuple(modules)
        self._loss_of = (_LossOf(modules[0]),)  # the skeleton functional_call reparametrizes
        self.shared_settings = self._shared_settings()
        for k, module in enumerate(modules):
            self._point(k, module)

    def _shared_settings(self) -> set[str]:
        """The setting buffers every slot holds at one value: read from the skeleton (slot
        0's module), not vmapped."""
        buffers = dict(zip(self.buffer_names, self.stacked_buffers(), strict=True))
        return {
            name
            for name in setting_buffers(self._slot_modules[0])
            if bool((buffers[name] == buffers[name][0]).all())
        }

    def fits(self, module: nn.Module) -> bool:
        """Whether ``module`` has the slots' parameters and buffers (names, shapes, dtypes)."""
        return _layout(module) == self._slot_layout

    @torch.no_grad()
    def replace(self, k: int, module: nn.Module) -> None:
        """Slot k holds ``module`` from now on, as if it had been stacked there: its
        parameters' and buffers' values are copied into slot k of the stacked tensors and
        become views of them; the settings every slot holds at one value are found again,
        and slot 0's module is the skeleton. The module slot k held is left as it is
        (its tensors still view the stack). Raises ValueError, changing nothing, when
        ``module`` does not :meth:`fits`."""
        if not self.fits(module):
            raise ValueError("a slot's module must have the stack's parameters, shapes and dtypes")
        own = dict(module.named_parameters())
        for name, stacked in zip(self.names, self.stacked, strict=True):
            stacked.data[k].copy_(own[name])
        buffers = dict(module.named_buffers())
        for name, stacked in zip(self.buffer_names, self.stacked_buffers(), strict=True):
            stacked[k].copy_(buffers[name])
        modules = list(self._slot_modules)
        modules[k] = module
        self._slot_modules = tuple(modules)
        if k == 0:
            self._loss_of = (_LossOf(module),)
        self.shared_settings = self._shared_settings()
        self._point(k, module)

    @property
    def slot_modules(self) -> tuple[nn.Module, ...]:
        """The module in each slot, by slot."""
        return self._slot_modules

    def stacked_buffers(self) -> list[torch.Tensor]:
        return [getattr(self, f"b{i}") for i in range(len(self.buffer_names))]

    def _point(self, k: int, module: nn.Module) -> None:
        """Slot k's module's tensors become views of the stacked ones."""
        own = dict(module.named_parameters())
        for name, stacked in zip(self.names, self.stacked, strict=True):
            own[name].data = stacked.data[k]
        buffers = dict(module.named_buffers())
        for name, stacked in zip(self.buffer_names, self.stacked_buffers(), strict=True):
            buffers[name].data = stacked[k]

    def pairs(self, k: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(stacked parameter, slot k's module's parameter) for each parameter, in order."""
        own = dict(self._slot_modules[k].named_parameters())
        return [
            (stacked, own[name]) for name, stacked in zip(self.names, self.stacked, strict=True)
        ]

    def loss(self, batch: Batch, slots: torch.Tensor | None = None) -> torch.Tensor:
        """(K,) losses: slot k's on ``batch``'s k-th slice (every field ``(K, ...)``).
        With ``slots`` (indices, ``(M,)``), only those slots' losses, ``(M,)``, on a
        batch of M slices: the others take no compute (their gradients are zero)."""
        skeleton = self._loss_of[0]

        def chosen(t: torch.Tensor) -> torch.Tensor:
            return t if slots is None else t.index_select(0, slots)

        params = {"m." + n: chosen(p) for n, p in zip(self.names, self.stacked, strict=True)}
        buffers = {
            "m." + n: chosen(b)
            for n, b in zip(self.buffer_names, self.stacked_buffers(), strict=True)
            if n not in self.shared_settings
        }

        def slot_loss(
            p: dict[str, torch.Tensor],
            b: dict[str, torch.Tensor],
            x: torch.Tensor,
            y: torch.Tensor,
            gaps: torch.Tensor,
        ) -> torch.Tensor:
            return functional_call(skeleton, (p, b), (x, y, gaps))

        return vmap(slot_loss, randomness="different")(
            params, buffers, batch.x, batch.y, batch.gaps
        )

    def train(self, mode: bool = True) -> StackedModules:
        super().train(mode)
        for module in self._slot_modules:
            module.train(mode)
        return self

    def release(self) -> None:
        """Give every slot's module its own storage again (copies of its current values)."""
        for module in self._slot_modules:
            for t in (*module.parameters(), *module.buffers()):
                t.data = t.data.clone()


def _layout(module: nn.Module) -> list[tuple[str, torch.Size, torch.dtype]]:
    """(name, shape, dtype) of each of ``module``'s parameters, then buffers, in order."""
    return [(n, t.shape, t.dtype) for n, t in (*module.named_parameters(), *module.named_buffers())]


def setting_buffers(module: nn.Module) -> set[str]:
    """The names of ``module``'s buffers that hold a setting (its modules'
    ``setting_buffers``): read by the step, never written."""
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, sub in module.named_modules()
        for name in getattr(sub, "setting_buffers", ())
    }


@dataclass
class StackedFolds:
    """The slots' fold data stacked: features ``(K, T, A, F)``, targets ``(K, T, A)``
    (each fold normalized with its own training statistics), the shared bar gaps."""

    features: torch.Tensor
    targets: torch.Tensor
    gaps: torch.Tensor
    lookback: int

    def __post_init__(self) -> None:
        self._windows = self.features.unfold(1, self.lookback, 1)  # (K, T-L+1, A, F, L) view
        self._gap_windows = self.gaps.unfold(0, self.lookback, 1)  # (T-L+1, L) view
        k = self.features.shape[0]
        self._slots = torch.arange(k, device=self.features.device).unsqueeze(1)  # (K, 1)

    @classmethod
    def stack(cls, folds: Sequence[FoldData]) -> tuple[StackedFolds, list[FoldData]]:
        """The stacked data of ``folds`` and each fold's data as views of it (the folds'
        own tensors are then no longer needed)."""
        first = folds[0]
        stacked = cls(
            features=torch.stack([f.features for f in folds]),
            targets=torch.stack([f.targets for f in folds]),
            gaps=first.gaps,
            lookback=first.lookback,
        )
        views = [
            FoldData(
                features=stacked.features[k],
                targets=stacked.targets[k],
                bar_returns=f.bar_returns,
                gaps=f.gaps,
                lookback=f.lookback,
                train=f.train,
                val=f.val,
                test=f.test,
                feature_mean=f.feature_mean,
                feature_std=f.feature_std,
            )
            for k, f in enumerate(folds)
        ]
        return stacked, views

    def batch(self, t: torch.Tensor, slots: torch.Tensor | None = None) -> Batch:
        """Every slot's windows at its decision bars ``t`` ((K, B) int64 on the device):
        x (K, B, A, L, F), y (K, B, A), gaps (K, B, L); with ``slots`` ((M,) indices),
        those slots' windows at ``t`` ((M, B))."""
        slot = self._slots if slots is None else slots.unsqueeze(1)
        start = t - (self.lookback - 1)
        x = self._windows[slot, start].permute(0, 1, 2, 4, 3)
        return Batch(x=x, y=self.targets[slot, t], gaps=self._gap_windows[start])


def epoch_schedule(
    orders: Sequence[torch.Tensor], batch_size: int, max_steps: int | None
) -> tuple[torch.Tensor, list[int]]:
    """One epoch of every slot's minibatches, aligned: ``times (K, S, B)`` and each
    slot's step count. Slot k takes its own shuffled ``orders[k]`` in batches of
    ``batch_size`` (a short tail dropped, at most ``max_steps``), as it would unfused; its
    rows past its count repeat its first batch (a masked step may compute on them, none
    applies them)."""
    counts = [o.numel() // batch_size for o in orders]
    if max_steps is not None:
        counts = [min(c, max_steps) for c in counts]
    steps = max(counts)
    rows = []
    for order, count in zip(orders, counts, strict=True):
        used = order[: count * batch_size].view(count, batch_size)
        if count < steps:
            filler = order[:batch_size].expand(steps - count, batch_size)
            used = torch.cat([used, filler])
        rows.append(used)
    return torch.stack(rows), counts
