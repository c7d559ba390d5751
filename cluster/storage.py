"""Where a sweep's results live: a local directory, a shared mount or an object store.

:class:`SweepLocation` is the one place that turns a user's ``storage`` (``./hpo-results``,
``/shared/hpo``, ``s3://bucket/hpo``, ``gs://...``) into something hpo can read and write.
Object stores go through pyarrow filesystems, as Ray Tune's own storage does, so
credentials and endpoints come from the same environment (``AWS_*``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AWS_ENDPOINT_URL`` for S3-compatible stores).

A multi-node sweep needs storage every node sees (a trial retried or resumed on another
node reads its checkpoints from there). What counts as shared:

* an object-store URI;
* a path on a network filesystem of this node (the mount table says nfs, cifs, lustre,
  a FUSE bucket mount, ...);
* a path the user declares shared with ``HPO_SHARED_STORAGE``: ``1`` (every path), or a
  ``:``-separated list of directories (``/mnt/shared:/data/hpo``). Needed when sharing
  is invisible from the mount table: a hostPath every node mounts, or, in the tests,
  several Ray nodes on one machine, which all see the same disk.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHARED_ENV = "HPO_SHARED_STORAGE"
# Filesystem types (as /proc/mounts names them) that several machines can mount at once.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.gcsfuse",
        "fuse.s3fs",
        "fuse.juicefs",
        "fuse.mountpoint-s3",
        "fuse.blobfuse2",
        "fuse.sshfs",
        "fuse.cephfs",
        "weka",
        "wekafs",
        "efs",
    }
)


def is_uri(storage: str) -> bool:
    """An object-store (or other remote) URI rather than a local path."""
    return "://" in storage and not storage.startswith("file://")


def filesystem_type(path: str | Path) -> str | None:
    """The filesystem type of the mount holding ``path`` (longest mount-point prefix)."""
    import psutil

    target = Path(path).expanduser().absolute()
    best: tuple[int, str] | None = None
    for part in psutil.disk_partitions(all=True):
        mount = Path(part.mountpoint)
        if (target == mount or mount in target.parents) and (
            best is None or len(part.mountpoint) > best[0]
        ):
            best = (len(part.mountpoint), part.fstype)
    return best[1] if best else None


def declared_shared(path: str | Path, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``HPO_SHARED_STORAGE`` declares ``path`` shared by every node."""
    value = (os.environ if env is None else env).get(SHARED_ENV, "").strip()
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if not value or value.lower() in ("0", "false", "no", "off"):
        return False
    target = Path(path).expanduser().absolute()
    for prefix in value.split(os.pathsep):
        if prefix:
            root = Path(prefix).expanduser().absolute()
            if target == root or root in target.parents:
                return True
    return False


def shared_storage_problem(
    storage: str, n_nodes: int, env: Mapping[str, str] | None = None
) -> str | None:
    """Why ``storage`` will not work for a cluster of ``n_nodes`` nodes, or None if it will."""
    if n_nodes <= 1 or is_uri(storage):
        return None
    path = storage.removeprefix("file://")
    if declared_shared(path, env):
        return None
    fstype = filesystem_type(path)
    if fstype in NETWORK_FILESYSTEMS:
        return None
    return (
        f"storage: {path} is a node-local path ({fstype or 'unknown'} filesystem on the "
        f"driver's node) but the cluster has {n_nodes} nodes: each node would keep its "
        "trials' checkpoints on its own disk, and a trial retried or resumed on another "
        "node could not find them. Use storage every node sees: a path all nodes mount at "
        "the same place (NFS, EFS, Filestore, Lustre, a shared volume), or an object-store "
        "URI (s3://bucket/hpo, gs://bucket/hpo) that Ray reads through pyarrow "
        f"filesystems. If this path already is shared in a way the mount table does not "
        f"show, declare it: {SHARED_ENV}=1 (or a list of shared directories), or "
        "`hpo submit --shared-storage`."
    )


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
