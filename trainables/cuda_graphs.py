"""A training step, eager or captured in a CUDA graph and replayed.

:func:`graph_plan` decides whether a step is captured (``trainer.cuda_graphs``: ``on``,
``auto`` for families that declare their step static, ``off``; never for rl families,
whose steps come from a loss generator, nor off CUDA). :class:`StepRunner` runs one step
the same way either way: a captured step trains on the inputs it is given, so a trial
takes the same steps eagerly and replayed, and a capture that fails steps eagerly from
then on with the reason logged, never an error. The trial loop (:mod:`trainables.trainer`)
builds a runner per fold; fold fusion (:mod:`trainables.fusion`) one per fused step unit, and
an eager one per subset of its slots.
Tests fake :func:`cuda_graphs_supported` and :func:`capture_cuda_graph` to run the capture
path on a CPU. Why: docs/precision.md#the-hot-loop
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from models.base import Family
from trainables.precision import StepResult

GRAPH_WARMUP_STEPS = 3  # eager steps on a side stream before capture (allocator, cuBLAS)

log = logging.getLogger(__name__)


def cuda_graphs_supported(device: torch.device) -> bool:
    """The device fact graph capture needs (tests fake it to run the capture path on CPU)."""
    return device.type == "cuda"


def graph_plan(setting: str, device: torch.device, family: Family) -> tuple[bool, str]:
    """(capture the step?, why not) for ``trainer.cuda_graphs = setting``."""
    if setting == "off":
        return False, "trainer.cuda_graphs is off"
    if family.kind == "rl":
        return False, f"{family.name} is an rl family: its steps come from a loss generator"
    if not cuda_graphs_supported(device):
        return False, f"no CUDA graphs on a {device.type} device"
    if setting == "auto" and not family.step_is_static:
        return False, f"{family.name} does not declare its step static (Family.static_step)"
    return True, ""


def capture_cuda_graph(
    step: Callable[[], None], device: torch.device, stream: Any = None
) -> Callable[[], None]:
    """Record one call of ``step`` in a CUDA graph (nothing runs); returns its replay.

    On ``stream``, the one the warm-up ran on (cuBLAS keeps a workspace per stream), into
    the graph's own memory pool (one per fold: sharing one across the folds would save
    memory but makes every later capture's allocations a hazard to check; the profiler
    measures the same per-fold pools the trial has). Written out instead of
    ``with torch.cuda.graph(...)``, whose exit ends the capture before restoring the
    stream: when the step fails inside the capture, ``capture_end`` raises too and the
    process stays on the capture stream, with the failed capture's pool held. Here the
    capture is ended (its error dropped), the caller's stream restored, and the step's
    own error raised, so the eager fallback runs where it should and says why."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device):
        previous = torch.cuda.current_stream(device)
        stream = stream if stream is not None else torch.cuda.Stream(device)
        torch.cuda.synchronize(device)  # as torch.cuda.graph does before it begins
        torch.cuda.empty_cache()
        stream.wait_stream(previous)
        with torch.cuda.stream(stream):  # restores ``previous`` on the way out, raised or not
            graph.capture_begin()
            try:
                step()
            except BaseException:
                with contextlib.suppress(Exception):
                    graph.capture_end()  # "a previous error during capture": not the news
                _give_back(graph)
                raise
            try:
                graph.capture_end()
            except BaseException:
                _give_back(graph)
                raise
        previous.wait_stream(stream)
    return graph.replay


def _give_back(graph: Any) -> None:
    """Release a failed capture's memory pool now, not when the graph is collected."""
    with contextlib.suppress(Exception):
        graph.reset()


@contextlib.contextmanager
def _on_stream(device: torch.device, side: Any) -> Iterator[None]:
    """Warm-up steps run on a side stream, as capture requires; no-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    current = torch.cuda.current_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


class StepRunner:
    """One training step, called with its inputs each time; returns (f32 loss, ok) tensors
    (``(K,)`` each for fused slots).

    ``step`` is the eager step on ``inputs`` (a fold's batch fields, or the fused slots'
    decision times and active mask). Eager: ``step(*inputs)``. Captured (``capture``
    True): the inputs are copied into static tensors and the step runs on them; the first
    :data:`GRAPH_WARMUP_STEPS` calls eagerly on a side stream, the next one is recorded
    with :func:`capture_cuda_graph` and replayed, and so is every later one. Warm-up and
    capture train on the inputs they are given, so a trial takes the same steps either
    way. A capture that fails is logged with its reason and the step runs eagerly from
    then on. The outputs of a replayed step are the same two tensors each time: consume
    them before the next call (the trainer adds them into its epoch sums at once).
    """

    def __init__(
        self,
        label: str,
        step: Callable[..., StepResult],
        capture: bool,
        why_not: str,
        *,
        device: torch.device,
        family: str,
        cuda_graphs: str,
    ) -> None:
        """``device`` the step runs on; ``family`` (its name) and ``label`` name the step
        in what is logged; ``cuda_graphs`` is the trial's ``trainer.cuda_graphs`` setting
        (``on`` warns when the step runs eagerly)."""
        self.label, self.step = label, step
        self.device, self.family = device, family
        self.capture = capture
        self.why_not = why_not
        self.replay: Callable[[], None] | None = None
        self.warmed = 0
        self.static: tuple[torch.Tensor, ...] | None = None
        # One side stream for the warm-up steps and the capture (a new stream per call
        # would cost a cuBLAS workspace each).
        self.stream = torch.cuda.Stream(device) if capture and device.type == "cuda" else None
        self.loss: torch.Tensor | None = None
        self.ok: torch.Tensor | None = None
        if not capture and cuda_graphs == "on":
            log.warning("trainer.cuda_graphs=on, stepping eagerly: %s", why_not)

    @property
    def replaying(self) -> bool:
        return self.replay is not None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.capture:
            result = self.step(*inputs)
            return result.loss, result.ok
        self._load(inputs)
        if self.replay is None:
            device = self.device
            if self.warmed < GRAPH_WARMUP_STEPS:
                self.warmed += 1
                with _on_stream(device, self.stream):
                    self._static_step()
                return self._outputs()
            try:
                self.replay = capture_cuda_graph(self._static_step, device, self.stream)
            except Exception as exc:  # any capture failure: train on, eagerly
                self.capture = False
                self.why_not = f"capture failed: {type(exc).__name__}: {exc}"
                log.warning(
                    "%s %s: CUDA graph %s; stepping eagerly",
                    self.family,
                    self.label,
                    self.why_not,
                )
                return self(*inputs)
        self.replay()
        return self._outputs()

    def _outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.loss is not None and self.ok is not None
        return self.loss, self.ok

    def _load(self, inputs: tuple[torch.Tensor, ...]) -> None:
        """Copy ``inputs`` into the static inputs (allocated from the first call)."""
        if self.static is None:
            self.static = tuple(t.clone() for t in inputs)
            return
        for i, (static, new) in enumerate(zip(self.static, inputs, strict=True)):
            if new.shape != static.shape:
                raise ValueError(
                    f"a captured step needs static shapes: input {i} of the {self.label} "
                    f"step is {tuple(new.shape)}, the captured one {tuple(static.shape)}"
                )
            static.copy_(new)

    def _static_step(self) -> None:
        assert self.static is not None
        result = self.step(*self.static)
        if self.loss is None or self.ok is None:  # outputs the replays write into
            self.loss, self.ok = result.loss.detach().clone(), result.ok.clone()
            return
        self.loss.copy_(result.loss)
        self.ok.copy_(result.ok)
