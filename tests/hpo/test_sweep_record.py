"""A sweep's record is read back without its data: `hpo status` and `hpo best` answer from
a machine that does not mount the bars (or after they moved), while `hpo resume`, which
trains on them, still says the data is gone before anything starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cluster.storage import SweepLocation
from hpo.cli import UserError, app
from hpo.record import SweepRecord
from hpo.spec import SpecError
from tests.hpo.sweep_helpers import tiny_spec
from trainables.data.synthetic import synthetic_bars

runner = CliRunner()


def _sweep_on_a_file(tmp_path: Path) -> tuple[Path, Path]:
    bars = tmp_path / "data" / "bars.csv"
    bars.parent.mkdir()
    synthetic_bars(n_assets=2, n_bars=900, seed=1).to_frame().to_csv(bars, index=False)
    spec = tiny_spec(tmp_path, data={"source": str(bars)})
    where = SweepLocation.parse(tmp_path / "results").child(spec.name)
    SweepRecord(spec, where, parent_run_id="0" * 32, tracking_uri=spec.tracking_uri).write()
    return where.local_path, bars


def test_status_and_best_do_not_need_the_sweeps_data(tmp_path: Path) -> None:
    """Also before Tune's first snapshot: no trial is recorded yet, which is an answer."""
    sweep_dir, bars = _sweep_on_a_file(tmp_path)
    bars.unlink()
    assert SweepRecord.read(sweep_dir, check_data=False).spec.data.source == str(bars)
    status = runner.invoke(app, ["status", str(sweep_dir)])
    assert status.exit_code == 0, status.output
    assert "e2e: 0 of 4 trials started" in status.output
    best = runner.invoke(app, ["best", str(sweep_dir)])
    assert isinstance(best.exception, UserError), best.output
    assert "no finished trial" in str(best.exception)
    assert "does not exist" not in str(best.exception)


def test_resume_still_names_the_missing_data(tmp_path: Path) -> None:
    sweep_dir, bars = _sweep_on_a_file(tmp_path)
    bars.unlink()
    with pytest.raises(SpecError, match=r"data\.source: .* does not exist"):
        SweepRecord.read(sweep_dir)
    result = runner.invoke(app, ["resume", str(sweep_dir)])
    assert isinstance(result.exception, UserError | SpecError), result.output
    assert "does not exist" in str(result.exception)


def test_status_of_a_sequential_sweep_counts_up_to_its_budget(tmp_path: Path) -> None:
    """A sequential comparison stops a family once it is decided, so its trial count is a
    most: 2 families x 12 configurations x 2 precisions, one seed, said as "up to 48"."""
    families: dict[str, Any] = {
        "families": ["kan", "liquid"],
        "search_space": {},
        "compare": True,
        "samples": 6,
    }
    spec = tiny_spec(
        tmp_path, comparison={"sequential": True, "max_configs": 12, "look_every": 2}, **families
    )
    where = SweepLocation.parse(tmp_path / "results").child(spec.name)
    SweepRecord(spec, where, parent_run_id="0" * 32, tracking_uri=spec.tracking_uri).write()
    status = runner.invoke(app, ["status", str(where.local_path)])
    assert status.exit_code == 0, status.output
    assert "e2e: 0 of up to 48 trials started" in status.output
    fixed = tiny_spec(tmp_path / "fixed", **families)
    assert fixed.n_trials == 24  # the fixed design: exactly its samples


def test_status_of_a_pbt_sweep_counts_its_exploits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trial's exploits (times it copied another) in a column, and the sweep's total."""
    from hpo import trials as trials_module
    from hpo.trials import TrialRow, TrialStatus

    spec = tiny_spec(
        tmp_path,
        families=["kan"],
        precisions=["f32"],
        search_space={},
        scheduler="pbt",
        samples=2,
        max_epochs=3,
    )
    where = SweepLocation.parse(tmp_path / "results").child(spec.name)
    SweepRecord(spec, where, parent_run_id="0" * 32, tracking_uri=spec.tracking_uri).write()

    def row(slug: str, exploits: int) -> TrialRow:
        return TrialRow(
            *(f"t0-{slug}", "kan", "f32", 0, "", TrialStatus("RUNNING"), 2, 0.5, None),
            *(False, False, {}, None),
            config_id=f"kan-f32-{slug}",
            exploits=exploits,
        )

    rows = [row("c000", 2), row("c001", 1)]
    monkeypatch.setattr(trials_module, "trial_rows", lambda *_, **__: rows)
    status = runner.invoke(app, ["status", str(where.local_path)])
    assert status.exit_code == 0, status.output
    lines = status.output.splitlines()
    header = next(line for line in lines if "exploits" in line and "┃" in line)
    column = [cell.strip() for cell in header.split("┃")].index("exploits")
    shown = {
        cells[1]: cells[column]
        for line in lines
        if "│" in line and (cells := [cell.strip() for cell in line.split("│")])[1]
    }
    assert shown == {"t0-c000": "2", "t0-c001": "1"}
    assert "population-based training: 3 exploits so far" in status.output
    as_json = runner.invoke(app, ["status", str(where.local_path), "--json"])
    payload = json.loads(as_json.output)
    assert payload["exploits"] == 3
    assert {t["trial_id"]: t["exploits"] for t in payload["trials"]} == {
        "t0-c000": 2,
        "t0-c001": 1,
    }


def test_best_of_a_pbt_sweep_shows_the_settings_its_trial_finished_with(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The best trial's config is what it trained with at the end (its last exploit's
    settings), said to differ from what the sweep started it with."""
    from hpo.cli import _sweeps
    from hpo.trials import TrialRow, TrialStatus, explored_settings

    before = {"lr": 1e-3, "weight_decay": 1e-4, "position_scale": 4.0}
    lineage = [
        {"epoch": 1, "before": before, "after": {**before, "lr": 2e-3}},
        {"epoch": 2, "before": {**before, "lr": 2e-3}, "after": {**before, "lr": 1.6e-3}},
    ]
    explored = explored_settings({"pbt_exploits": 2, "pbt_lineage": lineage})
    assert explored == {"lr": 1.6e-3}
    assert explored_settings({"val_sharpe": 1.0}) == {}
    row = TrialRow(
        *("t0-c000", "kan", "f32", 0, "", TrialStatus("TERMINATED"), 3, 0.5, None),
        *(False, False, {"lr": 1e-3, "width": 4}, None),
        config_id="kan-f32-c000",
        exploits=2,
        explored=explored,
    )
    printed: list[str] = []
    monkeypatch.setattr(_sweeps.console, "print", lambda table, **_: printed.append(table))
    _sweeps._print_best([row])
    (table,) = printed
    config = table.columns[5]._cells[0]  # type: ignore[attr-defined]
    assert config.startswith("lr=0.0016, width=4 (finished with the settings")
    assert "over 2 exploits; it started with lr=0.001)" in config
