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


# What CI saw when the per-job server did not come up within the proxier's channel check:
# the proxier's traceback, verbatim, which the retry warning printed to the user whole.
TIMED_OUT = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    '  File ".../ray/util/client/server/proxier.py", line 772, in Datapath\n'
    "    raise RuntimeError(\n"
    "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err "
    "for detailed logs.\n"
)


def test_the_retry_warning_is_one_line_naming_the_reason_without_the_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ray = _FakeRay([TIMED_OUT, ZOMBIE])
    with caplog.at_level("WARNING", logger=connect.log.name):
        connect._init_with_client_retry(ray, {})
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2
    assert all("Traceback" not in w and "\n" not in w for w in warnings)
    assert (
        "RuntimeError: Starting Ray client server failed. See ray_client_server_23000.err"
        in (warnings[0])
    )
    assert "attempt 2 of" in warnings[0]
    assert "psutil.ZombieProcess: PID still exists" in warnings[1]


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
