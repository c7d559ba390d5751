"""Expanding (running) median, so that time-gap units use past gaps only."""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["running_median"]


def running_median(x: np.ndarray) -> np.ndarray:
    """(n,) out[i] = median(x[0..i]), in O(n log n) with two heaps.

    ``np.median`` of every prefix would be O(n^2); minute bars over years make n ~ 1e6.
    """
    low: list[float] = []  # max-heap (negated) of the lower half; len(low) >= len(high)
    high: list[float] = []  # min-heap of the upper half
    out = np.empty(x.shape[0], dtype=np.float64)
    for i, value in enumerate(x.tolist()):
        if low and value > -low[0]:
            heapq.heappush(high, value)
        else:
            heapq.heappush(low, -value)
        if len(low) > len(high) + 1:
            heapq.heappush(high, -heapq.heappop(low))
        elif len(high) > len(low):
            heapq.heappush(low, -heapq.heappop(high))
        out[i] = -low[0] if len(low) > len(high) else (-low[0] + high[0]) / 2.0
    return out
