"""Safe defaults, checked the way a user meets them: the real ``hpo`` command in a
subprocess, with an environment that sets nothing for it."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.hpo.sweep_helpers import ONE_TFT, write_tiny_spec
from tests.processes import kill_tree

HPO = Path(sys.executable).with_name("hpo")  # the console script (hpo = "hpo.cli:main")


def _tiny_spec(tmp_path: Path, tracking_uri: str) -> Path:
    trainer = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 4}
    return write_tiny_spec(
        tmp_path,
        "loopback",
        tracking_uri,
        **ONE_TFT,
        max_epochs=1,
        max_concurrent=1,
        trainer=trainer,
        resources={"cpu": 1, "gpu": 0},
    )


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # '::ffff:127.0.0.1' is loopback too
    return address.is_loopback


def _listening(proc: psutil.Process) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening socket of ``proc``."""
    name = proc.name()
    return {
        (name, conn.laddr.ip, conn.laddr.port)
        for conn in proc.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    }


def _is_worker(proc: psutil.Process) -> bool:
    """A Ray worker process: ``default_worker.py`` until it renames itself ``ray::IDLE``,
    then ``ray::<actor or task>``; Ray's agents are ``ray::DashboardAgent`` and
    ``ray::RuntimeEnvAgent``."""
    command = proc.cmdline()
    if command and command[0].startswith("ray::"):
        return not command[0].startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))
    return any(arg.endswith("/default_worker.py") for arg in command[1:3])


@dataclass
class WatchedSweep:
    """A one-trial sweep's output and exit, and what its process tree did meanwhile,
    sampled every 0.2 s (Ray's GCS, raylet, agents and workers are all children of the
    driver)."""

    output: str
    returncode: int
    listening: set[tuple[str, str, int]] = field(default_factory=set)
    workers: dict[int, set[str]] = field(default_factory=dict)  # pid -> its names seen


@pytest.fixture(scope="module")
def watched_sweep(tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path) -> WatchedSweep:
    tmp_path = tmp_path_factory.mktemp("safe-defaults")
    shutil.copyfile(_mlflow_template, tmp_path / "mlflow.db")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")
    }
    log_path = tmp_path / "sweep.log"
    spec = _tiny_spec(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}")
    with log_path.open("w") as log:
        driver = subprocess.Popen(
            [str(HPO), "sweep", str(spec)],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        root = psutil.Process(driver.pid)
        listening: set[tuple[str, str, int]] = set()
        workers: dict[int, set[str]] = {}
        deadline = time.monotonic() + 400
        while driver.poll() is None and time.monotonic() < deadline:
            for proc in [root, *root.children(recursive=True)]:
                try:
                    listening |= _listening(proc)
                    if _is_worker(proc):
                        workers.setdefault(proc.pid, set()).add(proc.cmdline()[0])
                except psutil.Error:  # ended between the listing and the read
                    continue
            time.sleep(0.2)
        kill_tree(driver)  # past the deadline: the sweep and its Ray (a no-op once ended)
    return WatchedSweep(log_path.read_text(), driver.wait(30), listening, workers)


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedded_ray_of_a_sweep_listens_on_loopback_only(watched_sweep: WatchedSweep) -> None:
    output = watched_sweep.output
    assert watched_sweep.returncode == 0, output[-3000:]
    assert "1/1 trials finished" in output, output[-3000:]
    seen = watched_sweep.listening
    # The check saw Ray's services (it is not vacuous), and every one of them on loopback.
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in seen}, seen
    assert {s for s in seen if not _is_loopback(s[1])} == set()


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedded_ray_starts_a_worker_only_for_the_trial(watched_sweep: WatchedSweep) -> None:
    """Ray would prestart a worker per CPU (2 here) for the first driver; the sweep's
    local Ray does not (cluster.connect.LOCAL_SYSTEM_CONFIG), so its one trial's actor is
    the only worker there ever was."""
    assert watched_sweep.returncode == 0, watched_sweep.output[-3000:]
    assert len(watched_sweep.workers) == 1, watched_sweep.workers
    (names,) = watched_sweep.workers.values()
    assert any(name.startswith("ray::ImplicitFunc") for name in names), names
