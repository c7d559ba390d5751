"""A throwaway multi-node Ray cluster on loopback, for tests: one head and N worker nodes,
each its own ``ray start --block`` process, with token authentication on.

Isolation from every other Ray on the machine (the test session's own local Ray, other
people's): a dedicated ``--temp-dir`` per node (so ``ray_current_cluster`` and the
sessions live there, not in /tmp/ray), ports picked free instead of the defaults
(6379, 8265, 10001, 52365), and a fresh random token given through ``RAY_AUTH_TOKEN``
(``~/.ray/auth_token`` is never read or written). Teardown never runs ``ray stop``,
which stops every Ray process on the machine: it signals the node's own ``ray start``
process, then kills the node's process group and any process that still carries the
node's marker variable in its environment (Ray's agents outlive their raylet otherwise).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# Every node's IP. Ray rewrites 127.0.0.1/localhost to the machine's routable address
# unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and that setting refuses worker nodes; any
# other 127.x address is loopback too and Ray keeps it as given.
NODE_IP = "127.0.0.2"
MARK = "HPO_TEST_RAY_NODE"  # environment marker: "<cluster id>/<node name>"
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def marked_pids(prefix: str) -> list[int]:
    """Processes whose environment carries ``MARK=<prefix>...``. Read from /proc directly:
    Ray renames its processes (setproctitle) and psutil then reads an empty environment."""
    needle = f"{MARK}={prefix}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(needle) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class RayNode:
    name: str
    mark: str
    process: subprocess.Popen[bytes]
    temp_dir: Path
    log: Path
    node_id: str | None = None

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop this node like ``ray stop`` would, but only this node's processes."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # ray start --block stops its children
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (left := marked_pids(self.mark)) and time.monotonic() < deadline:
            _kill(left, signal.SIGKILL)
            time.sleep(0.2)

    def kill(self) -> None:
        """Lose this node at once, as when its machine dies or a spot VM is preempted:
        SIGKILL to every process of it (raylet, agents, the trials' workers) together."""
        pids = marked_pids(self.mark)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        _kill(pids, signal.SIGKILL)
        self.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (left := marked_pids(self.mark)) and time.monotonic() < deadline:
            _kill(left, signal.SIGKILL)
            time.sleep(0.2)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class LocalCluster:
    """Head + workers on 127.0.0.1. ``env`` is what a client of this cluster needs."""

    root: Path
    token: str
    cluster_id: str
    gcs_port: int
    dashboard_port: int
    client_port: int
    env: dict[str, str]
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def head_ip(self) -> str:
        return NODE_IP

    @property
    def gcs_address(self) -> str:
        return f"{NODE_IP}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def head(self) -> RayNode:
        return self.nodes[0]

    def workers(self) -> list[RayNode]:
        return self.nodes[1:]

    def _start(self, name: str, args: list[str]) -> RayNode:
        temp_dir = self.root / name
        temp_dir.mkdir(parents=True)
        mark = f"{self.cluster_id}/{name}"
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    RAY,
                    "start",
                    "--block",
                    f"--node-ip-address={NODE_IP}",
                    f"--temp-dir={temp_dir}",
                    f"--dashboard-agent-listen-port={free_port()}",
                    f"--node-name={name}",
                    "--disable-usage-stats",
                    *args,
                ],
                env={**self.env, MARK: mark},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node = RayNode(name=name, mark=mark, process=process, temp_dir=temp_dir, log=log)
        self.nodes.append(node)
        return node

    def start_head(self, num_cpus: float, num_gpus: float, system_config: str | None) -> RayNode:
        args = [
            "--head",
            f"--port={self.gcs_port}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={self.client_port}",
            f"--num-cpus={num_cpus:g}",
            f"--num-gpus={num_gpus:g}",
        ]
        if system_config:
            args.append(f"--system-config={system_config}")
        return self._start("head", args)

    def start_worker(self, name: str, num_cpus: float, num_gpus: float) -> RayNode:
        return self._start(
            name,
            [
                f"--address={self.gcs_address}",
                f"--num-cpus={num_cpus:g}",
                f"--num-gpus={num_gpus:g}",
            ],
        )

    def wait_for_nodes(self, n: int, timeout_s: float = 150.0) -> dict[str, str]:
        """Block until ``n`` nodes are alive; returns {node name: node id}."""
        import json
        import urllib.request

        deadline = time.monotonic() + timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            for node in self.nodes:
                if not node.alive:
                    raise RuntimeError(
                        f"ray node {node.name} exited:\n{node.log.read_text()[-3000:]}"
                    )
            try:
                request = urllib.request.Request(
                    f"{self.dashboard_url}/api/v0/nodes?detail=1&limit=100",
                    headers={"Authorization": f"Bearer {self.token}"},
                )
                with urllib.request.urlopen(request, timeout=5) as response:
                    payload = json.load(response)
                rows = payload["data"]["result"]["result"]
                alive = [r for r in rows if r.get("state") == "ALIVE"]
                if len(alive) >= n:
                    return self._name_nodes(alive)
            except Exception as exc:  # the dashboard comes up after the GCS
                last_error = repr(exc)
            time.sleep(1.0)
        raise TimeoutError(f"{n} ray nodes not alive after {timeout_s:.0f}s ({last_error})")

    def _name_nodes(self, alive: list[dict]) -> dict[str, str]:
        ids = {row.get("node_name"): row["node_id"] for row in alive}
        for node in self.nodes:
            node.node_id = ids.get(node.name, node.node_id)
        return {name: node_id for name, node_id in ids.items() if name}

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        left = marked_pids(self.cluster_id)
        _kill(left, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def client_env(token: str, cluster_id: str) -> dict[str, str]:
    """Environment of cluster processes and their clients: loopback node IPs, token auth
    with this cluster's token, and this project's Python first on PATH (the Jobs API runs
    ``python -m hpo.cli ...`` with the head's environment)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "HPO_")) and k not in ("PYTEST_CURRENT_TEST",)
    }
    env.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        RAY_USAGE_STATS_ENABLED="0",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        HPO_TEST_CLUSTER=cluster_id,
    )
    return env


def start_cluster(
    workers: int = 2,
    head_cpus: float = 1,
    worker_cpus: float = 1,
    worker_gpus: float = 2,
    system_config: str | None = None,
) -> LocalCluster:
    """Start head + workers and wait until all are alive; tears down on any failure."""
    cluster_id = uuid.uuid4().hex[:12]
    # Short root: Ray's unix socket paths live under it (108-byte limit).
    root = Path(tempfile.mkdtemp(prefix="hpo-rc-", dir="/tmp"))
    token = secrets.token_hex(32)
    cluster = LocalCluster(
        root=root,
        token=token,
        cluster_id=cluster_id,
        gcs_port=free_port(),
        dashboard_port=free_port(),
        client_port=free_port(),
        env=client_env(token, cluster_id),
    )
    try:
        cluster.start_head(head_cpus, 0, system_config)
        cluster.wait_for_nodes(1)
        for i in range(workers):
            cluster.start_worker(f"worker{i + 1}", worker_cpus, worker_gpus)
        cluster.wait_for_nodes(1 + workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_tracking_server_process(store: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`hpo tracking-server` on ``port`` over ``store``, as users start it, in its own
    process group (so a test can kill it whole), its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "hpo.cli", "tracking-server"),
                *("--port", str(port), "--store", str(store)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
