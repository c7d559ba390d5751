"""Joining a cluster through Ray Client retries a head whose per-job server failed to
start, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

import cluster.connect as connect

FLAKY = ConnectionAbortedError(
    "Initialization failure from server: RuntimeError: Starting Ray client server failed."
)
# What the proxier sends when the per-job server's shim process exits before psutil reads
# its command line (seen in CI on a fresh clone): its traceback, verbatim.
ZOMBIE = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    '  File ".../ray/util/client/server/proxier.py", line 396, in start_specific_server\n'
    "    cmd = psutil_proc.cmdline()\n"
    "psutil.ZombieProcess: PID still exists but it's a zombie (pid=4242)"
)


class _FakeRay:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls = 0

    def init(self, **kwargs: Any) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect.time, "sleep", lambda seconds: None)


def test_a_client_server_that_failed_to_start_is_asked_again() -> None:
    ray = _FakeRay([FLAKY, FLAKY])
    connect._init_with_client_retry(ray, {"address": "ray://127.0.0.1:10001"})
    assert ray.calls == 3


def test_a_client_server_whose_process_turned_zombie_is_asked_again() -> None:
    ray = _FakeRay([ZOMBIE, FLAKY])
    connect._init_with_client_retry(ray, {"address": "ray://127.0.0.1:10001"})
    assert ray.calls == 3


def test_it_gives_up_after_the_retries() -> None:
    ray = _FakeRay([FLAKY] * (connect.CLIENT_SERVER_RETRIES + 1))
    with pytest.raises(ConnectionAbortedError, match="client server failed"):
        connect._init_with_client_retry(ray, {})
    assert ray.calls == connect.CLIENT_SERVER_RETRIES + 1


def test_other_connection_errors_are_not_retried() -> None:
    ray = _FakeRay([ConnectionAbortedError("version mismatch"), FLAKY])
    with pytest.raises(ConnectionAbortedError, match="version mismatch"):
        connect._init_with_client_retry(ray, {})
    assert ray.calls == 1


@pytest.mark.ray
def test_a_local_ray_started_after_ray_was_imported_listens_on_loopback_only(
    ray_session: Any,
) -> None:
    """A library caller (a notebook, these tests) imports ray before ``ensure_ray``, so an
    environment variable set there comes too late for this process: the local Ray must
    still bind to loopback only."""
    import ipaddress

    import psutil

    listening = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listening.add((proc.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    assert listening, "no Ray process of this session was found listening"
    exposed = {
        entry
        for entry in listening
        if not ipaddress.ip_address(entry[1].split("%", 1)[0]).is_loopback
        and not (entry[1].startswith("::ffff:127."))
    }
    assert not exposed, f"Ray processes listen beyond loopback: {sorted(exposed)}"
