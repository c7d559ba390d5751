"""What a trial reports: ``val_sharpe`` is the Sharpe of the joined out-of-sample
validation returns (the quantity selection, ranking and the DSR share), the return series
behind it travels with the checkpoint, a non-finite position is a divergence, and
``peak_mem_mb`` is the trial's own."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from models.base import Batch
from tests.trainables.helpers import tiny_config
from trainables.backtest import backtest
from trainables.checkpoint import (
    RETURNS_FILE,
    CheckpointError,
    load_checkpoint,
    read_returns,
    save_checkpoint,
)
from trainables.config import DataConfig
from trainables.epoch_metrics import validation_metrics
from trainables.fold_run import TrialDiverged
from trainables.memory import TrialMemory
from trainables.predict import predict
from trainables.trainer import Trainer

PPY = 252.0


def _fixed_folds():
    """Two validation folds on fixed data whose fold-mean and joined Sharpe differ."""
    rng = np.random.default_rng(12)
    quiet = 0.001 + 0.002 * rng.standard_normal(40)  # a small steady edge
    loud = -0.004 + 0.03 * rng.standard_normal(60)  # a volatile losing fold
    results = [backtest(np.ones(r.size), r, cost=0.0, periods_per_year=PPY) for r in (quiet, loud)]
    return results, np.concatenate([quiet, loud])


def test_val_sharpe_is_the_sharpe_of_the_joined_validation_returns() -> None:
    results, joined = _fixed_folds()
    # positions of 1 from bar 0 on: the first bar earns nothing (w_{-1} = 0)
    np.testing.assert_array_equal(results[0].returns[1:], joined[1:40])
    returns = np.concatenate([r.returns for r in results])
    expected = returns.mean() / returns.std(ddof=1) * math.sqrt(PPY)

    metrics = validation_metrics(results, PPY)
    assert metrics["val_sharpe"] == pytest.approx(expected, rel=1e-12)
    assert metrics["val_sharpe_fold0"] == results[0].sharpe
    assert metrics["val_sharpe_fold1"] == results[1].sharpe
    fold_mean = (results[0].sharpe + results[1].sharpe) / 2
    assert metrics["val_sharpe_fold_mean"] == pytest.approx(fold_mean, rel=1e-12)
    assert abs(metrics["val_sharpe"] - fold_mean) > 1.0  # the two quantities really differ here
    # The per-period moments the DSR uses describe the same joined series.
    per_period = returns.mean() / returns.std(ddof=1)
    assert metrics["val_sharpe_per_period"] == pytest.approx(per_period, rel=1e-12)
    assert metrics["val_sharpe"] == pytest.approx(per_period * math.sqrt(PPY), rel=1e-12)
    assert metrics["val_n_obs"] == returns.size
    # Skew and raw kurtosis as scipy defines them (biased), computed without scipy.
    assert metrics["val_skew"] == pytest.approx(stats.skew(returns), rel=1e-12)
    assert metrics["val_kurtosis"] == pytest.approx(
        stats.kurtosis(returns, fisher=False), rel=1e-12
    )


def _two_fold_trainer() -> Trainer:
    return Trainer(tiny_config(epochs=1, n_folds=2, data=DataConfig(n_bars=900, n_assets=2)))


def test_trainer_reports_the_joined_sharpe_and_the_fold_values() -> None:
    trainer = _two_fold_trainer()
    metrics = trainer.fit()[0]
    ppy = trainer.config.periods_per_year
    per_fold = []
    for run in trainer.folds:
        positions = trainer.positions(run, run.data.val).double().numpy()
        bars = trainer.market.features.bar_returns[run.data.val[0] : run.data.val[1]]
        per_fold.append(backtest(positions, bars, cost=trainer.config.cost, periods_per_year=ppy))
    joined = np.concatenate([r.returns for r in per_fold])
    assert metrics["val_sharpe"] == pytest.approx(
        joined.mean() / joined.std(ddof=1) * math.sqrt(ppy), rel=1e-12
    )
    for k, result in enumerate(per_fold):
        assert metrics[f"val_sharpe_fold{k}"] == result.sharpe
    assert metrics["val_sharpe_fold_mean"] == pytest.approx(
        np.mean([r.sharpe for r in per_fold]), rel=1e-12
    )


def test_saved_returns_round_trip_and_reproduce_val_sharpe(tmp_path: Path) -> None:
    trainer = _two_fold_trainer()
    metrics = trainer.fit()[0]
    trainer.save(tmp_path / "ckpt")
    assert "returns.csv" in load_checkpoint(tmp_path / "ckpt").meta["checksums"]

    series = read_returns(tmp_path / "ckpt")
    timestamps = trainer.market.features.timestamps
    for k, run in enumerate(trainer.folds):
        rows = (series.split == "val") & (series.fold == k)
        start, stop = run.data.val
        assert rows.sum() == stop - start
        np.testing.assert_array_equal(series.timestamp[rows], timestamps[start:stop])
    test_rows = series.split == "test"
    start, stop = trainer.folds[-1].data.test
    assert set(series.fold[test_rows]) == {len(trainer.folds) - 1}
    np.testing.assert_array_equal(series.timestamp[test_rows], timestamps[start:stop])

    val = series.returns[series.split == "val"]  # fold order = time order
    sharpe = val.mean() / val.std(ddof=1) * math.sqrt(trainer.config.periods_per_year)
    assert sharpe == pytest.approx(metrics["val_sharpe"], rel=1e-12)
    test = series.returns[test_rows]
    test_sharpe = test.mean() / test.std(ddof=1) * math.sqrt(trainer.config.periods_per_year)
    assert test_sharpe == pytest.approx(metrics["test_sharpe"], rel=1e-12)


def test_a_corrupt_returns_file_is_named(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(epochs=1))
    trainer.fit()
    trainer.save(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / RETURNS_FILE
    path.write_text(path.read_text().replace("val", "test", 1))
    with pytest.raises(CheckpointError, match=r"returns\.csv: checksum mismatch"):
        read_returns(tmp_path / "ckpt")


def _nan_positions(trainer: Trainer, fold: int) -> None:
    run = trainer.folds[fold]
    original = run.model.positions  # type: ignore[attr-defined]

    def positions(batch: Batch) -> torch.Tensor:
        out = original(batch)
        return torch.full_like(out, float("nan"))

    run.model.positions = positions  # type: ignore[method-assign]


def test_nan_positions_make_the_trial_diverged_not_flat() -> None:
    trainer = _two_fold_trainer()
    _nan_positions(trainer, fold=1)
    with pytest.raises(TrialDiverged, match=r"non-finite positions .*fold 1 .*val"):
        trainer.train_epoch()


def test_predict_refuses_nan_positions(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(epochs=1))
    trainer.fit()
    trainer.save(tmp_path / "good")
    ckpt = load_checkpoint(tmp_path / "good")
    weights = {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
        for k, v in ckpt.weights.items()
    }
    meta = {k: v for k, v in ckpt.meta.items() if k not in ("checksums", "schema_version")}
    save_checkpoint(tmp_path / "nan", weights, ckpt.optim, ckpt.state, meta)
    with pytest.raises(ValueError, match=r"non-finite position"):
        predict(tmp_path / "nan", "synthetic", device=torch.device("cpu"), precision="f32")


def test_peak_memory_is_per_trial_not_per_process() -> None:
    # One process (a reused Ray actor): a large trial, then a small one.
    large = Trainer(
        tiny_config(epochs=1, batch_size=256, model_config={"d_model": 128, "n_heads": 2})
    )
    large_peak = large.fit()[0]["peak_mem_mb"]
    del large
    small = Trainer(tiny_config(epochs=1))
    small_peak = small.fit()[0]["peak_mem_mb"]
    assert 0 < small_peak < 0.5 * large_peak, (small_peak, large_peak)


def test_cuda_peak_is_reset_at_trial_start_and_counted_from_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Device facts of a GPU whose allocator still holds 100 MiB of an earlier trial and
    # peaked at 900 MiB during it; this trial then peaks at 300 MiB.
    mib = 2**20
    allocator = {"allocated": 100 * mib, "peak": 900 * mib}
    resets: list[object] = []

    def reset(device: object = None) -> None:
        resets.append(device)
        allocator["peak"] = allocator["allocated"]

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocator["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocator["peak"])
    device = torch.device("cuda", 0)
    memory = TrialMemory(device)
    assert resets == [device]
    allocator["peak"] = 300 * mib
    assert memory.peak_mb() == pytest.approx(200.0)  # this trial's own, not 900 or 300
