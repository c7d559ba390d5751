"""Checkpoints: safetensors for tensors, JSON for everything else, never pickle.

A checkpoint is one directory::

    model.safetensors   weights (and buffers) in the training dtype: bf16 trials write half
    optim.safetensors   optimizer moments (f32), Kahan compensation, loss scale, counters
    state.safetensors   the rest of the resumable state: replay buffers, environment
                        cursors, RNG generator states (tensors)
    returns.csv         the epoch's out-of-sample return series (split, fold, timestamp,
                        return; trainables.returns_file), for the comparison statistics;
                        not needed to resume
    meta.json           schema version, family, effective precision, epoch, step, config,
                        metric history, default RNG states (base64), the device type the
                        generator states come from, and a SHA-256 of each file

Loading a checkpoint cannot execute code. ``meta.json`` is written last and lists the
checksums, so a directory whose meta is missing, unparsable or disagrees with its files is
not a checkpoint; with the temp-directory + rename of :func:`save_checkpoint`, a crash
mid-save never leaves a half checkpoint as the newest. Checksums are mandatory: a
checkpoint without them is a :class:`CheckpointError` naming its ``meta.json``. Every
state tensor whose key ends in ``generator`` is
a device-shaped generator state: :func:`portable_generator_states` restores it unchanged on
the device type it was saved on (bit-exact resume) and on another type seeds the generator
from a hash of it (deterministic, another stream). Why: docs/reliability.md#checkpoints
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trainables.checkpoint_files import (
    CHECKPOINTS,
    EPOCH_DIR,
    META_FILE,
    OPTIM_FILE,
    STATE_FILE,
    TENSOR_FILES,
    WEIGHTS_FILE,
)
from trainables.returns_file import RETURNS_FILE, ReturnSeries, parse_returns
from trainables.returns_file import returns_csv as returns_csv  # what the trainer writes

SCHEMA_VERSION = 2
"""The one schema this build writes and reads (``meta.json``'s ``schema_version``)."""
GENERATOR_KEY = "generator"  # last component of every generator-state key in state.safetensors


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
    files: Mapping[str, str] | None = None,
) -> Path:
    """Write a checkpoint to ``directory`` atomically (a temp sibling renamed into place).

    ``files`` are further text files (name -> content, e.g. :data:`RETURNS_FILE`), written
    and checksummed like the tensor files.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        checksums = {}
        for name, tensors in ((WEIGHTS_FILE, weights), (OPTIM_FILE, optim), (STATE_FILE, state)):
            path = tmp / name
            save_file(_contiguous_cpu(tensors), str(path))
            checksums[name] = sha256_file(path)
        for name, text in (files or {}).items():
            if name in checksums or name == META_FILE or Path(name).name != name:
                raise ValueError(f"cannot store an extra checkpoint file named {name!r}")
            _write_text(tmp / name, text)
            checksums[name] = sha256_file(tmp / name)
        full_meta = {**meta, "schema_version": SCHEMA_VERSION, "checksums": checksums}
        write_json(tmp / META_FILE, full_meta)
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
    meta = read_meta(directory)
    checksums = meta["checksums"]
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for name in TENSOR_FILES:
        path = directory / name
        if not path.is_file():
            raise CheckpointError(path, "missing")
        _verify(path, checksums)
        try:
            tensors[name] = load_file(str(path), device=str(device))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(path, f"unreadable safetensors file ({exc})") from exc
    for name in sorted(set(checksums) - set(TENSOR_FILES)):  # the other files it lists
        if Path(name).name != name:
            raise CheckpointError(directory / META_FILE, f"lists a file outside it: {name!r}")
        path = directory / name
        if not path.is_file():
            raise CheckpointError(path, "missing (listed in meta.json)")
        _verify(path, checksums)
    return Checkpoint(
        path=directory,
        weights=tensors[WEIGHTS_FILE],
        optim=tensors[OPTIM_FILE],
        state=tensors[STATE_FILE],
        meta=meta,
    )


def read_meta(directory: Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint, schema-checked, with a checksum of every tensor file."""
    meta_path = Path(directory) / META_FILE
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
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise CheckpointError(
            meta_path, f"schema_version {version!r}, this build reads {SCHEMA_VERSION}"
        )
    checksums = meta.get("checksums")
    if not isinstance(checksums, dict) or not set(TENSOR_FILES) <= set(checksums):
        missing = sorted(set(TENSOR_FILES) - set(checksums if isinstance(checksums, dict) else {}))
        raise CheckpointError(
            meta_path, f"no checksums for {missing}; the checkpoint cannot be verified"
        )
    return meta


def _verify(path: Path, checksums: Mapping[str, str]) -> None:
    if sha256_file(path) != checksums.get(path.name):
        raise CheckpointError(path, "checksum mismatch (truncated or corrupted file)")


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


def checkpoint_source(path: Path) -> Path:
    """Where to look for checkpoints given a run dir, its checkpoints dir or one checkpoint."""
    path = Path(path)
    if (path / META_FILE).exists() or not (path / CHECKPOINTS).is_dir():
        return path
    return path / CHECKPOINTS


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
# generator states across devices


def portable_generator_states(
    state: Mapping[str, torch.Tensor],
    device: torch.device | str,
    saved_on: str,
) -> dict[str, torch.Tensor]:
    """``state`` with every generator state (key ending in ``generator``) loadable on
    ``device``.

    A state of ``device``'s own kind is kept as it is (bit-exact resume). One of another
    kind (``saved_on``, the device type recorded at save, differs, or its size is not
    what ``device``'s generators hold) is replaced by the state of a generator seeded with
    a hash of the saved bytes: deterministic, but a new stream, since a CPU and a CUDA
    generator cannot produce each other's numbers.
    """
    device = torch.device(device)
    native_size = torch.Generator(device=device).get_state().numel()
    out = dict(state)
    for key, saved in state.items():
        if key.rsplit(".", 1)[-1] != GENERATOR_KEY:
            continue
        if saved.numel() == native_size and saved_on == device.type:
            continue
        out[key] = derived_generator_state(saved, device)
    return out


def derived_generator_state(saved: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A ``device`` generator state seeded from a hash of ``saved`` (any device's state)."""
    return torch.Generator(device=device).manual_seed(derived_seed(saved)).get_state()


def derived_seed(saved: torch.Tensor) -> int:
    raw = saved.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    digest = hashlib.sha256(b"foxhunt-generator:" + raw).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# --------------------------------------------------------------------------------------
# out-of-sample return series (the format: trainables.returns_file)


def read_returns(directory: Path) -> ReturnSeries:
    """The :data:`~trainables.returns_file.RETURNS_FILE` of a checkpoint, verified against
    its meta checksum and parsed (:func:`trainables.returns_file.parse_returns`)."""
    directory = Path(directory)
    path = directory / RETURNS_FILE
    meta = read_meta(directory)
    if not path.is_file():
        raise CheckpointError(path, "missing (saved before an epoch was evaluated?)")
    checksums = meta["checksums"]
    if RETURNS_FILE not in checksums:
        raise CheckpointError(path, "not listed in meta.json's checksums")
    _verify(path, checksums)
    try:
        return parse_returns(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CheckpointError(path, str(exc)) from exc


# --------------------------------------------------------------------------------------


def _contiguous_cpu(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, tensor in tensors.items():
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        out[key] = t.contiguous()
    return out


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_text(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
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
