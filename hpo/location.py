"""Where a sweep lives: a local directory or a prefix in an object store.

The one place that turns a user's ``storage`` (``./hpo-results``, ``/shared/hpo``,
``s3://bucket/hpo``, ``gs://...``) into something hpo can read and write. Object stores
go through pyarrow filesystems, as Ray Tune's own storage does, so credentials and
endpoints come from the same environment (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``,
``AWS_ENDPOINT_URL`` for S3-compatible stores).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.storage import is_uri


@dataclass(frozen=True)
class SweepLocation:
    uri: str
    """What users see and pass back (``hpo resume``): an absolute path or a URI."""

    @classmethod
    def parse(cls, where: str | Path | SweepLocation) -> SweepLocation:
        if isinstance(where, SweepLocation):
            return where
        text = str(where)
        if is_uri(text):
            return cls(text.rstrip("/"))
        local = Path(text.removeprefix("file://")).expanduser().resolve()
        return cls(str(local))

    # -- naming ------------------------------------------------------------------------------
    def __str__(self) -> str:
        return self.uri

    @property
    def is_local(self) -> bool:
        return not is_uri(self.uri)

    @property
    def local_path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self.uri} is not a local path")
        return Path(self.uri)

    @property
    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> SweepLocation:
        head = self.uri.rstrip("/").rsplit("/", 1)[0]
        return SweepLocation(head or "/")

    def child(self, name: str) -> SweepLocation:
        return SweepLocation(f"{self.uri.rstrip('/')}/{name}")

    def uri_of(self, fs_path: str) -> str:
        """A path inside this location's filesystem (what pyarrow and Tune report, without
        the scheme) as a URI users can pass back."""
        if self.is_local:
            return fs_path
        scheme = self.uri.split("://", 1)[0]
        return f"{scheme}://{fs_path.lstrip('/')}"

    # -- files -------------------------------------------------------------------------------
    def filesystem(self) -> tuple[Any, str]:
        """``(pyarrow filesystem, path inside it)``."""
        from pyarrow import fs as pafs

        if self.is_local:
            return pafs.LocalFileSystem(), self.uri
        return pafs.FileSystem.from_uri(self.uri)

    def exists(self, name: str) -> bool:
        if self.is_local:
            return (self.local_path / name).exists()
        from pyarrow import fs as pafs

        filesystem, path = self.filesystem()
        return bool(filesystem.get_file_info(f"{path}/{name}").type != pafs.FileType.NotFound)

    def has_tune_state(self) -> bool:
        """Whether Ray Tune has written its first experiment snapshot here (a sweep that
        has just started, or whose driver stopped before that, has none yet)."""
        from pyarrow import fs as pafs
        from ray.tune.execution.tune_controller import TuneController

        snapshot = TuneController.CKPT_FILE_TMPL.format("*")  # experiment_state-*.json
        if self.is_local:
            return any(self.local_path.glob(snapshot))
        filesystem, path = self.filesystem()
        listing = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return any(fnmatch.fnmatch(info.base_name, snapshot) for info in listing)

    def read_text(self, name: str) -> str:
        if self.is_local:
            return (self.local_path / name).read_text()
        filesystem, path = self.filesystem()
        with filesystem.open_input_stream(f"{path}/{name}") as stream:
            return bytes(stream.read()).decode()

    def write_text(self, name: str, text: str) -> None:
        """Replace ``name`` whole: a rename on local disks, a single PUT on object stores
        (both atomic for readers)."""
        if self.is_local:
            self.local_path.mkdir(parents=True, exist_ok=True)
            tmp = self.local_path / f"{name}.tmp{os.getpid()}"
            tmp.write_text(text)
            tmp.replace(self.local_path / name)
            return
        filesystem, path = self.filesystem()
        with filesystem.open_output_stream(f"{path}/{name}") as stream:
            stream.write(text.encode())


@contextlib.contextmanager
def local_copy(where: str | Path) -> Iterator[Path]:
    """``where`` itself when it is a local path; otherwise a local copy of that remote
    directory (a checkpoint from ``hpo best`` on an object store), removed on exit."""
    from pyarrow import fs as pafs

    location = SweepLocation.parse(where)
    if location.is_local:
        yield location.local_path
        return
    filesystem, path = location.filesystem()
    if filesystem.get_file_info(path).type != pafs.FileType.Directory:
        raise FileNotFoundError(f"{location.uri}: no such directory")
    with tempfile.TemporaryDirectory(prefix="hpo-fetch-") as tmp:
        dest = Path(tmp) / location.name
        dest.mkdir()  # pyarrow copies files into existing directories only
        pafs.copy_files(
            path,
            str(dest),
            source_filesystem=filesystem,
            destination_filesystem=pafs.LocalFileSystem(),
        )
        yield dest


def writable_by_others(directory: Path) -> list[str]:
    """Why other users could change what is read from ``directory``: the directory or
    one of its entries is owned by another user, or group- or world-writable. Empty when
    only this user can. ``hpo resume`` unpickles Ray Tune's experiment state from a sweep
    directory (code runs as whoever resumes), so it refuses a directory others can
    write. Entries are checked one level deep, where Tune keeps that state; a directory
    replaced by another user shows as theirs."""
    problems = []
    me = os.getuid()
    for path in (directory, *sorted(directory.iterdir())):
        info = path.stat()
        if info.st_uid != me:
            problems.append(f"{path} is owned by uid {info.st_uid}, not by this user ({me})")
        elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = "everyone" if info.st_mode & stat.S_IWOTH else "its group"
            problems.append(f"{path} is writable by {who} (mode {stat.filemode(info.st_mode)})")
    return problems
