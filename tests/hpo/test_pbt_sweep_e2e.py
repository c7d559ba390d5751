"""Population-based training as a user runs it (the ``hpo`` CLI in child processes), both
kinds of population in one sweep, interval 1 over four epochs, default quantile:

* liquid: a population of four in one group trial (exploits are copies in memory);
* dqn: a population of four spanning Tune trials, each trial in its own, exploiting
  through boundary checkpoints and the sweep's board.

The sweep is interrupted (SIGTERM) once the liquid group has checkpointed two epochs and
the board has answered a dqn trial with an exploit, then resumed with ``hpo resume`` to
the end.
Over the two runs: liquid exploits once per boundary (the worst of four copies the best),
three in all; every exploit the board decided for dqn is in exactly one trial's lineage,
once (none done twice, none lost); in each trial's MLflow run the epoch after an exploit
trained with the explored lr (``lr`` per epoch) and the exploit is in
``pbt_lineage.json``; ``hpo status`` counts every exploit and ``--html`` draws both
populations; the donors' boundary checkpoints are under the sweep directory, where the recipients
read them.

A second sweep, liquid in populations of two with ``pbt.early_stopping = "asha"``, one
population at a time: the sweep's rungs stop whole populations exactly where Ray's ASHA
rule says, on each population's best trial's validation Sharpe, before its exploit, and
the next population takes the slot.

The two trial workers are frozen as they appear and stepped one checkpoint at a time, so
the signal lands where the test says however fast an epoch is (no sleeps)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from mlflow.tracking import MlflowClient

from hpo.population_board import BOARD_FILE, POPULATION_DIR
from hpo.rungs import ASHA_REDUCTION_FACTOR, AshaRungs
from tests.hpo.sweep_helpers import (
    checkpointed_epochs,
    results,
    rung_decisions,
    trial_dirs,
    trial_runs,
    write_tiny_spec,
)
from tests.reliability.sweep_process import HPO, sweep_then_sigterm

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EPOCHS = 4  # boundaries after epochs 1, 2 and 3


def _spec(tmp_path: Path) -> Path:
    return write_tiny_spec(
        tmp_path,
        "pbt",
        families=["liquid", "dqn"],
        precisions=["f32"],
        samples=4,
        max_epochs=EPOCHS,
        scheduler="pbt",
        pbt={"interval_epochs": 1},
        trainer={"lookback": 8, "batch_size": 32, "max_steps_per_epoch": 3, "rl_iterations": 8},
        search_space={
            "liquid": {"hidden": 8, "backbone_units": 8, "backbone_layers": 1},
            "dqn": {"hidden": 32, "learning_starts": 64},
        },
    )


def _decisions(sweep_dir: Path) -> dict[str, Any]:
    """The board's answers so far, by "<trial key>@<epoch>" ({} before its first)."""
    path = sweep_dir / POPULATION_DIR / BOARD_FILE
    if not path.exists():
        return {}
    state = json.loads(path.read_text())  # renamed into place: never half written
    return {k: v for p in state["populations"].values() for k, v in p["decisions"].items()}


def _group_epochs(sweep_dir: Path) -> int:
    return max(
        (checkpointed_epochs(d) for d in trial_dirs(sweep_dir) if d.name.startswith("liquid")),
        default=0,
    )


def _interrupt_midway(tmp_path: Path, spec: Path, sweep_dir: Path) -> str:
    """Run the sweep until the liquid group checkpointed two epochs and the board told a
    dqn trial to exploit, stepping the frozen workers one checkpoint at a time (the
    group's until it is there, a dqn trial's until the board is); SIGTERM its driver and
    return its log, asserting the resumable exit (3)."""
    group: list[int] = []  # the liquid group trial's worker, once seen to grow it
    turns = [0]

    def step(frozen: list[int], go: Callable[[int], Path]) -> None:
        if group and _group_epochs(sweep_dir) < 2:
            pid = group[0]
        elif group:
            pid = [p for p in frozen if p != group[0] and psutil.pid_exists(p)][-1]
        else:  # which worker is the group's is not known yet: in turn
            pid = frozen[turns[0] % len(frozen)]
            turns[0] += 1
        if go(pid).name.startswith("liquid"):
            group[:] = [pid]

    return sweep_then_sigterm(
        tmp_path,
        spec,
        sweep_dir,
        2,
        lambda: _group_epochs(sweep_dir) >= 2 and any(_decisions(sweep_dir).values()),
        step,
    )


def _trial_key(run: Any) -> str:
    """The run's trial key (trainables.trial_keys.trial_key), from its tags."""
    tags = run.data.tags
    return f"{tags['config_id']}|{tags['precision']}/{tags['seed']}"


def _lineages(client: MlflowClient, runs: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Each run's exploits (pbt_lineage.json), checked against its lr per epoch: the
    boundary epoch trained with the settings before, the next with the explored ones."""
    ids = {r.data.tags["trial_id"] for r in runs}
    out = {}
    for run in runs:
        lr = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "lr")}
        assert sorted(lr) == list(range(1, EPOCHS + 1))
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run.info.run_id, "pbt_lineage.json", tmp)
            lineage = json.loads(Path(path).read_text())
        assert lineage["trial_id"] == run.data.tags["trial_id"]
        for exploit in lineage["exploits"]:
            assert exploit["donor_trial_id"] in ids - {lineage["trial_id"]}
            assert lr[exploit["epoch"]] == pytest.approx(exploit["before"]["lr"])
            assert lr[exploit["epoch"] + 1] == pytest.approx(exploit["after"]["lr"])
        out[_trial_key(run)] = lineage["exploits"]
    return out


def test_both_kinds_of_population_exploit_and_resume(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "results" / "pbt"
    first = _interrupt_midway(tmp_path, _spec(tmp_path), sweep_dir)
    assert f"hpo resume {sweep_dir}" in first.replace("\n", "")
    resumed = subprocess.run(
        [*HPO, "resume", str(sweep_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "8/8 trials finished" in resumed.stdout

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    runs = trial_runs(uri, "pbt")
    assert len(runs) == 8 and all(r.info.status == "FINISHED" for r in runs)
    by_family = {
        family: _lineages(client, [r for r in runs if r.data.tags["family"] == family])
        for family in ("liquid", "dqn")
    }
    # liquid: at each boundary the worst of four copies the best, once.
    liquid = sorted(e["epoch"] for exploits in by_family["liquid"].values() for e in exploits)
    assert liquid == [1, 2, 3]

    # dqn: the board's answers, four trials at three boundaries each.
    decisions = _decisions(sweep_dir)
    assert sorted(k.rsplit("@", 1)[1] for k in decisions) == sorted(["1", "2", "3"] * 4)
    decided = sorted(
        (v["epoch"], k.rsplit("@", 1)[0], v["donor_key"]) for k, v in decisions.items() if v
    )
    assert decided, "no dqn trial exploited: the test would show nothing"
    done = sorted(
        (e["epoch"], key, e["donor_key"])
        for key, exploits in by_family["dqn"].items()
        for e in exploits
    )
    assert done == decided  # each decided exploit done once, none lost
    for _, _, donor in decided:  # the donors' boundary checkpoints, where they were read
        part = donor.replace("|", "_").replace("/", "_")
        assert any((sweep_dir / POPULATION_DIR).glob(f"*/{part}/epoch-*/meta.json"))

    report = tmp_path / "populations.html"
    status = subprocess.run(
        [*HPO, "status", str(sweep_dir), "--json", "--html", str(report)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout)["exploits"] == len(liquid) + len(decided)
    # The report: both populations, every trial's lr per epoch, every exploit.
    html = report.read_text()
    assert f"2 population(s), 8 trial(s), {len(liquid) + len(decided)} exploit(s)" in html
    for setting in ("lr", "weight_decay"):  # a line per trial in each setting's plot
        plot = html.split(f'<svg id="settings-{setting}"')[1].split("</svg>")[0]
        assert plot.count('<polyline class="curve"') == 8, setting
    assert html.split('<table id="exploits">')[1].count("<tr><td") == len(liquid) + len(decided)


def test_asha_across_populations_stops_whole_populations(tmp_path: Path) -> None:
    """Four populations of two liquid trials, one at a time (so the rungs see them in
    trial order), exploiting after every epoch: each group trial ends where Ray's ASHA
    rule (:class:`hpo.rungs.AshaRungs`, checked against Tune's own in test_rungs.py) stops
    it on the values it reported, both its trials with it and without the stopping
    epoch's exploit, and some population stops before the last epoch."""
    spec = write_tiny_spec(
        tmp_path,
        "pbt-asha",
        families=["liquid"],
        precisions=["f32"],
        samples=8,
        max_epochs=EPOCHS,
        max_concurrent=1,
        grace_epochs=1,
        scheduler="pbt",
        pbt={"interval_epochs": 1, "population_size": 2, "early_stopping": "asha"},
        trainer={"lookback": 8, "batch_size": 32, "max_steps_per_epoch": 3},
        search_space={
            "liquid": {"hidden": 8, "backbone_units": 8, "backbone_layers": 1},
        },
    )
    run = subprocess.run(
        [*HPO, "sweep", str(spec)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "random + pbt, asha across populations" in run.stdout

    # In the order the searcher made them: by their trials' slugs (c000-f32-s0, ...).
    groups = sorted(
        (results(d) for d in trial_dirs(tmp_path / "results" / "pbt-asha")),
        key=lambda rows: min(rows[0]["trials"]),
    )
    assert len(groups) == 4  # 8 configurations, 2 per population
    rungs = AshaRungs(grace=1, max_t=EPOCHS, reduction_factor=ASHA_REDUCTION_FACTOR)
    ended = []
    for rows in groups:
        population = min(rows[0]["trials"])
        assert [r["epoch"] for r in rows] == list(range(1, len(rows) + 1))
        for row in rows:  # the population's value: its best trial's
            members = row["trials"].values()
            assert len(members) == 2 and all(m["epoch"] == row["epoch"] for m in members)
            assert row["val_sharpe"] == max(m["val_sharpe"] for m in members)
        stop = next(
            r["epoch"] for r in rows if not rungs.keep(population, r["epoch"], r["val_sharpe"])
        )
        assert rows[-1]["epoch"] == stop, (population, [r["val_sharpe"] for r in rows])
        final = rows[-1]["trials"].values()
        # Stopped before the last epoch: both trials flagged, and the boundary's exploit
        # not made (interval 1: one exploit per epoch before the stop, none at it).
        assert all(m.get("stopped", 0) == int(stop < EPOCHS) for m in final)
        assert sorted(e["epoch"] for m in final for e in m["pbt_lineage"]) == list(
            range(1, stop if stop < EPOCHS else EPOCHS)
        )
        ended.append(stop)
    assert min(ended) < EPOCHS, ended  # ASHA stopped a population early
    assert ended[0] == EPOCHS  # the first at every rung goes on
    # The rungs the populations asked, as saved with the searcher's state (what a resume
    # loads): one entry per population, by its key, a stop for each that stopped early.
    decisions = rung_decisions(tmp_path / "results" / "pbt-asha")
    asked = {key for rung in decisions.values() for key in rung}
    assert len(asked) == 4 and all(key.startswith("population liquid-f32-") for key in asked)
    stops = [key for rung in decisions.values() for key, went_on in rung.items() if not went_on]
    assert len(stops) == sum(stop < EPOCHS for stop in ended)
    runs = trial_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "pbt-asha")
    assert len(runs) == 8 and {r.info.status for r in runs} == {"FINISHED"}
