"""``hpo sweep`` (hpo.cli._sweeps): what it imports before Ray starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.cli import _sweeps
from tests.hpo.sweep_helpers import ONE_TFT, write_tiny_spec

# `hpo sweep SPEC` with run_sweep replaced by a stand-in that records which modules the
# command had imported when it handed over (where Ray would start), then stops it.
SCRIPT = """
import json, sys
import hpo.sweep
from hpo.record import SweepError

out = sys.argv[1]

def run_sweep(spec, *, render_report, **kwargs):
    modules = ("dashboards.report", "hpo.compare", "scipy.stats")
    with open(out, "w") as f:
        json.dump({m: m in sys.modules for m in modules}, f)
    raise SweepError("stopped where Ray would start")

hpo.sweep.run_sweep = run_sweep
from hpo.cli import run
sys.argv = ["hpo", "sweep", sys.argv[2]]
run()
"""


def test_a_sweep_that_compares_nothing_starts_ray_without_the_report(tmp_path: Path) -> None:
    """The comparison report's statistics (scipy.stats, hpo.compare: about half a second
    of CPU) are imported when a compare sweep renders it, not before every sweep."""
    spec = write_tiny_spec(tmp_path, "plain", **ONE_TFT)
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), str(spec)], capture_output=True, text=True
    )
    assert "stopped where Ray would start" in done.stdout + done.stderr, done.stderr
    assert json.loads(out.read_text()) == {
        "dashboards.report": False,
        "hpo.compare": False,
        "scipy.stats": False,
    }


def test_the_sweep_renders_its_report_with_dashboards_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dashboards.report

    monkeypatch.setattr(dashboards.report, "render_report", lambda c: f"<html>{c}</html>")
    assert _sweeps._render_report("the comparison") == "<html>the comparison</html>"  # type: ignore[arg-type]
