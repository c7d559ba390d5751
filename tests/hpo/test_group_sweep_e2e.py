"""Grouped sweeps through the `hpo` CLI as a user runs them. A compare sweep with
`grouping.group_size`: the seeds of each configuration and precision train as one group
trial, and everything a user reads still lists its trials (one MLflow child run each, status
rows, the comparison). A search sweep with the default group size and ASHA: configurations
of one shape train as one group, and ASHA stops trials, not groups. (A population-based
training sweep's group trial: tests/hpo/test_pbt_sweep_e2e.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from hpo.record import SweepRecord
from tests.hpo.sweep_helpers import rung_decisions, trial_dirs, trial_runs
from trainables.trial_keys import trial_key

pytestmark = [pytest.mark.ray, pytest.mark.slow]
HPO = Path(sys.executable).with_name("hpo")  # the console script, as a user runs it


def _hpo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HPO), *args],
        cwd=tmp_path,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _write_spec(tmp_path: Path, name: str, **settings: object) -> tuple[Path, str]:
    """A tiny kan sweep named ``name`` as the YAML a user writes (``settings`` on top);
    its path and MLflow URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    payload = {
        "name": name,
        "families": ["kan"],
        "max_concurrent": 2,
        "storage": str(tmp_path / "results"),
        "tracking_uri": uri,
        "data": {"source": "synthetic", "n_assets": 2, "n_bars": 600},
        "trainer": {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 6},
        "resources": {"cpu": 1, "gpu": 0},
        **settings,
    }
    spec_path = tmp_path / f"{name}.yaml"
    spec_path.write_text(yaml.safe_dump(payload))
    return spec_path, uri


def test_a_grouped_compare_sweep_lists_every_trial_everywhere(tmp_path: Path) -> None:
    spec_path, uri = _write_spec(
        tmp_path,
        "grouped",
        precisions=["f32", "bf16"],
        compare=True,
        samples=1,
        search="random",
        max_epochs=2,
        seeds=[0, 1, 2],
        walk_forward={"n_folds": 2},
        grouping={"group_size": 3},
        search_space={"kan": {"width": 4}},
    )

    swept = _hpo(tmp_path, "sweep", str(spec_path))
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    assert "6/6 trials finished" in swept.stdout
    # Two Tune trials (one group per precision), six trials.
    sweep_dir = tmp_path / "results" / "grouped"
    assert len(trial_dirs(sweep_dir)) == 2

    runs = trial_runs(uri, "grouped")
    listed = sorted((r.data.tags["precision"], r.data.tags["seed"]) for r in runs)
    assert listed == [(p, s) for p in ("bf16", "f32") for s in ("0", "1", "2")]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert all(r.data.metrics["fused_folds"] == 6 for r in runs)  # 3 trials x 2 folds
    assert len({r.data.tags["trial_id"] for r in runs}) == 6
    assert len({r.data.tags["hpo.group_id"] for r in runs}) == 2  # the Tune trial each ran in

    status = _hpo(tmp_path, "status", str(sweep_dir), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)["trials"]
    assert len(rows) == 6 and all(r["status"] == "TERMINATED" and r["epochs"] == 2 for r in rows)
    assert all(r["checkpoint"].endswith(f"/state/{r['precision']}-s{r['seed']}") for r in rows)

    # The comparison pairs the trials: three seed pairs of one configuration.
    record = SweepRecord.read(sweep_dir, check_data=False)
    parent = MlflowClient(uri).get_run(record.parent_run_id).data.metrics
    assert parent["cmp.kan.bf16_vs_f32.val.n_seed_pairs"] == 3.0
    assert parent["cmp.kan.bf16_vs_f32.val.n_incomplete"] == 0.0
    compared = _hpo(tmp_path, "compare", "--experiment", "grouped", "--tracking-uri", uri)
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-3000:]


def test_asha_stops_trials_of_a_default_grouped_search_sweep(tmp_path: Path) -> None:
    # No [grouping] table: the default group size (8) groups nine sampled configurations of
    # one shape as a group of 8 and a lone trial; ASHA decides per trial at epochs 1, 2.
    spec_path, uri = _write_spec(
        tmp_path,
        "rungs",
        precisions=["f32"],
        samples=9,
        search="tpe",
        scheduler="asha",
        max_epochs=3,
        grace_epochs=1,
        walk_forward={"n_folds": 1},
        search_space={"kan": {"width": {"choices": [4, 8]}}},
    )
    swept = _hpo(tmp_path, "sweep", str(spec_path))
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    assert "9/9 trials finished" in swept.stdout
    sweep_dir = tmp_path / "results" / "rungs"
    assert len(trial_dirs(sweep_dir)) == 2  # a group of eight, one alone
    printed = swept.stdout.replace("\n", "")  # the console wraps long lines
    assert "9 trials as 2 Tune trials (groups of up to 8)" in printed
    assert "asha per trial" in printed and "group of 8 (c000-f32-s0, c001-f32-s0," in printed

    # The grouping is recorded with the sweep: a resume groups as it started.
    assert SweepRecord.read(sweep_dir, check_data=False).spec.grouping.configs_per_ask == {"kan": 8}

    decisions = rung_decisions(sweep_dir)
    assert len(decisions[1]) == 9  # every trial judged at the first rung
    stopped = [k for d in decisions.values() for k, keep in d.items() if not keep]
    assert stopped, "ASHA kept every one of nine trials: nothing was stopped"

    def epochs_of(key: str) -> int:  # where the rungs say the trial ended
        for rung in sorted(decisions):
            if decisions[rung].get(key) is False:
                return rung
        return 3

    client = MlflowClient(uri)
    runs = trial_runs(uri, "rungs")
    assert len(runs) == 9 and all(r.info.status == "FINISHED" for r in runs)
    for run in runs:
        key = trial_key(run.data.tags)
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_sharpe")]
        assert steps == list(range(1, epochs_of(key) + 1)), (key, steps)

    status = _hpo(tmp_path, "status", str(sweep_dir), "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)["trials"]
    assert sorted(r["epochs"] for r in rows) == sorted(epochs_of(trial_key(r)) for r in rows)
