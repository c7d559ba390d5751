"""Tensor operations shared by the family files: the casts around an f32 island, the
stable segment sum of the scan families (Mamba-2's SSD mask, xLSTM's log gate matrix), and
layers that fused members can batch (:class:`LSTM`, :class:`GRU`, and :class:`Dropout`,
whose rate may differ per member).

A family keeps a numerically sensitive part (a scan, a schedule, a log-softmax ratio) in
f32 whatever the policy's dtype: it upcasts the inputs with :func:`f32` and casts the
result back with :func:`like`. Neither chooses a dtype; ``trainables.precision`` decides
the policy's dtype, these only mark where a family leaves it and returns to it.
"""

from __future__ import annotations

import math
from typing import Any

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
    ``keep_f32``), so fused members may differ in it (see :func:`per_member`)."""
    return torch.tensor(float(value), dtype=F32)


def per_member(value: float, tensor: torch.Tensor) -> float | torch.Tensor:
    """The setting a module holds as ``value`` and as the buffer ``tensor``: the buffer
    where a vmap batches it (fused members that differ in it, each reads its own), else
    the Python float, so an unfused step, or members that agree, compute as always."""
    return tensor if under_vmap(tensor) else value


class Dropout(torch.nn.Dropout):
    """``nn.Dropout`` whose rate is also a tensor, so fused members may differ in it.

    The rate is a 0-d f32 buffer (``rate``; not saved, so checkpoints are ``nn.Dropout``'s)
    named in ``setting_buffers``: ``trainables.members`` passes it per member where the
    members' rates differ, and under that vmap each member drops at its own rate. Anywhere
    else (unfused, or every member at one rate) this is ``nn.Dropout`` (a rate of 0 returns
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
        # Inverted dropout at this member's rate (a rate of 0 keeps every unit, exactly).
        keep = torch.rand_like(x, dtype=F32) >= self.rate
        return x * like(keep / (1 - self.rate), x)  # the f32 scale, rounded once


# ----------------------------------------------------------------------------------------
# Recurrent layers fused members can batch: torch.func.vmap has no batching rule for
# aten::lstm / aten::gru, so under vmap these run the same equations as a loop over time
# steps (same parameter names and layout, so a checkpoint loads either way). Outside vmap
# they are torch's own layers, cuDNN kernels included.


class LSTM(torch.nn.LSTM):
    """``nn.LSTM`` (batch_first, unidirectional, no projection) that a vmap can batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.between_layers = Dropout(self.dropout)  # the loop form's, rate per member

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if not under_vmap(x, _layer_weights(self, 0)[0]):
            return super().forward(x, hx)
        _check_loopable(self)
        n = x.shape[0]
        zeros = x.new_zeros(self.num_layers, n, self.hidden_size)
        h0, c0 = hx if hx is not None else (zeros, zeros)
        out = x
        last_h, last_c = [], []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = _layer_weights(self, layer)
            inputs = torch.nn.functional.linear(out, w_ih, b_ih)  # (N, L, 4H): once per layer
            h, c = h0[layer], c0[layer]
            outputs = []
            for x_t in inputs.unbind(1):  # unbind: one stack in backward, not L copies
                gates = x_t + torch.nn.functional.linear(h, w_hh, b_hh)
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            out = torch.stack(outputs, dim=1)
            if layer < self.num_layers - 1:
                out = self.between_layers(out)
            last_h.append(h)
            last_c.append(c)
        return out, (torch.stack(last_h), torch.stack(last_c))


class GRU(torch.nn.GRU):
    """``nn.GRU`` (batch_first, unidirectional) that a vmap can batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.between_layers = Dropout(self.dropout)  # the loop form's, rate per member

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, hx: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not under_vmap(x, _layer_weights(self, 0)[0]):
            return super().forward(x, hx)
        _check_loopable(self)
        n = x.shape[0]
        h0 = hx if hx is not None else x.new_zeros(self.num_layers, n, self.hidden_size)
        out = x
        last = []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = _layer_weights(self, layer)
            inputs = torch.nn.functional.linear(out, w_ih, b_ih)  # (N, L, 3H)
            h = h0[layer]
            outputs = []
            for x_t in inputs.unbind(1):
                x_r, x_z, x_n = x_t.chunk(3, dim=-1)
                h_r, h_z, h_n = torch.nn.functional.linear(h, w_hh, b_hh).chunk(3, dim=-1)
                r = torch.sigmoid(x_r + h_r)
                z = torch.sigmoid(x_z + h_z)
                candidate = torch.tanh(x_n + r * h_n)
                h = (1 - z) * candidate + z * h
                outputs.append(h)
            out = torch.stack(outputs, dim=1)
            if layer < self.num_layers - 1:
                out = self.between_layers(out)
            last.append(h)
        return out, torch.stack(last)


def _check_loopable(rnn: torch.nn.RNNBase) -> None:
    if not rnn.batch_first or rnn.bidirectional or rnn.proj_size:
        raise NotImplementedError(
            "the loop form covers batch_first, unidirectional layers without projection"
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
