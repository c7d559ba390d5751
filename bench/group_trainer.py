"""Trials per minute: K trials trained as one group trial against the same K trials one
after another, whole epochs (training, every trial's validation and test, metrics), through the
trainer's own code.

    .venv/bin/python bench/group_trainer.py                    # liquid, kan, tggn; K = 4, 8
    .venv/bin/python bench/group_trainer.py --families liquid --trials 2 4 8 --epochs 2
    .venv/bin/python bench/group_trainer.py --device cuda      # on a GPU (unmeasured yet)

The trials are seeds 0..K-1 of one configuration (the families' tiny sizes, 2 folds,
``--steps`` minibatches per fold and epoch, f32), as a compare sweep's seeds are. Alone:
each trial a :class:`~trainables.trainer.Trainer` with its folds fused as ``--fuse``
(default ``auto``, what a sweep's trial does today) decides; on a CPU ``auto`` leaves the
families whose fused step measured slower unfused, grouped too ("fused rows" 0). Grouped: one
:class:`~trainables.group.TrainerGroup`. Both sides are built and timed side by side in
one run, alternating, best of ``--repeats``; the ratio is trials per minute grouped /
alone. Validation is per trial on both sides (not fused), so it bounds the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from models import get_family
from trainables.config import DataConfig, TrainConfig
from trainables.group import TrainerGroup
from trainables.trainer import Trainer


def trial_configs(family: str, k: int, args: argparse.Namespace) -> list[TrainConfig]:
    base = TrainConfig(
        family=family,
        precision="f32",
        epochs=args.epochs,
        n_folds=2,
        lookback=16,
        batch_size=32,
        max_steps_per_epoch=args.steps,
        data=DataConfig(n_bars=1200, n_assets=2),
        model_config=dict(get_family(family).tiny),
        device=args.device,
        fuse=args.fuse,
    )
    return [base.replace(seed=seed) for seed in range(k)]


def alone_s(configs: list[TrainConfig]) -> float:
    started = time.perf_counter()
    for config in configs:
        Trainer(config).fit()
    return time.perf_counter() - started


def grouped_s(configs: list[TrainConfig]) -> tuple[float, int]:
    started = time.perf_counter()
    group = TrainerGroup(configs)
    group.fit()
    fused = group.fusion.fused.k if group.fusion.fused is not None else 0
    return time.perf_counter() - started, fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["liquid", "kan", "tggn"])
    parser.add_argument("--trials", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="minibatches per fold and epoch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--fuse", default="auto", choices=["auto", "on"], help="trainer.fuse on both sides"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{args.epochs} epochs, 2 folds, {args.steps} steps per fold and epoch, f32, "
        f"{args.device}, 1 thread; best of {args.repeats}"
    )
    print("| family | K | fused rows | alone s | grouped s | trials/min alone | grouped | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for family in args.families:
        for k in args.trials:
            configs = trial_configs(family, k, args)
            alone, grouped, fused = [], [], 0
            for _ in range(args.repeats):  # alternating: drift hits both sides alike
                alone.append(alone_s(configs))
                seconds, fused = grouped_s(configs)
                grouped.append(seconds)
            a, g = min(alone), min(grouped)
            print(
                f"| {family} | {k} | {fused} | {a:.1f} | {g:.1f} | {60 * k / a:.1f} | "
                f"{60 * k / g:.1f} | {a / g:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
