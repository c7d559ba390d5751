"""A sequential compare sweep as a user runs it (the ``hpo`` CLI in child processes): kan
and liquid, first look 6, budget 24, a look after every configuration (the default). The
sweep is interrupted (SIGTERM) once a family's first look is applied, resumed with ``hpo
resume`` to the end, then read back with ``hpo compare --json --html``: every look
printed once across the two runs (none repeated, none lost), each family's looks those
of the rule (``hpo.stats.sequential_comparison`` with the sweep's directional alpha) on
its recorded differences, a decided family given at most its one configuration in
flight after its decision, and the looks in the JSON, the report and the parent run.

One trial worker, frozen as it appears and stepped one checkpoint at a time, so the
signal lands after the first look however fast a trial is (no sleeps). The looks at 6,
7 and 8 only report (the rule decides from ``hpo.stats.MIN_FIRST_LOOK`` configurations);
a budget is spent only if a family stays undecided."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from hpo.stats import DEFAULT_LOOK_EVERY, MIN_FIRST_LOOK, sequential_comparison, sequential_looks
from hpo.tracking import SEQUENTIAL_ARTIFACT
from tests.hpo.sweep_helpers import write_tiny_spec
from tests.reliability.sweep_process import HPO, sweep_then_sigterm

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FIRST, BUDGET = 6, 24
EVERY = DEFAULT_LOOK_EVERY  # a look after every configuration, as a user's sweep looks
MARGIN = 0.1  # the default
LOOK = re.compile(rf"^(kan|liquid): look (\d+) at (\d+) of up to {BUDGET} configurations", re.M)


def _spec(tmp_path: Path) -> Path:
    # Every shape-changing setting pinned: configurations of a family batch into group
    # trials (one per precision and look), as a sweep on a GPU would run them.
    return write_tiny_spec(
        tmp_path,
        "seq",
        families=["kan", "liquid"],
        compare=True,
        samples=FIRST,
        max_epochs=1,
        max_concurrent=1,
        comparison={"sequential": True, "max_configs": BUDGET},  # look_every: the default
        trainer={"lookback": 8, "batch_size": 32, "max_steps_per_epoch": 2},
        search_space={
            "kan": {"n_layers": 1, "width": 4, "window": 2, "grid_size": 3, "spline_order": 1},
            "liquid": {
                "hidden": 8,
                "backbone_units": 8,
                "backbone_layers": 1,
                "backbone_activation": "relu",
                "mode": "gated",
            },
        },
    )


def _interrupt_after_first_look(tmp_path: Path, spec: Path, sweep_dir: Path) -> str:
    log = tmp_path / "sweep.log"
    return sweep_then_sigterm(
        tmp_path, spec, sweep_dir, 1, lambda: bool(LOOK.search(log.read_text()))
    )


def _logged(client: MlflowClient, tmp_path: Path, experiment: str) -> dict[str, Any]:
    """The families of the sweep's parent run's sequential.json."""
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (parent,) = client.search_runs([found.experiment_id], "tags.`hpo.role` = 'sweep'")
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(parent.info.run_id, SEQUENTIAL_ARTIFACT, tmp)
        return dict(json.loads(Path(path).read_text())["families"])


def test_a_sequential_sweep_interrupted_and_resumed_decides_each_family_once(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    sweep_dir = tmp_path / "results" / "seq"
    plan = sequential_looks(FIRST, EVERY, BUDGET)
    assert plan == tuple(range(FIRST, BUDGET + 1, EVERY))

    first = _interrupt_after_first_look(tmp_path, spec, sweep_dir)
    assert f"up to {2 * BUDGET * 2} trials" in first and "comparison plan (bf16 vs f32" in first
    assert f"hpo resume {sweep_dir}" in first.replace("\n", "")
    assert "undecided after" in first  # the families' lines of an interrupted sweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    # What the parent run holds once the driver stopped: the searcher's records as they
    # were at the end (configurations made after the last look included), not the last
    # look's snapshot.
    summary = json.loads((sweep_dir / "hpo-summary.json").read_text())
    assert _logged(client, tmp_path, "seq") == summary["sequential"]

    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    second = resumed.stdout
    assert resumed.returncode == 0, second[-3000:] + resumed.stderr[-3000:]

    # Every look announced once over the two runs, in order, at the planned counts.
    looks = [(m[1], int(m[2]), int(m[3])) for m in LOOK.finditer(first + second)]
    assert len(set(looks)) == len(looks), looks
    for family in ("kan", "liquid"):
        mine = [(k, n) for f, k, n in looks if f == family]
        assert mine == [(k + 1, plan[k]) for k in range(len(mine))], (family, looks)
        assert len(mine) >= MIN_FIRST_LOOK - FIRST + 1  # no verdict before 9 configurations

    out = tmp_path / "compare.json"
    html = tmp_path / "report.html"
    compared = subprocess.run(
        [
            *HPO,
            *("compare", "--experiment", "seq", "--tracking-uri", uri),
            *("--json", str(out), "--html", str(html)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]
    comparison = json.loads(out.read_text())
    report = html.read_text()
    parent = client.get_run(comparison["parent_run_id"])
    assert parent.info.status == "FINISHED"
    logged = _logged(client, tmp_path, "seq")
    for family in ("kan", "liquid"):
        sequential = comparison["families"][family]["sequential"]
        record = logged[family]
        differences = [o["difference"] for o in record["order"] if o["difference"] is not None]
        # The rule as the sweep applies it: "worse"/"better" at alpha / (2 x 2 families).
        decisions = sequential_comparison(
            differences, plan, MARGIN, directional_alpha=0.05 / 4
        ).verdicts
        assert [look["decision"] for look in sequential["looks"]] == decisions
        assert [look["configs"] for look in sequential["looks"]] == list(plan[: len(decisions)])
        assert sequential["decision"] == decisions[-1] != "continue"
        assert all(
            {"configs", "low", "high", "decision"} <= set(look) for look in sequential["looks"]
        )
        # Decided at its last look: at most the one configuration in flight beside it made
        # after (in_flight 2; one slot, so no decided family's share handed on), recorded
        # and never read.
        decided_at = sequential["looks"][-1]["configs"]
        assert record["configs_made"] == len(record["order"])
        assert decided_at <= len(differences) <= decided_at + 1
        verdict_line = f"{family}: "
        assert verdict_line in second and f"of up to {BUDGET} configurations" in second
        assert f'id="looks-{family}"' in report
        assert report.count('data-configs="') >= len(decisions)
        assert parent.data.tags[f"cmp.{family}.decision"] == decisions[-1]
