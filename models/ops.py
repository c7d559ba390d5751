"""Tensor operations shared by the family files: the casts around an f32 island, and the
stable segment sum of the scan families (Mamba-2's SSD mask, xLSTM's log gate matrix).

A family keeps a numerically sensitive part (a scan, a schedule, a log-softmax ratio) in
f32 whatever the policy's dtype: it upcasts the inputs with :func:`f32` and casts the
result back with :func:`like`. Neither chooses a dtype; ``trainables.precision`` decides
the policy's dtype, these only mark where a family leaves it and returns to it.
"""

from __future__ import annotations

import math

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
