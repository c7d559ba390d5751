"""Tests of the tensor operations shared by the families (models/ops.py).

Run: .venv/bin/python -m pytest tests/models/test_ops.py -q
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from models.ops import segsum


def test_segsum_is_the_masked_segment_sum() -> None:
    a = torch.tensor([0.5, -1.0, 2.0, -0.25])
    out = segsum(a)
    for i, j in itertools.product(range(4), range(4)):
        expected = float(a[j + 1 : i + 1].sum()) if j <= i else -math.inf
        assert out[i, j].item() == pytest.approx(expected, abs=1e-7), (i, j)
    decay = torch.exp(segsum(-torch.rand(2, 7)))
    assert torch.equal(decay.diagonal(dim1=-2, dim2=-1), torch.ones(2, 7))
    assert float(decay.triu(1).abs().max()) == 0.0


def test_segsum_stays_accurate_where_cumsum_differences_cancel() -> None:
    # 2000 log-decays of -5: the cumulative sum reaches -1e4, where f32 resolves ~1e-3, so
    # differences of cumulative sums lose the short segments; segsum sums them directly.
    a = torch.full((2000,), -5.0) + 1e-3 * torch.randn(2000)
    exact = segsum(a.double())
    stable = segsum(a)
    cum = a.cumsum(0)
    naive = cum[:, None] - cum[None, :]
    rows, cols = torch.tril_indices(2000, 2000)
    err_stable = (stable[rows, cols].double() - exact[rows, cols]).abs().max().item()
    err_naive = (naive[rows, cols].double() - exact[rows, cols]).abs().max().item()
    near_diag = torch.arange(1, 2000)
    err_naive_short = (naive[near_diag, near_diag - 1].double() - a[1:].double()).abs().max()
    assert err_stable < 1e-3  # measured 4.9e-4: half an f32 spacing at 1e4, rounding only
    assert float((stable[near_diag, near_diag - 1] - a[1:]).abs().max()) == 0.0
    assert float(err_naive_short) > 1e-4 and err_naive > err_stable  # measured 9.2e-4, 1.0e-3


def test_segsum_of_log_forget_gates() -> None:
    # xLSTM's log gate matrix: segment sums of log sigmoid(f~), all negative.
    log_f = F.logsigmoid(torch.tensor([2.0, -1.0, 0.5, 3.0]))
    out = segsum(log_f)
    for t, j in itertools.product(range(4), range(4)):
        expected = float(log_f[j + 1 : t + 1].sum()) if j <= t else -math.inf
        assert out[t, j].item() == pytest.approx(expected, abs=1e-7), (t, j)
