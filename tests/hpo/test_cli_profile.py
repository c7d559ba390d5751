"""`hpo profile`: one trial's memory breakdown and GPU fraction; `--all` over families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import models
from cluster.packing import gpu_fraction, trials_per_gpu
from hpo.cli import app

runner = CliRunner()
TINY = ["--set", "n_folds=1", "--set", "lookback=16", "--set", "data.n_bars=600",
        "--set", "data.n_assets=2", "--set", "d_model=8", "--set", "n_heads=1"]  # fmt: skip


@pytest.fixture(autouse=True)
def _table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPO_VRAM_CACHE", str(tmp_path / "vram.json"))
    monkeypatch.setenv("HPO_GPU_TOTAL_GB", "80")


def test_profile_one_trial_as_json_then_from_the_table(tmp_path: Path) -> None:
    args = ["profile", "--family", "tft", "--precision", "bf16", "--batch-size", "16", "--estimate"]
    result = runner.invoke(app, [*args, *TINY, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    profile, packing = payload["profile"], payload["packing"]
    assert (profile["family"], profile["precision"], profile["batch_size"]) == ("tft", "bf16", 16)
    assert profile["method"] == "estimated" and profile["activations_bytes"] > 0
    assert profile["total_bytes"] == sum(
        profile[f"{part}_bytes"]
        for part in (
            "params",
            "grads",
            "optimizer",
            "data",
            "activations",
            "temporaries",
            "allocator",
            "workspace",
            "context",
        )
    )
    # The share cluster.packing gives this peak at the default headroom on HPO_GPU_TOTAL_GB.
    share = gpu_fraction(profile["peak_bytes"], profile["context_bytes"], 80 * 2**30, 0.15)
    assert (packing["fraction"], packing["headroom"]) == (share, 0.15)
    assert packing["trials_per_gpu"] == trials_per_gpu(share) > 1
    assert json.loads((tmp_path / "vram.json").read_text())["entries"]

    text = runner.invoke(app, [*args, *TINY])
    assert text.exit_code == 0, text.output
    assert f"GPU fraction {share:g}" in text.output
    assert f"{trials_per_gpu(share)} trials per GPU" in text.output


def test_profile_all_skips_families_that_do_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "FAMILY_MODULES", {"tft": "models.tft", "ghost": "models.ghost"})
    result = runner.invoke(app, ["profile", "--all", "--estimate", *TINY, "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    (row,) = payload["rows"]
    assert row["family"] == "tft" and 0.3 < row["bf16_over_f32_peak"] < 1.0
    assert row["f32"]["profile"]["precision"] == "f32"
    assert [s.split(":")[0] for s in payload["skipped"]] == ["ghost"]
    assert "cannot import" in payload["skipped"][0]


def test_profile_needs_a_family_or_all() -> None:
    result = runner.invoke(app, ["profile"])
    assert result.exit_code != 0
