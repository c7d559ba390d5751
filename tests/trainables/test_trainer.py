"""The shared trainer: the non-finite step guard, the bf16 -> f32 fallback, divergence,
determinism, and learning the planted synthetic signal."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from models.base import Batch
from tests.trainables.helpers import tiny_config
from trainables.config import DataConfig
from trainables.fold_run import TrialDiverged
from trainables.precision import BF16, F32
from trainables.trainer import Trainer


def _poison(trainer: Trainer, bad_calls: Callable[[int], bool]) -> None:
    """Make the fold's loss NaN on the calls ``bad_calls`` picks (a planted divergence)."""
    run = trainer.folds[0]
    original = run.model.loss  # type: ignore[attr-defined]
    counter = itertools.count()

    def loss(batch: Batch) -> torch.Tensor:
        value = original(batch)
        return value * float("nan") if bad_calls(next(counter)) else value

    run.model.loss = loss  # type: ignore[method-assign]


def test_planted_nan_steps_are_skipped_and_counted() -> None:
    trainer = Trainer(
        tiny_config(precision="f32", epochs=1, max_steps_per_epoch=8, fallback_after=3)
    )
    _poison(trainer, lambda i: i in (2, 5))  # two isolated bad steps: no fallback, no failure
    metrics = trainer.train_epoch()
    assert metrics["skipped_steps"] == 2
    assert metrics["fell_back_to_f32"] == 0
    assert metrics["step"] == 8


def test_k_consecutive_skips_under_bf16_fall_back_to_f32() -> None:
    k = 4
    trainer = Trainer(
        tiny_config(
            precision="bf16", epochs=2, max_steps_per_epoch=10, fallback_after=k, log_every=5
        )
    )
    _poison(trainer, lambda i: 2 <= i < 2 + k)
    before = trainer.folds[0].optimizer
    first = trainer.train_epoch()
    assert trainer.fell_back_to_f32 and trainer.policy.name == "f32"
    assert trainer.fallback_epoch == 1
    assert first["fell_back_to_f32"] == 1 and first["skipped_steps"] == k
    run = trainer.folds[0]
    assert all(p.dtype == F32 for p in run.model.parameters())
    assert run.data.features.dtype == F32
    assert run.optimizer is before  # moments kept, not re-initialised
    assert all("compensation" not in s for s in run.optimizer.state.values())
    second = trainer.train_epoch()  # keeps training in f32 with finite metrics
    assert second["skipped_steps"] == k
    # ... with f32 gradients too: the bf16 .grad buffers of before the fallback are gone.
    assert {p.grad.dtype for p in run.model.parameters() if p.grad is not None} == {F32}
    assert torch.isfinite(torch.tensor(second["train_loss"]))


def test_divergence_that_persists_in_f32_fails_with_a_reason() -> None:
    trainer = Trainer(
        tiny_config(
            precision="bf16", epochs=1, max_steps_per_epoch=12, fallback_after=3, log_every=3
        )
    )
    _poison(trainer, lambda i: i >= 1)  # NaN forever: falls back, then still diverges
    with pytest.raises(
        TrialDiverged, match=r"tft diverged under f32: \d+ consecutive non-finite steps"
    ):
        trainer.train_epoch()
    assert trainer.fell_back_to_f32


def test_same_seed_same_numbers_and_other_seed_differs() -> None:
    a = Trainer(tiny_config(epochs=1, seed=3)).fit()
    b = Trainer(tiny_config(epochs=1, seed=3)).fit()
    c = Trainer(tiny_config(epochs=1, seed=4)).fit()
    keys = ("train_loss", "val_sharpe", "test_sharpe")
    assert [a[0][k] for k in keys] == [b[0][k] for k in keys]
    assert a[0]["train_loss"] != c[0]["train_loss"]


def test_bf16_trains_in_bf16_and_reports_every_metric() -> None:
    trainer = Trainer(tiny_config(precision="bf16", epochs=1))
    metrics = trainer.fit()[0]
    run = trainer.folds[0]
    assert run.data.features.dtype == BF16
    assert run.model.quantile_levels.dtype == F32  # type: ignore[union-attr]  # keep_f32
    assert {p.dtype for p in run.model.parameters()} == {BF16}
    for key in (
        "train_loss",
        "val_sharpe",
        "val_sortino",
        "val_max_drawdown",
        "val_turnover",
        "val_hit_rate",
        "val_sharpe_per_period",
        "val_skew",
        "val_kurtosis",
        "val_n_obs",
        "test_sharpe",
        "skipped_steps",
        "steps_per_s",
        "peak_mem_mb",
        "fell_back_to_f32",
    ):
        assert key in metrics, key
    assert metrics["steps_per_s"] > 0 and metrics["peak_mem_mb"] > 0


def test_walk_forward_folds_each_train_their_own_model() -> None:
    trainer = Trainer(tiny_config(epochs=1, n_folds=2, data=DataConfig(n_bars=900, n_assets=2)))
    metrics = trainer.fit()[0]
    first, second = trainer.folds
    assert first.data.train[1] < first.data.val[0] < second.data.val[0] < first.data.test[0]
    assert first.data.val[0] - first.data.train[1] >= trainer.config.purge + trainer.config.embargo
    w0 = next(first.model.parameters())
    w1 = next(second.model.parameters())
    assert not torch.equal(w0, w1)
    assert metrics["val_sharpe_fold_mean"] == pytest.approx(
        (metrics["val_sharpe_fold0"] + metrics["val_sharpe_fold1"]) / 2
    )
