"""The population report (dashboards/population_report.py) and the settings per epoch it
draws (hpo.trials.settings_by_epoch): a member's setting steps at the epoch after each
exploit; one panel per population, one line per member; every exploit listed, its donor
named as a trial of the population."""

from __future__ import annotations

import re
from typing import Any

from dashboards.population_report import render_population_report
from hpo.trials import TrialRow, TrialStatus, settings_by_epoch
from models import get_family


def _row(
    trial_id: str, config_id: str, population: str, lineage: list[dict[str, Any]], lr: float
) -> TrialRow:
    return TrialRow(
        trial_id=trial_id,
        family="dqn",
        precision="f32",
        seed=0,
        pair_id="",
        status=TrialStatus("TERMINATED"),
        epochs=4,
        val_sharpe=1.0,
        test_sharpe=0.5,
        fell_back_to_f32=False,
        diverged=False,
        params={"lr": lr, "weight_decay": 1e-4, "hidden": 32},
        checkpoint=None,
        config_id=config_id,
        population=population,
        lineage=lineage,
    )


def _exploit(epoch: int, donor_key: str, before: float, after: float) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "donor": "t0",
        "donor_key": donor_key,
        "before": {"lr": before, "weight_decay": 1e-4},
        "after": {"lr": after, "weight_decay": 1e-4},
    }


DQN_TAU = float(get_family("dqn").make_config({}).tau)  # type: ignore[attr-defined]

ROWS = [
    _row("t0", "dqn-f32-c000", "dqn-f32-c000", [], 1e-3),
    _row(
        "t1",
        "dqn-f32-c001",
        "dqn-f32-c000",
        [
            _exploit(1, "dqn-f32-c000|f32/0", 1e-2, 8e-4),
            _exploit(3, "dqn-f32-c000|f32/0", 8e-4, 6e-4),
        ],
        1e-2,
    ),
    _row("t2", "dqn-f32-c002", "dqn-f32-c002", [], 3e-3),
    _row("t3", "dqn-f32-c003", "", [], 3e-3),  # no population: left out
]


def test_a_setting_steps_at_the_epoch_after_each_exploit() -> None:
    settings = settings_by_epoch(ROWS[1])
    assert settings["lr"] == [(1, 1e-2), (2, 8e-4), (3, 8e-4), (4, 6e-4)]
    assert settings["weight_decay"] == [(e, 1e-4) for e in range(1, 5)]
    # Without a lineage: what the sweep started it with, every epoch; a setting the
    # population explored that the trial's params lack comes from the family's default.
    started = settings_by_epoch(ROWS[0], ["lr", "tau"])
    assert started["lr"] == [(e, 1e-3) for e in range(1, 5)]
    assert started["tau"] == [(e, DQN_TAU) for e in range(1, 5)]


def test_the_report_draws_each_population_and_lists_every_exploit() -> None:
    html = render_population_report("pbt", ROWS)
    assert "2 population(s), 3 trial(s), 2 exploit(s)" in html
    lr_plot = re.search(r'<svg id="settings-lr".*?</svg>', html, re.S)
    assert lr_plot is not None and "(log10)" in lr_plot.group(0)
    # One line per trial of a population: two in the first panel, one in the second.
    assert lr_plot.group(0).count("<polyline") == 3
    points = re.findall(r'data-series="trial 2" points="([^"]+)"', lr_plot.group(0))
    (trial_2,) = points
    ys = [float(p.split(",")[1]) for p in trial_2.split()]
    assert len(ys) == 4 and ys[1] == ys[2] and len(set(ys)) == 3  # steps after 1 and 3
    exploits = re.search(r'<table id="exploits">.*?</table>', html, re.S)
    assert exploits is not None
    rows = re.findall(r"<tr><td", exploits.group(0))
    assert len(rows) == 2
    assert exploits.group(0).count("trial 1<") == 2  # the donor, named in its population
    assert "lr=0.0008" in exploits.group(0) and "t3" not in html
