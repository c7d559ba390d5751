"""`mlflow server` started by the project: loopback only by default, healthy, writing
runs to SQLite and artifacts under its store, and gone (with its workers) after stop()."""

from __future__ import annotations

import shutil
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from cluster.tracking_server import (
    TrackingServer,
    TrackingServerError,
    server_command,
    start_tracking_server,
)

# One server for the module: under pytest-xdist its tests stay on one worker.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.xdist_group("tracking-server"),
]


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path
) -> Iterator[TrackingServer]:
    store = tmp_path_factory.mktemp("store")
    shutil.copyfile(_mlflow_template, store / "mlflow.db")  # schema migrated once per session
    started = start_tracking_server(store, port=0)
    try:
        yield started
    finally:
        started.stop()


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def test_command_uses_sqlite_and_served_artifacts(tmp_path: Path) -> None:
    command = server_command(tmp_path, "127.0.0.1", 5000)
    assert command[1:4] == ["-m", "mlflow", "server"]
    assert command[command.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path}/mlflow.db"
    assert command[command.index("--artifacts-destination") + 1] == str(tmp_path / "artifacts")
    assert "--serve-artifacts" in command and "--allowed-hosts" not in command
    named = server_command(tmp_path, "0.0.0.0", 5000, allowed_hosts="mlflow:*, mlflow.*")
    assert named[named.index("--allowed-hosts") + 1] == (
        "mlflow:*,mlflow.*,localhost,localhost:*,127.0.0.1,127.0.0.1:*"
    )


def test_binds_to_loopback_by_default(server: TrackingServer) -> None:
    assert server.uri == f"http://127.0.0.1:{server.port}"
    pids = {p.pid for p in _tree(server.pid)}
    listening = {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in pids
    }
    assert listening == {("127.0.0.1", server.port)}


def test_health_and_host_header_checks(server: TrackingServer) -> None:
    with urllib.request.urlopen(f"{server.uri}/health", timeout=10) as response:
        assert response.status == 200 and response.read().strip() == b"OK"
    # MLflow 3's DNS-rebinding guard: a foreign Host header is refused, loopback ones pass.
    search = f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1"
    for host, allowed in (
        ("localhost", True),
        (f"127.0.0.1:{server.port}", True),
        ("evil.example", False),
    ):
        request = urllib.request.Request(search, headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert (status == 200) is allowed, (host, status)


def test_a_run_logged_through_the_server_lands_in_the_store(server: TrackingServer) -> None:
    client = MlflowClient(server.uri)
    experiment = client.create_experiment("through-the-server")
    run = client.create_run(experiment, tags={"node_id": "abc"}).info.run_id
    client.log_param(run, "lr", "0.001")
    for step in (1, 2, 3):
        client.log_metric(run, "val_sharpe", 0.5 * step, step=step)
    client.log_text(run, "report", "comparison/report.html")
    client.set_terminated(run)

    # Read the SQLite file directly, without the server.
    direct = MlflowClient(f"sqlite:///{server.store / 'mlflow.db'}")
    stored = direct.get_run(run)
    assert stored.data.params == {"lr": "0.001"} and stored.data.tags["node_id"] == "abc"
    history = direct.get_metric_history(run, "val_sharpe")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert stored.info.artifact_uri.startswith("mlflow-artifacts:/")  # proxied by the server
    (artifact,) = server.artifacts_dir.rglob("report.html")
    assert artifact.read_text() == "report"


def test_port_in_use_is_refused_at_once(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(
            TrackingServerError, match=f"port {port} on 127.0.0.1 is already in use"
        ):
            start_tracking_server(tmp_path / "store", port=port, timeout_s=5)


def test_stop_ends_the_server_and_its_workers(server: TrackingServer) -> None:
    """Runs last in this module: the fixture's stop() is then a no-op."""
    tree = _tree(server.pid)
    assert len(tree) >= 2  # mlflow CLI + uvicorn worker
    server.stop()
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, alive
    assert not server.healthy()
    with socket.socket() as probe:  # nothing listens there any more
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", server.port))
