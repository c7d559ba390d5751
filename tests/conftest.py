"""Shared test settings: small thread counts (2-core CI machine), deterministic seeds."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Tiny test models run faster on one intra-op thread than on two contended ones.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
