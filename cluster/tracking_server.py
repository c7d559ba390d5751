"""An MLflow tracking server for sweeps that run on several machines.

    hpo tracking-server --store ~/mlflow-store            # http://127.0.0.1:5000
    hpo tracking-server --host 0.0.0.0 --port 5000 --allowed-hosts 'mlflow.internal:*'
    hpo tracking-server --store ~/mlflow-store --add-reader alice   # a read-only user

One ``mlflow server`` process: runs and metrics in SQLite (``STORE/mlflow.db``), artifacts
served by the server itself (``--serve-artifacts``) from ``STORE/artifacts``, so clients
anywhere upload and download them over HTTP and need no access to the store's disk. The
sweep driver is the only writer of a sweep's runs (see :mod:`hpo.tracking`), which SQLite
handles well; one server worker is enough and spares small machines.

Security: bound to 127.0.0.1 unless a host is given. MLflow 3 also checks the ``Host``
header of every request (default: localhost and private IPs) and CORS origins (default:
localhost origins), so loopback clients work as they are; a server reached by a DNS name
(a Kubernetes Service, ``mlflow.internal``) needs that name in ``allowed_hosts``
(fnmatch patterns matched against ``host:port``, e.g. ``mlflow:*,mlflow.*``; loopback
names are kept).

Authentication (``auth=True``; the default of ``hpo tracking-server``): MLflow's
``basic-auth`` app, with its users and grants in ``STORE/auth/`` (see
:mod:`cluster.tracking_users`): a request without valid credentials gets 401, the sweep
user (``STORE/auth/sweep.credentials``, mode 0600) writes runs, readers only read. Without
it (``--no-auth``) anyone who reaches the port reads and rewrites every run, so that is
allowed on a loopback address only: :func:`exposure` is that rule, for
:func:`start_tracking_server` and ``hpo tracking-server`` alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5000
LOOPBACK_HOSTS = ("localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*")


class TrackingServerError(RuntimeError):
    """The tracking server could not start (the message says why, with its log's tail)."""


@dataclass
class TrackingServer:
    """A running ``mlflow server``; ``stop()`` (or leaving the ``with`` block) ends it."""

    host: str
    port: int
    store: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    credentials_path: Path | None = None
    """The sweep user's credentials file; None when the server runs without authentication."""
    _stopped: bool = field(default=False, repr=False)

    @property
    def auth(self) -> bool:
        return self.credentials_path is not None

    @property
    def uri(self) -> str:
        """The tracking URI clients use (``--tracking-uri``)."""
        return f"http://{_client_host(self.host)}:{self.port}"

    @property
    def backend_store_uri(self) -> str:
        return f"sqlite:///{self.store / 'mlflow.db'}"

    @property
    def artifacts_dir(self) -> Path:
        return self.store / "artifacts"

    @property
    def pid(self) -> int:
        return self.process.pid

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the server and its worker processes (its whole process group)."""
        if self._stopped:
            return
        self._stopped = True
        _signal_group(self.process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        _signal_group(self.process, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    def __enter__(self) -> TrackingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_command(
    store: Path,
    host: str,
    port: int,
    workers: int = 1,
    allowed_hosts: str | None = None,
    *,
    auth: bool = False,
) -> list[str]:
    """The ``mlflow server`` command line (MLflow 3: SQLite backend, proxied artifacts;
    with ``auth``, MLflow's basic-auth app with the rule of :mod:`cluster.tracking_app`)."""
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{store / 'mlflow.db'}",
        "--serve-artifacts",
        "--artifacts-destination",
        str(store / "artifacts"),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    if auth:
        from cluster.tracking_app import APP_NAME

        command += ["--app-name", APP_NAME]
    if allowed_hosts:
        # The given names replace MLflow's defaults; loopback stays allowed so the UI still
        # works through an SSH tunnel or `kubectl port-forward` (Host: localhost:PORT).
        names = [h.strip() for h in allowed_hosts.split(",") if h.strip()]
        names += [h for h in LOOPBACK_HOSTS if h not in names]
        command += ["--allowed-hosts", ",".join(names)]
    return command


def start_tracking_server(
    store: str | Path,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    workers: int = 1,
    allowed_hosts: str | None = None,
    auth: bool = False,
    sweep_credentials: str | Path | None = None,
    timeout_s: float = 180.0,
) -> TrackingServer:
    """Start ``mlflow server`` on ``host:port`` (port 0: a free one) and wait until its
    ``/health`` answers. Raises :class:`TrackingServerError` if it exits or stays silent.

    ``auth``: MLflow's basic-auth app, its users created on first start (see
    :mod:`cluster.tracking_users`; ``sweep_credentials``: the sweep user's name and
    password from that file instead of generated ones). Without ``auth`` the host must be
    a loopback address (:func:`exposure`)."""
    exposure(host, auth)
    store = Path(store).expanduser().resolve()
    (store / "artifacts").mkdir(parents=True, exist_ok=True)
    auth_env: dict[str, str] = {}
    credentials_path: Path | None = None
    if auth:
        from cluster.tracking_users import TrackingAuthSetupError, prepare

        try:
            files = prepare(store, sweep_credentials)
        except (TrackingAuthSetupError, ValueError) as exc:
            raise TrackingServerError(str(exc)) from exc
        auth_env = files.server_env()
        credentials_path = (
            Path(sweep_credentials).expanduser().resolve()
            if sweep_credentials is not None
            else files.sweep_credentials
        )
    if port == 0:
        port = _free_port(host)
    elif not _port_free(host, port):
        raise TrackingServerError(
            f"port {port} on {host} is already in use (another MLflow server?): pick "
            "another with --port, or 0 for any free port"
        )
    log_path = store / "server.log"
    # MLflow 3's job runner (GenAI judges, trace archival) spawns ~8 worker processes;
    # a sweep's tracking store needs none of it.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    # The admin already exists in the auth database; these would only override its config.
    for name in (
        "MLFLOW_AUTH_ADMIN_USERNAME",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_AUTH_CONFIG_PATH",
    ):
        env.pop(name, None)
    env.update(auth_env)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            server_command(store, host, port, workers, allowed_hosts, auth=auth),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: stop() reaches its workers
        )
    server = TrackingServer(
        host=host,
        port=port,
        store=store,
        process=process,
        log_path=log_path,
        credentials_path=credentials_path,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise TrackingServerError(
                f"mlflow server exited with code {process.returncode} before answering:\n"
                f"{_tail(log_path)}"
            )
        if server.healthy(timeout_s=2.0):
            return server
        time.sleep(0.5)
    server.stop()
    raise TrackingServerError(
        f"mlflow server did not answer {server.uri}/health within {timeout_s:.0f}s:\n"
        f"{_tail(log_path)}"
    )


def exposure(host: str, auth: bool) -> tuple[str, str] | None:
    """Who can reach a server on ``host``: raises :class:`TrackingServerError` for one
    without ``auth`` off loopback, where anyone who reaches it could read and rewrite
    every run; else ``(level, message)`` to show whoever starts it ("warning" or "note"),
    or None for an authenticated server on loopback."""
    if not auth and not is_loopback(host):
        raise TrackingServerError(
            f"refusing to serve {host} without authentication (--no-auth with --host "
            f"{host}): anyone who reaches it could read and rewrite every run; a server "
            "without authentication may listen on loopback (127.0.0.1) only: drop "
            "--no-auth to serve the network with MLflow's authentication"
        )
    if not auth:
        return (
            "warning",
            f"authentication is off (--no-auth): allowed because {host} is loopback; "
            "anyone on this machine can read and write the store",
        )
    if not is_loopback(host):
        return (
            "note",
            f"binding to {host}: clients need the sweep user's credentials; pass "
            "--allowed-hosts for the names clients use",
        )
    return None


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _client_host(host: str) -> str:
    # A server bound to every interface is reachable on loopback from this machine.
    if host in ("0.0.0.0", "::", ""):
        return DEFAULT_HOST
    return f"[{host}]" if ":" in host else host


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        # As the server will: connections of a previous server in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is not None and sig == signal.SIGTERM:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"
