"""Safe defaults, checked the way a user meets them: the real ``hpo`` command in a
subprocess, with an environment that sets nothing for it."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
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


def _listening(root: psutil.Process) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening socket of ``root`` and its
    descendants (Ray's GCS, raylet, agents and workers are all children of the driver)."""
    found = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = proc.name()
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((name, conn.laddr.ip, conn.laddr.port))
        except psutil.Error:  # ended between the listing and the read
            continue
    return found


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedded_ray_of_a_sweep_listens_on_loopback_only(
    tmp_path: Path, mlflow_uri: str
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")
    }
    log_path = tmp_path / "sweep.log"
    with log_path.open("w") as log:
        driver = subprocess.Popen(
            [str(HPO), "sweep", str(_tiny_spec(tmp_path, mlflow_uri))],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        root = psutil.Process(driver.pid)
        seen: set[tuple[str, str, int]] = set()
        deadline = time.monotonic() + 400
        while driver.poll() is None and time.monotonic() < deadline:
            seen |= _listening(root)
            time.sleep(0.2)
        kill_tree(driver)  # past the deadline: the sweep and its Ray (a no-op once ended)
    output = log_path.read_text()
    assert driver.wait(30) == 0, output[-3000:]
    assert "1/1 trials finished" in output, output[-3000:]
    # The check saw Ray's services (it is not vacuous), and every one of them on loopback.
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in seen}, seen
    assert {s for s in seen if not _is_loopback(s[1])} == set()
