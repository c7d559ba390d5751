"""Tensor operations shared by the family files: the casts around an f32 island.

A family keeps a numerically sensitive part (a scan, a schedule, a log-softmax ratio) in
f32 whatever the policy's dtype: it upcasts the inputs with :func:`f32` and casts the
result back with :func:`like`. Neither chooses a dtype; ``trainables.precision`` decides
the policy's dtype, these only mark where a family leaves it and returns to it.
"""

from __future__ import annotations

import torch

F32 = torch.float32


def f32(x: torch.Tensor) -> torch.Tensor:
    """Upcast for a numerically sensitive island (scans, log-softmax ratios, schedules)."""
    return x.float()


def like(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Cast ``x`` back to the dtype of ``ref`` after an f32 island."""
    return x.to(ref.dtype)
