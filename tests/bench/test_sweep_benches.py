"""bench/sweep_fixed_cost.py and bench/sweep_scale.py in their smallest modes: each runs
real `hpo sweep`s and prints its table (the numbers themselves are never asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_fixed_cost_prints_the_sweep_beside_ray_and_where_its_time_goes() -> None:
    out = _run("sweep_fixed_cost.py", "--rounds", "1")
    ray = float(re.search(r"Ray start \+ stop\s+([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    sweep, ratio = re.search(r"one-trial hpo sweep\s+([\d.]+) s\s+\(([\d.]+)x Ray\)", out).groups()  # type: ignore[union-attr]
    assert ray > 0 and float(sweep) > 0
    assert float(ratio) == pytest.approx(float(sweep) / ray, abs=0.02)
    for step in ("python start + hpo.cli", "Ray started", "Tune ran the trial", "tables printed"):
        assert re.search(rf"^\s+{re.escape(step)}\s+-?[\d.]+ s$", out, re.M), step


def test_scale_prints_trials_per_second_per_fifth_and_the_drivers_peak() -> None:
    out = _run("sweep_scale.py", "--smoke")
    row = re.search(
        r"^\s*(\d+) trials in .* trials/s per fifth((?:\s+[\d.]+){5}) \| .* driver peak\s+(\d+) MiB",
        out,
        re.M,
    )
    assert row is not None, out
    assert int(row.group(1)) == 12
    assert all(float(rate) > 0 for rate in row.group(2).split())
    assert int(row.group(3)) > 100  # a driver with torch, Ray and MLflow imported
