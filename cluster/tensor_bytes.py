"""Counting the device bytes of a training step from the tensors themselves.

Everything here counts *storages*, not tensors: a view costs nothing extra, and the first
tensor that reaches a storage pays for all of it (a saved slice of a big buffer keeps the
whole buffer alive). Storages are told apart by their data pointer.

* :func:`state_bytes`: parameters (and buffers), gradients and optimizer state of
  modules and their optimizers, exact;
* :func:`reachable_bytes`: every other tensor an object graph holds on the device
  (dataset tensors, replay buffers, environment state, counters);
* :class:`SavedTensors`: activations autograd saves for backward, counted with
  ``torch.autograd.graph.saved_tensors_hooks``, per optimizer step;
* :class:`LiveTensors`: the most bytes alive at once over a stretch of code, followed op by
  op (a ``TorchDispatchMode`` sees every op's outputs; a finalizer per tensor sees it die).
  It covers what saved activations leave out: a validation forward without autograd,
  optimizer temporaries, gradients of activations in backward.

The CUDA caching allocator hands out blocks in multiples of 512 bytes; the live count and
the ``rounding`` totals model that, so the estimate can be compared with
``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

CUDA_BLOCK_BYTES = 512  # CUDACachingAllocator rounds every allocation up to a multiple of this

# Objects whose attributes the reachability walk follows (besides containers and modules):
# this project's own classes, never torch's or a library's internals.
_PROJECT_PACKAGES = ("trainables", "models", "cluster", "hpo")
_MODULE_SLOTS = frozenset({"_parameters", "_buffers", "_modules"})


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def allocator_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator books for a request of ``nbytes``."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def on_device(t: torch.Tensor, device: torch.device) -> bool:
    return t.device.type == device.type and (device.index is None or t.device.index == device.index)


@dataclass
class StorageSet:
    """Distinct storages and their sizes.

    The storages are held while the set lives: their keys are addresses, and a counter
    told to leave these keys out must not meet another tensor at one of them. (A
    transient the walk found, such as the last step's batch, freed during the counted
    step would otherwise lend its address to an activation, which would then be left out:
    docs/packing.md#profiling.)
    """

    sizes: dict[int, int] = field(default_factory=dict)
    held: list[torch.UntypedStorage] = field(default_factory=list, repr=False, compare=False)

    def add(self, t: torch.Tensor) -> bool:
        key = storage_key(t)
        if key == 0 or key in self.sizes:  # 0: an empty storage
            return False
        self.sizes[key] = storage_nbytes(t)
        self.held.append(t.untyped_storage())
        return True

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())

    @property
    def rounding(self) -> int:
        """Extra bytes the allocator's 512-byte blocks add on top of :attr:`nbytes`."""
        return sum(allocator_bytes(n) - n for n in self.sizes.values())

    @property
    def keys(self) -> frozenset[int]:
        return frozenset(self.sizes)


@dataclass(frozen=True)
class StateBytes:
    """Exact bytes of parameters, gradients and optimizer state."""

    params: int
    grads: int
    optimizer: int
    rounding: int  # what 512-byte allocator blocks add to the three
    n_params: int  # elements of the parameters that have an optimizer
    keys: frozenset[int]  # storages counted, for the other counters to leave out
    held: tuple[torch.UntypedStorage, ...] = field(default=(), repr=False, compare=False)


class OptimizerState(Protocol):
    """What the counters read of an optimizer (torch's, or the trainer's GuardedAdamW)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...

    @property
    def state(self) -> Mapping[Any, Any]: ...


def state_bytes(
    modules: Iterable[nn.Module],
    optimizers: Iterable[OptimizerState],
    device: torch.device,
) -> StateBytes:
    """Parameters and buffers of ``modules``, the gradients of their parameters and every
    tensor in the optimizers' state (moments, step counts, compensation buffers)."""
    params, grads, optim = StorageSet(), StorageSet(), StorageSet()
    optimizers = list(optimizers)
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if on_device(tensor, device):
                params.add(tensor)
        for p in module.parameters():
            if p.grad is not None and on_device(p.grad, device):
                grads.add(p.grad)
    n_params = 0
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for p in group["params"]:
                n_params += p.numel()
                if p.grad is not None and on_device(p.grad, device):
                    grads.add(p.grad)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and on_device(value, device):
                    optim.add(value)
    return StateBytes(
        params=params.nbytes,
        grads=grads.nbytes,
        optimizer=optim.nbytes,
        rounding=params.rounding + grads.rounding + optim.rounding,
        n_params=n_params,
        keys=params.keys | grads.keys | optim.keys,
        held=(*params.held, *grads.held, *optim.held),  # see StorageSet
    )


def reachable_bytes(
    root: Any, device: torch.device, exclude: frozenset[int], max_depth: int = 12
) -> StorageSet:
    """Device tensors reachable from ``root`` through containers, dataclasses, this
    project's objects and the non-parameter attributes of modules, except ``exclude``."""
    found = StorageSet()
    seen: set[int] = set()

    def walk(obj: Any, depth: int) -> None:
        if depth > max_depth or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if on_device(obj, device) and storage_key(obj) not in exclude:
                found.add(obj)
            return
        if isinstance(obj, dict):
            for value in obj.values():
                walk(value, depth + 1)
        elif isinstance(obj, list | tuple | set | frozenset):
            for value in obj:
                walk(value, depth + 1)
        elif isinstance(obj, nn.Module):
            for name, value in vars(obj).items():
                if name not in _MODULE_SLOTS:
                    walk(value, depth + 1)
            for child in obj.children():
                walk(child, depth + 1)
        elif dataclasses.is_dataclass(obj) or _is_project_object(obj):
            for value in vars(obj).values():
                walk(value, depth + 1)

    walk(root, 0)
    return found


def _is_project_object(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return hasattr(obj, "__dict__") and module.split(".")[0] in _PROJECT_PACKAGES


class SavedTensors:
    """Bytes autograd saves for backward, per optimizer step.

    Call :meth:`end_step` after each step (an optimizer step hook); :attr:`peak` is the
    largest step. Storages in ``exclude`` (parameters, data) are not activations.
    """

    def __init__(self, exclude: frozenset[int] = frozenset()) -> None:
        self.exclude = exclude
        self.peak = 0
        self._step: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key and key not in self.exclude and key not in self._step:
            self._step[key] = storage_nbytes(t)
        # A detached alias: saving the tensor object itself would tie an output to its own
        # grad_fn in a reference cycle.
        return t.detach()

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def end_step(self) -> None:
        self.peak = max(self.peak, sum(self._step.values()))
        self._step.clear()

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
        self.end_step()


class LiveTensors(TorchDispatchMode):
    """The peak of device bytes alive at once among tensors created inside the block.

    Every op's output storage that is new (not one of the op's inputs: views and in-place
    results of outside tensors are free) is booked at the allocator's block size and
    released when the last tensor holding it is destroyed. Tensors that exist before the
    block (weights, data, optimizer state) are not counted: add them separately.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.live = 0
        self.peak = 0
        self._refs: dict[int, int] = {}
        self._sizes: dict[int, int] = {}

    def _release(self, key: int) -> None:
        count = self._refs.get(key)
        if count is None:
            return
        if count > 1:
            self._refs[key] = count - 1
            return
        del self._refs[key]
        self.live -= self._sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or not on_device(t, self.device):
                continue
            key = storage_key(t)
            if key == 0:
                continue
            if key in self._refs:
                self._refs[key] += 1
            elif key in inputs:
                continue  # a view or in-place result of a tensor made outside the block
            else:
                size = allocator_bytes(storage_nbytes(t))
                self._refs[key] = 1
                self._sizes[key] = size
                self.live += size
                self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._release, key)
        return out
