"""Connecting to Ray: an embedded local instance, or an existing cluster by address.

Local Ray binds to loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps ``ray.init``
off the machine's other addresses). With ``--address`` the sweep joins that cluster; its
token authentication stays on (``RAY_AUTH_MODE=token`` with the cluster's token).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ClusterInfo:
    address: str | None
    resources: dict[str, float]
    n_nodes: int
    started_here: bool


def ensure_ray(
    address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None
) -> ClusterInfo:
    """Start (or join) Ray once per process and describe what it offers."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {
            "log_to_driver": False,
            "configure_logging": True,
            "logging_level": "WARNING",
        }
        if address is None:
            kwargs.update(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False)
        else:
            kwargs["address"] = address
        ray.init(**kwargs)
        started = address is None
    resources = {k: float(v) for k, v in ray.cluster_resources().items()}
    alive = [n for n in ray.nodes() if n.get("Alive")]
    return ClusterInfo(
        address=address, resources=resources, n_nodes=len(alive), started_here=started
    )
