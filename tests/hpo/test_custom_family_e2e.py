"""A desk's own family, in a module outside the repository (not on the project's import
path), swept beside a built-in one in compare mode through the CLI, as a user runs it:
then compared, ensembled and served; its checkpoint names the missing module where the
family cannot be imported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from hpo.record import SweepRecord
from hpo.tracking import TAG_FAMILY
from tests.hpo.sweep_helpers import trial_runs

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
HPO = Path(sys.executable).with_name("hpo")  # the console script, as a user runs it
REFERENCE = "desk_gru:FAMILY"


def test_a_family_from_outside_is_swept_compared_ensembled_and_served(tmp_path: Path) -> None:
    desk = tmp_path / "desk"  # the desk's own folder, nowhere near the project
    desk.mkdir()
    shutil.copy(ROOT / "examples" / "custom_family" / "desk_gru.py", desk)
    work = tmp_path / "work"
    work.mkdir()
    payload = {
        "name": "desk",
        "families": [REFERENCE, "kan"],
        "precisions": ["f32", "bf16"],
        "compare": True,
        "samples": 1,
        "search": "random",
        "max_epochs": 1,
        "seeds": [0],
        "max_concurrent": 2,
        "storage": str(tmp_path / "results"),
        "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "data": {"source": "synthetic", "n_assets": 2, "n_bars": 600},
        "trainer": {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 6},
        "walk_forward": {"n_folds": 2},
        "resources": {"cpu": 1, "gpu": 0},
        "search_space": {REFERENCE: {"hidden": 8}, "kan": {"width": 4}},
    }
    spec_path = work / "desk.yaml"
    spec_path.write_text(yaml.safe_dump(payload))
    env = {**os.environ, "PYTHONPATH": str(desk)}

    def hpo(*args: str, environ: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(HPO), *args], cwd=work, env=environ, capture_output=True, text=True, timeout=900
        )

    swept = hpo("sweep", str(spec_path))
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    runs = trial_runs(payload["tracking_uri"], "desk")
    assert sorted(r.data.tags[TAG_FAMILY] for r in runs) == sorted([REFERENCE] * 2 + ["kan"] * 2)
    desk_runs = [r for r in runs if r.data.tags[TAG_FAMILY] == REFERENCE]
    assert all(r.data.metrics["fused_folds"] == 2 for r in desk_runs)  # its folds fused

    compared = hpo("compare", "--experiment", "desk", "--tracking-uri", payload["tracking_uri"])
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]
    assert REFERENCE in compared.stdout and "👪" not in compared.stdout
    record = SweepRecord.read(tmp_path / "results" / "desk", check_data=False)  # a reader
    parent = MlflowClient(payload["tracking_uri"]).get_run(record.parent_run_id)
    assert f"cmp.{REFERENCE}.verdict" in parent.data.tags

    ensembled = hpo("ensemble", str(record.sweep_dir), "--family", REFERENCE, "--out", "ens")
    assert ensembled.returncode == 0, ensembled.stdout[-3000:] + ensembled.stderr[-3000:]
    served = hpo("predict", "--checkpoint", "ens", "--data", "synthetic", "--out", "pos.csv")
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
    assert (work / "pos.csv").read_text().startswith("timestamp,asset,position,confidence")

    without = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    lost = hpo(
        "predict", "--checkpoint", "ens", "--data", "synthetic", "--out", "x.csv", environ=without
    )
    assert lost.returncode != 0
    assert "cannot import module 'desk_gru'" in lost.stdout + lost.stderr
