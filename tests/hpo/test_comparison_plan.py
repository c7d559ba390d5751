"""What a compare sweep can decide, said before it launches (hpo.compare.plan): per family
the fewest configurations for a verdict, the power table, the sequential looks, and a
warning naming `sequential = true` where a fixed design can never answer; `hpo sweep
--plan` prints it from the spec alone (the GPU plan is stubbed here: no Ray)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import hpo.sweep
from hpo.cli import app
from hpo.compare.plan import comparison_plan_text, plan_warnings
from hpo.spec import parse_spec
from hpo.stats import EQUIVALENCE_POWER, SEQUENTIAL_POWER, min_configs_for_verdict
from tests.hpo.sweep_helpers import write_tiny_spec

BASE: dict[str, Any] = {
    "name": "p",
    "families": ["kan", "liquid"],
    "compare": True,
    "search": "random",
}


def test_a_fixed_design_that_cannot_decide_is_warned_about() -> None:
    assert min_configs_for_verdict() == 5
    (warning,) = plan_warnings(parse_spec({**BASE, "samples": 4}))
    assert warning.startswith("warning: samples = 4 can never reach a verdict")
    assert "at least 5 configurations per family" in warning
    assert "sequential = true with max_configs" in warning and "first verdict at 9" in warning
    assert plan_warnings(parse_spec({**BASE, "samples": 5})) == []
    assert plan_warnings(parse_spec({**BASE, "compare": False, "samples": 2})) == []
    text = comparison_plan_text(parse_spec({**BASE, "samples": 4}))
    assert text.startswith(warning)
    assert "kan     fixed, 4 configurations  5 (unreachable)" in text


def test_the_sequential_plan_names_its_looks_and_expected_configurations() -> None:
    spec = parse_spec({**BASE, "samples": 6, "comparison": {"sequential": True, "max_configs": 24}})
    assert plan_warnings(spec) == []
    text = comparison_plan_text(spec)
    assert "sequential, looks at 6, 7, 8, ..., 24" in text  # DEFAULT_LOOK_EVERY: 1
    # 80% power within 24 configurations up to sd/margin 1 (the budget it needs: 11).
    assert SEQUENTIAL_POWER[1.0].budget <= 24 < SEQUENTIAL_POWER[1.5].budget
    expected = SEQUENTIAL_POWER[1.0]
    assert f"{expected.expected_configs:.1f} at sd/margin 1 (budget {expected.budget})" in text
    row = next(line for line in text.splitlines() if line.lstrip().startswith("kan"))
    fewest = re.search(r"looks at 6, 7, 8, \.\.\., 24\s+(\d+)\s", row)
    assert fewest and fewest.group(1) == "9"  # the first look that decides (6, 7, 8, 9, ...)
    fixed = "  ".join(f"{EQUIVALENCE_POWER[r]:>4}" for r in (0.5, 1.0, 1.5, 2.0, 3.0))
    assert " ".join(fixed.split()) in " ".join(text.split())


def test_the_sequential_plan_counts_the_first_deciding_look_on_its_own_grid() -> None:
    # Looks at 4, 6, 8, 10, ...: the rule first applies at 10, not MIN_FIRST_LOOK (9).
    comparison = {"sequential": True, "max_configs": 20, "look_every": 2}
    spec = parse_spec({**BASE, "samples": 4, "comparison": comparison})
    row = next(line for line in comparison_plan_text(spec).splitlines() if "kan" in line)
    fewest = re.search(r"looks at 4, 6, 8, \.\.\., 20\s+(\d+)\s", row)
    assert fewest and fewest.group(1) == "10"
    # The table's expected configurations are simulated for looks from 9 every 1: not
    # this schedule's, which decides first at 10.
    assert row.rstrip().endswith("not simulated for looks from 10 every 2")
    # Looks every 1 from a later first look (12): not the table's schedule either.
    later = parse_spec({**BASE, "samples": 12, "comparison": {**comparison, "look_every": 1}})
    row = next(line for line in comparison_plan_text(later).splitlines() if "kan" in line)
    assert row.rstrip().endswith("not simulated for looks from 12 every 1")


@pytest.mark.parametrize("samples", [3, 6])
def test_hpo_sweep_plan_prints_the_comparison_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, samples: int
) -> None:
    class GpuPlan:
        text = "GPU packing plan: (stubbed)"

    monkeypatch.setattr(hpo.sweep, "plan_only", lambda spec, **_: GpuPlan())
    spec = write_tiny_spec(tmp_path, "planned", compare=True, samples=samples)
    result = CliRunner().invoke(app, ["sweep", str(spec), "--plan"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "comparison plan (bf16 vs f32, margin ±0.1 Sharpe" in out
    assert "GPU packing plan: (stubbed)" in out
    assert ("can never reach a verdict" in out) is (samples < 5)
    assert not (tmp_path / "results" / "planned").exists()
