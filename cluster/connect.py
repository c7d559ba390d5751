"""Connecting to Ray: an embedded local instance, or an existing cluster by address.

Local Ray binds to loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps ``ray.init``
off the machine's other addresses). With ``--address`` the sweep joins that cluster; its
token authentication stays on (``RAY_AUTH_MODE=token`` with the cluster's token).

Addresses: ``ray://HEAD:10001`` (Ray Client, from a machine outside the cluster),
``HEAD:6379`` (the head's GCS; from a process on a cluster node), or ``auto`` (the
cluster this process runs in: ``RAY_ADDRESS``, as set for a Jobs API driver). Before
``ray.init`` the head's port is probed with a short timeout, so an unreachable head
fails in seconds with a :class:`ClusterError` instead of Ray's long retry loop; a Ray or
Python version mismatch and a missing token are rephrased into what to do.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's node address is loopback
PROBE_TIMEOUT_S = 3.0


class ClusterError(RuntimeError):
    """The Ray cluster cannot be used as asked; the message says what to do."""


@dataclass(frozen=True)
class ClusterInfo:
    address: str | None
    resources: dict[str, float]
    n_nodes: int
    started_here: bool
    node_resources: tuple[dict[str, float], ...] = ()
    """Total resources of each alive node."""
    scalable_node_resources: tuple[dict[str, float], ...] = field(default=())
    """Resources of each node type the cluster's autoscaler may still add (KubeRay worker
    groups, cluster-launcher node types with max_workers > 0)."""


def ensure_ray(
    address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None
) -> ClusterInfo:
    """Start (or join) Ray once per process and describe what it offers."""
    os.environ.setdefault(LOOPBACK_ENV, "0")
    if address is None:
        _keep_local_ray_on_loopback()
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
            probe_head(address)
            kwargs["address"] = address
        try:
            _init_with_client_retry(ray, kwargs)
        except Exception as exc:
            rephrased = rephrase_connect_error(exc, address)
            if rephrased is None:
                raise
            raise rephrased from exc
        started = address is None
    resources = {k: float(v) for k, v in ray.cluster_resources().items()}
    alive = [n for n in ray.nodes() if n.get("Alive")]
    return ClusterInfo(
        address=address,
        resources=resources,
        n_nodes=len(alive),
        started_here=started,
        node_resources=tuple(
            {k: float(v) for k, v in n.get("Resources", {}).items()} for n in alive
        ),
        scalable_node_resources=_autoscaler_node_types(),
    )


def _keep_local_ray_on_loopback() -> None:
    """A local Ray binds to loopback unless the user set ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1``.

    The variable is read twice: by the processes Ray starts (they inherit it from the
    environment) and by this process's ``ray._private.ray_constants`` at its import. The CLI sets it before
    anything imports ray; a library caller (a notebook, the tests) usually imported ray
    first, so the already-read constant is set too (``services.get_node_ip_address`` reads
    it at call time). An explicit user setting wins in both places."""
    import sys

    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None and os.environ[LOOPBACK_ENV] == "0":
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


# Ray Client starts one server process per connecting job on the head; that start can fail
# once and work when asked again: the server process does not come up ("Starting Ray
# client server failed"), or its shim process exits before the proxier reads its command
# line with psutil, whose ZombieProcess / NoSuchProcess then reaches the client as the
# proxier's traceback. The cause seen here was grpcio 1.80-1.85 killing about one forked
# child in a hundred before exec (grpc/grpc#43055; pyproject.toml keeps grpcio below
# 1.80); a head installed with another grpcio may still have it. Each ray.init connects
# with a new client id and a failed connect disconnects cleanly, so retrying is safe. Two
# failures in a row were seen on a loaded 2-core CI machine, hence three retries (waits of
# 2, 4 and 6 s between them, on top of the proxier's own 30-s channel check per failed
# start).
CLIENT_SERVER_RETRIES = 3
CLIENT_SERVER_START_FAILURES = (
    "Starting Ray client server failed",
    "psutil.ZombieProcess",
    "psutil.NoSuchProcess",
)


def _init_with_client_retry(ray: Any, kwargs: dict[str, Any]) -> None:
    for attempt in range(CLIENT_SERVER_RETRIES + 1):
        try:
            ray.init(**kwargs)
            return
        except ConnectionAbortedError as exc:
            flaky = any(sign in str(exc) for sign in CLIENT_SERVER_START_FAILURES)
            if not flaky or attempt == CLIENT_SERVER_RETRIES:
                raise
            log.warning(
                "Ray Client's server did not start on the head (%s); retrying, attempt %d of %d",
                _last_line(str(exc)),
                attempt + 2,
                CLIENT_SERVER_RETRIES + 1,
            )
            time.sleep(2.0 * (attempt + 1))


def _last_line(message: str) -> str:
    """The exception line of a server-side traceback that Ray forwards verbatim: the reason,
    without the frames (a retried transient should not look like a crash)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else message


def parse_address(address: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of ``ray://host:port`` / ``host:port``; None for ``auto``
    without ``RAY_ADDRESS`` (Ray resolves it from the local node)."""
    if address == "local":
        return None
    if address == "auto":
        env = os.environ.get("RAY_ADDRESS", "")
        if not env or env in ("auto", "local"):
            return None
        address = env
    scheme = "gcs"
    rest = address
    if "://" in address:
        scheme, rest = address.split("://", 1)
    rest = rest.rstrip("/")
    match = re.fullmatch(r"\[?([^\]]+?)\]?:(\d+)", rest)
    if match is None:
        default_port = 10001 if scheme == "ray" else None
        if default_port is None or not rest or ":" in rest:
            raise ClusterError(
                f"cannot parse the Ray address {address!r}: use ray://HEAD:10001 (Ray Client), "
                "HEAD:6379 (the head's GCS, from a cluster node) or auto"
            )
        return scheme, rest, default_port
    return scheme, match.group(1), int(match.group(2))


def probe_head(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast when nothing answers at the head's port (Ray itself retries for minutes)."""
    parsed = parse_address(address)
    if parsed is None:
        return
    scheme, host, port = parsed
    what = "Ray Client server" if scheme == "ray" else "GCS"
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.gaierror as exc:
        reason = f"cannot resolve host {host!r} ({exc.strerror})"
    except ConnectionRefusedError:
        reason = f"connection refused: nothing listens on {host}:{port}"
    except TimeoutError:
        reason = f"no answer within {timeout_s:g}s (wrong host, a firewall, or the head is down)"
    except OSError as exc:
        reason = exc.strerror or repr(exc)
    hint = (
        "the head's Ray Client server listens on 10001 unless `ray start --head "
        "--ray-client-server-port` says otherwise"
        if scheme == "ray"
        else "the head's GCS listens on 6379 unless `ray start --head --port` says otherwise; "
        "from outside the cluster use ray://HEAD:10001, or submit with "
        "`hpo submit SPEC --address http://HEAD:8265`"
    )
    raise ClusterError(
        f"cannot reach the Ray head's {what} at {address}: {reason}. Start the head "
        f"(`ray start --head`) or fix the address ({hint}); without --address a local Ray "
        "starts instead."
    )


_VERSION = re.compile(
    r"cluster was started with:\s*Ray: (?P<c_ray>\S+)\s*Python: (?P<c_py>\S+).*?"
    r"was started with:\s*Ray: (?P<m_ray>\S+)\s*Python: (?P<m_py>\S+)",
    re.S,
)


def rephrase_connect_error(exc: BaseException, address: str | None) -> ClusterError | None:
    """Ray's version-mismatch and missing-token errors, rephrased into what to do."""
    text = str(exc)
    where = address or "the local Ray"
    match = _VERSION.search(text)
    if match is not None or "Version mismatch" in text:
        if match is None:
            detail = text.strip().splitlines()[0]
        else:
            detail = (
                f"the cluster runs Ray {match['c_ray']} on Python {match['c_py']}, this "
                f"process has Ray {match['m_ray']} on Python {match['m_py']}"
            )
        return ClusterError(
            f"Ray version mismatch with the cluster at {where}: {detail}. A client must run "
            "the cluster's Ray and Python versions: install them here (e.g. "
            "`pip install 'ray[default]==VERSION'` in a venv with that Python), or run the "
            "sweep inside the cluster with `hpo submit SPEC --address http://HEAD:8265`, "
            "which uses the cluster's own environment."
        )
    if "Could not find any running Ray instance" in text:
        return ClusterError(
            f"no Ray cluster found for --address {address}: RAY_ADDRESS is not set and no "
            "`ray start` ran on this machine. Give the head's address (HEAD:6379 on a "
            "cluster node, ray://HEAD:10001 from outside), or leave --address out for a "
            "local Ray."
        )
    if type(exc).__name__ == "AuthenticationError" or "authentication token" in text.lower():
        return ClusterError(
            f"the Ray cluster at {where} requires its authentication token: set "
            "RAY_AUTH_MODE=token and provide the token as RAY_AUTH_TOKEN, in a file named "
            "by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token (`ray get-auth-token` on the "
            "head prints it)."
        )
    return None


def _autoscaler_node_types() -> tuple[dict[str, float], ...]:
    """Node types an autoscaler may still add (empty without an autoscaler or via Ray Client)."""
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:
        return ()
    if config is None:
        return ()
    return tuple(
        {k: float(v) for k, v in group.resources.items()}
        for group in config.node_group_configs
        if group.max_count != 0
    )
