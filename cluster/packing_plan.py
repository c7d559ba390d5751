"""The plan: what GPU share each trial shape asks for and how many trials that packs.

* A sweep's plan on a Ray cluster (:class:`ClusterPacker`, :func:`plan_rows`,
  :func:`render_plan`; ``hpo sweep SPEC --plan`` and the first lines of a sweep): per
  (family, precision, GPU type) the peak and its source, the share, trials per GPU and per
  node, and the binding constraint (:func:`cluster.fixed_plan.render_fixed_plan` when a
  sweep asks for a fixed GPU number per trial, or no GPUs).
* One shape's, or every family's in f32 and bf16, profiled in this process
  (:func:`shape_plan`, :func:`family_plans`; ``hpo profile --family`` / ``--all``).

:class:`ClusterPacker` is the resources callable the sweep hands Tune
(``tune.with_resources(trainable, resources=packer)``, see ``hpo.sweep``):

1. ``packer.prefetch(configs)`` profiles every shape known before launch on every GPU
   type, in one Ray task on a node of that type (:mod:`cluster.remote_profile`), reading
   the storage's :class:`~cluster.vram_table.SharedVramCache` first; a shape met later is
   profiled the same way when its first trial is created.
2. Per type the share is :func:`cluster.packing.plan`'s, the headroom doubled per OOM of
   that shape recorded in the shared cache.
3. Each trial goes to ONE type where it fits, the one whose GPUs would be least full; its
   bundle is ``{"CPU": c, "GPU": share, "accelerator_type:<TYPE>": 0.001}`` (the last entry
   only on a cluster of several types). A trial that fits no type asks for a whole GPU of
   the largest; an OOM retry keeps its trial's type. Why: docs/packing.md#the-plan
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.gpu_types import GpuType
from cluster.packing import (
    DEFAULT_HEADROOM,
    Packing,
    _boosted,
    device_total_bytes,
    plan,
    profile_for_config,
)
from cluster.profiler import GiB, MemoryProfile
from cluster.remote_profile import PROFILE_TIMEOUT_S, profile_on_types
from cluster.vram_table import SharedVramCache, key_string, type_key
from trainables.config import TrainConfig, TrialConfig, share_sized_by

log = logging.getLogger("cluster.packing_plan")

Shape = tuple[TrainConfig, int]
"""What a share is planned for: a trial's config and the size of its group trial (1: a
trial alone). A group trial's trials differ only in settings that change no memory."""


def shapes(items: Iterable[TrainConfig | Shape]) -> list[Shape]:
    """``items`` as shapes: a bare config is a trial alone."""
    return [item if isinstance(item, tuple) else (item, 1) for item in items]


@dataclass(frozen=True)
class TypeShare:
    """One trial shape on one GPU type."""

    gpu_type: GpuType
    profile: MemoryProfile
    packing: Packing
    oom_count: int

    @property
    def capacity(self) -> int:
        """Trials of this shape the type holds at once (GPU memory only)."""
        return math.floor(self.gpu_type.gpus + 1e-9) * self.packing.trials_per_gpu

    @property
    def trials_per_node_by_gpu(self) -> int:
        # Ray places a fractional request inside one GPU: a node holds gpus x per-GPU count.
        return math.floor(self.gpu_type.gpus_per_node + 1e-9) * self.packing.trials_per_gpu


class ClusterPacker:
    """Per-type GPU shares of trial configs, from profiles taken on the types' nodes.

    Picklable (Tune stores the resources callable in its experiment state): it holds the
    types, the shared cache's filesystem and path, and the profiles found so far.
    """

    def __init__(
        self,
        types: list[GpuType],
        *,
        headroom: float = DEFAULT_HEADROOM,
        cpu_per_trial: float = 1.0,
        cache: SharedVramCache | None = None,
        mode: str = "auto",
        profile_timeout_s: float = PROFILE_TIMEOUT_S,
    ) -> None:
        if not types:
            raise ValueError("no GPU nodes in the cluster: nothing to pack")
        self.types = sorted(types, key=lambda t: t.name)
        self.headroom = headroom
        self.cpu_per_trial = cpu_per_trial
        self.cache = cache
        self.mode = mode
        self.profile_timeout_s = profile_timeout_s  # all of one prefetch's profiles together
        self.profiles: dict[str, MemoryProfile] = {}  # the driver's table, by type key
        self._placed: dict[str, str] = {}  # trial identity -> type name
        self._load: dict[str, float] = {}  # type name -> GPU shares placed

    # -- profiles ----------------------------------------------------------------------------
    def prefetch(self, configs: Iterable[TrainConfig | Shape]) -> list[MemoryProfile]:
        """Profile every (shape, type) not yet known: shared cache first, then one Ray
        task per missing pair, all in parallel. Returns the new profiles."""
        missing: dict[str, tuple[TrainConfig, GpuType, int]] = {}
        for config, group_size in shapes(configs):
            for gpu_type in self.types:
                key = type_key(config, gpu_type, group_size)
                text = key_string(key)
                if text in self.profiles or text in missing:
                    continue
                found = self.cache.get(key) if self.cache is not None else None
                if found is not None:
                    self.profiles[text] = found
                else:
                    missing[text] = (config, gpu_type, group_size)
        if not missing:
            return []
        profiled = profile_on_types(
            list(missing.values()),
            mode=self.mode,
            cache=self.cache,
            timeout_s=self.profile_timeout_s,
        )
        for text, profile in zip(missing, profiled, strict=True):
            self.profiles[text] = profile
        return profiled

    def _profile(self, config: TrainConfig, gpu_type: GpuType, group_size: int) -> MemoryProfile:
        text = key_string(type_key(config, gpu_type, group_size))
        if text not in self.profiles:
            self.prefetch([(config, group_size)])
        return self.profiles[text]

    # -- shares ------------------------------------------------------------------------------
    def shares(self, config: TrainConfig, group_size: int = 1) -> list[TypeShare]:
        """This shape (a group trial of ``group_size`` when over 1) on every type, with the
        OOMs recorded against it there."""
        out = []
        for gpu_type in self.types:
            profile = self._profile(config, gpu_type, group_size)
            key = type_key(config, gpu_type, group_size)
            ooms = self.cache.oom_count(key) if self.cache is not None else 0
            # An estimate is a fraction of what the type declares now (a measurement of
            # the device it ran on); the declaration may have changed since it was cached.
            declared = gpu_type.memory_bytes if profile.method == "estimated" else None
            total = declared or profile.device_total_bytes or device_total_bytes()
            packing = plan(profile, _boosted(self.headroom, ooms), device_total=total)
            out.append(TypeShare(gpu_type, profile, packing, ooms))
        return out

    def place(self, identity: str, shares: list[TypeShare], pinned: str = "") -> TypeShare:
        """The type a trial goes to (the same one every time Tune asks for it; ``pinned``,
        an OOM retry's type, where the cluster still has it)."""
        by_name = {s.gpu_type.name: s for s in shares}
        if identity not in self._placed and pinned:
            if pinned in by_name:
                self._placed[identity] = pinned
                self._load[pinned] = self._load.get(pinned, 0.0) + self.taken(by_name[pinned])
            else:
                log.warning(
                    "an OOM retry ran out of memory on GPU type %s, which the cluster no longer "
                    "has; placing it again (its share floor was sized for that type)",
                    pinned,
                )
        if identity in self._placed and self._placed[identity] in by_name:
            return by_name[self._placed[identity]]
        fitting = [s for s in shares if s.packing.fits and s.capacity > 0]
        if not fitting:
            chosen = max(shares, key=lambda s: s.packing.device_total_bytes)
            log.warning(
                "%s/%s fits no GPU type (needs %.2f of a %.0f GiB %s); asking for a whole GPU",
                chosen.profile.family,
                chosen.profile.precision,
                chosen.packing.raw_fraction,
                chosen.packing.device_total_bytes / GiB,
                chosen.gpu_type.name,
            )
        else:
            chosen = min(fitting, key=lambda s: (self.fill(s), -s.capacity))
        self._placed[identity] = chosen.gpu_type.name
        name = chosen.gpu_type.name
        self._load[name] = self._load.get(name, 0.0) + self.taken(chosen)
        return chosen

    @staticmethod
    def taken(share: TypeShare) -> float:
        """The GPU a trial takes up: 1 / trials per GPU, not its share, as Ray packs whole
        trials into one GPU (three 0.26 shares fill an L4: the 0.22 left holds no fourth)."""
        return 1.0 / share.packing.trials_per_gpu if share.packing.trials_per_gpu else 1.0

    def fill(self, share: TypeShare) -> float:
        """How full the type's GPUs would be with one more trial of ``share``."""
        used = self._load.get(share.gpu_type.name, 0.0) + self.taken(share)
        return used / share.gpu_type.gpus

    def resources_of(self, trial: TrialConfig, group_size: int = 1) -> dict[str, float]:
        """The bundle of one Tune trial: CPUs, its share of the chosen type's GPU (never
        below its OOM floor) and, on a mixed cluster, the type constraint. A group trial
        is sized by its first trial and ``group_size`` (``share_sized_by``): its fused
        group's share."""
        shares = self.shares(trial.train_config(), group_size)
        # The trial, not the attempt: an OOM retry (the same trial with a floor) stays
        # on the type it ran out of memory on, as its floor is a share of that type's GPU;
        # its config names that type too, for a packer that never placed its first try.
        identity = json.dumps(
            [trial.config_id, trial.seed, trial.family, trial.precision,
             dict(trial.params), group_size],
            sort_keys=True,
            default=str,
        )  # fmt: skip
        chosen = self.place(identity, shares, pinned=trial.gpu_type)
        share = chosen.packing.fraction if chosen.packing.fits else 1.0
        bundle = {
            "CPU": float(self.cpu_per_trial),
            "GPU": max(share, min(1.0, trial.gpu_fraction_floor)),
        }
        if len(self.types) > 1:
            bundle.update(chosen.gpu_type.constraint)
        return bundle

    def __call__(self, config: Mapping[str, Any]) -> Any:
        """Tune's resources callable: a one-bundle placement group of :meth:`resources_of`."""
        from ray.tune import PlacementGroupFactory

        return PlacementGroupFactory([self.resources_of(*share_sized_by(config))])


# ------------------------------------------------------------------------------------------
# the plan table


def plan_rows(
    packer: ClusterPacker, configs: Iterable[TrainConfig | Shape]
) -> list[dict[str, Any]]:
    """One row per (family, precision, group_size, GPU type) of ``configs`` (profiled as
    needed). ``trials_per_gpu`` and ``trials_per_node`` count Tune trials (a group trial
    once); ``grouped_trials_per_gpu`` the trials a user sees."""
    planned = shapes(configs)
    packer.prefetch(planned)
    rows = []
    for config, group_size in planned:
        for share in packer.shares(config, group_size):
            by_gpu = share.trials_per_node_by_gpu
            cpu = packer.cpu_per_trial
            by_cpu = math.floor(share.gpu_type.cpus_per_node / cpu + 1e-9) if cpu > 0 else None
            binding = "GPU memory" if by_cpu is None or by_gpu <= by_cpu else "CPUs per node"
            if not share.packing.fits:
                binding = "does not fit"
            profile = share.profile
            rows.append(
                {
                    "family": config.family,
                    "precision": profile.precision,
                    "batch_size": config.batch_size,
                    "gpu_type": share.gpu_type.name,
                    "method": profile.method,
                    "peak_bytes": profile.peak_bytes,
                    "context_bytes": profile.context_bytes,
                    "device_total_bytes": share.packing.device_total_bytes,
                    "device_total_source": profile.device_total_source,
                    "oom_count": share.oom_count,
                    "share": share.packing.fraction,
                    "group_size": group_size,
                    "trials_per_gpu": share.packing.trials_per_gpu,
                    "grouped_trials_per_gpu": share.packing.trials_per_gpu * group_size,
                    "trials_per_gpu_by_memory": share.packing.trials_per_gpu_unrounded,
                    "trials_per_node": by_gpu if by_cpu is None else min(by_gpu, by_cpu),
                    "binding": binding,
                    "profiled_on": profile.node_id,
                    "profiled_pid": profile.pid,
                }
            )
    return rows


def render_plan(rows: list[dict[str, Any]], headroom: float) -> str:
    """The plan as a fixed-width text table (what ``--plan`` prints and the parent run
    stores as ``packing_plan.txt``). Where group trials are planned, the columns count
    groups (Tune trials) and the trials a user sees apart."""
    grouped = any(r.get("group_size", 1) > 1 for r in rows)
    header = [
        "family", "precision", "gpu type", "peak GiB", "how", "GPU GiB", "share",
        "trials/GPU", "by memory", "trials/node", "binding",
    ]  # fmt: skip
    if grouped:
        header[7:10] = ["groups/GPU", "trials/GPU", "groups by memory", "groups/node"]
        header.insert(3, "trials")
    body = []
    for r in rows:
        row = [
            r["family"],
            r["precision"],
            r["gpu_type"],
            f"{r['peak_bytes'] / GiB:.2f}",
            r["method"] + (f" +{r['oom_count']} OOM" if r["oom_count"] else ""),
            f"{r['device_total_bytes'] / GiB:.1f}",
            f"{r['share']:.4f}",
            str(r["trials_per_gpu"]),
            str(r["trials_per_gpu_by_memory"]),
            str(r["trials_per_node"]),
            r["binding"],
        ]
        if grouped:
            row.insert(8, str(r["grouped_trials_per_gpu"]))
            row.insert(3, str(r["group_size"]))
        body.append(row)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        f"GPU packing plan: share = (peak x (1 + {headroom:g}) + context) / GPU memory, "
        "rounded at Ray's 1e-4",
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# one shape, or every family, profiled in this process (`hpo profile`)


@dataclass(frozen=True)
class ShapeRequest:
    """What to profile besides the family and precision: the ``--set`` overrides, the
    batch size (None: the trainer's), the headroom, and where profiles come from."""

    overrides: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    headroom: float = DEFAULT_HEADROOM
    mode: str | None = None  # cluster.packing's HPO_VRAM_MODE values; None: the env's
    refresh: bool = False


def shape_plan(family: str, precision: str, request: ShapeRequest) -> tuple[MemoryProfile, Packing]:
    """The (family, precision) trial's profile (from the VRAM table, or profiled now) and
    its packing."""
    from trainables.config import build_train_config

    base: dict[str, Any] = {} if request.batch_size is None else {"batch_size": request.batch_size}
    config = build_train_config(family, dict(request.overrides), precision=precision, **base)
    _, profile = profile_for_config(config, mode=request.mode, refresh=request.refresh)
    return profile, plan(profile, request.headroom)


@dataclass(frozen=True)
class FamilyPlans:
    """One row per family that profiled, plus a line per family that did not."""

    rows: list[dict[str, Any]]
    skipped: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": self.skipped}


def family_plans(request: ShapeRequest) -> FamilyPlans:
    """Every registered family in f32 and bf16. A row holds each precision's profile and
    packing (as dicts) and ``bf16_over_f32_peak`` / ``bf16_over_f32_trials``. A family
    that cannot be imported (a module being written) or profiled is skipped with the
    reason, so one broken family does not hide the others."""
    from models import family_names, get_family

    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in family_names():
        try:
            get_family(name)
        except Exception as exc:
            skipped.append(f"{name}: cannot import ({type(exc).__name__}: {exc})")
            continue
        row: dict[str, Any] = {"family": name}
        try:
            for precision in ("f32", "bf16"):
                profile, packing = shape_plan(name, precision, request)
                row[precision] = {"profile": profile.to_dict(), "packing": packing.to_dict()}
        except Exception as exc:
            skipped.append(f"{name}: profiling failed ({type(exc).__name__}: {exc})")
            continue
        reference, other = row["f32"], row["bf16"]
        row["bf16_over_f32_peak"] = (
            other["profile"]["peak_bytes"] / reference["profile"]["peak_bytes"]
        )
        row["bf16_over_f32_trials"] = (
            other["packing"]["trials_per_gpu"] / reference["packing"]["trials_per_gpu"]
        )
        rows.append(row)
    return FamilyPlans(rows=rows, skipped=skipped)


__all__ = [
    "ClusterPacker",
    "FamilyPlans",
    "ShapeRequest",
    "TypeShare",
    "family_plans",
    "plan_rows",
    "render_plan",
    "shape_plan",
]
