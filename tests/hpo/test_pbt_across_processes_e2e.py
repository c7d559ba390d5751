"""Population-based training across processes, as a user runs it (the ``hpo`` CLI in
child processes): a dqn population of four (each member its own Tune trial, two at a
time), interval 1 over three epochs, interrupted (SIGTERM) once the board has answered
three boundaries, resumed with ``hpo resume`` to the end.

What must hold over the two runs: every exploit the board decided is in exactly one
member's lineage, once (none done twice, none lost), in its MLflow run
(``pbt_lineage.json``); the epoch after an exploit trained with the explored lr (the
``lr`` metric per epoch), the boundary epoch with the one before; ``hpo status`` counts
the exploits; the donors' snapshots are under the sweep directory, where the recipients
read them.

The worker is stepped one checkpoint at a time (tests/reliability/sweep_process.py), so
the signal lands mid-sweep however fast an epoch is."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from hpo.population_board import BOARD_FILE, SNAPSHOT_DIR
from tests.hpo.sweep_helpers import trial_runs, write_tiny_spec
from tests.reliability.sweep_process import HPO, sweep_then_sigterm

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _decisions(sweep_dir: Path) -> dict[str, Any]:
    """The board's answers so far, by "member@epoch" ({} before its first)."""
    path = sweep_dir / SNAPSHOT_DIR / BOARD_FILE
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
    except ValueError:  # never half written (a rename), but be safe while polling
        return {}
    return {k: v for p in state["populations"].values() for k, v in p["decisions"].items()}


def test_a_dqn_population_exploits_across_processes_and_resumes(tmp_path: Path) -> None:
    spec = write_tiny_spec(
        tmp_path,
        "pbtdqn",
        families=["dqn"],
        precisions=["f32"],
        samples=4,
        max_epochs=3,
        scheduler="pbt",
        pbt={"interval_epochs": 1, "quantile": 0.5},
        search_space={"dqn": {"hidden": 32, "learning_starts": 64}},
    )
    sweep_dir = tmp_path / "results" / "pbtdqn"
    first = sweep_then_sigterm(
        tmp_path, spec, sweep_dir, 2, lambda: len(_decisions(sweep_dir)) >= 3
    )
    assert f"hpo resume {sweep_dir}" in first.replace("\n", "")
    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "4/4 trials finished" in resumed.stdout

    decisions = _decisions(sweep_dir)
    # Four members, two boundaries each (after epochs 1 and 2, never after the last).
    assert sorted(k.rsplit("@", 1)[1] for k in decisions) == ["1"] * 4 + ["2"] * 4
    decided = sorted(
        (v["epoch"], k.rsplit("@", 1)[0], v["donor_key"]) for k, v in decisions.items() if v
    )
    assert decided, "no member exploited: the test shows nothing"

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = trial_runs(uri, "pbtdqn")
    assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)
    key_of = {r.data.tags["trial_id"]: r for r in runs}
    done = []
    for run in runs:
        lr = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "lr")}
        assert sorted(lr) == [1, 2, 3]
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run.info.run_id, "pbt_lineage.json", tmp)
            lineage = json.loads(Path(path).read_text())
        for exploit in lineage["exploits"]:
            assert exploit["donor_trial_id"] in key_of.keys() - {run.data.tags["trial_id"]}
            assert lr[exploit["epoch"]] == pytest.approx(exploit["before"]["lr"])
            assert lr[exploit["epoch"] + 1] == pytest.approx(exploit["after"]["lr"])
            done.append((exploit["epoch"], _trial_key(run), exploit["donor_key"]))
    assert sorted(done) == decided  # each decided exploit done once, none lost

    status = subprocess.run(
        [*HPO, "status", str(sweep_dir), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout)["exploits"] == len(decided)
    # The donors' snapshots, where the recipients read them.
    for _, _, donor in decided:
        part = donor.replace("|", "_").replace("/", "_")
        assert any((sweep_dir / "pbt").glob(f"*/{part}/epoch-*/meta.json"))


def _trial_key(run: Any) -> str:
    """The run's trial key (trainables.trial_keys.trial_key), from its tags."""
    tags = run.data.tags
    return f"{tags['config_id']}|{tags['precision']}/{tags['seed']}"
