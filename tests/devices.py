"""The CUDA device as a test parameter: marked ``gpu`` (so ``pytest -m gpu`` selects every
CUDA case, as ``bench/gpu_session.sh`` does on a GPU machine) and skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

ON_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)
