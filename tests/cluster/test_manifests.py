"""The cluster manifests parse and hold the fields cluster/README.md relies on: kinds and
names, GPU resources, the head's ports, the token Secret, shared storage, loopback-only
or ClusterIP services, and `hpo` command lines that the CLI accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import yaml

from hpo.cli import app

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
README = (CLUSTER / "README.md").read_text()
SECRET, TOKEN_KEY, SHARED = "hpo-ray-auth", "auth_token", "/mnt/hpo"


def _k8s() -> dict[str, dict[str, Any]]:
    docs = [
        d for d in yaml.safe_load_all((CLUSTER / "kuberay" / "raycluster.yaml").read_text()) if d
    ]
    by_kind_name = {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}
    assert len(by_kind_name) == len(docs), "duplicate kind/name"
    return by_kind_name


K8S = _k8s()
LAUNCHER = yaml.safe_load((CLUSTER / "launcher" / "gpu-cluster.yaml").read_text())


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _cli_accepts(argv: list[str]) -> None:
    """Parse an `hpo ...` command line with the real CLI (without running it)."""
    assert argv[0] == "hpo", argv
    group = typer.main.get_command(app)
    command = group.commands[argv[1]]  # type: ignore[attr-defined]
    # Parsed, not run: no option callback (--tracking-credentials reads its file) runs.
    with click.Context(command, resilient_parsing=True) as ctx:
        command.parse_args(ctx, list(argv[2:]))


# -- KubeRay ----------------------------------------------------------------------------------------
def test_kuberay_documents() -> None:
    assert set(K8S) == {
        "PersistentVolumeClaim/hpo-shared",
        "PersistentVolumeClaim/mlflow-store",
        "RayCluster/hpo",
        "Deployment/mlflow",
        "Service/mlflow",
    }
    raycluster = K8S["RayCluster/hpo"]
    assert raycluster["apiVersion"] == "ray.io/v1"
    import ray

    assert raycluster["spec"]["rayVersion"] == ray.__version__  # the version pyproject pins


def test_head_is_a_cpu_node_with_the_documented_ports() -> None:
    head = K8S["RayCluster/hpo"]["spec"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    assert head["rayStartParams"]["num-gpus"] == "0" and head["rayStartParams"]["num-cpus"] == "0"
    (container,) = head["template"]["spec"]["containers"]
    ports = {p["containerPort"]: p["name"] for p in container["ports"]}
    assert ports == {6379: "gcs-server", 8265: "dashboard", 10001: "client"}
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    # README: the head Service KubeRay derives from the cluster name.
    assert f"svc/{K8S['RayCluster/hpo']['metadata']['name']}-head-svc 8265:8265" in README


def test_gpu_worker_group() -> None:
    (group,) = K8S["RayCluster/hpo"]["spec"]["workerGroupSpecs"]
    assert group["groupName"] == "gpu"
    assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    (container,) = group["template"]["spec"]["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus >= 1 and group["rayStartParams"]["num-gpus"] == str(gpus)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == gpus
    tolerations = group["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations


def _ray_pods() -> list[dict[str, Any]]:
    spec = K8S["RayCluster/hpo"]["spec"]
    return [spec["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in spec["workerGroupSpecs"]
    ]


def test_every_ray_pod_has_token_auth_from_the_secret_and_the_shared_volume() -> None:
    for pod in _ray_pods():
        (container,) = pod["containers"]
        env = _env(container)
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"] == {"secretKeyRef": {"name": SECRET, "key": TOKEN_KEY}}
        assert env["HPO_SHARED_STORAGE"] == SHARED
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert mounts["hpo-shared"] == SHARED
        assert volumes["hpo-shared"]["persistentVolumeClaim"]["claimName"] == "hpo-shared"
    assert K8S["PersistentVolumeClaim/hpo-shared"]["spec"]["accessModes"] == ["ReadWriteMany"]
    # README: the Secret it tells you to create, and how the client reads the same token.
    assert f"kubectl create secret generic {SECRET} --from-literal={TOKEN_KEY}=" in README
    assert f"kubectl get secret {SECRET} -o jsonpath='{{.data.{TOKEN_KEY}}}'" in README
    assert f"--storage {SHARED}/results" in README


def test_mlflow_deployment_and_service() -> None:
    deployment, service = K8S["Deployment/mlflow"], K8S["Service/mlflow"]
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"  # one SQLite writer
    pod = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    _cli_accepts(command)
    assert command[:2] == ["hpo", "tracking-server"]
    assert command[command.index("--store") + 1] == "/mlflow"
    port = int(command[command.index("--port") + 1])
    assert {"containerPort": port, "name": "http"} in container["ports"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts["store"] == "/mlflow"
    assert volumes["store"]["persistentVolumeClaim"]["claimName"] == "mlflow-store"
    # Reached as http://mlflow:5000 from the head: ClusterIP only, and that Host allowed.
    assert service["spec"]["type"] == "ClusterIP"
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == 5000 and service_port["targetPort"] == "http"
    import fnmatch

    allowed = command[command.index("--allowed-hosts") + 1].split(",")
    assert any(fnmatch.fnmatch("mlflow:5000", pattern) for pattern in allowed)
    assert any(fnmatch.fnmatch("mlflow.hpo.svc.cluster.local:5000", pattern) for pattern in allowed)
    assert "--tracking-uri http://mlflow:5000" in README


def test_no_service_is_exposed_outside_the_cluster() -> None:
    for key, doc in K8S.items():
        if doc["kind"] == "Service":
            assert doc["spec"].get("type", "ClusterIP") == "ClusterIP", key
    assert "LoadBalancer" not in (CLUSTER / "kuberay" / "raycluster.yaml").read_text()


# -- Ray cluster launcher ----------------------------------------------------------------------------
def _commands(key: str) -> str:
    return "\n".join(LAUNCHER[key])


def test_launcher_node_types() -> None:
    assert LAUNCHER["provider"]["type"] in ("aws", "gcp")
    types = LAUNCHER["available_node_types"]
    head = types[LAUNCHER["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # the head runs the driver, never a trial
    (worker_type,) = [name for name in types if name != LAUNCHER["head_node_type"]]
    worker = types[worker_type]
    assert re.match(r"(g5|g6|p4d|p5)\.", worker["node_config"]["InstanceType"])  # NVIDIA GPUs
    assert 1 <= worker["min_workers"] <= worker["max_workers"] <= LAUNCHER["max_workers"]


def test_launcher_installs_the_project_and_keeps_token_auth() -> None:
    assert LAUNCHER["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert LAUNCHER["file_mounts"]["~/foxhunt-hpo"] == "."
    assert ".venv" in LAUNCHER["rsync_exclude"] and ".git" in LAUNCHER["rsync_exclude"]
    setup = _commands("setup_commands")
    assert "pip install -e ~/foxhunt-hpo" in setup and f"{SHARED}" in setup
    head = _commands("head_start_ray_commands")
    for flag in (
        "--head",
        "--port=6379",
        "--dashboard-host=127.0.0.1",
        "--dashboard-port=8265",
        "--ray-client-server-port=10001",
    ):
        assert flag in head, flag
    worker = _commands("worker_start_ray_commands")
    assert "--address=$RAY_HEAD_IP:6379" in worker
    for start in (head, worker):
        assert "RAY_AUTH_MODE=token" in start and f"HPO_SHARED_STORAGE={SHARED}" in start


def test_launcher_tracking_server_is_loopback_and_a_valid_command() -> None:
    head = _commands("head_start_ray_commands")
    (line,) = [c for c in LAUNCHER["head_start_ray_commands"] if "tracking-server" in c]
    words = shlex.split(line[line.rindex("hpo tracking-server") :].split(">")[0])
    _cli_accepts(words)
    assert words[words.index("--host") + 1] == "127.0.0.1"
    assert "hpo tracking-server" in head
    for step in (
        "ray up cluster/launcher/gpu-cluster.yaml",
        "ray dashboard cluster/launcher/gpu-cluster.yaml",
        "ray attach cluster/launcher/gpu-cluster.yaml -p 5000",
    ):
        assert step in README


@pytest.mark.parametrize(
    "section",
    ["## A cluster of your own machines", "## Kubernetes (KubeRay)", "## Cloud GPU cluster"],
)
def test_readme_sections_submit_with_hpo(section: str) -> None:
    body = README.split(section, 1)[1].split("\n## ", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", body)  # shell line continuations
    submits = [line for line in joined.splitlines() if line.startswith("hpo submit")]
    assert submits, section
    for line in submits:  # every documented submit parses with the real CLI
        argv = shlex.split(line.split("#")[0])
        _cli_accepts(argv)
        assert "--storage" in argv and "--tracking-uri" in argv


def test_readme_local_walkthrough_is_in_order() -> None:
    body = README.split("## A cluster of your own machines", 1)[1].split("\n## ", 1)[0]
    steps = [
        "ray start --head",
        "ray start --address",
        "hpo tracking-server",
        "hpo submit",
        "ray job logs --follow",
        "hpo compare",
        "open http://127.0.0.1:5000",
    ]
    positions = [body.index(step) for step in steps]
    assert positions == sorted(positions)
