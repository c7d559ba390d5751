"""`hpo train`, `hpo train --resume`, `hpo families` and `hpo predict` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from hpo.cli import app
from trainables.data import synthetic_bars

runner = CliRunner()
TINY = [
    "--set",
    "d_model=8",
    "--set",
    "n_heads=1",
    "--set",
    "max_steps_per_epoch=6",
    "--set",
    "lookback=16",
    "--set",
    "n_folds=1",
    "--set",
    "data.n_bars=600",
    "--set",
    "data.n_assets=2",
]


def _train(*args: str) -> str:
    result = runner.invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_train_then_resume_in_f32(tmp_path: Path) -> None:
    out = tmp_path / "run"
    output = _train(
        "--family", "tft", "--precision", "bf16", "--epochs", "2", "--out", str(out), *TINY
    )
    assert "final metrics (bf16)" in output and "val_sharpe" in output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["precision"] == "bf16"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_0001", "epoch_0002"]

    output = _train("--resume", str(out), "--precision", "f32", "--epochs", "3")
    assert "resuming at epoch 2" in output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["precision"] == "f32"
    assert [m["epoch"] for m in metrics["history"]] == [1, 2, 3]
    meta = json.loads((out / "checkpoints" / "epoch_0003" / "meta.json").read_text())
    assert meta["weights_dtype"] == "float32" and meta["requested_precision"] == "f32"


def test_resume_a_single_checkpoint_dir_needs_out(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train("--family", "tft", "--epochs", "1", "--out", str(out), *TINY)
    single = out / "checkpoints" / "epoch_0001"
    result = runner.invoke(app, ["train", "--resume", str(single), "--epochs", "2"])
    assert result.exit_code != 0
    _train("--resume", str(single), "--epochs", "2", "--out", str(tmp_path / "longer"))
    assert (tmp_path / "longer" / "checkpoints" / "epoch_0002" / "meta.json").exists()


def test_bad_input_names_the_field(tmp_path: Path) -> None:
    cases = {
        ("--family", "gpt5"): "unknown family 'gpt5'",
        ("--family", "tft", "--precision", "fp8"): "precision must be one of",
        ("--family", "tft", "--set", "hiddden=3"): "unknown setting(s) ['hiddden']",
        ("--family", "tft", "--data", str(tmp_path / "nope.csv")): "nope.csv' does not exist",
    }
    for args, message in cases.items():
        result = runner.invoke(app, ["train", *args, "--out", str(tmp_path / "x")])
        assert result.exit_code != 0
        assert message in str(result.exception) or message in result.output, (args, result.output)


def test_families_lists_search_spaces() -> None:
    result = runner.invoke(app, ["families", "--json"])
    assert result.exit_code == 0, result.output
    listed = {m["name"]: m for m in json.loads(result.output)}
    assert {"dqn", "tft"} <= set(listed)
    assert listed["tft"]["search_space"]["dropout"] == "float in [0, 0.3]"
    assert listed["dqn"]["kind"] == "rl"


def test_predict_writes_positions_for_new_bars(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train("--family", "tft", "--epochs", "1", "--out", str(out), *TINY)
    bars = synthetic_bars(n_assets=2, n_bars=300, seed=9)
    table = bars.to_frame()
    csv = tmp_path / "new.csv"
    table.to_csv(csv, index=False)
    result = runner.invoke(
        app,
        [
            "predict",
            "--checkpoint",
            str(out),
            "--data",
            str(csv),
            "--out",
            str(tmp_path / "pos.csv"),
            "--precision",
            "f32",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "(ran in f32;" in " ".join(result.output.split())
    positions = pd.read_csv(tmp_path / "pos.csv")
    assert list(positions.columns) == ["timestamp", "asset", "position"]
    assert positions["position"].between(-1, 1).all()
    n_decisions = 300 - (20 + 16 - 1)  # features need 20 bars, windows 16
    assert len(positions) == n_decisions * 2
    summary = json.loads((tmp_path / "pos.backtest.json").read_text())
    assert np.isfinite(summary["sharpe"]) and summary["n_periods"] == n_decisions


def test_resume_honours_device_and_otherwise_keeps_the_runs_own(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _train("--family", "tft", "--epochs", "1", "--device", "cpu", "--out", str(out), *TINY)

    def saved_device(epoch: int) -> str:
        meta = json.loads((out / "checkpoints" / f"epoch_{epoch:04d}" / "meta.json").read_text())
        return str(meta["config"]["device"])

    assert saved_device(1) == "cpu"
    _train("--resume", str(out), "--epochs", "2")  # no --device: the run's own
    assert saved_device(2) == "cpu"
    output = _train("--resume", str(out), "--epochs", "3", "--device", "auto")
    assert saved_device(3) == "auto" and "device cpu" in output  # auto is the CPU here
