"""Clear errors before anything launches: an unreachable head (in seconds, not Ray's
minutes of retries), a Ray/Python version mismatch, a missing token, resources no node
offers, and node-local storage on a multi-node cluster."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster.connect import (
    ClusterError,
    ClusterInfo,
    ensure_ray,
    parse_address,
    probe_head,
    rephrase_connect_error,
)
from cluster.preflight import preflight, resource_problems
from cluster.storage import SHARED_ENV, shared_storage_problem
from tests.cluster.local_cluster import free_port
from tests.hpo.sweep_helpers import tiny_spec

CPU_HEAD = {"CPU": 4.0, "memory": 8e9}
GPU_WORKER = {"CPU": 8.0, "GPU": 2.0}


def _ray_mismatch_error(where: str) -> RuntimeError:
    """The error Ray itself raises (same function, same text) for a version mismatch."""
    from ray._private.utils import check_version_info

    with pytest.raises(RuntimeError) as caught:
        check_version_info(
            {"ray_version": "2.59.0", "python_version": "3.10.14"},
            where,
            raise_on_mismatch=True,
            python_version_match_level="minor",
        )
    return caught.value


# -- unreachable head --------------------------------------------------------------------------
def test_addresses_parse_into_the_port_to_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_address("ray://head.internal:10001") == ("ray", "head.internal", 10001)
    assert parse_address("ray://head.internal") == ("ray", "head.internal", 10001)
    assert parse_address("10.0.0.5:6379") == ("gcs", "10.0.0.5", 6379)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert parse_address("auto") is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.2:6380")  # what a Jobs API driver sees
    assert parse_address("auto") == ("gcs", "127.0.0.2", 6380)
    with pytest.raises(ClusterError, match="cannot parse the Ray address"):
        parse_address("head.internal")


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_closed_port_is_refused_at_once(scheme: str) -> None:
    address = f"{scheme}127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ClusterError) as caught:
        probe_head(address, timeout_s=60.0)  # a refusal never waits for the timeout
    message = str(caught.value)
    assert "cannot reach the Ray head's" in message and address in message
    assert "connection refused" in message and "ray start --head" in message
    assert ("10001" if scheme else "6379") in message


@contextlib.contextmanager
def _port_that_never_answers() -> Iterator[int]:
    """A loopback port whose connects hang, as behind a firewall that drops packets: a
    listener that accepts nothing, its accept queue filled (Linux then drops further
    SYNs, and a client's connect waits until its timeout)."""
    with socket.socket() as server, contextlib.ExitStack() as held:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(16):
            client = held.enter_context(socket.socket())
            client.settimeout(0.5)
            try:
                client.connect(("127.0.0.1", port))
            except TimeoutError:
                break  # the queue is full: the next connect hangs too
        else:
            pytest.fail("the listener's accept queue never filled")
        yield port


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_head_that_never_answers_fails_at_the_probe_timeout(scheme: str) -> None:
    with _port_that_never_answers() as port:
        address = f"{scheme}127.0.0.1:{port}"
        started = time.monotonic()
        with pytest.raises(ClusterError) as caught:
            probe_head(address, timeout_s=1.0)
        waited = time.monotonic() - started
    message = str(caught.value)
    assert "cannot reach the Ray head's" in message and address in message
    assert "no answer within 1s" in message  # the timeout branch, not a refusal
    # It waited for its timeout, not for Ray's minutes of retries (a loose upper bound:
    # a loaded machine may be slow to wake the probe).
    assert 0.9 <= waited < 30.0


def test_a_listening_head_passes_the_probe() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        probe_head(f"127.0.0.1:{server.getsockname()[1]}")


def test_hpo_sweep_with_an_unreachable_address_starts_nothing(tmp_path: Path) -> None:
    """End to end in a fresh process (this one may already hold the session's Ray)."""
    import yaml

    spec = tiny_spec(tmp_path)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump()))
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "sweep", str(path), "--address", address],
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    message = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"cannot reach the Ray head's GCS at {address}: connection refused" in message
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "mlflow.db").exists()
    print(f"unreachable head reported in {elapsed:.1f}s (imports included)")


# -- version mismatch and token ------------------------------------------------------------------
@pytest.mark.parametrize("where", ["node 127.0.0.1", "Ray Client"])
def test_version_mismatch_is_rephrased_into_what_to_do(where: str) -> None:
    import platform

    import ray

    error = rephrase_connect_error(_ray_mismatch_error(where), "ray://head:10001")
    assert error is not None
    message = str(error)
    assert message.startswith("Ray version mismatch with the cluster at ray://head:10001")
    assert "the cluster runs Ray 2.59.0 on Python 3.10.14" in message
    assert (
        f"this process has Ray {ray.__version__} on Python {platform.python_version()}" in message
    )
    assert "hpo submit" in message and "pip install 'ray[default]==" in message


def test_ensure_ray_raises_the_rephrased_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    mismatch = _ray_mismatch_error("node 127.0.0.1")

    def failing_init(**kwargs: object) -> None:
        raise mismatch

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", failing_init)
    with socket.socket() as head:  # a head that answers the probe
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        with pytest.raises(ClusterError, match="Ray version mismatch") as caught:
            ensure_ray(address)
    assert caught.value.__cause__ is mismatch


def test_missing_token_and_unrelated_errors() -> None:
    from ray.exceptions import AuthenticationError

    error = rephrase_connect_error(AuthenticationError("no token"), "10.0.0.5:6379")
    assert error is not None
    assert "RAY_AUTH_TOKEN" in str(error) and "ray get-auth-token" in str(error)
    assert rephrase_connect_error(ValueError("something else"), "10.0.0.5:6379") is None
    nothing = ConnectionError("Could not find any running Ray instance. Please specify ...")
    error = rephrase_connect_error(nothing, "auto")
    assert error is not None and str(error).startswith("no Ray cluster found for --address auto")


# -- resources -----------------------------------------------------------------------------------
def test_measured_gpu_on_a_cluster_without_gpus() -> None:
    (problem,) = resource_problems(1.0, "measured", [CPU_HEAD, CPU_HEAD])
    assert "resources.gpu = 'measured'" in problem
    assert "the cluster has no GPUs (2 node(s): 2 x 4 CPU/0 GPU)" in problem
    assert "resources.gpu = 0" in problem and "--num-gpus" in problem


@pytest.mark.parametrize(
    ("cpu", "gpu", "expected"),
    [
        (1.0, 0.25, []),
        (1.0, "measured", []),
        (8.0, 1.0, []),
        (1.0, 1.0, []),
        (0.5, 2.0, []),
        (1.0, 4.0, ["resources.gpu = 4 per trial, but the node with the most GPUs has 2"]),
        (16.0, 0.0, ["resources.cpu = 16 per trial, but the largest node has 8 CPUs"]),
        (1.0, 3.0, ["resources.gpu = 3 per trial"]),
    ],
)
def test_resources_checked_against_node_shapes(
    cpu: float, gpu: float | str, expected: list[str]
) -> None:
    problems = resource_problems(cpu, gpu, [CPU_HEAD, GPU_WORKER, GPU_WORKER])
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem


def test_cpu_and_gpu_must_fit_on_one_node() -> None:
    # 8 CPUs on the head, GPUs on workers with 2 CPUs: a 4-CPU GPU trial fits nowhere.
    problems = resource_problems(4.0, 0.5, [{"CPU": 8.0}, {"CPU": 2.0, "GPU": 4.0}])
    assert len(problems) == 1
    assert problems[0].startswith("no single node has both resources.cpu = 4 CPUs")


def test_autoscaler_node_types_count_as_available() -> None:
    # A KubeRay GPU group scaled to zero: no GPU node now, but the autoscaler can add one.
    assert resource_problems(1.0, "measured", [CPU_HEAD], scalable=[GPU_WORKER]) == []


# -- storage -------------------------------------------------------------------------------------
def test_node_local_storage_on_several_nodes_is_explained(tmp_path: Path) -> None:
    problem = shared_storage_problem(str(tmp_path / "results"), 3, env={})
    assert problem is not None
    assert f"{tmp_path / 'results'} is a node-local path" in problem
    assert "the cluster has 3 nodes" in problem
    for fix in ("NFS", "s3://", "gs://", "pyarrow", f"{SHARED_ENV}=1", "--shared-storage"):
        assert fix in problem


def test_what_counts_as_shared_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = str(tmp_path / "results")
    assert shared_storage_problem(local, 1, env={}) is None  # one node: any path works
    assert shared_storage_problem("s3://bucket/hpo", 4, env={}) is None
    assert shared_storage_problem("gs://bucket/hpo", 4, env={}) is None
    assert shared_storage_problem(local, 4, env={SHARED_ENV: "1"}) is None
    assert shared_storage_problem(local, 4, env={SHARED_ENV: f"/elsewhere:{tmp_path}"}) is None
    assert shared_storage_problem(local, 4, env={SHARED_ENV: "/elsewhere"}) is not None
    assert shared_storage_problem(local, 4, env={SHARED_ENV: "0"}) is not None

    import psutil

    nfs = SimpleNamespace(mountpoint=str(tmp_path), fstype="nfs4")
    real = psutil.disk_partitions
    monkeypatch.setattr(psutil, "disk_partitions", lambda all=True: [*real(all=True), nfs])
    assert shared_storage_problem(local, 4, env={}) is None


# -- the whole check ------------------------------------------------------------------------------
def test_preflight_lists_every_problem_at_once(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path, resources={"cpu": 1, "gpu": "measured"})
    nodes = ({"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 2.0})
    info = ClusterInfo(
        address="10.0.0.5:6379",
        resources={"CPU": 6.0},
        n_nodes=3,
        started_here=False,
        node_resources=nodes,
    )
    with pytest.raises(ClusterError) as caught:
        preflight(spec, info, env={})
    message = str(caught.value)
    assert message.startswith("sweep 'e2e' cannot run on this Ray cluster (nothing was launched)")
    assert "the cluster has no GPUs (3 node(s): 3 x 2 CPU/0 GPU)" in message
    assert "is a node-local path" in message
    ok = tiny_spec(tmp_path, resources={"cpu": 1, "gpu": 0})
    preflight(ok, info, env={SHARED_ENV: "1"})  # nothing to say


@pytest.mark.ray
def test_run_sweep_checks_resources_before_creating_anything(
    ray_session: object, tmp_path: Path
) -> None:
    """On the session's real local Ray (2 CPUs): a 3-CPU trial is refused before the
    sweep folder or any MLflow run exists."""
    from hpo.record import SweepError
    from hpo.sweep import run_sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = tiny_spec(tmp_path, tracking_uri=uri, resources={"cpu": 3, "gpu": 0})
    with pytest.raises(
        SweepError, match=r"resources.cpu = 3 per trial, but the largest node has 2"
    ):
        run_sweep(spec)
    assert not (tmp_path / "results").exists()
    assert not (tmp_path / "mlflow.db").exists()  # not even the tracking store was touched
