"""Checkpoints: safetensors for tensors, JSON for everything else, never pickle.

A checkpoint is one directory::

    model.safetensors   weights (and buffers) in the training dtype: bf16 trials write half
    optim.safetensors   optimizer moments (f32), Kahan compensation, loss scale, counters
    state.safetensors   the rest of the resumable state: replay buffers, environment
                        cursors, RNG generator states (tensors)
    meta.json           schema version, family, precision, epoch, step, config, metric
                        history, torch RNG states (base64) and a SHA-256 of each file

Loading a checkpoint cannot execute code: safetensors holds raw tensors and JSON holds
data. ``meta.json`` is written last and lists the checksums, so a directory whose meta
is missing, unparsable or disagrees with its files is not a checkpoint; together with
the temp-directory + rename in :func:`save_checkpoint`, a crash mid-save never leaves a
half checkpoint as the newest one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

SCHEMA_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
OPTIM_FILE = "optim.safetensors"
STATE_FILE = "state.safetensors"
META_FILE = "meta.json"
TENSOR_FILES = (WEIGHTS_FILE, OPTIM_FILE, STATE_FILE)
EPOCH_DIR = re.compile(r"^epoch_(\d{4,})$")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or of another schema."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    weights: dict[str, torch.Tensor]
    optim: dict[str, torch.Tensor]
    state: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def epoch(self) -> int:
        return int(self.meta["epoch"])


def epoch_dir_name(epoch: int) -> str:
    return f"epoch_{epoch:04d}"


def save_checkpoint(
    directory: Path,
    weights: Mapping[str, torch.Tensor],
    optim: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    meta: Mapping[str, Any],
) -> Path:
    """Write a checkpoint to ``directory`` atomically (a temp sibling renamed into place)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        checksums = {}
        for name, tensors in ((WEIGHTS_FILE, weights), (OPTIM_FILE, optim), (STATE_FILE, state)):
            path = tmp / name
            save_file(_contiguous_cpu(tensors), str(path))
            checksums[name] = _sha256(path)
        full_meta = {"schema_version": SCHEMA_VERSION, **meta, "checksums": checksums}
        _write_json(tmp / META_FILE, full_meta)
        _fsync_dir(tmp)
        if directory.exists():  # re-saving the same epoch (a retried trial): replace it
            shutil.rmtree(directory)
        os.replace(tmp, directory)
        _fsync_dir(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def load_checkpoint(directory: Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Read and verify a checkpoint; any problem raises :class:`CheckpointError` naming the file."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise CheckpointError(
            meta_path, "missing (not a checkpoint directory, or an interrupted save)"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(meta_path, f"not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise CheckpointError(meta_path, "expected a JSON object")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise CheckpointError(
            meta_path,
            f"schema_version {meta.get('schema_version')!r}, this build reads {SCHEMA_VERSION}",
        )
    checksums = meta.get("checksums", {})
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for name in TENSOR_FILES:
        path = directory / name
        if not path.is_file():
            raise CheckpointError(path, "missing")
        expected = checksums.get(name)
        if expected is not None and _sha256(path) != expected:
            raise CheckpointError(path, "checksum mismatch (truncated or corrupted file)")
        try:
            tensors[name] = load_file(str(path), device=str(device))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(path, f"unreadable safetensors file ({exc})") from exc
    return Checkpoint(
        path=directory,
        weights=tensors[WEIGHTS_FILE],
        optim=tensors[OPTIM_FILE],
        state=tensors[STATE_FILE],
        meta=meta,
    )


def epoch_checkpoints(root: Path) -> list[Path]:
    """``root/epoch_NNNN`` directories, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if p.is_dir() and (m := EPOCH_DIR.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest_good_checkpoint(
    root: Path, device: torch.device | str = "cpu"
) -> tuple[Checkpoint | None, list[CheckpointError]]:
    """The newest checkpoint under ``root`` that loads, and the errors of newer ones skipped.

    ``root`` may itself be a checkpoint directory (then it is loaded directly).
    """
    root = Path(root)
    if (root / META_FILE).exists():
        return load_checkpoint(root, device), []
    errors: list[CheckpointError] = []
    for path in reversed(epoch_checkpoints(root)):
        try:
            return load_checkpoint(path, device), errors
        except CheckpointError as exc:
            errors.append(exc)
    return None, errors


def prune_checkpoints(root: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` epoch checkpoints (keep >= 2 so a corrupt newest
    one still leaves a good one behind)."""
    for path in epoch_checkpoints(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def file_size(directory: Path, name: str = WEIGHTS_FILE) -> int:
    return (Path(directory) / name).stat().st_size


# --------------------------------------------------------------------------------------


def _contiguous_cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, tensor in tensors.items():
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        out[key] = t.contiguous()
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json(path: Path, payload: Mapping[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True, default=_json_default)
        fh.flush()
        os.fsync(fh.fileno())


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in checkpoint metadata")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
