"""Multi-tensor guarded AdamW: a few dozen ATen ops per step, whatever the parameter count.

The update: f32 moments; a step that a boolean device tensor ``ok`` turns into an exact
no-op (moments, step counts and weights untouched, no host sync); one ``grad_scale``
tensor that folds gradient clipping and the fp16 unscale into the gradients; and Kahan
compensation for weights held in a lower precision than the moments.

Layout: each (param group, device) gets contiguous *arenas*: the two moments as one
``(2, N)`` f32 tensor, the step counts as one ``(n,)`` tensor, the compensation buffers as
one tensor per low-precision dtype. The state the checkpoint code reads
(``state[p]["exp_avg"]``, ``"exp_avg_sq"``, ``"compensation"``, shaped like ``p``, and a
0-d ``"step"``) are non-overlapping views into them, so a restore that copies into the
state tensors writes into the arenas. The update runs as flat elementwise ops on the
arenas, with ``_foreach`` ops only where per-parameter tensors are read or written.
Step counts are per parameter (a parameter that first receives a gradient later has its
own count). The arenas are rebuilt (a host-side copy, outside the hot loop) when the set
of parameters with gradients changes, when a parameter changes dtype (the bf16 -> f32
fallback) or when the ``state`` dict object is replaced.

Interface: ``param_groups``, ``state``, ``zero_grad``, ``state_dict`` /
``load_state_dict`` in torch's format, and ``register_step_post_hook``. It is not a
``torch.optim.Optimizer``, so torch's LR schedulers do not apply: an lr schedule sets
``group["lr"]``, which every step reads. Why this design: docs/precision.md, "The optimizer"
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")
_UNSUPPORTED_OPTIONS = ("amsgrad", "maximize")  # torch AdamW options load_state_dict refuses


def _carries_less(dtype: torch.dtype, than: torch.dtype) -> bool:
    """True when ``dtype`` has fewer significand bits than ``than`` (bf16/fp16 vs f32)."""
    return torch.finfo(dtype).eps > torch.finfo(than).eps


@dataclass
class _Region:
    """Parameters of one dtype and update rule, contiguous in the arenas."""

    dtype: torch.dtype
    rule: str  # "exact" (same dtype as the moments), "kahan" or "round" (plain rounding)
    params: list[torch.Tensor]
    start: int  # element offset in the arenas
    stop: int
    update_flat: torch.Tensor | None = None  # this region's slice of the update row
    grad_views: list[torch.Tensor] = field(default_factory=list)  # into the flat gradient
    update_views: list[torch.Tensor] = field(default_factory=list)  # into the update row
    compensation: torch.Tensor | None = None  # (stop - start,) in ``dtype`` (kahan)
    before: torch.Tensor | None = None  # f32 copy of the weights (kahan / weight decay)
    before_views: list[torch.Tensor] = field(default_factory=list)
    rounded: torch.Tensor | None = None  # weights + update rounded to ``dtype`` (kahan)
    rounded_views: list[torch.Tensor] = field(default_factory=list)
    carry: torch.Tensor | None = None  # f32 scratch (kahan)


class _Arena:
    """Flat state and scratch of one (param group, device).

    Every arena has ``rows`` rows: one per slot for an optimizer over a fused stack
    (``GuardedAdamW(n_slots=K)``: each parameter is ``(K, ...)``, row k holds slot k's
    elements), one otherwise. Per-element ops run on ``(rows, total)`` tensors, and
    per-slot factors (the skip mask, the gradient scale, lr and weight decay) are
    ``(rows, 1)`` columns broadcast over a row.
    """

    def __init__(
        self,
        optimizer: GuardedAdamW,
        group: dict,
        params: list[nn.Parameter],
    ) -> None:
        self.state_ref = optimizer.state
        self.hyper: tuple[Any, ...] | None = None
        device = params[0].device
        sd = optimizer.state_dtype
        self.device = device
        self.n_slots = optimizer.n_slots
        rows = max(1, self.n_slots)
        self.rows = rows
        # Regions in a fixed order: exact (f32) first, then one per low-precision dtype.
        buckets: dict[tuple[torch.dtype, str], list[torch.Tensor]] = {}
        for p in params:
            if p.dtype == sd or not _carries_less(p.dtype, sd):
                rule = "exact"
            elif "compensation" in optimizer.state.get(p, {}) or (
                optimizer.kahan and not optimizer.state.get(p)
            ):
                rule = "kahan"
            else:
                rule = "round"
            buckets.setdefault((p.dtype, rule), []).append(p)
        ordered = sorted(buckets.items(), key=lambda kv: (kv[0][1] != "exact", str(kv[0])))
        self.params = [p for _, ps in ordered for p in ps]
        n = len(self.params)
        sizes = [_row_numel(p, self.n_slots) for p in self.params]
        total = sum(sizes)
        self.n, self.total = n, total

        # State arenas; the per-parameter state entries become views of them.
        moments = torch.zeros((2, rows, total), dtype=sd, device=device)
        steps = torch.zeros((rows, n), dtype=sd, device=device)
        self.moments, self.steps = moments, steps
        self.exp_avg, self.exp_avg_sq = moments[0], moments[1]
        # A parameter's step count: 0-d, or (K,) across the slots.
        self.step_views = list(steps.unbind(1)) if self.n_slots else list(steps[0].unbind())
        # Scratch: gradients in f32, the two ratios m/b1 and v/b2, the spread bias terms.
        self.grad = torch.zeros((rows, total), dtype=sd, device=device)
        self.ratio = torch.zeros((2, rows, total), dtype=sd, device=device)
        self.update, self.denom = self.ratio[0], self.ratio[1]
        self.bias = torch.zeros((2, rows, total), dtype=sd, device=device)
        # Bias corrections per parameter (and slot): b1^s and b2^s are computed in place
        # in ``powers`` (0-d views, so the scalar pow kernel of the per-parameter code),
        # then 1 - powers is spread over each parameter's elements by ``owner``.
        self.safe_steps = torch.ones((rows, n), dtype=sd, device=device)  # max(step, 1)
        self.exponents = list(self.safe_steps.view(-1).unbind()) * 2
        self.powers = torch.zeros((2, rows, n), dtype=sd, device=device)
        self.power_views = list(self.powers.view(-1).unbind())
        self.bias_per_param = torch.zeros((2, rows, n), dtype=sd, device=device)
        self.beta_rows = torch.zeros((2, rows, n), dtype=sd, device=device)  # set_hyper fills
        self.one = torch.ones((), dtype=sd, device=device)
        self.owner = torch.repeat_interleave(  # element of a row -> index of its parameter
            torch.arange(n, device=device), torch.tensor(sizes, device=device)
        )
        self.regions: list[_Region] = []
        offset = 0
        index = 0
        for (dtype, rule), ps in ordered:
            size = sum(_row_numel(p, self.n_slots) for p in ps)
            region = _Region(dtype, rule, ps, offset, offset + size)
            region_grad = self.grad[:, offset : offset + size]
            region_update = self.update[:, offset : offset + size]
            region.grad_views = _split(region_grad, ps, self.n_slots)
            region.update_flat = region_update
            region.update_views = _split(region_update, ps, self.n_slots)
            if rule == "kahan":
                region.compensation = torch.zeros((rows, size), dtype=dtype, device=device)
                region.rounded = torch.zeros((rows, size), dtype=dtype, device=device)
                region.rounded_views = _split(region.rounded, ps, self.n_slots)
                region.carry = torch.zeros((rows, size), dtype=sd, device=device)
            if (
                rule == "kahan"
                or (_any(group["weight_decay"]) and rule != "exact")
                or _per_slot(group["weight_decay"])
            ):
                region.before = torch.zeros((rows, size), dtype=sd, device=device)
                region.before_views = _split(region.before, ps, self.n_slots)
            self._adopt_state(optimizer, region, index)
            self.regions.append(region)
            offset += size
            index += len(ps)
        self.true = torch.ones((), dtype=torch.bool, device=device)
        self.zero = torch.zeros((), dtype=sd, device=device)
        self.gathered = False
        self.key = optimizer._key(params)  # in group order; compensation entries exist now

    def _adopt_state(self, optimizer: GuardedAdamW, region: _Region, index: int) -> None:
        """Copy existing state values into the arenas and point the state entries at them."""
        exp_avg = _split(self.exp_avg[:, region.start : region.stop], region.params, self.n_slots)
        exp_avg_sq = _split(
            self.exp_avg_sq[:, region.start : region.stop], region.params, self.n_slots
        )
        comp_views = (
            _split(region.compensation, region.params, self.n_slots)
            if region.compensation is not None
            else None
        )
        for j, p in enumerate(region.params):
            views = {
                "step": self.step_views[index + j],
                "exp_avg": exp_avg[j],
                "exp_avg_sq": exp_avg_sq[j],
            }
            if comp_views is not None:
                views["compensation"] = comp_views[j]
            old = optimizer.state.get(p, {})
            with torch.no_grad():
                for key, view in views.items():
                    if key in old:
                        view.copy_(old[key])
            optimizer.state[p] = views

    def set_hyper(self, group: dict) -> None:
        """Device constants for the current lr/betas/weight decay (rebuilt only when they
        change); lr and weight decay may be one value per slot."""
        beta1, beta2 = group["betas"]
        hyper = (
            _values(group["lr"], self.rows, "lr"),
            float(beta1),
            float(beta2),
            float(group["eps"]),
            _values(group["weight_decay"], self.rows, "weight_decay"),
        )
        if hyper == self.hyper:
            return
        self.hyper = hyper
        lrs, _, _, _, decays = hyper
        sd = self.steps.dtype
        # The per-step scalars of each row, computed exactly as the per-parameter code
        # computed them from ``live`` (1.0 for a kept step, 0.0 for a skipped one): lerp
        # weight of the first moment, decay of the second, and -lr (0 when skipped).
        rows = []
        for live_value in (1.0, 0.0):
            live = torch.full((), live_value, dtype=sd)
            rows.append(
                torch.stack(
                    [
                        torch.stack([live * (1 - beta1), 1 - live * (1 - beta2), live * -lr])
                        for lr in lrs
                    ],
                    dim=1,
                ).unsqueeze(-1)  # (3, rows, 1)
            )
        self.scalars_ok = rows[0].to(self.device)
        self.scalars_skip = rows[1].to(self.device)
        self.scalars = torch.zeros((3, self.rows, 1), dtype=sd, device=self.device)
        self.w1, self.f2, self.neg_lr = self.scalars.unbind()
        self.decay = (
            torch.tensor(decays, dtype=sd, device=self.device).unsqueeze(-1)
            if len(set(decays)) > 1
            else None
        )  # (rows, 1) when the slots' weight decays differ
        self.beta_rows[0].fill_(beta1)
        self.beta_rows[1].fill_(beta2)

    def grad_lists(self) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
        return [(r.grad_views, [p.grad for p in r.params]) for r in self.regions]  # type: ignore[misc]

    def gather(self) -> None:
        """Copy every gradient into the flat f32 gradient (one op per dtype)."""
        for views, grads in self.grad_lists():
            torch._foreach_copy_(views, grads)
        self.gathered = True

    def column(self, factor: torch.Tensor) -> torch.Tensor:
        """A 0-d or per-slot ``(K,)`` factor shaped to broadcast over the rows."""
        return factor.view(-1, 1) if factor.dim() else factor


def _row_numel(p: torch.Tensor, n_slots: int) -> int:
    """Elements of ``p`` in one row: one slot's slice, or the whole parameter."""
    if not n_slots:
        return p.numel()
    if p.dim() == 0 or p.shape[0] != n_slots:
        raise ValueError(
            f"an optimizer over {n_slots} slots needs parameters of shape ({n_slots}, ...), "
            f"got {tuple(p.shape)}"
        )
    return p[0].numel()


def _any(value: Any) -> bool:
    return any(_values(value, 1, "weight_decay")) if _per_slot(value) else bool(value)


def _per_slot(value: Any) -> bool:
    return isinstance(value, list | tuple | torch.Tensor) and len(set(_values(value, 1, ""))) > 1


def _values(value: Any, rows: int, name: str) -> tuple[float, ...]:
    """A hyperparameter as one float per row: a number for every row, or one per slot."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, list | tuple):
        values = tuple(float(v) for v in value)
        if rows > 1 and len(values) != rows:
            raise ValueError(f"{name} has {len(values)} values for {rows} slots")
        return values
    return (float(value),) * rows


def _state_shape(key: str, p: torch.Tensor, n_slots: int = 0) -> torch.Size:
    if key == "step":
        return torch.Size([n_slots]) if n_slots else torch.Size([])
    return p.shape


def _split(flat: torch.Tensor, params: list[torch.Tensor], n_slots: int = 0) -> list[torch.Tensor]:
    """Views of ``flat`` (rows, size) shaped like each parameter, in order."""
    views, offset = [], 0
    for p in params:
        size = _row_numel(p, n_slots)
        views.append(flat[:, offset : offset + size].view(p.shape))
        offset += size
    return views


class GuardedAdamW:
    """AdamW whose moments are held in ``state_dtype`` (the precision policy passes f32)
    and whose update can be masked off on the device; see the module docstring for the
    layout.

    Parameters held in bf16/fp16 get a compensation buffer of their own dtype (Kahan
    summation, ``kahan=True``): the part of each update lost to rounding is carried to the
    next step, so a 1e-4 update to a weight near 1.0 accumulates instead of rounding away.

    ``step(ok=..., grad_scale=...)``: ``ok`` is a boolean 0-d tensor (False: the step is
    an exact no-op), ``grad_scale`` an f32 0-d tensor multiplied into every gradient.
    :meth:`grad_norm` gathers the gradients first and returns their global f32 L2 norm, so
    a guarded step reads every gradient once. The gathered f32 copy is what ``step`` uses;
    the parameters' ``.grad`` tensors are left as they are.

    ``n_slots=K`` (a fused stack): every parameter is K slots' stacked ``(K, ...)``
    tensor, and the optimizer is K independent AdamWs in one: :meth:`grad_norm` returns
    each slot's norm ``(K,)``, ``ok`` and ``grad_scale`` may be ``(K,)`` (a slot whose
    ``ok`` is False is left exactly as it was), a group's ``lr`` and ``weight_decay`` may
    be K values, and ``state[p]["step"]`` is ``(K,)``. :meth:`slot_state` is slot k's
    state in the unstacked layout.

    ``params`` is an iterable of parameters or of param-group dicts, as for torch's
    optimizers; ``param_groups`` and ``state`` have torch's layout (``state[p]`` holds
    ``step``, ``exp_avg``, ``exp_avg_sq`` and, for Kahan weights, ``compensation``).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        kahan: bool = True,
        *,
        state_dtype: torch.dtype,
        n_slots: int = 0,
    ) -> None:
        for value in _values(lr, 1, "lr"):
            if value <= 0 or not math.isfinite(value):
                raise ValueError(f"lr must be a positive finite number, got {lr}")
        if n_slots < 0:
            raise ValueError(f"n_slots must be >= 0, got {n_slots}")
        self.n_slots = n_slots
        self.defaults: dict[str, Any] = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
        }
        self.param_groups: list[dict[str, Any]] = _param_groups(params, self.defaults)
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)
        self.kahan = kahan
        self.state_dtype = state_dtype
        self._arenas: dict[tuple[int, torch.device], _Arena] = {}
        self._step_post_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()

    def __repr__(self) -> str:
        sizes = ", ".join(str(len(g["params"])) for g in self.param_groups)
        return (
            f"{type(self).__name__}(lr={self.defaults['lr']}, param groups of [{sizes}] "
            f"tensors, state {self.state_dtype}, kahan={self.kahan})"
        )

    # -- layout ---------------------------------------------------------------------------
    def init_state(self) -> None:
        """Allocate every state tensor up front (nothing is allocated in the hot loop)."""
        for gi, group in enumerate(self.param_groups):
            by_device: dict[torch.device, list[nn.Parameter]] = {}
            for p in group["params"]:
                by_device.setdefault(p.device, []).append(p)
            for device, params in by_device.items():
                if (gi, device) not in self._arenas:
                    self._arenas[(gi, device)] = _Arena(self, group, params)

    def _key(self, params: list[nn.Parameter]) -> tuple:
        return tuple((id(p), p.dtype, "compensation" in self.state.get(p, ())) for p in params)

    def _current_arenas(self) -> list[tuple[dict, _Arena]]:
        """The arenas for the parameters that have gradients now (rebuilt when that set,
        a dtype or the state dict object changed)."""
        out = []
        for gi, group in enumerate(self.param_groups):
            by_device: dict[torch.device, list[nn.Parameter]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_device.setdefault(p.device, []).append(p)
            for device, params in by_device.items():
                key = self._key(params)
                arena = self._arenas.get((gi, device))
                if arena is None or arena.key != key or arena.state_ref is not self.state:
                    arena = _Arena(self, group, params)
                    self._arenas[(gi, device)] = arena
                out.append((group, arena))
        return out

    # -- the step -------------------------------------------------------------------------
    @torch.no_grad()
    def grad_norm(self) -> torch.Tensor:
        """Global L2 norm of all gradients, in ``state_dtype`` (gathers them); one per
        slot, ``(K,)``, with ``n_slots=K``."""
        norms = []
        for _, arena in self._current_arenas():
            arena.gather()
            if self.n_slots:
                norms.append(torch.linalg.vector_norm(arena.grad, dim=1))
            else:
                norms.append(torch.linalg.vector_norm(arena.grad))
        if not norms:
            shape = (self.n_slots,) if self.n_slots else ()
            return torch.zeros(shape, dtype=self.state_dtype)
        if len(norms) == 1:
            return norms[0]
        return torch.linalg.vector_norm(torch.stack(norms), dim=0)

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        for _, arena in self._current_arenas():
            for _, grads in arena.grad_lists():
                torch._foreach_zero_(grads)

    @torch.no_grad()
    def step(
        self,
        closure: None = None,
        *,
        ok: torch.Tensor | None = None,
        grad_scale: torch.Tensor | None = None,
    ) -> None:
        if closure is not None:
            raise ValueError("closures are not supported")
        for group, arena in self._current_arenas():
            if not arena.gathered:
                arena.gather()
            arena.gathered = False
            self._step_arena(group, arena, ok, grad_scale)
        for hook in list(self._step_post_hooks.values()):
            hook(self, (), {"ok": ok, "grad_scale": grad_scale})

    def register_step_post_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(optimizer, args, kwargs)`` after every step (torch's signature)."""
        handle = RemovableHandle(self._step_post_hooks)
        self._step_post_hooks[handle.id] = hook
        return handle

    # -- torch's state-dict format ----------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {...}}, "param_groups": [...]}``, parameters numbered in
        group order as torch numbers them. The tensors are the live state (views of the
        arenas), not copies."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: dict(values) for p, values in self.state.items() if values}
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict in torch's format (this class's, or a torch AdamW's).

        Values are copied into this optimizer's state tensors (views of the arenas, which
        stay where they are), cast to their dtypes: f32 moments stay f32 for bf16 weights.
        A parameter without saved state starts fresh (zeros), a Kahan weight whose saved
        state has no compensation gets a zero one (as a checkpoint restore does), and a
        saved compensation for a weight not compensated here is ignored. lr, betas, eps and
        weight decay come from the saved groups; of a torch AdamW's other options, those
        that change the update (``amsgrad``, ``maximize``) are refused when set, the rest
        (``foreach``, ``fused``, ...) have no meaning here. Raises ValueError naming the
        group or parameter that does not fit, before anything is changed.
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"the state dict has {len(saved_groups)} param groups, "
                f"this optimizer {len(self.param_groups)}"
            )
        by_index: dict[int, torch.Tensor] = {}
        for g, (saved, group) in enumerate(zip(saved_groups, self.param_groups, strict=True)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"param group {g}: the state dict has {len(saved['params'])} "
                    f"parameters, this optimizer {len(group['params'])}"
                )
            for option in _UNSUPPORTED_OPTIONS:  # a torch AdamW's, changing the update
                if saved.get(option):
                    raise ValueError(f"param group {g}: {option}=True is not supported here")
            indices = [int(i) for i in saved["params"]]
            if len(set(indices) | set(by_index)) != len(by_index) + len(indices):
                raise ValueError(f"param group {g}: a parameter index appears twice")
            by_index.update(zip(indices, group["params"], strict=True))
        saved_state = {int(index): values for index, values in state_dict["state"].items()}
        for index, values in saved_state.items():
            unknown = set(values) - {*_STATE_KEYS, "compensation"}
            if index not in by_index or unknown:
                what = f"state keys {sorted(unknown)}" if unknown else "no such parameter"
                raise ValueError(f"parameter {index} of the state dict: {what}")
            p = by_index[index]
            for key, value in values.items():
                shape, wanted = torch.as_tensor(value).shape, _state_shape(key, p, self.n_slots)
                if shape != wanted:
                    raise ValueError(
                        f"parameter {index} of the state dict: {key} has shape "
                        f"{tuple(shape)}, this parameter {tuple(wanted)}"
                    )
        for saved, group in zip(saved_groups, self.param_groups, strict=True):
            group.update({k: saved[k] for k in self.defaults if k in saved})
        if any(not set(_STATE_KEYS) <= set(self.state.get(p, ())) for p in by_index.values()):
            # A parameter that never had a gradient is in no arena yet (``_current_arenas``
            # builds them from the parameters with gradients): lay every group out again.
            self._arenas.clear()
        self.init_state()  # every parameter has state tensors to copy into
        for index, p in by_index.items():
            values = saved_state.get(index, {})
            for key, slot in self.state[p].items():
                if key in values:
                    slot.copy_(torch.as_tensor(values[key]).reshape(slot.shape))
                else:
                    slot.zero_()

    def _step_arena(
        self,
        group: dict,
        a: _Arena,
        ok: torch.Tensor | None,
        grad_scale: torch.Tensor | None,
    ) -> None:
        a.set_hyper(group)
        _, _, beta2, eps, decays = a.hyper  # type: ignore[misc]
        wd = decays[0]
        keep = a.true if ok is None else a.column(ok)
        torch.where(keep, a.scalars_ok, a.scalars_skip, out=a.scalars)  # w1, f2, -lr
        grad = a.grad
        if grad_scale is not None:
            grad.mul_(a.column(grad_scale))
        if ok is not None:
            # NaN * 0 is NaN: zero the gradient itself where the step is skipped.
            torch.where(keep, grad, a.zero, out=grad)
        a.steps.add_(keep)
        a.exp_avg.lerp_(grad, a.w1)
        a.exp_avg_sq.mul_(a.f2).addcmul_(grad, grad, value=1 - beta2)
        # A skipped step added (1-beta2)*0*0 above: the moments are untouched.
        torch.clamp(a.steps, min=1.0, out=a.safe_steps)
        a.powers.copy_(a.beta_rows)
        torch._foreach_pow_(a.power_views, a.exponents)  # [b1^s_i], [b2^s_i]
        torch.sub(a.one, a.powers, out=a.bias_per_param)
        torch.index_select(a.bias_per_param, 2, a.owner, out=a.bias)
        torch.div(a.moments, a.bias, out=a.ratio)  # m / (1 - b1^s), v / (1 - b2^s)
        a.denom.sqrt_().add_(eps)
        update = a.update.div_(a.denom)
        for region in a.regions:
            if region.before is not None:
                torch._foreach_copy_(region.before_views, region.params)
        if a.decay is not None:  # the slots' weight decays differ: every region has ``before``
            for region in a.regions:
                region.update_flat.addcmul_(region.before, a.decay)  # type: ignore[union-attr,arg-type]
        elif wd:
            for region in a.regions:
                if region.before is not None:
                    region.update_flat.add_(region.before, alpha=wd)  # type: ignore[union-attr]
                else:
                    torch._foreach_add_(region.update_views, region.params, alpha=wd)
        update.mul_(a.neg_lr)
        for region in a.regions:
            _apply(region, region.update_flat)  # type: ignore[arg-type]

    @torch.no_grad()
    def set_lr_and_weight_decay(self, lr: Any, weight_decay: Any) -> None:
        """Every group's lr and weight decay from the next step on (a number, or one per
        slot), as if the optimizer had been built with them. The next step reads them
        (``set_hyper``); where the new weight decay changes which scratch a region keeps
        (zero against not, one value against one per slot), the arenas are laid out
        again now (the state's values copied into them, a host-side copy)."""
        for value in _values(lr, 1, "lr"):
            if value <= 0 or not math.isfinite(value):
                raise ValueError(f"lr must be a positive finite number, got {lr}")
        relayout = any(
            (_any(group["weight_decay"]), _per_slot(group["weight_decay"]))
            != (_any(weight_decay), _per_slot(weight_decay))
            for group in self.param_groups
        )
        self.defaults.update(lr=lr, weight_decay=weight_decay)
        for group in self.param_groups:
            group["lr"], group["weight_decay"] = lr, weight_decay
        if relayout:
            self._arenas.clear()
            self.init_state()

    # -- views for checks and the fallback -------------------------------------------------
    def slot_state(
        self, k: int, params: Iterable[tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[torch.Tensor, dict[str, torch.Tensor]]:
        """Slot k's state, keyed by its module's parameters: ``params`` pairs each stacked
        parameter with the slot's tensor it stands for. The values are views of this
        optimizer's state (what a checkpoint writes and a restore copies into); take them
        again after a step that rebuilt the arenas."""
        if not self.n_slots:
            raise ValueError("slot_state needs an optimizer over a fused stack")
        return {
            own: {key: value[k] for key, value in self.state[stacked].items()}
            for stacked, own in params
            if stacked in self.state
        }

    def master_weight(self, p: torch.Tensor) -> torch.Tensor:
        """The f32 value a low-precision weight stands for (weight + compensation)."""
        compensation = self.state.get(p, {}).get("compensation")
        if compensation is None:
            return p.detach().to(self.state_dtype)
        return p.detach().to(self.state_dtype) + compensation.to(self.state_dtype)


def _apply(region: _Region, update: torch.Tensor) -> None:
    """Add ``update`` (already times -lr, 0 when skipped) to the region's weights."""
    if region.rule == "exact":
        torch._foreach_add_(region.params, region.update_views)
        return
    if region.rule == "round":  # plain round-to-nearest (kept for the numeric test)
        torch._foreach_copy_(region.params, torch._foreach_add(region.params, region.update_views))
        return
    # Kahan: add what was lost last time, round, and keep what this rounding lost.
    assert region.compensation is not None and region.before is not None
    assert region.rounded is not None and region.carry is not None
    wanted = update.add_(region.compensation)
    torch.add(region.before, wanted, out=region.rounded)  # rounds to the weight dtype
    torch._foreach_copy_(region.params, region.rounded_views)
    torch.sub(region.rounded, region.before, out=region.carry)  # what the weight moved
    torch.sub(wanted, region.carry, out=region.compensation)


def _param_groups(
    params: Iterable[nn.Parameter] | Iterable[dict[str, Any]], defaults: dict[str, Any]
) -> list[dict[str, Any]]:
    """torch's param-group rules: a list of parameters is one group; dicts are groups whose
    missing hyperparameters come from ``defaults``; no parameter in two places."""
    items = list(params)
    if not items:
        raise ValueError("the optimizer got an empty parameter list")
    raw = items if isinstance(items[0], dict) else [{"params": items}]
    groups, seen = [], set()
    for g, group in enumerate(raw):
        if not isinstance(group, dict):
            raise TypeError(f"param group {g}: expected a dict, got {type(group).__name__}")
        group_params = group["params"]
        group_params = (
            [group_params] if isinstance(group_params, torch.Tensor) else list(group_params)
        )
        for p in group_params:
            if not isinstance(p, torch.Tensor) or not p.is_leaf:
                raise ValueError(f"param group {g}: can only optimize leaf tensors")
            if id(p) in seen:
                raise ValueError(f"param group {g}: a parameter appears in more than one place")
            seen.add(id(p))
        unknown = set(group) - set(defaults) - {"params"}
        if unknown:
            raise ValueError(f"param group {g}: unknown hyperparameters {sorted(unknown)}")
        groups.append({**defaults, **group, "params": group_params})
    return groups
