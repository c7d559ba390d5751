"""The memory estimator: exact state bytes, saved-activation bytes, whole-trial profiles;
and, on CUDA, the estimate against the allocator's measurement."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

from cluster.profiler import (
    DEFAULT_CONTEXT_BYTES,
    MemoryProfile,
    context_allowance,
    cublas_workspace_bytes,
    profile_trial,
    profiling_config,
    trial_workspace_bytes,
)
from cluster.tensor_bytes import LiveTensors, SavedTensors, state_bytes, storage_key
from tests.trainables.helpers import tiny_config
from trainables.precision import PrecisionPolicy, StepGuard, get_policy

CPU = torch.device("cpu")
ELEMENT = {"f32": 4, "bf16": 2}
TINY_DQN: dict[str, Any] = {
    "hidden": 16,
    "buffer_capacity": 512,
    "learning_starts": 64,
    "replay_batch_size": 32,
}


def linear_stack(precision: str, widths: tuple[int, ...]) -> tuple[nn.Module, PrecisionPolicy]:
    policy = get_policy(precision)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    module = policy.convert_module(nn.Sequential(*layers[:-1]))
    return module, policy


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_state_bytes_are_exact_for_a_linear_stack(precision: str) -> None:
    model, policy = linear_stack(precision, (16, 32, 8))
    optimizer = policy.make_optimizer(model.parameters(), lr=1e-3)
    x = policy.convert_input(torch.randn(64, 16))
    policy.backward_and_step(model(x).float().pow(2).mean(), optimizer, StepGuard(CPU), 1.0)

    counted = state_bytes([model], [optimizer], CPU)
    n = 16 * 32 + 32 + 32 * 8 + 8  # 808 weights and biases, in 4 tensors
    e = ELEMENT[precision]
    assert counted.n_params == n
    assert counted.params == n * e
    assert counted.grads == n * e  # gradients in the parameters' dtype
    # exp_avg + exp_avg_sq in f32 per element, an f32 step count per tensor, and under
    # bf16 the Kahan compensation buffer in the weights' dtype.
    assert counted.optimizer == n * 8 + 4 * 4 + (n * 2 if precision == "bf16" else 0)
    assert counted.rounding > 0  # every storage takes whole 512-byte allocator blocks


def _saved_bytes(precision: str) -> int:
    torch.manual_seed(0)
    model, policy = linear_stack(precision, (64, 128, 128, 16))
    x = policy.convert_input(torch.randn(32, 64))
    exclude = frozenset({storage_key(p) for p in model.parameters()} | {storage_key(x)})
    with SavedTensors(exclude=exclude) as saved:
        loss = model(x).pow(2).mean()
    del loss
    return saved.peak


def test_bf16_activations_are_half_of_f32_for_a_linear_stack() -> None:
    f32, bf16 = _saved_bytes("f32"), _saved_bytes("bf16")
    # Saved: two ReLU outputs (each also the next Linear's input: one storage) and the
    # output the square saves; the input and weights are not activations.
    assert f32 == 4 * (32 * 128 * 2 + 32 * 16)
    assert abs(2 * bf16 - f32) <= 8


def test_saved_tensors_keep_the_largest_step_not_the_sum() -> None:
    model, _ = linear_stack("f32", (8, 256, 8))
    counter = SavedTensors(exclude=frozenset(storage_key(p) for p in model.parameters()))
    with counter:
        for batch in (4, 64, 16):
            model(torch.randn(batch, 8)).sum().backward()
            counter.end_step()
    assert counter.peak == 64 * (8 + 256) * 4  # input and ReLU output of the 64-row step


def test_live_tensors_follow_a_no_grad_forward() -> None:
    width, batch = 256, 64
    model, _ = linear_stack("f32", (width,) * 5)
    x = torch.randn(batch, width)
    act = batch * width * 4  # one (64, 256) f32 activation: 64 KiB, a whole number of blocks
    with torch.no_grad(), LiveTensors(CPU) as live:
        y = model(x)
        assert live.live == act  # only the output is still alive
    del y
    assert live.live == 0
    # A layer's input and output, plus the fused ReLU's, never more than three at once.
    assert 2 * act <= live.peak <= 3 * act + 4 * 512


def test_allowances_default_and_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPO_CUDA_CONTEXT_MB", raising=False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert context_allowance() == DEFAULT_CONTEXT_BYTES == 1024 * 2**20  # H200: 742-940 seen
    assert cublas_workspace_bytes((9, 0)) == 32 * 2**20  # Hopper: torch's 32 MiB
    assert cublas_workspace_bytes((8, 0)) == (4096 * 2 + 16 * 8) * 1024
    monkeypatch.setenv("HPO_CUDA_CONTEXT_MB", "300")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1")
    assert context_allowance() == 300 * 2**20
    assert cublas_workspace_bytes((9, 0)) == 4096 * 1024


def test_a_trial_holds_a_cublas_workspace_per_handle_and_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As an H200 showed (torch 2.11): two 32 MiB workspaces per stream (the forward's
    handle and autograd's), and a second stream where the step is captured in a CUDA
    graph. The estimate booked one workspace and fell 33-100 MiB short of every family."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    hopper, MiB = (9, 0), 2**20
    captured = tiny_config("kan", "f32")  # cuda_graphs auto, a static step: captured
    assert trial_workspace_bytes(captured, hopper) == 4 * 32 * MiB
    assert trial_workspace_bytes(captured.replace(cuda_graphs="off"), hopper) == 2 * 32 * MiB
    dqn = tiny_config("dqn", "f32", model_config=TINY_DQN)  # rl: never captured
    assert trial_workspace_bytes(dqn, hopper) == 2 * 32 * MiB
    assert profile_trial(captured, device=CPU).workspace_bytes == 4 * 32 * MiB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1")
    assert trial_workspace_bytes(dqn, hopper) == 2 * 4 * MiB


def test_profiling_config_lowers_learning_starts_only_for_rl() -> None:
    dqn = profiling_config(tiny_config("dqn", model_config=TINY_DQN), CPU)
    assert dqn.model_config["learning_starts"] == 32  # one replay batch
    assert (dqn.max_steps_per_epoch, dqn.rl_iterations, dqn.device) == (1, 1, "cpu")
    assert profiling_config(tiny_config("tft", precision="auto"), CPU).precision == "bf16"


@pytest.fixture(scope="module")
def dqn_profiles() -> dict[str, MemoryProfile]:
    return {
        p: profile_trial(tiny_config("dqn", p, n_folds=2, model_config=TINY_DQN), device=CPU)
        for p in ("f32", "bf16")
    }


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_dqn_profile_counts_both_networks_and_the_replay(
    dqn_profiles: dict[str, MemoryProfile], precision: str
) -> None:
    from models.base import DataShape
    from models.dqn import DQNConfig
    from models.nets.dqn import DQNLearner

    profile = dqn_profiles[precision]
    e = ELEMENT[precision]
    learner = DQNLearner(DQNConfig(**TINY_DQN), DataShape(n_features=8, lookback=16, n_assets=2))
    n_online = sum(p.numel() for p in learner.trainable_parameters())
    n_all = sum(p.numel() for p in learner.parameters())  # online + target network
    n_tensors = len(list(learner.trainable_parameters()))
    compensation = 2 if precision == "bf16" else 0

    assert profile.method == "estimated" and profile.n_folds == 2
    assert profile.n_params == n_online
    assert profile.params_bytes == 2 * n_all * e  # two folds
    assert profile.grads_bytes == 2 * n_online * e
    assert profile.optimizer_bytes == 2 * (n_online * (8 + compensation) + 4 * n_tensors)
    # Two (capacity, L, F) window buffers per fold's replay, in the data dtype.
    assert profile.data_bytes > 2 * 2 * 512 * 16 * 8 * e
    assert profile.activations_bytes > 0
    parts = profile.components()
    assert profile.total_bytes == sum(parts.values())
    assert (
        profile.peak_bytes == profile.estimated_peak_bytes == profile.total_bytes - parts["context"]
    )


def test_dqn_bf16_halves_the_replay_windows(dqn_profiles: dict[str, MemoryProfile]) -> None:
    f32, bf16 = dqn_profiles["f32"], dqn_profiles["bf16"]
    window_bytes_f32 = 2 * 2 * 512 * 16 * 8 * 4  # folds x (window, next_window) x C x L x F
    assert f32.data_bytes - bf16.data_bytes >= window_bytes_f32 // 2
    assert bf16.activations_bytes < 0.75 * f32.activations_bytes


def test_forecast_profile_is_smaller_in_bf16() -> None:
    f32 = profile_trial(tiny_config("tft", "f32"), device=CPU)
    bf16 = profile_trial(tiny_config("tft", "bf16"), device=CPU)
    assert abs(2 * bf16.params_bytes - f32.params_bytes) <= 64  # TFT keeps its quantiles f32
    assert bf16.activations_bytes < f32.activations_bytes
    assert bf16.estimated_peak_bytes - bf16.workspace_bytes < (
        f32.estimated_peak_bytes - f32.workspace_bytes
    )
    restored = MemoryProfile.from_dict(f32.to_dict())
    assert restored == f32


def test_a_group_profile_holds_every_trial_in_one_context() -> None:
    """A group trial of three KAN trials (two folds each) fused: three times a trial's
    state and step, one CUDA context and one set of cuBLAS workspaces, under its own shape
    key."""
    from cluster.vram_table import key_string, profile_key

    config = tiny_config("kan", "f32", n_folds=2)
    alone = profile_trial(config, device=CPU)
    group = profile_trial(config, device=CPU, group_size=3)
    assert (alone.group_size, group.group_size) == (1, 3)
    assert group.n_params == alone.n_params and group.n_folds == alone.n_folds == 2
    for part in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        assert getattr(group, part) == 3 * getattr(alone, part), part
    assert 2.5 * alone.activations_bytes <= group.activations_bytes <= 3.5 * alone.activations_bytes
    assert 2.5 * alone.data_bytes <= group.data_bytes <= 3.5 * alone.data_bytes
    assert (group.context_bytes, group.workspace_bytes) == (
        alone.context_bytes,
        alone.workspace_bytes,
    )
    assert group.total_bytes < 3 * alone.total_bytes - 2 * alone.context_bytes + 1
    keys = [key_string(profile_key(config, CPU, "estimate", n)) for n in (1, 3, 4)]
    assert len(set(keys)) == 3 and '"group_size"' not in keys[0]  # alone: the key of old
    assert MemoryProfile.from_dict(group.to_dict()) == group
    with pytest.raises(ValueError, match="group_size must be >= 1"):
        profile_trial(config, device=CPU, group_size=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_group_estimate_within_ten_percent_of_its_cuda_measurement() -> None:
    from trainables.config import build_train_config

    config = build_train_config("kan", {}, precision="bf16")
    measured = profile_trial(config, device="cuda", measure=True, group_size=4)
    alone = profile_trial(config, device="cuda", measure=True)
    allocated = measured.measured_allocated_bytes
    assert allocated and alone.measured_allocated_bytes
    assert abs(measured.estimated_peak_bytes / allocated - 1) <= 0.10, measured.to_dict()
    assert allocated < 4 * alone.measured_allocated_bytes  # one workspace for the four


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["dqn", "tft"])
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_estimate_within_ten_percent_of_cuda_measurement(model: str, precision: str) -> None:
    from trainables.config import build_train_config

    config = build_train_config(model, {}, precision=precision)  # default trial sizes
    measured = profile_trial(config, device="cuda", measure=True)
    cpu_estimate = profile_trial(config, device="cpu", measure=False)
    allocated, reserved = measured.measured_allocated_bytes, measured.measured_reserved_bytes
    assert allocated and reserved and reserved >= allocated
    assert abs(measured.estimated_peak_bytes / allocated - 1) <= 0.10, measured.to_dict()
    assert abs(cpu_estimate.estimated_peak_bytes / allocated - 1) <= 0.10, cpu_estimate.to_dict()


class FakeNvml:
    """pynvml's calls cuda_device makes, for one H100 split into MIG instances: the
    parent has 80 GiB, the instance this process sees 10 GiB."""

    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self) -> None:
        self.parent, self.mig = object(), object()

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        assert index == 0
        return self.parent

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> object:
        assert uuid == "MIG-1234-abcd"
        return self.mig

    def nvmlDeviceGetMigMode(self, handle: object) -> tuple[int, int]:
        return (1, 1) if handle is self.parent else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, slot: int) -> object:
        if slot == 0:
            return self.mig
        raise RuntimeError("empty slot")

    def nvmlDeviceGetUUID(self, handle: object) -> bytes:
        return b"MIG-1234-abcd"

    def nvmlDeviceGetName(self, handle: object) -> bytes:
        return (
            b"NVIDIA H100 80GB HBM3 MIG 1g.10gb" if handle is self.mig else b"NVIDIA H100 80GB HBM3"
        )

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(total=(10 if handle is self.mig else 80) * 2**30)


@pytest.mark.parametrize("visible", ["MIG-1234-abcd", ""])
def test_cuda_device_reads_a_mig_instances_own_memory(
    monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    """By the MIG UUID in CUDA_VISIBLE_DEVICES, or by matching torch's device UUID among the
    parent's MIG instances; never the parent GPU's 80 GiB."""
    import sys
    from types import SimpleNamespace

    from cluster import profiler

    props = SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30, major=9, minor=0, uuid="1234-abcd"
    )
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", lambda index: index)
    info = profiler.cuda_device(torch.device("cuda", 0))
    assert info.name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert info.total_bytes == 10 * 2**30
    assert info.nvml_index is None  # NVML lists no per-process memory for MIG instances
    assert info.total_source == "nvml"
    # Without NVML (a container without the library): torch's figure, said so.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    plain = profiler.cuda_device(torch.device("cuda", 0))
    assert (plain.total_bytes, plain.total_source) == (80 * 2**30, "torch")


@pytest.mark.parametrize(("fuse", "captures"), [("off", 2), ("on", 1)])
def test_the_allocated_peak_is_read_from_eager_steps_and_the_reserved_after_capture(
    fuse: str, captures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU a trial's forecast step is captured after its warm-up. A replay allocates
    nothing, so the allocated peak must come from eager steps; the graphs' private pools
    are reserved memory the trial's allocator cap counts, so the reserved peak is read
    after each step is captured and replayed: each fold's, or the fused folds' one.
    `_count` on CPU with the device facts faked: a capture that keeps the step, and
    allocator statistics that log when read."""
    import cluster.profiler as profiler
    from trainables import cuda_graphs
    from trainables.cuda_graphs import GRAPH_WARMUP_STEPS
    from trainables.trainer import Trainer

    events: list[str] = []

    def capture(step: Any, device: torch.device, stream: object = None) -> Any:
        events.append("capture")
        return step

    def read(name: str) -> Any:
        return lambda device=None: events.append(name) or 0

    monkeypatch.setattr(cuda_graphs, "cuda_graphs_supported", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "capture_cuda_graph", capture)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", read("allocated peak read"))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", read("reserved peak read"))
    monkeypatch.setattr(profiler, "cuda_device", lambda device: None)
    monkeypatch.setattr(profiler, "measured_context_bytes", lambda device, info: None)

    config = profiling_config(tiny_config("tlob", n_folds=2, fuse=fuse), torch.device("cpu"))
    trainer = Trainer(config.replace(cuda_graphs="on"))
    assert len(trainer.step_units) == captures
    profiler._count([trainer], trainer, torch.device("cpu"), measure=True, baseline=(0, 0))
    assert GRAPH_WARMUP_STEPS >= 3  # the first unit's eager measured step is its third call
    assert events == ["allocated peak read", *["capture"] * captures, "reserved peak read"]
    assert [unit.step.replaying for unit in trainer.step_units] == [True] * captures

    events.clear()
    eager = Trainer(config.replace(cuda_graphs="off"))
    profiler._count([eager], eager, torch.device("cpu"), measure=True, baseline=(0, 0))
    assert events == ["allocated peak read", "reserved peak read"]  # nothing captured


def test_storages_left_out_of_a_count_keep_their_addresses_while_it_runs() -> None:
    """Counters leave storages out by address. A transient the walk found (last step's
    batch) freed during the counted step used to lend its address to an activation,
    which was then left out too (a dqn estimate moved by 256 bytes with the heap's
    history). The set holds what it found, so no new tensor can land there."""
    from cluster.tensor_bytes import reachable_bytes

    reused = []
    for size in (256, 1024, 4096, 16384):  # which sizes malloc hands back at once varies
        for _ in range(5):
            batch = torch.ones(size)
            found = reachable_bytes({"batch": batch}, torch.device("cpu"), frozenset())
            (key,) = found.keys
            del batch
            fresh = [torch.empty(size) for _ in range(200)]
            reused += [size for t in fresh if storage_key(t) == key]
            assert found.held[0].data_ptr() == key
            del fresh, found
    assert reused == []  # without the hold, most of these sizes came back within 200


@pytest.mark.parametrize("val_fraction", [0.1, 0.3])  # the test window longer, then shorter
def test_the_profile_evaluates_once_over_the_longest_window(
    val_fraction: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evaluation's peak is its largest forward's: over the longest of the folds'
    validation windows and the last fold's test window, whose chunks and output are the
    largest. The profile runs that one forward, not the shorter window's too."""
    from trainables.trainer import Trainer

    config = tiny_config("tft", "f32", n_folds=2, val_fraction=val_fraction)
    trainer = Trainer(config)
    windows = [(run, run.data.val) for run in trainer.folds]
    windows.append((trainer.folds[-1], trainer.folds[-1].data.test))
    peaks = {}
    for run, span in windows:
        with LiveTensors(CPU) as live:
            trainer.positions(run, span)
        peaks[span[1] - span[0]] = live.peak
    longest = max(peaks)
    assert len(set(peaks)) > 1 and peaks[longest] == max(peaks.values())

    evaluated: list[int] = []
    positions = Trainer.positions

    def recorded(self: Trainer, run: Any, span: tuple[int, int]) -> torch.Tensor:
        evaluated.append(span[1] - span[0])
        return positions(self, run, span)

    monkeypatch.setattr(Trainer, "positions", recorded)
    profile_trial(config, device=CPU)
    assert evaluated == [longest]
