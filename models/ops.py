"""Tensor operations shared by the family files: the casts around an f32 island, the
stable segment sum of the scan families (Mamba-2's SSD mask, xLSTM's log gate matrix), and
layers that fused slots can batch (:class:`LSTM`, :class:`GRU`, and :class:`Dropout`,
whose rate may differ per slot).

A family keeps a numerically sensitive part (a scan, a schedule, a log-softmax ratio) in
f32 whatever the policy's dtype: it upcasts the inputs with :func:`f32` and casts the
result back with :func:`like`. Neither chooses a dtype; ``trainables.precision`` decides
the policy's dtype, these only mark where a family leaves it and returns to it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from typing import Any, NamedTuple

import torch

F32 = torch.float32


def f32(x: torch.Tensor) -> torch.Tensor:
    """Upcast for a numerically sensitive island (scans, log-softmax ratios, schedules)."""
    return x.float()


def like(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Cast ``x`` back to the dtype of ``ref`` after an f32 island."""
    return x.to(ref.dtype)


def segsum(a: torch.Tensor) -> torch.Tensor:
    """(..., T) log-decays -> (..., T, T): out[i, j] = sum_{j < s <= i} a[s], -inf for j > i.

    The segment sums are cumulative sums of the masked segment itself (stable: no
    difference of two large cumulative sums, so nothing large cancels); exp(out) is the
    lower-triangular decay matrix with ones on the diagonal and exact zeros above it.
    Callers pass f32 (an accumulator).
    """
    t = a.size(-1)
    strict = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(-1)
    rows = a.unsqueeze(-1).expand(*a.shape, t)  # (..., T, T): rows[s, j] = a[s]
    sums = rows.masked_fill(~strict, 0.0).cumsum(dim=-2)  # [i, j] = sum_{j < s <= i} a[s]
    causal = torch.ones(t, t, dtype=torch.bool, device=a.device).tril(0)
    return sums.masked_fill(~causal, -math.inf)


def under_vmap(*tensors: torch.Tensor) -> bool:
    """Whether any of ``tensors`` is batched by an enclosing ``torch.func.vmap``."""
    return any(torch._C._functorch.is_batchedtensor(t) for t in tensors)


def setting_tensor(value: float) -> torch.Tensor:
    """A setting (a rate, a loss weight) as the 0-d f32 buffer a module registers beside
    its Python value (not saved, named in the module's ``setting_buffers`` and
    ``keep_f32``), so fused slots may differ in it (see :func:`per_slot`)."""
    return torch.tensor(float(value), dtype=F32)


def per_slot(value: float, tensor: torch.Tensor) -> float | torch.Tensor:
    """The setting a module holds as ``value`` and as the buffer ``tensor``: the buffer
    where a vmap batches it (fused slots that differ in it, each reads its own), else
    the Python float, so an unfused step, or slots that agree, compute as always."""
    return tensor if under_vmap(tensor) else value


class Dropout(torch.nn.Dropout):
    """``nn.Dropout`` whose rate is also a tensor, so fused slots may differ in it.

    The rate is a 0-d f32 buffer (``rate``; not saved, so checkpoints are ``nn.Dropout``'s)
    named in ``setting_buffers``: ``trainables.stacked`` passes it per slot where the
    slots' rates differ, and under that vmap each slot drops at its own rate. Anywhere
    else (unfused, or every slot at one rate) this is ``nn.Dropout`` (a rate of 0 returns
    its input, as ``nn.Dropout`` does, without dispatching)."""

    keep_f32 = ("rate",)  # a probability, compared with f32 uniforms whatever the policy
    setting_buffers = ("rate",)

    def __init__(self, p: float = 0.5) -> None:
        super().__init__(p)
        self.rate: torch.Tensor
        self.register_buffer("rate", setting_tensor(p), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        if not under_vmap(self.rate):
            return super().forward(x) if self.p > 0 else x
        # Inverted dropout at this slot's rate (a rate of 0 keeps every unit, exactly).
        keep = torch.rand_like(x, dtype=F32) >= self.rate
        return x * like(keep / (1 - self.rate), x)  # the f32 scale, rounded once


# ----------------------------------------------------------------------------------------
# Recurrent layers fused slots can batch. torch.func.vmap has no batching rule for
# aten::lstm / aten::gru, so under vmap each layer runs through _FusedRecurrentLayer,
# whose batching rule runs the K slots as ONE torch layer with block-diagonal weights
# (slot k's units see only slot k's inputs and state): one aten::lstm per layer for
# all slots (unfused: one per module and fold), instead of ~10 ops per bar. On a CPU,
# where the slots are wide, or where the layer computes in fp16 (``_computes_in_fp16``),
# it runs the same equations as a loop over bars (``recurrent_loop``). Under autocast the
# layers compute in autocast's dtype with autocast off (``_run_layers``), fused or not
# (batch_first, unidirectional layers without projection, on a batch of sequences).
# Parameter names and layout are torch's either way, so a checkpoint loads in both
# modes; outside vmap these are torch's own layers, cuDNN kernels included.

# The most units per gate (slots x hidden) the block-diagonal form is used for, per
# device type. Its matmuls do K times the arithmetic of K separate layers (the zero
# blocks): cheap next to the launches saved on a GPU while the layer is this narrow
# (unmeasured until a GPU run). A CPU is compute-bound at these sizes and runs the loop
# (bench/README.md, "Fused slots").
BLOCK_DIAGONAL_MAX_UNITS: dict[str, int] = {"cuda": 1024}
_GATES = {"lstm": 4, "gru": 3}
# cuDNN copies weights that are not one flat buffer into one on every call and warns
# that it does, every call. The block-diagonal weights are built per call, so the copy
# is expected (a few small copies per layer). Filtered once here: a filter set per call
# (warnings.catch_warnings) is not thread-safe.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")


class LSTM(torch.nn.LSTM):
    """``nn.LSTM`` (batch_first, unidirectional, no projection) that a vmap can batch, and
    that computes in autocast's dtype under autocast (:func:`_run_layers`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.between_layers = Dropout(self.dropout)  # the fused form's, rate per slot

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if _runs_as_torchs(self, x):
            return super().forward(x, hx)
        out, (h, c) = _run_layers(self, "lstm", x, None if hx is None else list(hx))
        return out, (h, c)


class GRU(torch.nn.GRU):
    """``nn.GRU`` (batch_first, unidirectional) that a vmap can batch, and that computes in
    autocast's dtype under autocast (:func:`_run_layers`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.between_layers = Dropout(self.dropout)  # the fused form's, rate per slot

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, hx: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if _runs_as_torchs(self, x):
            return super().forward(x, hx)
        out, (h,) = _run_layers(self, "gru", x, None if hx is None else [hx])
        return out, h


def _runs_as_torchs(rnn: torch.nn.RNNBase, x: torch.Tensor) -> bool:
    """Whether torch's own forward runs ``rnn`` on ``x``: outside vmap, unless autocast is
    on and the layer is one :func:`_run_layers` covers (batch_first, unidirectional, no
    projection, a batch of sequences; others keep autocast's own casts)."""
    if under_vmap(x, _layer_weights(rnn, 0)[0]):
        return False
    return not torch.is_autocast_enabled(x.device.type) or not (_loopable(rnn) and x.dim() == 3)


def _run_layers(
    rnn: LSTM | GRU, kind: str, x: torch.Tensor, states: list[torch.Tensor] | None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``rnn`` on x (N, L, I) from ``states`` ([h] or [h, c], each (layers, N, H); None:
    zeros) -> outputs (N, L, H) and the last states, under vmap or autocast.

    Under autocast the layers compute in autocast's dtype, autocast off: torch's CUDA
    autocast runs cuDNN's recurrent layers in fp16 whatever autocast's dtype, so a
    bf16-mixed step would otherwise run them in fp16 without a loss scale, and fused
    slots could not use the block-diagonal form. (A CPU's autocast already runs the
    LSTM in its dtype; it left the GRU in f32.) Under vmap each layer runs through
    :class:`_FusedRecurrentLayer`; otherwise as torch's layer with the cast weights."""
    _check_loopable(rnn, x)
    weights = [_layer_weights(rnn, layer) for layer in range(rnn.num_layers)]
    batched = under_vmap(x, weights[0][0])
    device = x.device.type
    autocast = torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if autocast else x.dtype

    def cast(t: torch.Tensor | None) -> Any:  # not even a no-op aten::to outside autocast
        return t.to(dtype) if autocast and t is not None else t

    with torch.autocast(device, enabled=False) if autocast else contextlib.nullcontext():
        x = cast(x)
        if states is None:
            zeros = x.new_zeros(rnn.num_layers, x.shape[0], rnn.hidden_size)
            states = [zeros] * (2 if kind == "lstm" else 1)
        states = [cast(s) for s in states]
        cast_weights = [tuple(cast(w) for w in layer) for layer in weights]
        run = _fused_layers if batched else _torch_layers
        return run(rnn, kind, x, states, cast_weights)


Weights = list[tuple[torch.Tensor | None, ...]]  # per layer: w_ih, w_hh, b_ih, b_hh


def _torch_layers(
    rnn: LSTM | GRU,
    kind: str,
    x: torch.Tensor,
    states: list[torch.Tensor],
    weights: Weights,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torch's layer (cuDNN's on a GPU) with ``weights`` in place of the module's."""
    flat = [w for layer in weights for w in layer if w is not None]
    dropout = rnn.dropout if rnn.training else 0.0
    flags = (rnn.bias, rnn.num_layers, dropout, rnn.training, False, True)
    if kind == "lstm":
        out, h, c = torch._VF.lstm(x, tuple(states), flat, *flags)
        return out, [h, c]
    out, h = torch._VF.gru(x, states[0], flat, *flags)
    return out, [h]


def _fused_layers(
    rnn: LSTM | GRU,
    kind: str,
    x: torch.Tensor,
    states: list[torch.Tensor],
    weights: Weights,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The layers of fused slots, one :class:`_FusedRecurrentLayer` each (dropout
    between layers at each slot's rate)."""
    h0, c0 = states[0], (states[1] if kind == "lstm" else None)
    out = x
    last_h, last_c = [], []
    for layer in range(rnn.num_layers):
        if layer > 0:
            out = rnn.between_layers(out)
        out, h, c = _FusedRecurrentLayer.apply(
            kind, out, h0[layer], None if c0 is None else c0[layer], *weights[layer]
        )
        last_h.append(h)
        last_c.append(c)
    last = [torch.stack(last_h)]
    return out, ([*last, torch.stack(last_c)] if kind == "lstm" else last)


class RecurrentInputs(NamedTuple):
    """What one recurrent layer reads: input x (N, L, I), initial state h and c (N, H;
    no c for a GRU) and torch's weights for the layer (biases None without bias)."""

    x: torch.Tensor
    h: torch.Tensor
    c: torch.Tensor | None
    w_ih: torch.Tensor
    w_hh: torch.Tensor
    b_ih: torch.Tensor | None
    b_hh: torch.Tensor | None


Layer = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # outputs, last h, last c


def recurrent_loop(kind: str, layer: RecurrentInputs) -> Layer:
    """One layer of one slot -> (N, L, H), last h, last c: torch's LSTM / GRU equations
    as a loop over the L bars (vmap batches every op)."""
    x, h, c, w_ih, w_hh, b_ih, b_hh = layer
    inputs = torch.nn.functional.linear(x, w_ih, b_ih)  # (N, L, gates * H): once per layer
    outputs = []
    for x_t in inputs.unbind(1):  # unbind: one stack in backward, not L copies
        if kind == "lstm":
            assert c is not None
            gates = x_t + torch.nn.functional.linear(h, w_hh, b_hh)
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        else:
            x_r, x_z, x_n = x_t.chunk(3, dim=-1)
            h_r, h_z, h_n = torch.nn.functional.linear(h, w_hh, b_hh).chunk(3, dim=-1)
            r = torch.sigmoid(x_r + h_r)
            z = torch.sigmoid(x_z + h_z)
            h = (1 - z) * torch.tanh(x_n + r * h_n) + z * h
        outputs.append(h)
    return torch.stack(outputs, dim=1), h, c


def block_diagonal(weights: torch.Tensor, gates: int) -> torch.Tensor:
    """K slots' (gates * H, I) weights -> one (gates * K * H, K * I) weight: rows gate by
    gate, slot by slot within a gate (the layout torch's layer chunks into gates);
    slot k's rows are zero outside slot k's columns."""
    k, rows, cols = weights.shape
    eye = torch.eye(k, dtype=weights.dtype, device=weights.device)
    blocks = weights.view(k, gates, rows // gates, 1, cols).transpose(0, 1) * eye.view(
        1, k, 1, k, 1
    )
    return blocks.reshape(rows * k, k * cols)


def _gate_major(bias: torch.Tensor, gates: int) -> torch.Tensor:
    """K slots' (gates * H,) biases -> (gates * K * H,) in :func:`block_diagonal`'s rows."""
    k, rows = bias.shape
    return bias.view(k, gates, rows // gates).transpose(0, 1).reshape(-1)


def _block_diagonal_layer(kind: str, slots: RecurrentInputs) -> Layer:
    """:func:`recurrent_loop` for K slots at once (every tensor with a leading slot
    dimension) as one torch layer over the slots' concatenated units, quarantined
    (:class:`_Quarantine`) so that one slot's non-finite values stay its own."""
    gates = _GATES[kind]
    k, n, length, _ = slots.x.shape
    hidden = slots.w_hh.shape[-1]
    quarantine = _Quarantine(k, slots.x.device)
    x, h, c, w_ih, w_hh, b_ih, b_hh = quarantine.enter_backward(*quarantine.enter_forward(*slots))

    def joined(state: torch.Tensor) -> torch.Tensor:  # (K, N, H) -> (1, N, K * H)
        return state.transpose(0, 1).reshape(1, n, k * hidden)

    def split(state: torch.Tensor) -> torch.Tensor:  # (1, N, K * H) -> (K, N, H)
        return state.view(n, k, hidden).transpose(0, 1)

    params = [block_diagonal(w_ih, gates), block_diagonal(w_hh, gates)]
    if b_ih is not None and b_hh is not None:
        params += [_gate_major(b_ih, gates), _gate_major(b_hh, gates)]
    joined_x = x.permute(1, 2, 0, 3).reshape(n, length, -1)  # (N, L, K * I)
    # Bias, 1 layer, no dropout, train, unidirectional, batch_first. "train" is cuDNN's
    # training mode, which keeps what its backward needs (dropout is 0 here, so it changes
    # nothing else): whenever autograd records, as a training step's forward does.
    flags = (len(params) == 4, 1, 0.0, torch.is_grad_enabled(), False, True)
    if kind == "lstm":
        assert c is not None
        out, h_n, c_n = torch._VF.lstm(joined_x, (joined(h), joined(c)), params, *flags)
        last_c: torch.Tensor | None = split(c_n)
    else:
        out, h_n = torch._VF.gru(joined_x, joined(h), params, *flags)
        last_c = None
    outs = (out.view(n, length, k, hidden).permute(2, 0, 1, 3), split(h_n), last_c)
    out, last_h, last_c = quarantine.leave_backward(*outs)
    return quarantine.leave_forward(out, last_h, last_c)


def _present(tensors: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor]:
    return [t for t in tensors if t is not None]


def _refill(tensors: tuple[Any, ...], present: Any) -> tuple[Any, ...]:
    values = iter(present)
    return tuple(None if t is None else next(values) for t in tensors)


def _slot_column(flags: torch.Tensor, like_tensor: torch.Tensor) -> torch.Tensor:
    """(K,) -> (K, 1, ..., 1), to broadcast over ``like_tensor``'s slot rows."""
    return flags.view(-1, *([1] * (like_tensor.dim() - 1)))


def _finite_slots(*tensors: torch.Tensor | None) -> torch.Tensor:
    """(K,) whether each slot's rows of every tensor (leading slot dimension) are
    all finite."""
    flags = [torch.isfinite(t).flatten(1).all(1) for t in _present(tensors)]
    return functools.reduce(torch.logical_and, flags)


class _Quarantine:
    """Keeps each slot's non-finite values its own in a block-diagonal layer.

    The zero blocks put every slot's values into every other slot's sums, and
    0 * inf is NaN: one diverging slot would otherwise turn the others' outputs or
    gradients NaN, and the guarded step would skip them all. In forward a slot whose
    inputs or weights are not all finite enters as zeros and leaves as NaN (its own
    layer would give NaN too, and its loss is then NaN, which the guarded step skips
    whatever its gradients); in backward a slot whose incoming gradient is not all
    finite enters the layer's backward as zeros and its inputs' and weights' gradients
    leave as NaN (so its step is skipped, as unfused). The other slots compute exactly
    what they compute beside finite slots. Every tensor has a leading slot dimension
    and each slot's rows are its own (fused slots' weights always are)."""

    def __init__(self, k: int, device: torch.device) -> None:
        self.finite_inputs: torch.Tensor  # (K,), set by enter_forward
        self.finite_grads = torch.ones(k, dtype=torch.bool, device=device)

    def enter_forward(self, *tensors: torch.Tensor | None) -> Any:
        self.finite_inputs = _finite_slots(*tensors)
        return tuple(
            None if t is None else torch.where(_slot_column(self.finite_inputs, t), t, 0.0)
            for t in tensors
        )

    def leave_forward(self, *tensors: torch.Tensor | None) -> Any:
        return tuple(
            None if t is None else torch.where(_slot_column(self.finite_inputs, t), t, math.nan)
            for t in tensors
        )

    def enter_backward(self, *tensors: torch.Tensor | None) -> Any:
        return _refill(tensors, _GradientGate.apply(self, "enter", *_present(tensors)))

    def leave_backward(self, *tensors: torch.Tensor | None) -> Any:
        return _refill(tensors, _GradientGate.apply(self, "leave", *_present(tensors)))


class _GradientGate(torch.autograd.Function):
    """Identity in forward; in backward, the quarantine's gate on the gradients: on the
    way into the layer's backward ("leave": the layer's outputs) it zeroes the slots
    whose gradient is not all finite and records them; on the way out ("enter": the
    layer's inputs) it makes the recorded slots' gradients NaN."""

    @staticmethod
    def forward(quarantine: _Quarantine, side: str, *tensors: torch.Tensor) -> Any:
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.quarantine, ctx.side = inputs[0], inputs[1]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        quarantine: _Quarantine = ctx.quarantine
        if ctx.side == "leave":
            quarantine.finite_grads = _finite_slots(*grads)
            fill = 0.0
        else:
            fill = math.nan
        gated = [torch.where(_slot_column(quarantine.finite_grads, g), g, fill) for g in grads]
        return (None, None, *gated)


class _FusedRecurrentLayer(torch.autograd.Function):
    """One recurrent layer of fused slots: only a batching rule (``vmap``). Under it the
    layer's tensors carry a slot dimension, and regular autograd records the ops the
    rule runs on them, so no backward of its own is needed."""

    @staticmethod
    def forward(*args: Any) -> Any:
        raise RuntimeError("_FusedRecurrentLayer runs only under torch.func.vmap")

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        pass

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int | None, ...], kind: str, *tensors: Any) -> Any:
        k = info.batch_size
        slots = RecurrentInputs(
            *(  # type: ignore[arg-type]  # None only where the layer has none (c, biases)
                None if t is None else _slot_first(t, d, k)
                for t, d in zip(tensors, in_dims[1:], strict=True)
            )
        )
        most = BLOCK_DIAGONAL_MAX_UNITS.get(slots.x.device.type, 0)
        if k * slots.w_hh.shape[-1] <= most and not _computes_in_fp16(slots.x):
            outs = _block_diagonal_layer(kind, slots)
        else:
            outs = _vmapped_loop(kind, slots)
        return outs, tuple(None if t is None else 0 for t in outs)


def _vmapped_loop(kind: str, slots: RecurrentInputs) -> Layer:
    """:func:`recurrent_loop` under a vmap of its own over the slots (whose arguments
    and results are tensors only: the GRU's cell state is None)."""

    def one_slot(*present: torch.Tensor) -> list[torch.Tensor]:
        return _present(recurrent_loop(kind, RecurrentInputs(*_refill(slots, present))))

    out, h, *c = torch.func.vmap(one_slot)(*_present(slots))
    return out, h, (c[0] if c else None)


def _computes_in_fp16(x: torch.Tensor) -> bool:
    """Whether a layer on ``x`` computes in fp16. There the block-diagonal form is not used:
    fp16 overflows inside a layer (where the quarantine does not look), and the zero
    blocks would carry one slot's inf into the others' sums. :func:`_run_layers` turns
    autocast off before a layer, so ``x`` carries the dtype; were a layer run under CUDA
    autocast, it would compute in fp16 whatever autocast's dtype."""
    device = x.device.type
    if x.dtype == torch.float16:
        return True
    if not torch.is_autocast_enabled(device):
        return False
    return device == "cuda" or torch.get_autocast_dtype(device) == torch.float16


def _slot_first(t: torch.Tensor, dim: int | None, k: int) -> torch.Tensor:
    return t.expand(k, *t.shape) if dim is None else t.movedim(dim, 0)


def _loopable(rnn: torch.nn.RNNBase) -> bool:
    return bool(rnn.batch_first and not rnn.bidirectional and not rnn.proj_size)


def _check_loopable(rnn: torch.nn.RNNBase, x: torch.Tensor) -> None:
    if not _loopable(rnn) or x.dim() != 3:
        raise NotImplementedError(
            "fused recurrent layers cover batch_first, unidirectional layers without "
            f"projection, on a batch of sequences (N, L, I); got input of shape {tuple(x.shape)}"
        )


def _layer_weights(
    rnn: torch.nn.RNNBase, layer: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    # By name, not rnn._flat_weights: torch.func.functional_call swaps the attributes.
    names = [f"{kind}_l{layer}" for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    w_ih, w_hh, b_ih, b_hh = (getattr(rnn, name, None) for name in names)
    assert isinstance(w_ih, torch.Tensor) and isinstance(w_hh, torch.Tensor)
    return w_ih, w_hh, b_ih if rnn.bias else None, b_hh if rnn.bias else None


def conv1d(conv: torch.nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` for x (N, C, L), its weights taken in x's dtype and its bias added after.

    What autocast does to a convolution, spelled out: under ``torch.func.vmap`` autocast
    casts a batched convolution's input and weight but not its bias, and the kernel then
    refuses the mix (bf16 input, f32 bias). Spelled out, the step is the same with and
    without vmap."""
    out = torch.nn.functional.conv1d(
        x,
        like(conv.weight, x),
        None,
        conv.stride,
        conv.padding,
        conv.dilation,
        conv.groups,
    )
    return out if conv.bias is None else out + like(conv.bias, out).unsqueeze(-1)
