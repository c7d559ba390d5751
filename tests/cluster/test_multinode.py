"""A real multi-node Ray cluster on this machine: a head (no GPUs) and two worker nodes
(2 logical GPUs each) as separate `ray start` processes with token authentication,
`hpo tracking-server` as its own process (authenticated: submitted sweeps log in with
its sweep user's file, named by path with `--head-credentials`), and sweeps sent with
`hpo submit` through the Jobs API.

All nodes share this machine's disk, so the sweep's storage is declared shared with
`--shared-storage` (on a real cluster: NFS or another mount every node sees); the same
path without that declaration is refused by the sweep driver before any trial starts.
Everything is torn down by the fixtures' finalizers, also when a test fails: each node's
processes are stopped by their own process group and environment marker, never with
`ray stop` (which would stop every Ray on the machine, the test session's included).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mlflow.tracking import MlflowClient

from cluster.tracking_auth import PASSWORD_VAR, USERNAME_VAR, apply_credentials, load_credentials
from tests.cluster.local_cluster import (
    LocalCluster,
    RayNode,
    free_port,
    marked_pids,
    start_cluster,
    start_tracking_server_process,
)
from tests.hpo.sweep_helpers import (
    checkpointed_epochs,
    results,
    trial_dirs,
    trial_id,
    trial_runs,
    write_tiny_spec,
)
from tests.processes import signal_all, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[2]
HPO = [sys.executable, "-m", "hpo.cli"]


@pytest.fixture(scope="module")
def tracking_process(
    tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path
) -> Iterator[dict[str, Any]]:
    """`hpo tracking-server` in its own process group, started before the cluster so both
    come up at once; the `tracking` fixture waits for it."""
    store = tmp_path_factory.mktemp("mlflow-server")
    shutil.copyfile(_mlflow_template, store / "mlflow.db")  # schema migrated once per session
    port = free_port()
    log = store.parent / "tracking-server.log"
    process = start_tracking_server_process(store, port, log)
    try:
        yield {"process": process, "uri": f"http://127.0.0.1:{port}", "store": store, "log": log}
    finally:
        process.send_signal(signal.SIGTERM)  # the command stops its mlflow server, then exits
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        signal_all(
            [
                child
                for child in psutil.process_iter(["cmdline"])
                if f"--port {port}" in " ".join(child.info["cmdline"] or [])
            ],
            signal.SIGKILL,
        )


@pytest.fixture(scope="module")
def cluster(tracking_process: dict[str, Any]) -> Iterator[LocalCluster]:
    started = start_cluster(workers=2, head_cpus=1, worker_cpus=1, worker_gpus=2)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def tracking(tracking_process: dict[str, Any]) -> tuple[str, Path]:
    """(uri, store) of the running tracking server."""
    process, uri, log = (
        tracking_process["process"],
        tracking_process["uri"],
        tracking_process["log"],
    )
    wait_for(
        lambda: "tracking URI:" in log.read_text(),
        timeout=240,
        what="the tracking server's 'tracking URI:' line",
        proc=process,
        interval=0.5,
        detail=log.read_text,
    )
    assert f"tracking URI: {uri}" in log.read_text()
    with urllib.request.urlopen(f"{uri}/health", timeout=10) as response:
        assert response.status == 200
    return uri, tracking_process["store"]


@pytest.fixture
def sweep_user(tracking: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sweep user's credentials file; this test process's MLflow clients log in with it.
    The cluster and the `hpo` clients (``cluster.env``) never see these variables: a
    submitted sweep authenticates only through the file `--head-credentials` names."""
    for var in (USERNAME_VAR, PASSWORD_VAR):
        monkeypatch.delenv(var, raising=False)
    path = tracking[1] / "auth" / "sweep.credentials"
    apply_credentials(path)  # sets both variables; monkeypatch restores them afterwards
    return path


def write_spec(tmp_path: Path, name: str, uri: str, **overrides: Any) -> Path:
    """The tiny end-to-end sweep as a YAML spec: trials ask for half a GPU, so they only
    fit on the two GPU workers (the head has none)."""
    return write_tiny_spec(
        tmp_path,
        name,
        tracking_uri=uri,
        storage=str(tmp_path / "shared"),
        resources={"cpu": 1, "gpu": 0.5},
        **overrides,
    )


def hpo(cluster: LocalCluster, *args: str, timeout: float = 360) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*HPO, *args],
        cwd=REPO,
        env=cluster.env,  # the client holds the cluster's token (RAY_AUTH_TOKEN), like a user
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def submit(cluster: LocalCluster, spec: Path, *args: str) -> subprocess.CompletedProcess:
    return hpo(
        cluster,
        "submit",
        str(spec),
        "--address",
        cluster.dashboard_url,
        "--working-dir",
        str(REPO),
        *args,
    )


def login(credentials: Path) -> tuple[str, ...]:
    """The client checks the server with the file; the job's sweep reads the same file on
    the head (one machine here), named by path: no secret travels through Ray."""
    return ("--tracking-credentials", str(credentials), "--head-credentials", str(credentials))


def job_id(output: str) -> str:
    match = re.search(r"submitted job: (\S+)", output)
    assert match, output
    return match.group(1)


def assert_no_token(
    token: str, *texts: str, store: Path | None = None, skip: Path | None = None
) -> None:
    """``token`` is in none of ``texts`` nor any file of ``store`` (but those under ``skip``)."""
    for text in texts:
        assert token not in text
    if store is not None:
        for path in store.rglob("*"):
            if path.is_file() and not (skip is not None and path.is_relative_to(skip)):
                assert token.encode() not in path.read_bytes(), path


def _trial_workers_on(node: RayNode) -> list[int]:
    """The node's Tune trial workers (processes Ray titles ``ray::ImplicitFunc...``)."""
    pids = []
    for pid in marked_pids(node.mark):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"ray::ImplicitFunc"):
            pids.append(pid)
    return pids


def _hold_the_first_trial_until_the_other_worker_runs_one(
    cluster: LocalCluster, submitted: subprocess.Popen
) -> None:
    """Freeze the first trial's worker until a trial runs on the other GPU worker node.

    A trial that ends before the next one's worker has started on the other node hands
    its actor to that trial (Tune reuses actors), and a sweep of short trials then never
    leaves the first node. Held, the first trial keeps its node's only CPU, so the next
    one can only start on the other node: what is checked is that it does, however fast
    the trials are."""
    first = wait_for(
        lambda: next(((n, p) for n in cluster.workers() for p in _trial_workers_on(n)), None),
        timeout=300,
        what="the first trial's worker on a GPU worker node",
        proc=submitted,
        interval=0.05,
    )
    signal_all([first[1]], signal.SIGSTOP)
    try:
        wait_for(
            lambda: any(_trial_workers_on(n) for n in cluster.workers() if n is not first[0]),
            timeout=300,
            what="a trial's worker on the other GPU worker node",
            proc=submitted,
            interval=0.2,
        )
    finally:
        signal_all([first[1]], signal.SIGCONT)


def test_submitted_sweep_runs_on_both_gpu_workers_and_logs_to_the_tracking_server(
    cluster: LocalCluster, tracking: tuple[str, Path], sweep_user: Path, tmp_path: Path
) -> None:
    from cluster.submit import job_client

    uri, store = tracking
    assert not any(k in cluster.env for k in (USERNAME_VAR, PASSWORD_VAR))
    spec = write_spec(tmp_path, "multinode", uri)
    started = time.monotonic()
    args = ["--address", cluster.dashboard_url, "--working-dir", str(REPO)]
    submitted = subprocess.Popen(
        [*HPO, "submit", str(spec), *args, "--follow", "--shared-storage", *login(sweep_user)],
        cwd=REPO,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _hold_the_first_trial_until_the_other_worker_runs_one(cluster, submitted)
        output, _ = submitted.communicate(timeout=360)
    finally:
        submitted.kill()
    assert submitted.returncode == 0, output[-6000:]
    job = job_id(output)
    assert f"job {job}: SUCCEEDED" in output
    print(f"multinode sweep: {time.monotonic() - started:.0f}s")

    # Every trial reached the tracking server, ran to the end, and ran on a GPU worker.
    children = trial_runs(uri, "multinode")
    assert len(children) == 4
    client = MlflowClient(uri)
    for run in children:
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "val_sharpe")
        assert sorted(m.step for m in history) == [1, 2]
    nodes = {run.data.tags["node_id"] for run in children}
    workers = {node.node_id for node in cluster.workers()}
    assert nodes <= workers and len(nodes) == 2, (nodes, workers)
    assert cluster.head.node_id not in nodes

    # Results and checkpoints sit in the shared storage path, one folder per trial.
    sweep_dir = tmp_path / "shared" / "multinode"
    assert (sweep_dir / "hpo-sweep.json").is_file()
    dirs = trial_dirs(sweep_dir)
    assert len(dirs) == 4
    for trial_dir in dirs:
        assert (trial_dir / "checkpoint_000001" / "state" / "model.safetensors").is_file()

    # The job is listed; neither the Ray token nor the MLflow password shows in hpo's
    # output, the job's entrypoint, metadata or logs, the MLflow params and tags of the
    # parent and trial runs, or the MLflow store (but its own auth/ folder).
    listed = hpo(cluster, "jobs", "--address", cluster.dashboard_url, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["job_id"]: row for row in json.loads(listed.stdout)}
    assert rows[job]["status"] == "SUCCEEDED" and rows[job]["sweep"] == "multinode"
    assert "--address auto" in rows[job]["entrypoint"]
    jobs = job_client(cluster.dashboard_url, cluster.token)
    details = jobs.get_job_info(job)
    logs = jobs.get_job_logs(job)
    assert logs.strip()  # the driver's own output, not an empty log
    # The credentials reached the driver as a path on the head, never in the runtime_env
    # (Ray writes that to runtime_env_agent.log on every node that starts a trial).
    _, password = load_credentials(sweep_user)
    assert details.entrypoint.endswith(f"--tracking-credentials {sweep_user}")
    assert not {USERNAME_VAR, PASSWORD_VAR} & set(details.runtime_env.get("env_vars", {}))
    experiment = client.get_experiment_by_name("multinode")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) >= 5  # the parent and its four trials
    for secret in (cluster.token, password):
        for run in runs:
            values = [*run.data.params.values(), *run.data.tags.values()]
            assert not any(secret in value for value in values), run.info.run_name
        assert_no_token(
            secret,
            output,
            listed.stdout,
            listed.stderr,
            details.entrypoint,
            json.dumps(details.metadata or {}),
            logs,
            store=store,
            skip=store / "auth",
        )
    # Nor in any file the Ray nodes wrote: session logs, runtime_env_agent.log, job logs.
    assert any(cluster.root.rglob("runtime_env_agent.log"))
    assert_no_token(password, store=cluster.root)


def test_dashboard_binds_to_loopback_and_refuses_requests_without_the_token(
    cluster: LocalCluster,
) -> None:
    listening = {
        c.laddr.ip
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == cluster.dashboard_port
    }
    assert listening == {"127.0.0.1"}
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(cluster.root / "no-home")  # no ~/.ray/auth_token either
    refused = subprocess.run(
        [*HPO, "jobs", "--address", cluster.dashboard_url],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "token authentication" in refused.stderr and "RAY_AUTH_TOKEN" in refused.stderr


@pytest.mark.parametrize("kind", ["ray-client", "gcs"])
def test_sweep_joins_by_address_and_refuses_node_local_storage(
    cluster: LocalCluster, tmp_path: Path, kind: str
) -> None:
    """`hpo sweep --address` joins the cluster both ways (Ray Client `ray://HEAD:PORT`, the
    head's GCS `HEAD:PORT`) and, seeing three nodes and a node-local storage path, stops
    with the fix before the sweep folder or any MLflow run exists."""
    address = {
        "ray-client": f"ray://{cluster.head_ip}:{cluster.client_port}",
        "gcs": cluster.gcs_address,
    }[kind]
    spec = write_spec(tmp_path, "unshared", f"sqlite:///{tmp_path / 'mlflow.db'}")
    done = hpo(cluster, "sweep", str(spec), "--address", address, timeout=240)
    text = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines
    assert done.returncode == 2, text[-4000:]
    assert "sweep 'unshared' cannot run on this Ray cluster (nothing was launched)" in text
    assert f"{tmp_path / 'shared'} is a node-local path" in text
    assert "the cluster has 3 nodes" in text and "HPO_SHARED_STORAGE=1" in text
    assert "Traceback" not in text
    assert not (tmp_path / "shared").exists() and not (tmp_path / "mlflow.db").exists()


def test_losing_a_worker_node_mid_sweep_moves_its_trial_to_the_other_from_its_checkpoint(
    cluster: LocalCluster, tracking: tuple[str, Path], sweep_user: Path, tmp_path: Path
) -> None:
    """The issue-8 fault: one GPU worker node is stopped hard (every process of it
    SIGKILLed at once, as when its machine dies) while its trial is mid-sweep; Ray Tune
    retries the trial (FailureConfig) on the remaining worker from its newest checkpoint,
    and the sweep finishes with every trial and every epoch in MLflow exactly once.
    Runs last: it leaves the cluster with one worker."""
    from cluster.submit import job_client

    uri, _ = tracking
    epochs = 6
    spec = write_spec(
        tmp_path,
        "nodefault",
        uri,
        families=["tft"],
        search_space={"tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1}},
        max_epochs=epochs,
        trainer={"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 20},
    )
    done = submit(cluster, spec, "--shared-storage", *login(sweep_user))
    assert done.returncode == 0, done.stdout + done.stderr
    job = job_id(done.stdout)
    victim_node = cluster.nodes[2]  # worker2
    survivor = cluster.nodes[1]
    client = MlflowClient(uri)
    sweep_dir = tmp_path / "shared" / "nodefault"

    def half_done_on_worker2() -> tuple[str, int] | None:
        """A trial on worker2 with an epoch in MLflow and two or more epochs still to train
        (by the checkpoints its worker wrote, which are never behind MLflow)."""
        checkpointed = {trial_id(d): checkpointed_epochs(d) for d in trial_dirs(sweep_dir)}
        # One MLflow search per poll: every request to the authenticated server checks a
        # password hash, and a trial is half done for a few seconds only.
        for run in trial_runs(uri, "nodefault"):
            tid = run.data.tags["trial_id"]
            if run.data.tags.get("node_id") != victim_node.node_id:
                continue
            logged = int("val_sharpe" in run.data.metrics)  # an epoch is in MLflow
            if logged and checkpointed.get(tid, 0) < epochs - 1:
                return tid, logged
        return None

    victim_id, killed_after = wait_for(
        half_done_on_worker2, timeout=300, what="a trial half done on worker2"
    )
    victim_node.kill()
    assert not victim_node.alive and not marked_pids(victim_node.mark)

    jobs = job_client(cluster.dashboard_url, cluster.token)
    wait_for(
        lambda: jobs.get_job_status(job).is_terminal(),
        timeout=300,
        what="the sweep job to end after the node stop",
        interval=1.0,
    )
    assert str(jobs.get_job_status(job).value) == "SUCCEEDED", jobs.get_job_logs(job)[-4000:]

    children = trial_runs(uri, "nodefault")
    assert len(children) == 2
    for run in children:
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")]
        assert sorted(steps) == list(range(1, epochs + 1))  # every epoch, exactly once
    moved = next(r for r in children if r.data.tags["trial_id"] == victim_id)
    assert moved.data.tags["node_id"] == survivor.node_id

    # Tune's own record of the trial: reported on worker2 up to the stop, then resumed on
    # the survivor from a checkpoint (not from scratch), and finished.
    trial_dir = next(d for d in trial_dirs(sweep_dir) if trial_id(d) == victim_id)
    rows = results(trial_dir)
    on_victim = [r["epoch"] for r in rows if r["node_id"] == victim_node.node_id]
    on_survivor = [r["epoch"] for r in rows if r["node_id"] == survivor.node_id]
    assert on_victim == list(range(1, len(on_victim) + 1))
    assert len(on_victim) >= killed_after >= 1
    assert on_survivor and on_survivor[-1] == epochs
    assert on_survivor[0] > 1, "restarted from scratch instead of from its checkpoint"
    resumed = next(r for r in rows if r["node_id"] == survivor.node_id)
    assert resumed["iterations_since_restore"] == 1  # Tune restored it from a checkpoint
    assert on_survivor[0] <= on_victim[-1] + 1
    assert on_survivor == list(range(on_survivor[0], epochs + 1))
    newest = max(trial_dir.glob("checkpoint_*"))
    assert json.loads((newest / "state" / "meta.json").read_text())["epoch"] == epochs
