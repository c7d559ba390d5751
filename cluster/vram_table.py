"""The on-disk table of memory profiles, so a sweep profiles each trial shape once.

One JSON file (``HPO_VRAM_CACHE``, default ``~/.cache/foxhunt-hpo/vram.json``) maps a
shape key to a :class:`~cluster.profiler.MemoryProfile`. The key holds what sets a trial's
memory and nothing else:

* family, precision (``auto`` resolved), trainer batch size;
* the model's size settings: every field of the family's config by value, except the
  floats the family's adapter searches (its ``search_space``), which count only by whether
  they are zero, and the settings a family module lists in an optional ``MEMORY_NEUTRAL``
  tuple, which are left out;
* the data's shape: lookback, folds, validation/test shares, data source, assets, bars;
* the device name (``estimate`` for estimates, which also record their allowances) and
  the torch version; and a schema version, bumped when the estimator changes.

Writes are atomic (a temporary file renamed over the table) and serialized between
processes with an ``flock`` on ``vram.json.lock``, merging with what others wrote.

A sweep on a cluster also keeps a :class:`SharedVramCache` in its storage (a shared path
or an object store, through pyarrow as Tune's own storage): one small JSON file per shape
and GPU type (:func:`type_key`), read and written by the profiling tasks on the GPU nodes,
the trials that run out of memory and the driver that sizes shares.
Why the key is built this way: docs/packing.md#the-vram-table
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from cluster.gpu_types import GpuType
from cluster.profiler import (
    ESTIMATE_DEVICE_NAME,
    MemoryProfile,
    context_allowance,
    cublas_workspace_bytes,
    profiling_config,
    target_precision,
)
from cluster.storage import SweepLocation
from models import family_module, get_family
from trainables.config import TrainConfig

log = logging.getLogger("cluster.vram_table")

CACHE_ENV = "HPO_VRAM_CACHE"
# Part of every key: a profile cached under another schema is not found, and is measured
# again.
SCHEMA_VERSION = 4  # 4: a trial's cuBLAS workspaces per handle and stream


def default_cache_path() -> Path:
    raw = os.environ.get(CACHE_ENV)
    if raw:
        return Path(raw).expanduser()
    return Path.home() / ".cache" / "foxhunt-hpo" / "vram.json"


def _size_value(value: Any, searched_float: bool = False) -> Any:
    """How a model setting enters the key: by value, except a float the family's adapter
    searches, which enters only by being zero or not."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        if searched_float:
            return "0" if value == 0.0 else "+"
        return value
    if isinstance(value, list | tuple):
        return [_size_value(v, searched_float) for v in value]
    return repr(value)


def memory_neutral(family: str) -> frozenset[str]:
    """Config fields ``family`` declares memory-neutral (``MEMORY_NEUTRAL``)."""
    return frozenset(getattr(family_module(family), "MEMORY_NEUTRAL", ()))


def profile_key(
    config: TrainConfig, device: torch.device, device_name: str, group_size: int = 1
) -> dict[str, Any]:
    """The shape key of ``config`` profiled on ``device`` (named ``device_name``); with
    ``group_size`` > 1 that of a group trial of that many such trials (a trial alone has no
    ``group_size`` entry)."""
    family = get_family(config.family)
    neutral = memory_neutral(config.family)
    model_config = {
        name: value
        for name, value in dataclasses.asdict(family.make_config(config.model_config)).items()
        if name not in neutral
    }
    key: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "family": config.family,
        "precision": target_precision(config.precision, device),
        "batch_size": config.batch_size,
        "size": {
            name: _size_value(value, searched_float=name in family.search_space)
            for name, value in sorted(model_config.items())
        },
        "fused": profiling_config(config, device, group_size).fuse == "on",
        "data": {
            "lookback": config.lookback,
            "n_folds": config.n_folds,
            "val_fraction": config.val_fraction,
            "test_fraction": config.test_fraction,
            "source": config.data.source,
            "n_assets": config.data.n_assets,
            "n_bars": config.data.n_bars,
        },
        "device": device_name,
        "torch": torch.__version__,
    }
    if group_size > 1:
        key["group_size"] = group_size
    if device_name == ESTIMATE_DEVICE_NAME:
        key["allowances"] = {
            "context": context_allowance(),
            "workspace": cublas_workspace_bytes(),
        }
    return key


def type_key(config: TrainConfig, gpu_type: GpuType, group_size: int = 1) -> dict[str, Any]:
    """The shape key of ``config`` on a cluster's GPU type: the same fields as
    :func:`profile_key`, the type's name instead of a device name (the profiling task
    decides on the node whether it measures or estimates), and the allowances an
    estimate depends on. The declared memory is not part of it: an estimate's bytes do
    not depend on it, and the share reads the type's current declaration."""
    key = profile_key(config, torch.device("cpu"), ESTIMATE_DEVICE_NAME, group_size)
    key["device"] = f"ray-type:{gpu_type.name}"
    return key


def key_string(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


class VramTable:
    """Memory profiles by shape key, in memory and in one JSON file.

    ``measurements`` counts the profiles this object computed (not found in the table).
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_cache_path()
        self.measurements = 0
        self._entries: dict[str, dict[str, Any]] = {}
        self._loaded_mtime: float | None = None

    # -- reading ---------------------------------------------------------------------------
    def _read_file(self) -> dict[str, dict[str, Any]]:
        try:
            payload = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as exc:
            log.warning(
                "ignoring unreadable VRAM table %s (%s); it will be rewritten", self.path, exc
            )
            return {}
        if not isinstance(payload, dict) or payload.get("schema") != SCHEMA_VERSION:
            return {}
        entries = payload.get("entries", {})
        return entries if isinstance(entries, dict) else {}

    def _refresh(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime != self._loaded_mtime:
            self._entries.update(self._read_file())
            self._loaded_mtime = mtime

    def entry(self, key: dict[str, Any]) -> dict[str, Any] | None:
        text = key_string(key)
        if text not in self._entries:
            self._refresh()
        return self._entries.get(text)

    def get(self, key: dict[str, Any]) -> MemoryProfile | None:
        found = self.entry(key)
        if not found or "profile" not in found:  # an OOM mark may precede the re-measurement
            return None
        return MemoryProfile.from_dict(found["profile"])

    def oom_count(self, key: dict[str, Any]) -> int:
        """How many times trials of this shape ran out of memory at the packed fraction."""
        found = self.entry(key)
        return int(found.get("oom_count", 0)) if found else 0

    def entries(self) -> list[dict[str, Any]]:
        self._refresh()
        return list(self._entries.values())

    # -- writing ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _update(self, text: str, change: Callable[[dict[str, Any] | None], dict[str, Any]]) -> None:
        with self._locked():
            entries = self._read_file()  # merge what other processes wrote meanwhile
            entries[text] = change(entries.get(text))
            payload = {"schema": SCHEMA_VERSION, "entries": entries}
            fd, tmp = tempfile.mkstemp(prefix=self.path.name, suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as handle:
                    json.dump(payload, handle, indent=1, sort_keys=True)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            self._entries = entries
            self._loaded_mtime = self.path.stat().st_mtime

    def put(self, key: dict[str, Any], profile: MemoryProfile) -> None:
        def change(old: dict[str, Any] | None) -> dict[str, Any]:
            return {
                "key": key,
                "profile": profile.to_dict(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "oom_count": int(old.get("oom_count", 0)) if old else 0,
            }

        self._update(key_string(key), change)

    def record_oom(self, key: dict[str, Any]) -> int:
        """Mark this shape's profile as too small; returns the new OOM count."""
        counted: list[int] = []

        def change(old: dict[str, Any] | None) -> dict[str, Any]:
            new = dict(old or {"key": key})
            new["oom_count"] = int(new.get("oom_count", 0)) + 1
            counted.append(new["oom_count"])
            return new

        self._update(key_string(key), change)
        return counted[0]

    def get_or_measure(
        self, key: dict[str, Any], measure: Callable[[], MemoryProfile]
    ) -> MemoryProfile:
        """The stored profile for ``key``, or ``measure()`` stored under it."""
        found = self.get(key)
        if found is not None:
            return found
        with self._locked():  # another process may be measuring the same shape right now
            self._loaded_mtime = None
            self._refresh()
            found = self.get(key)
            if found is None:
                profile = measure()
                self.measurements += 1
        if found is not None:
            return found
        self.put(key, profile)
        return profile


class SharedVramCache:
    """Profiles and OOM counts by shape key, one JSON file per key under ``root`` on a
    pyarrow filesystem (the sweep's storage: every node sees it).

    Each file is replaced whole (a rename locally, a single PUT on an object store), so a
    reader never sees half a record. Two trials of one shape running out of memory at
    the same moment may count as one OOM (read-modify-write without a lock): the count
    only raises the headroom, and the next OOM raises it again.
    """

    DIRNAME = ".hpo-vram"

    def __init__(self, filesystem: Any, root: str) -> None:
        self.filesystem = filesystem
        self.root = root.rstrip("/")

    @classmethod
    def in_storage(cls, filesystem: Any, storage_fs_path: str) -> SharedVramCache:
        """The cache of every sweep stored under ``storage_fs_path`` on ``filesystem``."""
        return cls(filesystem, f"{storage_fs_path.rstrip('/')}/{cls.DIRNAME}")

    @classmethod
    def at(cls, storage: str) -> SharedVramCache:
        """The cache under a storage path or URI (``/shared/hpo``, ``s3://bucket/hpo``)."""
        filesystem, path = SweepLocation.parse(storage).filesystem()
        return cls.in_storage(filesystem, path)

    def __reduce__(self) -> tuple[Any, ...]:  # pyarrow filesystems pickle; keep it explicit
        return (SharedVramCache, (self.filesystem, self.root))

    def _path(self, key: dict[str, Any]) -> str:
        digest = hashlib.sha256(key_string(key).encode()).hexdigest()[:32]
        return f"{self.root}/{key['family']}-{digest}.json"

    def entry(self, key: dict[str, Any]) -> dict[str, Any] | None:
        from pyarrow import ArrowException

        try:
            with self.filesystem.open_input_stream(self._path(key)) as stream:
                found = json.loads(bytes(stream.read()).decode())
        except (FileNotFoundError, ArrowException, OSError, json.JSONDecodeError):
            return None
        if not isinstance(found, dict) or found.get("key") != json.loads(key_string(key)):
            return None  # a hash collision, or a record from another schema
        return found

    def get(self, key: dict[str, Any]) -> MemoryProfile | None:
        found = self.entry(key)
        if not found or "profile" not in found:
            return None
        return MemoryProfile.from_dict(found["profile"])

    def oom_count(self, key: dict[str, Any]) -> int:
        found = self.entry(key)
        return int(found.get("oom_count", 0)) if found else 0

    def _write(self, key: dict[str, Any], record: dict[str, Any]) -> None:
        self.filesystem.create_dir(self.root, recursive=True)
        text = json.dumps(record, indent=1, sort_keys=True).encode()
        path = self._path(key)
        if type(self.filesystem).__name__ == "LocalFileSystem":
            tmp = f"{path}.tmp{os.getpid()}"
            with self.filesystem.open_output_stream(tmp) as stream:
                stream.write(text)
            os.replace(tmp, path)
            return
        with self.filesystem.open_output_stream(path) as stream:
            stream.write(text)

    def put(self, key: dict[str, Any], profile: MemoryProfile) -> None:
        old = self.entry(key) or {}
        self._write(
            key,
            {
                "key": json.loads(key_string(key)),
                "profile": profile.to_dict(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "oom_count": int(old.get("oom_count", 0)),
            },
        )

    def record_oom(self, key: dict[str, Any]) -> int:
        """One more OOM of this shape on this type; returns the new count."""
        record = self.entry(key) or {"key": json.loads(key_string(key))}
        record["oom_count"] = int(record.get("oom_count", 0)) + 1
        self._write(key, record)
        return int(record["oom_count"])


_TABLES: dict[Path, VramTable] = {}


def table_at(path: Path | str | None = None) -> VramTable:
    """One :class:`VramTable` per file per process (``None``: the default path)."""
    resolved = (Path(path).expanduser() if path is not None else default_cache_path()).resolve()
    if resolved not in _TABLES:
        _TABLES[resolved] = VramTable(resolved)
    return _TABLES[resolved]


__all__ = [
    "CACHE_ENV",
    "SCHEMA_VERSION",
    "SharedVramCache",
    "VramTable",
    "default_cache_path",
    "key_string",
    "memory_neutral",
    "profile_key",
    "table_at",
    "type_key",
]
