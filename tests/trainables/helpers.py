"""Tiny trial configurations shared by the trainer tests (fast on a 2-core CPU), and a
way to make fused slots diverge."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.base import Batch
from trainables.config import DataConfig, TrainConfig
from trainables.contract import fold_weights as fold_weights  # the tests' name for it
from trainables.stacked import StackedModules
from trainables.trainer import Trainer

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


def group_config(family: str = "kan", policy: str = "f32", **overrides: Any) -> TrainConfig:
    """A two-fold trial of ``family``'s tiny size (``tests.models.test_contract.TINY``),
    six steps an epoch for two epochs: the trial the group-trial and PBT tests group."""
    from tests.models.test_contract import TINY

    values: dict[str, Any] = {
        "epochs": 2,
        "n_folds": 2,
        "max_steps_per_epoch": 6,
        "model_config": {**TINY[family]},
        "data": DataConfig(n_bars=800, n_assets=2),
    }
    values.update(overrides)
    return tiny_config(family, policy, **values)


def trial_weights(trainer: Trainer) -> torch.Tensor:
    """Every fold's parameters of ``trainer``, flattened into one f32 vector."""
    return torch.cat(
        [p.detach().float().flatten() for run in trainer.folds for p in run.model.parameters()]
    )


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |a|`` (L2)."""
    return float((a - b).norm() / a.norm())


def poison_slots(monkeypatch: pytest.MonkeyPatch, k: int, rows: slice, steps: range) -> None:
    """NaN losses for fused rows ``rows`` of a stack of ``k`` slots at calls ``steps``."""
    original = StackedModules.loss
    calls = []

    def poisoned(self: StackedModules, batch: Batch, slots: Any = None) -> torch.Tensor:
        value = original(self, batch, slots)
        if self.k == k:
            calls.append(1)
            if len(calls) in steps:
                mask = torch.ones_like(value)
                mask[rows] = float("nan")
                return value * mask
        return value

    monkeypatch.setattr(StackedModules, "loss", poisoned)
