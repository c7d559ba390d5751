"""A sweep's driver and the commands that read a sweep import no torch: every family's
record reads without it (its network is imported where a trial builds one), so torch's
import (about 2 s of one core here) is off the driver's path (bench/README.md, "A sweep's
fixed cost"). Checked on the real ``hpo`` command in a subprocess: ``-X importtime``
lists every module the driver imports (Ray's workers, which train, are processes of
their own and import torch as before)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hpo.sweep_helpers import ONE_TFT, write_tiny_spec

HPO = [sys.executable, "-X", "importtime", "-m", "hpo.cli"]
ROOT = Path(__file__).resolve().parents[2]  # the child imports tests.hpo.sweep_helpers


def _imported(stderr: str) -> set[str]:
    """The top-level packages an ``-X importtime`` run imported."""
    found = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            found.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return found


def test_every_familys_record_settings_and_space_read_without_torch() -> None:
    code = (
        "import sys, dataclasses, models\n"
        "for family in models.all_families():\n"
        "    config = family.make_config(dict(family.tiny))\n"
        "    dataclasses.asdict(config), dict(family.search_space), family.fuses\n"
        "print(len(models.all_families()), 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["10", "False"]


def test_a_sweep_comparing_nothing_builds_its_searcher_without_scipy_statistics(
    tmp_path: Path,
) -> None:
    """The searcher every sweep builds (its budgets, its stop reasons) reads without
    hpo.compare and hpo.stats: SciPy's statistics are half a second of the driver's start,
    spent only where a sweep compares (tests/hpo/test_budget.py runs those budgets)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from hpo.search.sweep_searcher import SweepSearcher\n"
        "from tests.hpo.sweep_helpers import tiny_spec\n"
        f"searcher = SweepSearcher(tiny_spec(Path({str(tmp_path)!r})))\n"
        "print(len(searcher.streams), 'scipy.stats' in sys.modules, 'hpo.compare' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["4", "False", "False"]


# `hpo sweep` with the sweep itself replaced by one that compared nothing: what the rest
# of the command (the spec, its result printed, its exit) imports.
SWEEP_COMPARING_NOTHING = """
import sys
import hpo.sweep
from hpo.cli import main

hpo.sweep.run_sweep = lambda spec, **kwargs: hpo.sweep.SweepRows([], planned=1, complete=True)
sys.argv = ["hpo", "sweep", sys.argv[1]]
try:
    main()
finally:
    print("scipy.stats" in sys.modules, "hpo.compare" in sys.modules)
"""


def test_a_sweep_comparing_nothing_prints_its_result_without_scipy_statistics(
    tmp_path: Path,
) -> None:
    """The comparison's tables (and with them hpo.compare and SciPy's statistics, half a
    second to a second of one core) are imported only where a sweep has a comparison to
    print."""
    spec = write_tiny_spec(tmp_path, "printed")
    done = subprocess.run(
        [sys.executable, "-c", SWEEP_COMPARING_NOTHING, str(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0/1 trials finished" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "False False"


@pytest.mark.ray
@pytest.mark.slow
def test_a_sweeps_driver_and_its_readers_import_no_torch(tmp_path: Path, mlflow_uri: str) -> None:
    # A compare sweep, so the driver's end (the comparison, its report) is on the path too.
    spec = write_tiny_spec(
        tmp_path,
        "no-torch",
        mlflow_uri,
        **{**ONE_TFT, "precisions": ["f32", "bf16"]},
        compare=True,
        max_epochs=1,
        trainer={"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 3},
        walk_forward={"n_folds": 1},
    )
    sweep = subprocess.run(
        [*HPO, "sweep", str(spec)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    imported = _imported(sweep.stderr)
    assert {"hpo", "ray", "mlflow", "models"} <= imported  # the flag did list the driver's
    assert "torch" not in imported
    sweep_dir = tmp_path / "results" / "no-torch"
    for command in ("status", "best"):
        read = subprocess.run(
            [*HPO, command, str(sweep_dir), "--json"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert read.returncode == 0, read.stderr[-3000:]
        assert "torch" not in _imported(read.stderr), command
        rows = json.loads(read.stdout)
        rows = rows["trials"] if isinstance(rows, dict) else rows
        assert sorted((r["precision"], r["status"], r["epochs"]) for r in rows) == [
            ("bf16", "TERMINATED", 1),
            ("f32", "TERMINATED", 1),
        ]
    # the best trials' checkpoints, found by the torch-free file names, hold what resume reads
    assert all((Path(r["checkpoint"]) / "meta.json").is_file() for r in rows)
    assert "comparison" in sweep.stdout.lower()
