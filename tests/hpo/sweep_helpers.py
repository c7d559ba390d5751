"""Tiny sweep specs for end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpo.spec import SweepSpec, parse_spec


def tiny_spec(tmp_path: Path, tracking_uri: str | None = None, **overrides: Any) -> SweepSpec:
    payload: dict[str, Any] = {
        "name": "e2e",
        "models": ["tft", "dqn"],
        "precisions": ["f32", "bf16"],
        "samples": 1,
        "search": "random",
        "scheduler": "fifo",
        "max_epochs": 2,
        "max_concurrent": 2,
        "storage": str(tmp_path / "results"),
        "tracking_uri": tracking_uri or f"sqlite:///{tmp_path / 'mlflow.db'}",
        "data": {"n_assets": 2, "n_bars": 600},
        "walk_forward": {"n_folds": 1},
        "trainer": {
            "lookback": 16,
            "batch_size": 32,
            "max_steps_per_epoch": 6,
            "rl_iterations": 10,
        },
        "search_space": {
            "tft": {"d_model": 8, "n_heads": 1, "lstm_layers": 1},
            "dqn": {"hidden": 32, "learning_starts": 64},
        },
    }
    payload.update(overrides)
    return parse_spec(payload)
