"""The training step every family and policy runs is capturable: it reads nothing on the
host and it sees inputs of one shape.

* :class:`~trainables.contract.NoHostReads` (the contract's host-read check) around the trainer's training loop of
  one fold (batch gather, forward, loss, backward, the guarded optimizer update, the guard
  counters, the loss sums; for rl families also collect and ``after_step``), for all ten
  families x f32, bf16, bf16-mixed and fp16-mixed. What the trainer reads on purpose
  (the divergence check every ``log_every`` steps) is pushed out of the run, and KAN's
  once-per-epoch grid refit, which runs before the first step, is allowed explicitly.
* every batch a forecast step sees has ``batch_size`` windows when the training split is
  not a multiple of it (the short tail is dropped);
* the captured-step path of :class:`trainables.trainer.StepRunner` on CPU, with only the
  device facts faked: a capture that "records" by keeping the step (its replay calls it
  on the static inputs) trains to exactly the eager numbers; a capture that raises falls
  back to eager with the reason logged and ``cuda_graphs`` 0.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from models import family_names, get_family
from models.base import Batch
from tests.models.test_contract import PRECISIONS, TINY
from tests.trainables.helpers import tiny_config
from trainables import cuda_graphs
from trainables.config import DataConfig, TrainConfig
from trainables.contract import NoHostReads, check_host_reads
from trainables.trainer import Trainer

# Fewer warm-up transitions than the contract's tiny DQN, so two collects already learn.
STEP_OVERRIDES: dict[str, dict[str, Any]] = {"dqn": {"learning_starts": 16}}


def _config(model: str, precision: str, **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "family": model,
        "precision": precision,
        "epochs": 1,
        "max_steps_per_epoch": 2,
        "rl_iterations": 2,
        "log_every": 10**6,  # the trainer's own host read is not part of the step
        "model_config": {**TINY[model], **STEP_OVERRIDES.get(model, {})},
        "data": DataConfig(n_bars=400, n_assets=2),
    }
    values.update(overrides)
    return tiny_config(**values)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("model", family_names())
def test_the_training_step_reads_nothing_on_the_host(model: str, precision: str) -> None:
    """The contract's host-read check (trainables/contract.py), as `hpo check-family`
    runs it: every step ran and was counted, nothing read on the host, and nothing
    skipped (fp16 may skip while its loss scale backs off from 2^16)."""
    check_host_reads(model, precision)


class _SyncInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * torch.nonzero(grad).shape[0]


@pytest.mark.parametrize(
    "hot_loop",
    [
        lambda x: x.sum().item(),
        lambda x: float(x.detach().sum()),
        lambda x: x[x > 0].sum(),  # boolean mask: a nonzero inside
        lambda x: torch.nonzero(x),
        lambda x: x.repeat_interleave((x > 0).long()),
        lambda x: _SyncInBackward.apply(x).sum().backward(),  # only backward syncs
    ],
)
def test_the_guard_catches_host_syncs(
    hot_loop: Callable[[torch.Tensor], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(8, requires_grad=True)
    with pytest.raises(AssertionError, match="host"), NoHostReads():
        hot_loop(x)
    hot_loop(x)  # and nothing is left patched


@pytest.mark.parametrize("model", [f for f in family_names() if get_family(f).kind == "forecast"])
def test_every_forecast_step_sees_a_full_batch(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = Trainer(_config(model, "f32", batch_size=48, max_steps_per_epoch=None))
    run = trainer.folds[0]
    n_train = run.data.decision_times(run.data.train).numel()
    assert n_train % 48 != 0, "the split must leave a short tail for this test"
    shapes: list[tuple[tuple[int, ...], ...]] = []
    step = trainer.forecast_step

    def recording_step(run_: Any, batch: Batch) -> Any:
        shapes.append((tuple(batch.x.shape), tuple(batch.y.shape), tuple(batch.gaps.shape)))
        return step(run_, batch)

    monkeypatch.setattr(trainer, "forecast_step", recording_step)
    trainer.train_fold(run)
    assert len(shapes) == n_train // 48  # the short tail is dropped, never stepped
    assert set(shapes) == {((48, 2, 16, trainer.shape.n_features), (48, 2), (48, 16))}


# ----------------------------------------------------------------------------------------
# the captured path on CPU, device facts faked


def _fake_capture(calls: list[str]) -> Callable[..., Callable[[], None]]:
    def capture(
        step: Callable[[], None], device: torch.device, stream: object = None
    ) -> Callable[[], None]:
        calls.append(device.type)  # records, runs nothing: the replay runs the step
        return step

    return capture


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for run in trainer.folds for p in run.model.parameters()]


@pytest.mark.parametrize(("fuse", "captures"), [("off", 2), ("on", 1)])
@pytest.mark.parametrize("precision", ["f32", "fp16-mixed"])
def test_a_replayed_step_trains_to_the_eager_numbers(
    precision: str, fuse: str, captures: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fold's step captured and replayed, or the fused folds' one step."""
    config = _config("tlob", precision, epochs=2, max_steps_per_epoch=6, n_folds=2, fuse=fuse)
    config = config.replace(data=DataConfig(n_bars=600, n_assets=2))
    eager = Trainer(config.replace(cuda_graphs="off"))
    eager_metrics = eager.fit()

    calls: list[str] = []
    monkeypatch.setattr(cuda_graphs, "cuda_graphs_supported", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "capture_cuda_graph", _fake_capture(calls))
    graphed = Trainer(config)  # auto: tlob declares its step static
    graphed_metrics = graphed.fit()

    assert calls == ["cpu"] * captures  # one per step unit, after the warm-up steps
    assert [m["cuda_graphs"] for m in graphed_metrics] == [1, 1]
    assert [m["fused_folds"] for m in graphed_metrics] == [2 if fuse == "on" else 0] * 2
    assert [m["cuda_graphs"] for m in eager_metrics] == [0, 0]
    for a, b in zip(_weights(eager), _weights(graphed), strict=True):
        assert torch.equal(a, b)
    for key in ("train_loss", "val_sharpe", "skipped_steps"):
        assert [m[key] for m in eager_metrics] == [m[key] for m in graphed_metrics], key


def test_a_failed_capture_steps_eagerly_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def failing_capture(
        step: Callable[[], None], device: torch.device, stream: object = None
    ) -> Callable[[], None]:
        raise RuntimeError("operation not permitted when stream is capturing")

    config = _config("tlob", "f32", max_steps_per_epoch=6)
    eager = Trainer(config.replace(cuda_graphs="off"))
    eager.fit()
    monkeypatch.setattr(cuda_graphs, "cuda_graphs_supported", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "capture_cuda_graph", failing_capture)
    trainer = Trainer(config.replace(cuda_graphs="on"))
    with caplog.at_level(logging.WARNING, logger=cuda_graphs.log.name):
        metrics = trainer.fit()
    step = trainer.folds[0].step
    assert step is not None and not step.replaying
    assert (
        step.why_not
        == "capture failed: RuntimeError: operation not permitted when stream is capturing"
    )
    assert metrics[-1]["cuda_graphs"] == 0
    assert any(
        "stepping eagerly" in r.message and "capture failed" in r.message for r in caplog.records
    )
    assert trainer.global_step == eager.global_step == 6  # the failed capture's batch was stepped
    for a, b in zip(_weights(eager), _weights(trainer), strict=True):
        assert torch.equal(a, b)


def test_a_fallback_to_f32_captures_the_step_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cuda_graphs, "cuda_graphs_supported", lambda device: True)
    monkeypatch.setattr(cuda_graphs, "capture_cuda_graph", _fake_capture(calls))
    config = _config("tlob", "bf16", max_steps_per_epoch=10, fallback_after=3, log_every=6)
    trainer = Trainer(config.replace(data=DataConfig(n_bars=600, n_assets=2)))
    run = trainer.folds[0]
    original, seen = run.model.loss, []  # type: ignore[attr-defined]

    def poisoned(batch: Batch) -> torch.Tensor:  # steps 3-5 (the first replays) are NaN
        seen.append(len(seen))
        value = original(batch)
        return value * float("nan") if 3 <= seen[-1] <= 5 else value

    monkeypatch.setattr(run.model, "loss", poisoned)
    metrics = trainer.train_epoch()
    assert metrics["fell_back_to_f32"] == 1 and metrics["skipped_steps"] == 3
    assert calls == ["cpu", "cpu"]  # captured under bf16, dropped, captured again in f32
    assert metrics["cuda_graphs"] == 1 and metrics["step"] == 10
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}


@pytest.mark.parametrize(
    ("setting", "device", "model", "expected"),
    [
        ("auto", "cuda", "tlob", (True, "")),
        ("auto", "cpu", "tlob", (False, "no CUDA graphs on a cpu device")),
        ("off", "cuda", "tlob", (False, "trainer.cuda_graphs is off")),
        ("on", "cuda", "dqn", (False, "dqn is an rl family: its steps come from a loss generator")),
        (
            "auto",
            "cuda",
            "ppo",
            (False, "ppo is an rl family: its steps come from a loss generator"),
        ),
    ],
)
def test_graph_plan(setting: str, device: str, model: str, expected: tuple[bool, str]) -> None:
    assert cuda_graphs.graph_plan(setting, torch.device(device), get_family(model)) == expected


def test_cuda_graphs_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="cuda_graphs must be one of"):
        TrainConfig(cuda_graphs="yes")


# ----------------------------------------------------------------------------------------
# capture_cuda_graph itself, on faked torch.cuda calls (the order and the stream facts)


class _Stream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: _Stream) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


class _FakeCuda:
    """The torch.cuda calls capture_cuda_graph makes: streams, device, graph, cache."""

    def __init__(self, step_error: Exception | None) -> None:
        self.log: list[str] = []
        self.default = _Stream("default", self.log)
        self.current = self.default
        self.step_error = step_error
        fake = self

        class Graph:
            def capture_begin(self) -> None:
                fake.log.append(f"capture begins on {fake.current.name}")

            def capture_end(self) -> None:
                if fake.step_error is not None:  # an invalidated capture fails to end too
                    raise RuntimeError("operation failed due to a previous error during capture")
                fake.log.append("capture ends")

            def reset(self) -> None:
                fake.log.append("graph reset")

            def replay(self) -> None:
                fake.log.append("replay")

        self.Graph = Graph

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        @contextlib.contextmanager
        def on_stream(stream: _Stream) -> Iterator[None]:
            previous, self.current = self.current, stream
            try:
                yield
            finally:
                self.current = previous

        cuda = torch.cuda
        monkeypatch.setattr(cuda, "CUDAGraph", self.Graph)
        monkeypatch.setattr(cuda, "Stream", lambda device=None: _Stream("side", self.log))
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: self.current)
        monkeypatch.setattr(cuda, "stream", on_stream)
        monkeypatch.setattr(cuda, "device", lambda device: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(cuda, "empty_cache", lambda: None)

    def step(self) -> None:
        self.log.append(f"step on {self.current.name}")
        if self.step_error is not None:
            raise self.step_error


def test_a_capture_records_on_the_given_stream_and_returns_to_the_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeCuda(step_error=None)
    fake.install(monkeypatch)
    warm_up_stream = _Stream("warm-up", fake.log)
    replay = cuda_graphs.capture_cuda_graph(fake.step, torch.device("cuda", 0), warm_up_stream)
    assert fake.log == [
        "warm-up waits for default",
        "capture begins on warm-up",
        "step on warm-up",
        "capture ends",
        "default waits for warm-up",
    ]
    assert fake.current is fake.default
    replay()
    assert fake.log[-1] == "replay"


def test_a_step_that_fails_inside_the_capture_raises_its_own_error_on_the_callers_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.cuda.graph's exit ends the capture before restoring the stream, so a failed
    step left the process on the capture stream and reported capture_end's error."""
    fake = _FakeCuda(step_error=RuntimeError("operation not permitted when stream is capturing"))
    fake.install(monkeypatch)
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        cuda_graphs.capture_cuda_graph(fake.step, torch.device("cuda", 0))
    assert fake.current is fake.default  # the eager fallback steps on the caller's stream
    assert fake.log[-1] == "graph reset"  # the failed capture's pool is given back
