"""Device memory of one trial shape: measured on CUDA, estimated from tensor bytes without.

The trial is built by the shared :class:`~trainables.trainer.Trainer` itself (every fold's
model, ``GuardedAdamW``, dataset tensors, environment and replay), so the profile sees
exactly what a trial allocates. After a warm-up of one optimizer step per fold through the
trainer's own step:

* estimate, on any device: parameters + gradients + optimizer state + data + activations
  saved for backward + temporaries at the busiest moment of a step or evaluation forward
  + 512-byte allocator rounding + the cuBLAS workspaces + the CUDA context allowance;
* on CUDA also measure: ``max_memory_allocated`` / ``max_memory_reserved`` of a step on
  every fold and the largest evaluation forward, above the process's baseline; the
  device's name and total memory from pynvml (torch when NVML cannot answer); the context
  as what NVML sees the process use beyond the allocator's reservation.

The peak a packing uses is the measured reservation on CUDA, the estimate elsewhere; the
context is kept apart (the fraction adds it outside the headroom).

Allowances: ``HPO_CUDA_CONTEXT_MB`` (default 1024) for the per-process CUDA context;
``CUBLAS_WORKSPACE_CONFIG`` (torch's variable) for one cuBLAS workspace, by default 32 MiB
on compute capability >= 9, else 8 MiB + 128 KiB (torch's own values); a trial holds one
per cuBLAS handle and stream (:func:`trial_workspace_bytes`). An estimate made without a
GPU assumes the H100 the packing assumes (:mod:`cluster.packing`).
Method and constants: docs/packing.md#profiling
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from cluster.tensor_bytes import (
    LiveTensors,
    SavedTensors,
    StateBytes,
    StorageSet,
    reachable_bytes,
    state_bytes,
)
from models import get_family
from trainables.config import TrainConfig
from trainables.cuda_graphs import graph_plan
from trainables.precision import default_device, resolve_policy_name

MiB = 2**20
GiB = 2**30
CONTEXT_ENV = "HPO_CUDA_CONTEXT_MB"
# NVML saw 742-940 MiB per process on an H200 (torch 2.11, CUDA 13; bench/README.md, "GPU
# rows"): the context grows with the kernels a process has loaded.
DEFAULT_CONTEXT_BYTES = 1024 * MiB
ASSUMED_CAPABILITY = (9, 0)  # an estimate without CUDA targets an H100
ESTIMATE_DEVICE_NAME = "estimate"
# A training step calls cuBLAS through two handles, the calling thread's (forward,
# validation) and autograd's device thread's (backward), and torch keeps one workspace per
# handle and stream: an H200 under torch 2.11 held two 32 MiB blocks per stream after a
# profile (bench/README.md, "GPU rows").
CUBLAS_HANDLES_PER_STEP = 2
MAX_COLLECT_CYCLES = 512  # rl warm-up: collect-and-learn cycles allowed before a first loss


class ProfileError(RuntimeError):
    """The trial could not be profiled (the message says why)."""


@dataclass(frozen=True)
class MemoryProfile:
    """Device memory of one trial shape, by component, in bytes.

    The persistent components sum over every walk-forward fold of the trial (the trainer
    keeps them all on the device); the transient ones are those of the busiest single step
    or evaluation forward (folds run one after another, or fused as one step). A group
    trial's profile (``group_size`` > 1) is the same for all its trials' folds together.
    """

    family: str
    precision: str  # the policy that ran (``auto`` resolved)
    batch_size: int
    n_folds: int  # of one trial
    n_params: int  # trained parameters of one fold's model
    method: str  # "measured" (CUDA) or "estimated" (tensor bytes only)
    device_name: str
    device_total_bytes: int | None  # None for an estimate made without a GPU
    torch_version: str
    params_bytes: int  # weights and buffers, target networks included
    grads_bytes: int  # kept between steps (the trainer zeroes them in place)
    optimizer_bytes: int  # f32 moments + step counts (+ bf16 Kahan compensation)
    data_bytes: int  # dataset tensors, replay/rollout buffers, environment, counters
    activations_bytes: int  # saved for backward by the largest step
    temporaries_bytes: int  # alive beyond the saved activations at the busiest moment
    allocator_bytes: int  # 512-byte block rounding of the persistent tensors
    workspace_bytes: int  # cuBLAS workspaces (trial_workspace_bytes)
    context_bytes: int  # CUDA context (outside the allocator)
    measured_allocated_bytes: int | None = None  # CUDA: max_memory_allocated above baseline
    measured_reserved_bytes: int | None = None  # CUDA: max_memory_reserved above baseline
    # Where it was profiled, when a Ray profiling task did it (cluster.remote_profile):
    gpu_type: str | None = None  # the node's accelerator type (``GPU`` when it names none)
    node_id: str | None = None  # the Ray node
    pid: int | None = None  # the worker process
    device_total_source: str | None = None  # "nvml", "torch", "declared" or None (default)
    context_measured: bool = False  # context_bytes from NVML (else the allowance)
    # Trials trained as one fused group (trainables.group): the components are the
    # group's, every trial's folds together, in one process and one CUDA context.
    group_size: int = 1

    @property
    def estimated_peak_bytes(self) -> int:
        """The estimate of ``max_memory_allocated``: every component but the context."""
        return (
            self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.data_bytes
            + self.activations_bytes
            + self.temporaries_bytes
            + self.allocator_bytes
            + self.workspace_bytes
        )

    @property
    def peak_bytes(self) -> int:
        """What a packing reserves besides the context: the measured reservation on CUDA
        (allocator caching included), the estimate otherwise."""
        if self.measured_reserved_bytes is not None:
            return self.measured_reserved_bytes
        return self.estimated_peak_bytes

    @property
    def total_bytes(self) -> int:
        return self.peak_bytes + self.context_bytes

    @property
    def estimate_error(self) -> float | None:
        """(estimate - measured allocated) / measured allocated, on CUDA."""
        if not self.measured_allocated_bytes:
            return None
        return self.estimated_peak_bytes / self.measured_allocated_bytes - 1.0

    def components(self) -> dict[str, int]:
        return {
            "params": self.params_bytes,
            "grads": self.grads_bytes,
            "optimizer": self.optimizer_bytes,
            "data": self.data_bytes,
            "activations": self.activations_bytes,
            "temporaries": self.temporaries_bytes,
            "allocator": self.allocator_bytes,
            "workspace": self.workspace_bytes,
            "context": self.context_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            estimated_peak_bytes=self.estimated_peak_bytes,
            peak_bytes=self.peak_bytes,
            total_bytes=self.total_bytes,
            estimate_error=self.estimate_error,
        )
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MemoryProfile:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


# ----------------------------------------------------------------------------------------
# allowances and device facts


def context_allowance() -> int:
    """Bytes of CUDA context per process: ``HPO_CUDA_CONTEXT_MB`` or the 1024 MiB default."""
    raw = os.environ.get(CONTEXT_ENV)
    if raw is None:
        return DEFAULT_CONTEXT_BYTES
    try:
        return int(float(raw) * MiB)
    except ValueError:
        raise ValueError(f"{CONTEXT_ENV} must be a number of MiB, got {raw!r}") from None


def cublas_workspace_bytes(capability: tuple[int, int] = ASSUMED_CAPABILITY) -> int:
    """torch's cuBLAS workspace per handle and stream (``CUBLAS_WORKSPACE_CONFIG`` or the
    default torch picks for ``capability``)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        segments = re.findall(r":([0-9]+):([0-9]+)", config)
        if segments:
            return sum(int(size) * int(count) for size, count in segments) * 1024
    if capability[0] >= 9:
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def step_streams(config: TrainConfig) -> int:
    """CUDA streams a trial's step runs matmuls on where it trains (a GPU): the current
    stream, plus the side stream a step captured in a CUDA graph warms up and is captured
    on (the trainer's own :func:`~trainables.cuda_graphs.graph_plan` decides)."""
    captured, _ = graph_plan(config.cuda_graphs, torch.device("cuda"), get_family(config.family))
    return 2 if captured else 1


def trial_workspace_bytes(
    config: TrainConfig, capability: tuple[int, int] = ASSUMED_CAPABILITY
) -> int:
    """The cuBLAS workspaces a trial holds: one per handle (:data:`CUBLAS_HANDLES_PER_STEP`)
    and stream (:func:`step_streams`), each :func:`cublas_workspace_bytes`."""
    return cublas_workspace_bytes(capability) * CUBLAS_HANDLES_PER_STEP * step_streams(config)


@dataclass(frozen=True)
class CudaDevice:
    name: str
    total_bytes: int
    capability: tuple[int, int]
    nvml_index: int | None
    total_source: str = "torch"  # "nvml" where NVML answered for the device


def cuda_device(device: torch.device) -> CudaDevice:
    """Name and total memory from NVML (the device torch calls ``device``), torch's own
    figures when NVML cannot answer (no library, containers).

    MIG-aware: a MIG instance (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``, or the instance of a
    MIG-enabled GPU whose UUID torch reports) has its own name and memory, a slice of the
    parent's; those are what a share is a fraction of. ``nvml_index`` is None for a MIG
    instance: NVML does not list its processes' memory, so the context allowance applies.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    name, total, nvml_index, source = props.name, int(props.total_memory), None, "torch"
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        handle, nvml_index = _nvml_handle(pynvml, index, props)
        raw = pynvml.nvmlDeviceGetName(handle)
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        total, source = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), "nvml"
    return CudaDevice(
        name=name,
        total_bytes=total,
        capability=(props.major, props.minor),
        nvml_index=nvml_index,
        total_source=source,
    )


def nvml_handle(device: torch.device) -> Any:
    """NVML handle of ``device`` as :func:`cuda_device` finds it (MIG-aware); raises where
    NVML cannot answer."""
    import pynvml

    pynvml.nvmlInit()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _nvml_handle(pynvml, index, torch.cuda.get_device_properties(index))[0]


def _nvml_handle(pynvml: Any, index: int, props: Any) -> tuple[Any, int | None]:
    """NVML handle of torch's device ``index``: a MIG instance's own handle where the
    process sees one, else the physical GPU's (with its NVML index)."""
    visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if index < len(visible) and visible[index].startswith("MIG-"):
        return pynvml.nvmlDeviceGetHandleByUUID(visible[index]), None
    try:
        nvml_index = int(torch.cuda._get_nvml_device_index(index))  # CUDA_VISIBLE_DEVICES
    except Exception:
        nvml_index = index
    handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
    with contextlib.suppress(Exception):
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        if current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
            wanted = str(getattr(props, "uuid", "")).removeprefix("MIG-").removeprefix("GPU-")
            for mig_index in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
                except Exception:
                    continue  # no MIG device at this index
                uuid = pynvml.nvmlDeviceGetUUID(mig)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                if wanted and uuid.removeprefix("MIG-").removeprefix("GPU-") == wanted:
                    return mig, None
    return handle, nvml_index


def measured_context_bytes(device: torch.device, info: CudaDevice) -> int | None:
    """What NVML sees this process hold on the device beyond torch's reservation."""
    if info.nvml_index is None:
        return None
    with contextlib.suppress(Exception):
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(info.nvml_index)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            if proc.pid == os.getpid() and used:
                return max(0, int(used) - torch.cuda.memory_reserved(device))
    return None  # not visible (another PID namespace, MIG): the allowance applies


# ----------------------------------------------------------------------------------------
# the trial as the trainer builds it


def target_precision(name: str, device: torch.device) -> str:
    """The policy a trial runs. ``auto`` resolves for ``device`` on CUDA; an estimate made
    without CUDA targets a bf16-capable GPU (the H100 the packing assumes), so ``bf16``."""
    if name == "auto" and device.type != "cuda":
        return "bf16"
    return resolve_policy_name(name, device)


def target_fuse(config: TrainConfig, device: torch.device, group_size: int = 1) -> str:
    """Whether the trial's folds (a group's: every trial's) train fused where its share
    is planned: ``on`` or ``off``. ``auto`` fuses a fusable family's folds (two or more)
    on a GPU, and an estimate made without one targets a GPU, so it fuses them whatever
    the family does on a CPU. A trial that cannot fuse after all (its folds too short for
    a batch) needs less than its profile says, never more."""
    if config.fuse == "off" or not get_family(config.family).fuses:
        return "off"
    return "on" if config.fuse == "on" or config.n_folds * group_size >= 2 else "off"


def profiling_config(config: TrainConfig, device: torch.device, group_size: int = 1) -> TrainConfig:
    """``config`` with only what does not change memory cut short: one minibatch per
    forecast step call, one collect-and-learn cycle per rl call, ``learning_starts``
    lowered to one replay batch, on ``device``; fused as the trial (or the group of
    ``group_size``) will be (:func:`target_fuse`)."""
    family = get_family(config.family)
    changes: dict[str, Any] = {
        "device": str(device),
        "precision": target_precision(config.precision, device),
        "fuse": target_fuse(config, device, group_size),
        "epochs": 1,
        "max_steps_per_epoch": 1,
        "rl_iterations": 1,
    }
    if family.kind == "rl" and "learning_starts" in family.config_fields():
        model_config = family.make_config(config.model_config)
        lowered = min(model_config.learning_starts, getattr(model_config, "replay_batch_size", 1))
        changes["model_config"] = {**config.model_config, "learning_starts": max(1, lowered)}
    return config.replace(**changes)


def _train_step(trainer: Any, unit: Any) -> None:
    """At least one optimizer step on ``unit`` (a fold, or the fused folds) through the
    trainer's own step code."""
    before = trainer.global_step
    for _ in range(MAX_COLLECT_CYCLES if trainer.is_rl else 1):
        trainer.train_unit(unit)
        if trainer.global_step > before:
            return
    raise ProfileError(
        f"{trainer.family.name} took no optimizer step in {MAX_COLLECT_CYCLES} "
        "collect-and-learn cycles (does its learner start learning that late?)"
    )


def _eval_forward(trainer: Any) -> None:
    """The largest forward ``Trainer.train_epoch`` validates and tests with: over the
    longest of the folds' validation windows and the last fold's test window (folds share
    their shapes). Its chunks are the largest (up to ``EVAL_CHUNK`` decision bars each; an
    rl family's greedy run steps one bar at a time, the same at any length) and so is its
    output (bars x assets), so its peak is the evaluation's: the shorter window's forward
    only repeats a smaller one (a fifth of a bf16 profile's time on a CPU). The result is
    dropped at once."""
    windows = [(run, run.data.val) for run in trainer.folds]
    windows.append((trainer.folds[-1], trainer.folds[-1].data.test))
    run, span = max(windows, key=lambda window: window[1][1] - window[1][0])
    trainer.positions(run, span)


def _cuda_baseline(device: torch.device) -> tuple[int, int]:
    gc.collect()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()  # so the workspace is booked to this trial, not to an earlier one
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)


@dataclass(frozen=True)
class _Counts:
    n_folds: int  # of one trial
    group_size: int
    precision: str
    state: StateBytes
    data: StorageSet
    saved: int
    transient: int
    allocated: int | None
    reserved: int | None
    context: int | None


def _until_replayed(trainer: Any, unit: Any) -> None:
    """Step ``unit`` until a step the trainer captures in a CUDA graph is captured and
    replayed, so the graph's private memory pool is in the reservation measured (the
    trial's allocator cap counts it too); returns at once for an eager step."""
    from trainables.cuda_graphs import GRAPH_WARMUP_STEPS

    for _ in range(GRAPH_WARMUP_STEPS + 1):
        step = getattr(unit, "step", None)
        if step is None or not step.capture or step.replaying:
            return
        _train_step(trainer, unit)


def _step_units(trainers: list[Any]) -> list[tuple[Any, Any]]:
    """(trainer, unit) for what one step trains: each fold, or the folds fused into one
    module (a group's trials share theirs: it is listed once)."""
    seen: set[int] = set()
    out = []
    for trainer in trainers:
        for unit in trainer.step_units:
            if id(unit) not in seen:
                seen.add(id(unit))
                out.append((trainer, unit))
    return out


def _count(
    trainers: list[Any], root: Any, device: torch.device, measure: bool, baseline: tuple[int, int]
) -> _Counts:
    # What one step trains: each fold, or the folds fused into one module (what the
    # trial runs, so what its share must hold); a group's trainers are its trials.
    units = _step_units(trainers)
    for trainer, unit in units:  # warm: grads, optimizer state, replay storage, workspace
        _train_step(trainer, unit)
    state = state_bytes([u.model for _, u in units], [u.optimizer for _, u in units], device)
    data = reachable_bytes(root, device, exclude=state.keys)

    host, first = units[0]  # every fold has the same shapes
    with SavedTensors(exclude=state.keys | data.keys) as saved, LiveTensors(device) as live:
        hook = first.optimizer.register_step_post_hook(lambda *_: saved.end_step())
        try:
            _train_step(host, first)
        finally:
            hook.remove()
    with LiveTensors(device) as live_eval:
        _eval_forward(host)
    # The counts are taken: let the held storages go (transients before the CUDA peaks,
    # and nothing of the trainer outlives the profile through them).
    data.held.clear()
    state = replace(state, held=())

    allocated = reserved = context = None
    if measure:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        # Eager steps (a step the trainer captures is still warming up: at most its third
        # call), so the allocator sees every activation: a replay allocates nothing.
        for trainer, unit in units:
            _train_step(trainer, unit)
        _eval_forward(host)
        torch.cuda.synchronize(device)
        allocated = torch.cuda.max_memory_allocated(device) - baseline[0]
        # Then captured and replayed where a trial's step is: the graphs' private pools
        # are reserved memory the trial's allocator cap counts.
        for trainer, unit in units:
            _until_replayed(trainer, unit)
        torch.cuda.synchronize(device)
        reserved = torch.cuda.max_memory_reserved(device) - baseline[1]
        context = measured_context_bytes(device, cuda_device(device))
    return _Counts(
        n_folds=len(host.folds),
        group_size=len(trainers),
        precision=host.policy.name,
        state=state,
        data=data,
        saved=saved.peak,
        transient=max(live.peak, live_eval.peak),
        allocated=allocated,
        reserved=reserved,
        context=context,
    )


def profile_trial(
    config: TrainConfig,
    *,
    device: torch.device | str | None = None,
    measure: bool | None = None,
    group_size: int = 1,
) -> MemoryProfile:
    """Profile the trial ``config`` describes on ``device`` (default: CUDA when present);
    with ``group_size`` > 1 the group trial of that many such trials (seeds ``config.seed``
    onwards: a trial's other settings do not change memory), fused as it trains.

    ``measure`` (default: on CUDA) adds the allocator's measured peaks; without CUDA only
    the estimate exists. Persistent components cover all folds; transients one step.
    """
    from trainables.group import TrainerGroup
    from trainables.trainer import Trainer

    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    device = torch.device(device) if device is not None else default_device()
    measure = device.type == "cuda" if measure is None else measure
    if measure and device.type != "cuda":
        raise ValueError(f"measuring needs a CUDA device, got {device}")
    cfg = profiling_config(config, device, group_size)
    info = cuda_device(device) if device.type == "cuda" else None
    baseline = _cuda_baseline(device) if measure else (0, 0)
    built: Any
    if group_size == 1:
        built = Trainer(cfg, device=device)
        trainers = [built]
    else:
        built = TrainerGroup(
            [cfg.replace(seed=cfg.seed + i) for i in range(group_size)], device=device
        )
        trainers = built.trials
    try:
        counts = _count(trainers, built, device, measure, baseline)
    finally:
        del built, trainers
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    return MemoryProfile(
        family=config.family,
        precision=counts.precision,
        batch_size=config.batch_size,
        n_folds=counts.n_folds,
        n_params=counts.state.n_params // (counts.n_folds * counts.group_size),
        method="measured" if measure else "estimated",
        device_name=info.name if info is not None else ESTIMATE_DEVICE_NAME,
        device_total_bytes=info.total_bytes if info is not None else None,
        device_total_source=info.total_source if info is not None else None,
        torch_version=torch.__version__,
        params_bytes=counts.state.params,
        grads_bytes=counts.state.grads,
        optimizer_bytes=counts.state.optimizer,
        data_bytes=counts.data.nbytes,
        activations_bytes=counts.saved,
        temporaries_bytes=max(0, counts.transient - counts.saved),
        allocator_bytes=counts.state.rounding + counts.data.rounding,
        workspace_bytes=trial_workspace_bytes(
            cfg, info.capability if info is not None else ASSUMED_CAPABILITY
        ),
        context_bytes=counts.context if counts.context is not None else context_allowance(),
        context_measured=counts.context is not None,
        measured_allocated_bytes=counts.allocated,
        measured_reserved_bytes=counts.reserved,
        group_size=counts.group_size,
    )


__all__ = [
    "ASSUMED_CAPABILITY",
    "CONTEXT_ENV",
    "CUBLAS_HANDLES_PER_STEP",
    "DEFAULT_CONTEXT_BYTES",
    "CudaDevice",
    "MemoryProfile",
    "ProfileError",
    "context_allowance",
    "cublas_workspace_bytes",
    "cuda_device",
    "profile_trial",
    "profiling_config",
    "step_streams",
    "target_fuse",
    "target_precision",
    "trial_workspace_bytes",
]
