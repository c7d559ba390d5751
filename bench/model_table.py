"""The model zoo table of models/README.md: family, paper, parameters at the default size,
CPU f32 optimizer steps/s at the default trial batch, and what stays f32 under bf16.

    .venv/bin/python bench/model_table.py                 # all ten families, markdown to stdout
    .venv/bin/python bench/model_table.py --smoke         # two families, few steps

Steps/s is measured side by side in one run on one CPU thread: the trainer's own training
loop (guarded step, default TrainConfig: batch 64, lookback 32, 4 synthetic assets), after
one warm-up epoch; rl families count learner gradient steps.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from models import family_names, get_family
from models.base import count_parameters
from trainables.config import DataConfig, TrainConfig
from trainables.trainer import Trainer


def measure(name: str, steps: int) -> tuple[int, float]:
    config = TrainConfig(
        family=name,
        precision="f32",
        epochs=2,
        n_folds=1,
        device="cpu",
        max_steps_per_epoch=steps,
        rl_iterations=steps,
        data=DataConfig(n_bars=1500, n_assets=4),
    )
    trainer = Trainer(config)
    params = count_parameters(trainer.folds[0].model)
    run = trainer.folds[0]
    trainer.train_fold(run)  # warm-up (allocations, lazily built buffers)
    before = trainer.global_step
    start = time.perf_counter()
    trainer.train_fold(run)
    elapsed = time.perf_counter() - start
    return params, (trainer.global_step - before) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = family_names()[:2] if args.smoke else family_names()
    steps = 4 if args.smoke else args.steps
    print(
        "| family | kind | paper | parameters (default) | CPU f32 steps/s | kept in f32 under bf16 |"
    )
    print("| --- | --- | --- | ---: | ---: | --- |")
    for name in names:
        family = get_family(name)
        params, rate = measure(name, steps)
        print(
            f"| {name} | {family.kind} | {family.paper} | {params:,} | {rate:.1f} | {family.keeps_f32} |"
        )


if __name__ == "__main__":
    main()
