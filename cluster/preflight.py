"""Checks a sweep against the cluster it is about to run on, before anything launches.

Ray Tune does not fail a trial whose resources no node can ever offer: it waits, printing
"insufficient resources" warnings, forever. And a node-local storage path on a multi-node
cluster fails only when a trial first checkpoints on a worker, or later, when a retried
trial cannot find its checkpoints. Both are decided here from what the cluster reports
(:class:`cluster.connect.ClusterInfo`, or the Jobs API's node list for ``hpo submit``),
and every problem is raised at once in one :class:`ClusterError` that says what to do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from cluster.connect import ClusterError, ClusterInfo
from cluster.storage import shared_storage_problem

__all__ = ["ClusterError", "preflight", "resource_problems"]


def resource_problems(
    cpu: float,
    gpu: float | str,
    nodes: Sequence[Mapping[str, float]],
    scalable: Sequence[Mapping[str, float]] = (),
) -> list[str]:
    """What keeps a trial asking ``cpu`` CPUs and ``gpu`` GPUs (a share, a count or
    ``"measured"``) from ever being scheduled on these nodes (plus node types an
    autoscaler may add)."""
    shapes = [dict(n) for n in (*nodes, *scalable)]
    if not shapes:
        return []
    problems = []
    total_gpus = sum(s.get("GPU", 0.0) for s in shapes)
    max_cpus = max(s.get("CPU", 0.0) for s in shapes)
    max_gpus = max(s.get("GPU", 0.0) for s in shapes)
    wants_gpu = gpu == "measured" or float(gpu) > 0
    # "measured" packs a share of one GPU: at most 1, usually far less.
    need_gpu = 0.0 if not wants_gpu else (1e-9 if gpu == "measured" else float(gpu))
    where = _describe(nodes, scalable)
    if wants_gpu and total_gpus == 0:
        what = (
            "'measured' (a share of a GPU per trial, from its VRAM)"
            if gpu == "measured"
            else f"{gpu:g}"
        )
        problems.append(
            f"resources.gpu = {what}, but the cluster has no GPUs ({where}): set "
            "resources.gpu = 0 to train on CPUs, or add GPU nodes (`ray start --num-gpus N` "
            "on a GPU machine, a KubeRay GPU worker group, a launcher GPU node type)."
        )
    elif need_gpu > max_gpus:
        problems.append(
            f"resources.gpu = {need_gpu:g} per trial, but the node with the most GPUs has "
            f"{max_gpus:g} ({where}): ask for at most {max_gpus:g}, or add larger GPU nodes."
        )
    if cpu > max_cpus:
        problems.append(
            f"resources.cpu = {cpu:g} per trial, but the largest node has {max_cpus:g} CPUs "
            f"({where}): lower resources.cpu to at most {max_cpus:g}, or add larger nodes."
        )
    if not problems and not any(
        s.get("CPU", 0.0) >= cpu and s.get("GPU", 0.0) >= need_gpu for s in shapes
    ):
        problems.append(
            f"no single node has both resources.cpu = {cpu:g} CPUs and resources.gpu = "
            f"{gpu if gpu == 'measured' else f'{need_gpu:g}'} GPUs that one trial needs "
            f"({where}): give the GPU nodes CPUs (`ray start --num-cpus`), or lower "
            "resources.cpu."
        )
    return problems


def preflight(
    spec: Any,
    info: ClusterInfo,
    storage: str | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`ClusterError` listing every reason ``spec`` cannot run on ``info``'s
    cluster (resources no node offers; node-local storage on several nodes)."""
    nodes = list(info.node_resources) or [info.resources]
    problems = resource_problems(
        float(spec.resources.cpu), spec.resources.gpu, nodes, info.scalable_node_resources
    )
    n_nodes = max(info.n_nodes, len(info.node_resources))
    if info.scalable_node_resources and n_nodes < 2:
        n_nodes = 2  # an autoscaler may add workers: storage must be shared from the start
    problem = shared_storage_problem(storage or spec.storage, n_nodes, env)
    if problem:
        problems.append(problem)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ClusterError(
            f"sweep {spec.name!r} cannot run on this Ray cluster (nothing was launched):\n{lines}"
        )


def _describe(nodes: Sequence[Mapping[str, float]], scalable: Sequence[Mapping[str, float]]) -> str:
    text = f"{len(nodes)} node(s): {_shapes(nodes)}" if nodes else "no nodes"
    if scalable:
        text += f"; autoscaler node types: {_shapes(scalable)}"
    return text


def _shapes(nodes: Sequence[Mapping[str, float]]) -> str:
    counts = Counter(_shape(n) for n in nodes)
    return ", ".join(f"{n} x {shape}" if n > 1 else shape for shape, n in counts.items())


def _shape(node: Mapping[str, float]) -> str:
    return f"{node.get('CPU', 0.0):g} CPU/{node.get('GPU', 0.0):g} GPU"
