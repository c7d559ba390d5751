"""The GPU types of a Ray cluster, and what a node says about its GPUs.

A node's GPU type is its ``accelerator_type:<NAME>`` resource: Ray adds it by itself on
nodes whose NVIDIA GPUs it detects (``accelerator_type:H100``, ``accelerator_type:L4``,
``accelerator_type:A100`` ...), and an operator can declare it for logical GPUs. Nodes
with GPUs but no such resource form one untyped group, ``GPU``.

A node can also declare the memory of one of its GPUs, so that a share can be computed on
a node that cannot measure it (no CUDA in the profiling process, logical GPUs in tests):

    ray start --address HEAD:6379 --num-gpus 4 \\
        --resources '{"accelerator_type:L4": 1, "hpo_gpu_memory_mib": 23034}'

``hpo_gpu_memory_mib`` is the memory of ONE GPU of that node in MiB (for MIG, of one
instance; ``nvidia-smi --query-gpu=memory.total --format=csv`` prints it); MiB because
Ray accepts only whole numbers as a node's custom resource quantities. A node is never asked for it (trials request only ``GPU`` and a sliver of
``accelerator_type:<NAME>``). Without a declaration, a node that measures reports its
device's own total (pynvml), and an estimate falls back to ``HPO_GPU_TOTAL_GB`` or 80 GiB.

To keep a trial on the type it was planned for, its bundle carries
``{"accelerator_type:<NAME>": TYPE_CONSTRAINT}``: a quantity far below the 1 every typed
node has, so it never limits how many trials fit, only where they go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ACCELERATOR_PREFIX = "accelerator_type:"
GPU_MEMORY_RESOURCE = "hpo_gpu_memory_mib"
UNTYPED = "GPU"
TYPE_CONSTRAINT = 0.001  # a node's accelerator_type resource is 1: up to 1000 trials fit
MiB = 2**20


@dataclass(frozen=True)
class GpuType:
    """One kind of GPU node in the cluster."""

    name: str  # the accelerator type (``L4``), or ``GPU`` for nodes that do not say
    memory_bytes: int | None  # one GPU's memory, as the nodes declare it (None: undeclared)
    gpus: float  # GPUs of this type in the whole cluster
    gpus_per_node: float  # the smallest node's
    cpus_per_node: float  # the smallest node's
    node_ids: tuple[str, ...] = field(default=())

    @property
    def constraint(self) -> dict[str, float]:
        """The resource that keeps a trial on this type (none for untyped nodes)."""
        if self.name == UNTYPED:
            return {}
        return {f"{ACCELERATOR_PREFIX}{self.name}": TYPE_CONSTRAINT}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "gpus": self.gpus,
            "gpus_per_node": self.gpus_per_node,
            "cpus_per_node": self.cpus_per_node,
            "node_ids": list(self.node_ids),
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> GpuType:
        return cls(
            name=str(values["name"]),
            memory_bytes=values.get("memory_bytes"),
            gpus=float(values["gpus"]),
            gpus_per_node=float(values["gpus_per_node"]),
            cpus_per_node=float(values["cpus_per_node"]),
            node_ids=tuple(values.get("node_ids", ())),
        )


def node_type_name(resources: Mapping[str, float]) -> str:
    """The GPU type a node's resources name (``GPU`` when none does)."""
    names = sorted(
        key.removeprefix(ACCELERATOR_PREFIX)
        for key in resources
        if key.startswith(ACCELERATOR_PREFIX)
    )
    return names[0] if names else UNTYPED


def declared_memory_bytes(resources: Mapping[str, float]) -> int | None:
    value = resources.get(GPU_MEMORY_RESOURCE)
    return int(float(value) * MiB) if value else None


def gpu_types(nodes: Iterable[Mapping[str, Any]]) -> list[GpuType]:
    """GPU types of ``nodes`` (``ray.nodes()`` rows: alive ones with a GPU count), by name.

    A type's declared memory is the smallest its nodes declare: a share planned against it
    fits on every node of the type.
    """
    grouped: dict[str, list[tuple[str, Mapping[str, float]]]] = {}
    for node in nodes:
        resources = node.get("Resources") or {}
        if not node.get("Alive", True) or float(resources.get("GPU", 0)) <= 0:
            continue
        grouped.setdefault(node_type_name(resources), []).append((str(node["NodeID"]), resources))
    types = []
    for name, of_type in sorted(grouped.items()):
        declared = [m for _, r in of_type if (m := declared_memory_bytes(r)) is not None]
        types.append(
            GpuType(
                name=name,
                memory_bytes=min(declared) if declared else None,
                gpus=sum(float(r["GPU"]) for _, r in of_type),
                gpus_per_node=min(float(r["GPU"]) for _, r in of_type),
                cpus_per_node=min(float(r.get("CPU", 0)) for _, r in of_type),
                node_ids=tuple(node_id for node_id, _ in of_type),
            )
        )
    return types


def cluster_gpu_types() -> list[GpuType]:
    """The connected Ray cluster's GPU types (empty without GPU nodes)."""
    import ray

    return gpu_types(ray.nodes())


def this_node() -> tuple[str, Mapping[str, float]]:
    """(node id, resources) of the node this Ray worker runs on; RuntimeError outside Ray
    (asking Ray's runtime context there would start a local Ray of its own)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("not in a Ray worker or driver: no node to ask")
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            return node_id, node.get("Resources") or {}
    return node_id, {}


__all__ = [
    "ACCELERATOR_PREFIX",
    "GPU_MEMORY_RESOURCE",
    "TYPE_CONSTRAINT",
    "UNTYPED",
    "GpuType",
    "cluster_gpu_types",
    "declared_memory_bytes",
    "gpu_types",
    "node_type_name",
    "this_node",
]
