"""Ensembles without Ray: the combination's numbers, an ensemble of one member serving
exactly that member's positions, selection and weights blind to the test period, and the
checkpoint's verification."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from hpo.ensemble import evaluate_ensemble, select_members, write_ensemble
from hpo.trials import TrialRow, TrialStatus
from tests.trainables.helpers import tiny_config
from trainables.checkpoint import CheckpointError, latest_good_checkpoint
from trainables.config import DataConfig
from trainables.data import synthetic_bars
from trainables.ensemble import combine, load_ensemble, predict_ensemble
from trainables.local import train_local
from trainables.predict import predict

CPU = torch.device("cpu")
TINY = {
    "tft": {"d_model": 8, "n_heads": 1, "dropout": 0.0},
    "dqn": {"hidden": 32, "learning_starts": 64},
    "mamba2": {},
}


# --------------------------------------------------------------------------------------
# combine


def test_one_member_is_reproduced_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    p = np.clip(rng.normal(size=(1, 50, 3)), -1, 1)
    c = rng.uniform(size=(1, 50, 3))
    c[0, :5] = 0.0  # zero confidence falls back to the weights, still exact
    pos, conf = combine(p, c, np.array([0.37]), np.array([0.123]))
    assert np.array_equal(pos, p[0]) and np.array_equal(conf, c[0])


def test_two_members_vote_by_relative_confidence_and_report_agreement() -> None:
    p = np.array([[[1.0], [0.5]], [[-0.5], [0.5]]])  # (M=2, N=2, A=1)
    c = np.array([[[0.2], [0.1]], [[0.4], [0.4]]])
    w = np.array([0.75, 0.25])
    typical = np.array([0.1, 0.4])  # member 1 reports 4x larger numbers on average
    pos, conf = combine(p, c, w, typical)
    # bar 0: votes 0.75 * 2 = 1.5 and 0.25 * 1 = 0.25 -> alpha 6/7, 1/7
    assert pos[0, 0] == pytest.approx(6 / 7 * 1.0 + 1 / 7 * -0.5)
    agreement = abs(pos[0, 0]) / (6 / 7 * 1.0 + 1 / 7 * 0.5)
    assert conf[0, 0] == pytest.approx((0.75 * 0.2 + 0.25 * 0.4) * agreement)
    # bar 1: both +0.5 -> position 0.5 and full agreement
    assert pos[1, 0] == pytest.approx(0.5)
    assert conf[1, 0] == pytest.approx(0.75 * 0.1 + 0.25 * 0.4)


def test_opposite_members_cancel_with_zero_confidence() -> None:
    p = np.array([[[1.0]], [[-1.0]]])
    c = np.full((2, 1, 1), 0.5)
    pos, conf = combine(p, c, np.array([0.5, 0.5]))
    assert pos[0, 0] == 0.0 and conf[0, 0] == 0.0


def test_bad_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="weights must be >= 0"):
        combine(np.zeros((2, 3, 1)), np.zeros((2, 3, 1)), np.array([0.0, 0.0]))


# --------------------------------------------------------------------------------------
# members trained in-process on a CSV


def _row(trial_id: str, model: str, checkpoint: Path, val_sharpe: float) -> TrialRow:
    return TrialRow(
        trial_id=trial_id,
        family=model,
        precision="f32",
        seed=0,
        pair_id=trial_id,
        status=TrialStatus("TERMINATED"),
        epochs=2,
        val_sharpe=val_sharpe,
        test_sharpe=None,
        fell_back_to_f32=False,
        diverged=False,
        params={},
        checkpoint=str(checkpoint),
    )


@pytest.fixture(scope="module")
def csv_members(tmp_path_factory: Any) -> tuple[Path, list[TrialRow]]:
    tmp = tmp_path_factory.mktemp("members")
    bars_csv = tmp / "bars.csv"
    synthetic_bars(n_assets=2, n_bars=600, seed=3).to_frame().to_csv(bars_csv, index=False)
    rows = []
    for i, model in enumerate(("tft", "dqn", "mamba2")):
        config = tiny_config(
            model,
            data=DataConfig(source=str(bars_csv)),
            model_config=TINY[model],
            rl_iterations=5,
            seed=i,
        )
        run = train_local(config, tmp / model)
        ckpt, _ = latest_good_checkpoint(tmp / model / "checkpoints")
        assert ckpt is not None
        rows.append(_row(f"t{i}", model, ckpt.path, float(run.final["val_sharpe"])))
    return bars_csv, rows


@pytest.mark.parametrize("model", ["tft", "dqn"])
def test_an_ensemble_of_one_serves_its_members_positions_exactly(
    csv_members: tuple[Path, list[TrialRow]], model: str, tmp_path: Path
) -> None:
    bars_csv, rows = csv_members
    row = next(r for r in rows if r.family == model)
    result = evaluate_ensemble([row], [row], "stacked", device=CPU)
    # the member's validation Sharpe recomputed from its checkpoint is the trial's own
    assert result.metrics["val_sharpe"] == row.val_sharpe
    out = write_ensemble(result, tmp_path / "ens", {})
    served = predict_ensemble(out, bars_csv, device=CPU, precision="f32")
    alone = predict(Path(str(row.checkpoint)), bars_csv, device=CPU, precision="f32")
    assert np.array_equal(served.timestamps, alone.timestamps)
    assert np.array_equal(served.positions, alone.positions)
    assert served.backtest.sharpe == alone.backtest.sharpe
    assert np.all((served.confidence >= 0) & (served.confidence <= 1))
    assert float(served.confidence.std()) > 0  # confidence varies bar by bar


def _alter_test_period(bars_csv: Path, out: Path, seed: int) -> Path:
    frame = pd.read_csv(bars_csv)
    stamps = np.sort(frame["timestamp"].unique())
    test_from = stamps[int(len(stamps) * 0.85)]  # well inside the final 20%
    late = frame["timestamp"] >= test_from
    rng = np.random.default_rng(seed)
    factor = np.exp(np.cumsum(rng.normal(0, 0.03, size=int(late.sum()))))
    for column in ("open", "high", "low", "close"):
        frame.loc[late, column] = frame.loc[late, column] * factor
    frame.to_csv(out, index=False)
    return out


def test_members_and_weights_ignore_the_test_period(
    csv_members: tuple[Path, list[TrialRow]], tmp_path: Path
) -> None:
    bars_csv, rows = csv_members
    original = bars_csv.read_bytes()
    chosen = select_members(rows, top=1)
    first = evaluate_ensemble(chosen, rows, "stacked", device=CPU)
    try:
        _alter_test_period(bars_csv, bars_csv, seed=1)
        again = evaluate_ensemble(select_members(rows, top=1), rows, "stacked", device=CPU)
    finally:
        bars_csv.write_bytes(original)
    assert [r.trial_id for r in again.rows] == [r.trial_id for r in first.rows]
    assert np.array_equal(again.weights, first.weights)
    assert not np.allclose(first.weights, 1 / 3)  # stacked moved off equal weights
    assert again.metrics["val_sharpe"] == first.metrics["val_sharpe"]
    assert again.metrics["test_sharpe"] != first.metrics["test_sharpe"]  # the test did change


def test_weightings_differ_and_sum_to_one(csv_members: tuple[Path, list[TrialRow]]) -> None:
    _, rows = csv_members
    weights = {
        method: evaluate_ensemble(rows, rows, method, device=CPU).weights
        for method in ("equal", "psr", "inverse-variance")
    }
    for w in weights.values():
        assert w.sum() == pytest.approx(1.0) and np.all(w >= 0)
    assert np.allclose(weights["equal"], 1 / 3)
    assert not np.allclose(weights["inverse-variance"], weights["equal"])


def test_a_corrupt_member_file_is_named(
    csv_members: tuple[Path, list[TrialRow]], tmp_path: Path
) -> None:
    _, rows = csv_members
    result = evaluate_ensemble(rows[:1], rows, "equal", device=CPU)
    out = write_ensemble(result, tmp_path / "ens", {})
    assert len(load_ensemble(out).checkpoints) == 1
    weights = next((out / "members").iterdir()) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: checksum mismatch"):
        load_ensemble(out)
