"""ATen ops and CPU time per training step, per family and precision, against a
bare loop with ``torch.optim.AdamW(fused=True)`` on the same module and batches.

    .venv/bin/python bench/step_ops.py            # every family x all precisions (minutes)
    .venv/bin/python bench/step_ops.py --smoke    # kan and dqn, two precisions, few steps
    .venv/bin/python bench/step_ops.py tlob dqn   # chosen families
    .venv/bin/python bench/step_ops.py --precisions f32 bf16   # chosen precisions
    .venv/bin/python bench/step_ops.py --slots 1 4 8         # fused slots vs unfused

Ops are top-level ATen ops counted with ``torch.profiler`` on CPU (a proxy for GPU kernel
launches): "fwd+bwd" is forward, loss and backward alone (gradients zeroed outside the
count), "opt+guard" is what the trainer's guarded step adds on top (norm, clip, skip
mask, AdamW, Kahan, counters, zeroing), "fused" the same for the bare loop
(``clip_grad_norm_(foreach=True)`` + fused AdamW + ``zero_grad``). Milliseconds are the
median over interleaved blocks of steps on one CPU thread, measured side by side in one
run; "ratio" is trainer / bare. The rl families' update step is measured the same way on
fixed batches of their own: DQN on replay samples (``learner.loss(sample)`` after the
replay holds ``learning_starts`` transitions), PPO on the minibatches of one collected
rollout (``learner.loss(indices)``); collecting and ``after_step`` (priorities, target
updates) stay outside the count, on both sides.

``--slots K ...`` compares, per forecast family, precision and K, one *trial-step* (a step
of each of a trial's K folds) fused (``trainer.fuse = "on"``: one vmapped step over the K
folds) against the same K folds stepped one after another (``fuse = "off"``), through the
trainer's own step code: ops, ms, and their ratios fused / unfused. Sizes are the
families' tiny sizes (``Family.tiny``) (``--size default`` for the adapters' defaults).
Fused, tft's LSTM and the diffusion's GRU run as a loop over bars on a CPU and as one
block-diagonal layer on a GPU (``models.ops``); ``--recurrent gpu`` runs the GPU's form
here, to count its ops.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile

import models.ops
from models import family_names, get_family
from models.base import RLLearner
from trainables.config import DataConfig, build_train_config
from trainables.trainer import Trainer

PRECISIONS = ("f32", "tf32", "bf16", "bf16-mixed", "fp16-mixed")


@dataclass(frozen=True)
class Row:
    family: str
    precision: str
    tensors: int
    fwd_bwd: int
    opt_guard: int
    fused: int
    trainer_ms: float
    bare_ms: float


def count_ops(fn: Callable[[], None]) -> int:
    """Top-level ATen ops (no ATen parent) run by ``fn``."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(
        1
        for e in prof.events()
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    )


def measure(family: str, precision: str, steps: int, repeats: int) -> Row:
    cfg = build_train_config(
        family,
        {},
        data=DataConfig(),
        precision=precision,
        seed=0,
        epochs=1,
        max_steps_per_epoch=4,
        n_folds=1,
    )
    trainer = Trainer(cfg, device=torch.device("cpu"))
    run, policy = trainer.folds[0], trainer.policy
    model = run.model
    loss_of, batches = _rl_batches(trainer) if trainer.is_rl else _forecast_batches(trainer)
    params = [p for p in model.parameters() if p.requires_grad]
    bare = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    clip = cfg.grad_clip

    def trainer_step(batch: object) -> None:
        with policy.autocast():
            loss = loss_of(batch)
        policy.backward_and_step(loss, run.optimizer, run.guard, clip, run.scaler)

    def forward_backward(batch: object) -> None:
        with policy.autocast():
            loss = loss_of(batch)
        loss.float().backward()

    def bare_step(batch: object) -> None:
        with policy.autocast():
            loss = loss_of(batch)
        loss.float().backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        bare.step()
        bare.zero_grad(set_to_none=False)

    for batch in batches:  # warm-up: arenas built, fused state allocated
        trainer_step(batch)
        bare_step(batch)
    model.zero_grad(set_to_none=False)
    fwd_bwd = count_ops(lambda: forward_backward(batches[0]))
    model.zero_grad(set_to_none=False)
    step_ops = count_ops(lambda: trainer_step(batches[0]))
    bare_ops = count_ops(lambda: bare_step(batches[0]))

    def timed(step: Callable[[object], None]) -> float:
        start = time.perf_counter()
        for i in range(steps):
            step(batches[i % len(batches)])
        return (time.perf_counter() - start) * 1e3 / steps

    trainer_ms, bare_ms = [], []
    for _ in range(repeats):  # interleaved blocks: both loops see the same machine load
        trainer_ms.append(timed(trainer_step))
        bare_ms.append(timed(bare_step))
    return Row(
        family=family,
        precision=precision,
        tensors=len(params),
        fwd_bwd=fwd_bwd,
        opt_guard=step_ops - fwd_bwd,
        fused=bare_ops - fwd_bwd,
        trainer_ms=statistics.median(trainer_ms),
        bare_ms=statistics.median(bare_ms),
    )


LossOf = Callable[[object], torch.Tensor]


def _forecast_batches(trainer: Trainer) -> tuple[LossOf, list[object]]:
    run = trainer.folds[0]
    times = run.data.decision_times(run.data.train)
    size = min(trainer.config.batch_size, times.numel())
    batches: list[object] = [run.data.batch(times[i * size : (i + 1) * size]) for i in range(4)]
    return run.model.loss, batches  # type: ignore[return-value]


def _rl_batches(trainer: Trainer) -> tuple[LossOf, list[object]]:
    """The learner's loss and four batches of its own: replay samples (DQN) or one
    rollout's minibatch indices (PPO)."""
    run = trainer.folds[0]
    learner: RLLearner = run.model  # type: ignore[assignment]
    assert run.env is not None
    cfg = learner.config  # type: ignore[attr-defined]
    with torch.no_grad(), trainer.policy.autocast():
        learner.collect(run.env, 0.0)
        replay = getattr(learner, "replay", None)
        while replay is not None and replay.count < cfg.learning_starts:
            learner.collect(run.env, 0.0)
    if replay is not None:  # DQN: loss(sample) -> (loss, priority signal)
        samples: list[object] = [replay.sample(cfg.replay_batch_size, 1.0) for _ in range(4)]
        return (lambda batch: learner.loss(batch)[0]), samples  # type: ignore[attr-defined]
    items = cfg.num_envs * cfg.n_steps // (cfg.bptt if cfg.recurrent else 1)
    order = torch.randperm(items, generator=torch.Generator().manual_seed(0))
    minibatches: list[object] = list(order.tensor_split(cfg.minibatches))
    return learner.loss, minibatches  # type: ignore[attr-defined]


@dataclass(frozen=True)
class FusedRow:
    family: str
    precision: str
    slots: int
    unfused_ops: int
    fused_ops: int
    unfused_ms: float
    fused_ms: float


def measure_fused(
    family: str, precision: str, k: int, steps: int, repeats: int, size: str
) -> FusedRow:
    """One trial-step of K folds, fused and unfused, through the trainer's step code."""
    model_config = dict(get_family(family).tiny) if size == "tiny" else {}
    trainers = {}
    for fuse in ("off", "on"):
        cfg = build_train_config(
            family,
            model_config,
            data=DataConfig(n_bars=2000),
            precision=precision,
            seed=0,
            epochs=1,
            n_folds=k,
            val_fraction=0.5 / max(k, 4),
            fuse=fuse,
            device="cpu",
        )
        trainers[fuse] = Trainer(cfg, device=torch.device("cpu"))
    unfused, fused_trainer = trainers["off"], trainers["on"]
    fused = fused_trainer.fused
    if fused is None:
        raise RuntimeError(f"{family} did not fuse: {fused_trainer.unfused_reason}")
    size_b = unfused.config.batch_size
    times = torch.stack(
        [run.data.decision_times(run.data.train)[:size_b] for run in fused_trainer.folds]
    )
    batches = [run.data.batch(times[i]) for i, run in enumerate(unfused.folds)]

    def fused_step() -> None:
        fused_trainer.fusion.fused_step(fused, times)

    def unfused_step() -> None:
        for run, batch in zip(unfused.folds, batches, strict=True):
            unfused.forecast_step(run, batch)

    for _ in range(2):  # warm-up: arenas built
        fused_step()
        unfused_step()
    fused_ops, unfused_ops = count_ops(fused_step), count_ops(unfused_step)

    def timed(step: Callable[[], None]) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - start) * 1e3 / steps

    fused_ms, unfused_ms = [], []
    for _ in range(repeats):  # interleaved blocks
        fused_ms.append(timed(fused_step))
        unfused_ms.append(timed(unfused_step))
    return FusedRow(
        family,
        precision,
        k,
        unfused_ops,
        fused_ops,
        statistics.median(unfused_ms),
        statistics.median(fused_ms),
    )


FUSED_HEADER = (
    "| family | precision | K | unfused ops | fused ops | ops ratio | unfused ms | fused ms "
    "| ms ratio |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def fused_row(r: FusedRow) -> str:
    return (
        f"| {r.family} | {r.precision} | {r.slots} | {r.unfused_ops} | {r.fused_ops} "
        f"| {r.fused_ops / r.unfused_ops:.3f} | {r.unfused_ms:.2f} | {r.fused_ms:.2f} "
        f"| {r.fused_ms / r.unfused_ms:.2f}x |"
    )


HEADER = (
    "| family | precision | param tensors | fwd+bwd ops | opt+guard ops | fused-loop ops "
    "| trainer ms/step | bare ms/step | ratio |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def table_row(r: Row) -> str:
    return (
        f"| {r.family} | {r.precision} | {r.tensors} | {r.fwd_bwd} | {r.opt_guard} | {r.fused} "
        f"| {r.trainer_ms:.2f} | {r.bare_ms:.2f} | {r.trainer_ms / r.bare_ms:.2f}x |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="default: every family")
    parser.add_argument("--smoke", action="store_true", help="one tiny family, few steps")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="timed blocks per loop")
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=PRECISIONS,
        default=list(PRECISIONS),
        metavar="PRECISION",
        help=f"default: all of {', '.join(PRECISIONS)}",
    )
    parser.add_argument(
        "--slots",
        nargs="+",
        type=int,
        metavar="K",
        help="fused slots: a trial-step of K folds fused vs unfused, per K",
    )
    parser.add_argument(
        "--size", choices=("tiny", "default"), default="tiny", help="--slots model sizes"
    )
    parser.add_argument(
        "--recurrent",
        choices=("device", "gpu"),
        default="device",
        help="--slots: the fused LSTM/GRU form this device runs (a CPU: a loop over "
        "bars), or the one a GPU runs (one block-diagonal layer) to count its ops here",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.slots:
        fused_main(args)
        return
    precisions: tuple[str, ...]
    if args.smoke:
        families, precisions, steps, repeats = ["kan", "dqn"], ("f32", "bf16"), 2, 1
    else:
        families = args.families or list(family_names())
        precisions, steps, repeats = tuple(args.precisions), args.steps, args.repeats
    print(HEADER, flush=True)
    rows = []
    for family in families:
        for precision in precisions:
            rows.append(measure(family, precision, steps, repeats))
            print(table_row(rows[-1]), flush=True)  # a row as soon as it is measured
    worst = max(rows, key=lambda r: r.opt_guard)
    print(f"\nmost optimizer+guard ops: {worst.opt_guard} ({worst.family}, {worst.precision})")


def fused_main(args: argparse.Namespace) -> None:
    forecast = [f for f in family_names() if get_family(f).fuses]
    if args.smoke:
        families, precisions, steps, repeats = ["kan"], ("f32",), 2, 1
    else:
        families = args.families or forecast
        precisions, steps, repeats = tuple(args.precisions), args.steps, args.repeats
    if args.recurrent == "gpu":  # the device fact that picks the fused recurrent form
        models.ops.BLOCK_DIAGONAL_MAX_UNITS["cpu"] = models.ops.BLOCK_DIAGONAL_MAX_UNITS["cuda"]
    print(FUSED_HEADER, flush=True)
    for family in families:
        for precision in precisions:
            for k in args.slots:
                row = measure_fused(family, precision, k, steps, repeats, args.size)
                print(fused_row(row), flush=True)


if __name__ == "__main__":
    main()
