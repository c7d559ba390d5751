"""Precision policies: the one module of foxhunt-hpo that chooses a dtype.

Every other module asks a :class:`PrecisionPolicy` (or the helpers at the bottom of this
file) instead of naming ``torch.bfloat16`` itself, so a policy is one object that says:
which dtype the weights are held in, which dtype data is cast to once at the boundary,
which autocast context wraps forward + loss, and how a loss becomes an optimizer step.

``f32``         everything f32, strict: f32 matmuls never run on TF32 tensor cores.
``tf32``        f32 weights, moments and data; f32 matmuls/convolutions on TF32 tensor
                cores on CUDA Ampere or newer (scoped to the policy's regions); on a CPU
                or an older GPU the same numbers as ``f32``.
``bf16``        "pure bf16": weights, activations and gradients in bf16; data cast once
                when a dataset tensor or replay buffer is built; the loss cast to f32
                before backward; f32 optimizer moments and a Kahan-compensated update.
``bf16-mixed``  f32 master weights; ``torch.autocast(bf16)`` around forward + loss.
``fp16-mixed``  f32 master weights; autocast fp16 and dynamic loss scaling (init 2^16,
                x2 after 2000 clean steps, x0.5 and skip on inf/NaN) for pre-Ampere GPUs.
``auto``        CUDA compute capability >= 8.0 -> ``bf16``, anything else -> ``f32``.

Every policy guards the step without a host sync: a non-finite loss or gradient norm makes
the update (:mod:`trainables.optim`, about 30-40 ATen ops whatever the parameter count) an
exact no-op, counted on the device by :class:`StepGuard`; the trainer reads the counters
once per logging interval and, under ``bf16``, falls back to ``f32`` after K consecutive
skips. Why each policy is built this way: docs/precision.md
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainables.optim import GuardedAdamW
from trainables.precision_names import POLICY_NAMES as POLICY_NAMES

F32 = torch.float32
BF16 = torch.bfloat16
FP16 = torch.float16

# Attribute a module may set to name its parameters/buffers (dotted, relative to the
# module) that stay f32 under every policy: spline grids, diffusion schedules, atom supports.
KEEP_F32_ATTR = "keep_f32"

_DTYPE_NAMES = {"float32": F32, "bfloat16": BF16, "float16": FP16}


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' / 'bfloat16' / 'float16': the spelling used in checkpoint metadata."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r}; expected one of {sorted(_DTYPE_NAMES)}"
        ) from None


def is_low_precision(dtype: torch.dtype) -> bool:
    return dtype in (BF16, FP16)


@dataclass(frozen=True)
class DeviceInfo:
    """What ``auto`` needs to know about the device a trial runs on."""

    type: str
    name: str
    capability: tuple[int, int] | None

    @property
    def supports_bf16(self) -> bool:
        return self.type == "cuda" and self.capability is not None and self.capability >= (8, 0)

    @property
    def supports_tf32(self) -> bool:
        """TF32 tensor cores arrived with Ampere (compute capability 8.0), as bf16 did."""
        return self.supports_bf16


def describe_device(device: torch.device) -> DeviceInfo:
    """Name and compute capability of ``device``: torch for the capability, pynvml for the
    marketing name when nvidia-ml-py can talk to the driver."""
    if device.type != "cuda":
        return DeviceInfo(type=device.type, name=device.type, capability=None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    with contextlib.suppress(Exception):  # pynvml is optional at run time (no driver, MIG, ...)
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        raw = pynvml.nvmlDeviceGetName(handle)
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
    return DeviceInfo(type="cuda", name=name, capability=capability)


def resolve_policy_name(name: str, device: torch.device) -> str:
    """Map ``auto`` to a concrete policy for ``device``; validate every other name."""
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown precision policy {name!r}; expected one of {POLICY_NAMES}")
    if name != "auto":
        return name
    return "bf16" if describe_device(device).supports_bf16 else "f32"


# --------------------------------------------------------------------------------------
# Step guard: skip non-finite steps without a host sync


@dataclass
class StepGuard:
    """Device-side counters of skipped (non-finite) steps.

    ``longest_streak`` is the longest run of consecutive skips seen since the last
    :meth:`reset_streak`; reading it once per logging interval is enough to decide a
    fallback, because skipped steps leave the weights untouched. The three counters are
    views of one int64 tensor, so a step updates them with three ops. With ``n_slots=K``
    each counter is ``(K,)``, one per fused slot, and :meth:`slot` is slot k's
    guard (views of the same counters).
    """

    device: torch.device
    n_slots: int = 0
    skipped: torch.Tensor = field(init=False)
    streak: torch.Tensor = field(init=False)
    longest_streak: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        i64 = torch.int64
        column = (self.n_slots,) if self.n_slots else ()
        self._counts = torch.zeros((3, *column), dtype=i64, device=self.device)
        self.skipped, self.streak, self.longest_streak = self._counts.unbind()
        # counts <- counts * keep + add: (skipped, 0, longest) on a clean step,
        # (skipped + 1, streak + 1, longest) on a skip, as they were for an idle slot;
        # then longest = max(longest, streak).
        rule_shape = (6, 1) if self.n_slots else (6,)
        self._clean = torch.tensor([1, 0, 1, 0, 0, 0], dtype=i64, device=self.device)
        self._skip = torch.tensor([1, 1, 1, 1, 1, 0], dtype=i64, device=self.device)
        self._idle = torch.tensor([1, 1, 1, 0, 0, 0], dtype=i64, device=self.device)
        self._clean, self._skip, self._idle = (
            r.view(rule_shape) for r in (self._clean, self._skip, self._idle)
        )
        self._rule = torch.zeros((6, *column), dtype=i64, device=self.device)
        self._keep, self._add = self._rule[:3], self._rule[3:]

    def record(self, ok: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """Count a step: ``ok`` (0-d, or ``(K,)``) False is a skip, except for slots
        ``active`` leaves out (they took no step and count nothing)."""
        if active is None:
            torch.where(ok, self._clean, self._skip, out=self._rule)
        else:
            torch.where(
                ok, self._clean, torch.where(active, self._skip, self._idle), out=self._rule
            )
        torch.addcmul(self._add, self._counts, self._keep, out=self._counts)
        torch.maximum(self.longest_streak, self.streak, out=self.longest_streak)

    def reset_streak(self) -> None:
        self.streak.zero_()
        self.longest_streak.zero_()

    def slot(self, k: int) -> StepGuard:
        """Slot k's guard: 0-d views of these counters (reads, checkpoints, restores)."""
        if not self.n_slots:
            raise ValueError("slot() needs a guard over fused slots")
        view = object.__new__(StepGuard)
        view.device, view.n_slots = self.device, 0
        view._counts = self._counts[:, k]
        view.skipped, view.streak, view.longest_streak = view._counts.unbind()
        return view

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            "skipped": self.skipped.clone(),
            "streak": self.streak.clone(),
            "longest_streak": self.longest_streak.clone(),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            getattr(self, key).copy_(value)


# --------------------------------------------------------------------------------------
# Dynamic loss scaling for fp16


@dataclass
class LossScaler:
    """Dynamic loss scale kept on the device (init 2^16, x2 after 2000 clean steps,
    x0.5 on inf/NaN). The update is tensor arithmetic, so it never syncs the host."""

    device: torch.device
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    n_slots: int = 0  # K > 0: one scale per fused slot, (K,)
    scale: torch.Tensor = field(init=False)
    clean_steps: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        shape = (self.n_slots,) if self.n_slots else ()
        self.scale = torch.full(shape, self.init_scale, dtype=F32, device=self.device)
        self.clean_steps = torch.zeros(shape, dtype=torch.int64, device=self.device)

    def update(self, ok: torch.Tensor, active: torch.Tensor | None = None) -> None:
        """After a step: grow, keep or back off the scale; slots ``active`` leaves out
        (they took no step) keep theirs and their clean-step count."""
        before = self.clean_steps.clone() if active is not None else None
        # clean_steps = (clean_steps + 1) if ok else 0, as ok + clean_steps * ok
        torch.addcmul(ok, self.clean_steps, ok, out=self.clean_steps)
        grow = self.clean_steps >= self.growth_interval  # only ever true on a clean step
        factor = torch.where(grow, self.growth_factor, torch.where(ok, 1.0, self.backoff_factor))
        if active is not None:
            assert before is not None
            factor = torch.where(active, factor, 1.0)
            torch.where(active, self.clean_steps, before, out=self.clean_steps)
        self.scale.mul_(factor)
        self.clean_steps.masked_fill_(grow, 0)

    def slot(self, k: int) -> LossScaler:
        """Slot k's scaler: 0-d views of this one's tensors."""
        if not self.n_slots:
            raise ValueError("slot() needs a scaler over fused slots")
        view = object.__new__(LossScaler)
        view.__dict__.update(self.__dict__)
        view.n_slots, view.scale, view.clean_steps = 0, self.scale[k], self.clean_steps[k]
        return view

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"scale": self.scale, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.scale.copy_(state["scale"])
        self.clean_steps.copy_(state["clean_steps"])


# --------------------------------------------------------------------------------------
# Policies


@dataclass(frozen=True)
class StepResult:
    """Device tensors of one optimizer step; read them on the host only when logging."""

    loss: torch.Tensor  # f32 scalar, the unscaled loss that reached backward
    grad_norm: torch.Tensor  # f32 scalar, before clipping
    ok: torch.Tensor  # bool scalar, False when the step was skipped


class PrecisionPolicy:
    """How one trial turns modules, data and losses into dtypes and optimizer steps."""

    name: str = "f32"
    param_dtype: torch.dtype = F32  # dtype the module's weights are held in
    data_dtype: torch.dtype = F32  # dtype dataset tensors / replay states are stored in
    autocast_dtype: torch.dtype | None = None  # None: no autocast region
    # Whether f32 matmuls/convolutions may run on TF32 tensor cores (CUDA Ampere+) inside
    # this policy's regions. Only ``tf32`` allows it; every other policy runs its f32
    # islands as strict IEEE f32, whatever the process-wide torch flags say.
    allow_tf32: bool = False

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._constants: dict[float, torch.Tensor] = {}
        self._seeds: dict[tuple[int, ...], torch.Tensor] = {}

    # -- modules and data ----------------------------------------------------------------
    def convert_module(self, module: nn.Module) -> nn.Module:
        """Move ``module`` to the device and cast its floating tensors to ``param_dtype``,
        except the ones it lists in its ``keep_f32`` attribute."""
        module.to(self.device)
        if self.param_dtype == F32:
            return module
        keep = keep_f32_names(module)
        for name, tensor in _floating_tensors(module):
            if name not in keep:
                tensor.data = tensor.data.to(self.param_dtype)
        _repack_rnns(module)
        return module

    def convert_input(self, tensor: torch.Tensor) -> torch.Tensor:
        """Cast a floating dataset tensor once, when it is built (never per step)."""
        tensor = tensor.to(self.device)
        return tensor.to(self.data_dtype) if tensor.is_floating_point() else tensor

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The region forward + loss (and evaluation) run in: autocast where the policy
        has one, and this policy's f32 matmul precision (TF32 or strict)."""
        return _compute_region(self.device, self.autocast_dtype, self.allow_tf32)

    def float32_matmul(self, info: DeviceInfo | None = None) -> str:
        """How f32 matmuls run under this policy on ``info`` (default: this policy's
        device): ``"tf32"`` on TF32 tensor cores, ``"ieee"`` strict f32."""
        info = info if info is not None else describe_device(self.device)
        return "tf32" if self.allow_tf32 and info.supports_tf32 else "ieee"

    # -- optimizer -----------------------------------------------------------------------
    def make_optimizer(
        self,
        params: Iterable[nn.Parameter],
        lr: float | Sequence[float],
        weight_decay: float | Sequence[float] = 0.0,
        n_slots: int = 0,
    ) -> GuardedAdamW:
        """The guarded AdamW with f32 moments; ``n_slots=K`` for a fused stack of K (lr
        and weight decay then may be one value per slot)."""
        optimizer = GuardedAdamW(
            params,
            lr=lr,  # type: ignore[arg-type]
            weight_decay=weight_decay,  # type: ignore[arg-type]
            kahan=True,
            state_dtype=F32,
            n_slots=n_slots,
        )
        optimizer.init_state()
        return optimizer

    def make_scaler(self, n_slots: int = 0) -> LossScaler | None:
        return None

    def backward_and_step(
        self,
        loss: torch.Tensor,
        optimizer: GuardedAdamW,
        guard: StepGuard,
        max_grad_norm: float | None,
        scaler: LossScaler | None = None,
        active: torch.Tensor | None = None,
    ) -> StepResult:
        """Backward in f32 from the loss, clip, and a guarded optimizer step.

        The loss is cast to f32 *before* backward (the gradient entering the graph is f32;
        autograd casts it down where the forward ran in bf16). Nothing here reads a tensor
        on the host, and the op count does not grow with the number of parameters.

        Fused slots: ``loss`` is ``(K,)``, one per slot, and the optimizer, guard and
        scaler are over K slots; each slot is clipped, scaled and skipped on its own
        (its gradients are its loss's alone), and a slot ``active`` (``(K,)`` bool)
        leaves out takes no step and counts no skip.
        """
        loss32 = loss if loss.dtype == F32 else loss.float()
        scale = scaler.scale if scaler is not None else None
        seed = scale if scale is not None or loss32.dim() == 0 else self._ones(loss32)
        with _float32_matmul(self.device, self.allow_tf32):
            # Seeding backward with the scale gives exactly the gradients of loss * scale
            # (per slot: each slot's loss times its own scale).
            loss32.backward(seed)
        with torch.no_grad():
            grad_norm = optimizer.grad_norm()  # f32 L2 norm over every gradient (per slot)
            if scale is not None:
                grad_norm = grad_norm / scale
            # grad_norm + 0 * loss is NaN when the loss is inf/NaN: one test for both.
            ok = torch.isfinite(torch.add(grad_norm, loss32, alpha=0.0))
            if active is not None:
                ok = ok & active
            grad_scale = self._grad_scale(grad_norm, max_grad_norm, scale)
            optimizer.step(ok=ok, grad_scale=grad_scale)
            optimizer.zero_grad(set_to_none=False)
            guard.record(ok, active)
            if scaler is not None:
                scaler.update(ok, active)
        return StepResult(loss=loss32.detach(), grad_norm=grad_norm, ok=ok)

    def _ones(self, like: torch.Tensor) -> torch.Tensor:
        """The backward seed of a per-slot loss (cached: nothing allocated per step)."""
        seed = self._seeds.get(tuple(like.shape))
        if seed is None:
            seed = self._seeds[tuple(like.shape)] = torch.ones_like(like)
        return seed

    def _grad_scale(
        self,
        grad_norm: torch.Tensor,
        max_grad_norm: float | None,
        scale: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """One factor for every gradient: min(1, max / (norm + 1e-6)) / loss scale.

        Written as max / (max(norm + 1e-6, max) * scale): the same value (the scale is a
        power of two, so multiplying by it is exact) in three or four ops. A non-finite
        norm gives a non-finite factor, harmless because that step is masked off anyway.
        """
        if max_grad_norm is None:
            return None if scale is None else scale.reciprocal()
        denom = (grad_norm + 1e-6).clamp_(min=max_grad_norm)
        if scale is not None:
            denom.mul_(scale)
        return torch.div(self._constant(max_grad_norm), denom)

    def _constant(self, value: float) -> torch.Tensor:
        """A 0-d f32 device tensor holding ``value``, made once (no per-step upload)."""
        tensor = self._constants.get(value)
        if tensor is None:
            tensor = self._constants[value] = torch.full((), value, dtype=F32, device=self.device)
        return tensor


class F32Policy(PrecisionPolicy):
    """Strict f32: weights, moments, data and every matmul in IEEE f32 (TF32 off)."""

    name = "f32"


class TF32Policy(PrecisionPolicy):
    """f32 weights, moments and data; f32 matmuls and convolutions on TF32 tensor cores
    (10-bit mantissa inputs, f32 accumulation) on CUDA Ampere or newer, inside the
    policy's regions only. On a CPU or an older GPU it computes exactly what ``f32`` does."""

    name = "tf32"
    allow_tf32 = True


class BF16Policy(PrecisionPolicy):
    """Pure bf16 with f32 optimizer moments and Kahan-compensated weight updates."""

    name = "bf16"
    param_dtype = BF16
    data_dtype = BF16


class BF16MixedPolicy(PrecisionPolicy):
    name = "bf16-mixed"
    autocast_dtype = BF16


class FP16MixedPolicy(PrecisionPolicy):
    name = "fp16-mixed"
    autocast_dtype = FP16

    def make_scaler(self, n_slots: int = 0) -> LossScaler:
        return LossScaler(self.device, n_slots=n_slots)


_POLICIES: dict[str, type[PrecisionPolicy]] = {
    "f32": F32Policy,
    "tf32": TF32Policy,
    "bf16": BF16Policy,
    "bf16-mixed": BF16MixedPolicy,
    "fp16-mixed": FP16MixedPolicy,
}


def get_policy(name: str, device: torch.device | str = "cpu") -> PrecisionPolicy:
    """The one place a policy name becomes a policy (``auto`` resolved for ``device``)."""
    device = torch.device(device)
    return _POLICIES[resolve_policy_name(name, device)](device)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def promote_to_f32(module: nn.Module, optimizer: GuardedAdamW) -> None:
    """Switch a low-precision module to f32 in place (the bf16 -> f32 fallback).

    Each weight becomes its f32 master value (bf16 weight + Kahan compensation), so the
    fallback loses nothing the compensated optimizer had accumulated; the f32 moments are
    kept as they are and the compensation buffers are dropped.
    """
    masters = {
        id(p): optimizer.master_weight(p) for g in optimizer.param_groups for p in g["params"]
    }
    for _, tensor in _floating_tensors(module):
        tensor.data = masters.get(id(tensor), tensor.data.float())
    for state in optimizer.state.values():
        state.pop("compensation", None)
    _repack_rnns(module)


# --------------------------------------------------------------------------------------
# Helpers


def _repack_rnns(module: nn.Module) -> None:
    # An in-place dtype change bypasses nn.RNNBase's weight packing; on CUDA an unpacked
    # LSTM copies its weights on every forward. No-op on CPU.
    for sub in module.modules():
        if isinstance(sub, nn.RNNBase):
            sub.flatten_parameters()


@contextlib.contextmanager
def _float32_matmul(device: torch.device, allow_tf32: bool) -> Iterator[None]:
    """Set how CUDA runs f32 matmuls/convolutions/RNNs for the region, then restore.

    Scoped, not process-wide: Ray reuses actors, so a flag left behind by a ``tf32``
    trial would silently turn the next ``f32`` trial into TF32. No effect on CPU.
    """
    if device.type != "cuda":
        yield
        return
    precision = "tf32" if allow_tf32 else "ieee"
    knobs: tuple[Any, ...] = (
        torch.backends.cuda.matmul,
        torch.backends.cudnn.conv,  # type: ignore[attr-defined]
        torch.backends.cudnn.rnn,
    )
    saved = [knob.fp32_precision for knob in knobs]
    for knob in knobs:
        knob.fp32_precision = precision
    try:
        yield
    finally:
        for knob, value in zip(knobs, saved, strict=True):
            knob.fp32_precision = value


@contextlib.contextmanager
def _compute_region(
    device: torch.device, autocast_dtype: torch.dtype | None, allow_tf32: bool
) -> Iterator[None]:
    with _float32_matmul(device, allow_tf32):
        if autocast_dtype is None:
            yield
        else:
            with torch.autocast(device_type=device.type, dtype=autocast_dtype):
                yield


def _floating_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, param in module.named_parameters():
        if param.is_floating_point():
            yield name, param
    for name, buf in module.named_buffers():
        if buf.is_floating_point():
            yield name, buf


def keep_f32_names(module: nn.Module) -> set[str]:
    """Dotted names of the tensors ``module``'s submodules list in ``keep_f32``."""
    keep: set[str] = set()
    for prefix, sub in module.named_modules():
        for name in getattr(sub, KEEP_F32_ATTR, ()):
            keep.add(f"{prefix}.{name}" if prefix else name)
    return keep


def floating_dtypes(module: nn.Module) -> dict[str, torch.dtype]:
    """Name -> dtype of every floating parameter and buffer (used by checks and tests)."""
    return {name: t.dtype for name, t in _floating_tensors(module)}
