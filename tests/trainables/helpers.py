"""Tiny trial configurations shared by the trainer tests (fast on a 2-core CPU)."""

from __future__ import annotations

from typing import Any

from trainables.config import DataConfig, TrainConfig
from trainables.contract import fold_weights as fold_weights  # the tests' name for it

TINY_TFT = {"d_model": 8, "n_heads": 1, "dropout": 0.0}


def tiny_config(family: str = "tft", precision: str = "f32", **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "family": family,
        "precision": precision,
        "epochs": 2,
        "n_folds": 1,
        "lookback": 16,
        "batch_size": 32,
        "max_steps_per_epoch": 8,
        "data": DataConfig(n_bars=600, n_assets=2),
        "model_config": TINY_TFT if family == "tft" else {},
        "device": "cpu",
    }
    values.update(overrides)
    return TrainConfig(**values)
