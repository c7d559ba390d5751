"""Tiny trial configurations shared by the trainer tests (fast on a 2-core CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainables.config import DataConfig, TrainConfig

if TYPE_CHECKING:
    from trainables.trainer import Trainer

TINY_TFT = {"d_model": 8, "n_heads": 1, "dropout": 0.0}


def tiny_config(model: str = "tft", precision: str = "f32", **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "family": model,
        "precision": precision,
        "epochs": 2,
        "n_folds": 1,
        "lookback": 16,
        "batch_size": 32,
        "max_steps_per_epoch": 8,
        "data": DataConfig(n_bars=600, n_assets=2),
        "model_config": TINY_TFT if model == "tft" else {},
        "device": "cpu",
    }
    values.update(overrides)
    return TrainConfig(**values)


def untrained_and_trained_sharpe(
    config: TrainConfig, seeds: tuple[int, ...]
) -> tuple[list[float], list[float]]:
    """Validation Sharpe before and after training, one pair per seed.

    A single untrained model is a coin flip on this data (a random linear read of the
    momentum features can score +-4), so learning is judged against the mean over seeds,
    whose expectation for an untrained model is ~0 by the sign symmetry of random init.
    """
    from trainables.trainer import Trainer

    untrained, trained = [], []
    for seed in seeds:
        trainer = Trainer(config.replace(seed=seed))
        untrained.append(trainer._evaluate(trainer.folds[0], trainer.folds[0].data.val).sharpe)
        trained.append(trainer.fit()[-1]["val_sharpe"])
    return untrained, trained


def fold_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every fold's weights, cloned, keyed ``<fold>.<name>`` (to compare two trainers)."""
    return {
        f"{run.index}.{k}": v.clone()
        for run in trainer.folds
        for k, v in run.model.state_dict().items()
    }
