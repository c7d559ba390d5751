"""Where a multi-node sweep may keep its results and checkpoints.

Every node must see the same storage: a trial that Ray retries or resumes on another
node reads its checkpoints from there, and the sweep driver reads every trial's results.
Ray accepts a path that all nodes mount at the same place (NFS, EFS, Filestore, Lustre,
a shared Kubernetes volume) or an object-store URI (``s3://``, ``gs://``, ``abfs://``)
that it reads through pyarrow filesystems.

What counts as shared here:

* an object-store URI;
* a path on a network filesystem of this node (the mount table says nfs, cifs, lustre,
  a FUSE bucket mount, ...);
* a path the user declares shared with ``HPO_SHARED_STORAGE``: ``1`` (every path), or a
  ``:``-separated list of directories (``/mnt/shared:/data/hpo``). Needed when sharing
  is invisible from the mount table — a hostPath every node mounts, or, in the tests,
  several Ray nodes on one machine, which all see the same disk.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

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
