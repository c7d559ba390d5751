"""The default generators' state in a checkpoint: the streams dropout, ``randn_like`` and
exploration draw from (``torch.manual_seed``'s, not a fold's own minibatch generator).

:func:`default_rng_meta` writes them into a checkpoint's meta as base64 text, the CPU
generator always and the CUDA one of the trial's device where CUDA is in use;
:func:`restore_default_rng` sets them back, so a resumed trial draws what it would have
drawn. Reading them never initializes CUDA: a CPU trial creates no CUDA context.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from trainables.checkpoint import derived_seed


def _cuda_in_use() -> bool:
    # Not initialized means nothing in this process drew from a CUDA generator, and
    # touching one would create a CUDA context for a CPU trial.
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _cuda_device(device: torch.device) -> torch.device | str:
    return device if device.type == "cuda" else "cuda"


def default_rng_meta(device: torch.device) -> dict[str, str]:
    """Checkpoint meta for the default generators: the CPU one always, the CUDA one of
    ``device`` where CUDA is in use, and the device type generator states are shaped for."""
    meta = {"torch_rng": _b64(torch.get_rng_state()), "rng_device": device.type}
    if _cuda_in_use():
        meta["cuda_rng"] = _b64(torch.cuda.get_rng_state(_cuda_device(device)))
    return meta


def restore_default_rng(meta: Mapping[str, Any], device: torch.device) -> None:
    """Restore :func:`default_rng_meta`. Without a saved CUDA state (a CPU checkpoint
    resumed on a GPU) the CUDA generator is seeded from the saved CPU state,
    so it does not replay the stream of the trial's first epoch."""
    cpu_state = _from_b64(meta["torch_rng"])
    torch.set_rng_state(cpu_state)
    if not _cuda_in_use():
        return
    if "cuda_rng" in meta:
        torch.cuda.set_rng_state(_from_b64(meta["cuda_rng"]), _cuda_device(device))
    else:
        with torch.cuda.device(_cuda_device(device)):
            torch.cuda.manual_seed(derived_seed(cpu_state))


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode()


def _from_b64(text: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(text), dtype=np.uint8).copy())
