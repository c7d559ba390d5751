"""Sweep specs: the shipped examples load; every invalid spec fails before Ray starts,
naming the field and the allowed values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.spec import SpecError, load_spec, parse_spec
from trainables.data import synthetic_bars

ROOT = Path(__file__).resolve().parents[2]
VALID: dict[str, Any] = {"name": "ok", "families": ["tft"]}


def _problems(**changes: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec({**VALID, **changes})
    return "\n".join(info.value.problems)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")))
def test_shipped_examples_load(path: Path) -> None:
    spec = load_spec(path)
    assert spec.n_trials >= 1


def test_quick_example_is_the_cpu_demo() -> None:
    spec = load_spec(ROOT / "examples" / "quick.toml")
    assert spec.families == ["liquid", "dqn"] and spec.precisions == ["f32", "bf16"]
    assert spec.walk_forward.n_folds == 2  # liquid's folds train fused
    assert spec.resources.gpu == 0 and spec.data.source == "synthetic"
    assert spec.n_trials == 8


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"families": ["tft", "gpt"]},
            "families: Value error, unknown family(ies) ['gpt']; allowed: ['dqn'",
        ),
        (
            {"precisions": ["f32", "fp8"]},
            "precisions: Value error, unknown precision(s) ['fp8']; allowed: ['f32', 'tf32', 'bf16', 'bf16-mixed', 'fp16-mixed', 'auto']",
        ),
        ({"samples": -1}, "samples: Input should be greater than or equal to 1"),
        ({"search": "grid"}, "search: Input should be 'tpe', 'random' or 'pso'"),
        ({"scheduler": "hyperband"}, "scheduler: Input should be 'asha', 'fifo' or 'pbt'"),
        ({"resources": {"gpu": 1.5}}, "resources.gpu"),
        ({"resources": {"gpu": -0.25}}, "resources.gpu"),
        ({"resources": {"gpu": "half"}}, "resources.gpu"),
        (
            {"data": {"source": "nowhere/bars.csv"}},
            "data.source: 'nowhere/bars.csv' does not exist",
        ),
        (
            {"search_space": {"tft": {"hiddden": 3}}},
            "search_space.tft.hiddden: unknown setting for tft",
        ),
        (
            {"search_space": {"tft": {"dropout": {"low": 0.3, "high": 0.1}}}},
            "search_space.tft.dropout: Float needs low < high",
        ),
        (
            {"search_space": {"tft": {"dropout": {"min": 0.1}}}},
            "search_space.tft.dropout must be a constant, {low, high[, log]} or {choices = [...]}",
        ),
        (
            {"search_space": {"dqn": {"gamma": 0.9}}},
            "search_space.dqn: not one of this sweep's families",
        ),
        (
            {"trainer": {"lokback": 8}},
            "trainer: Value error, unknown or sweep-level key(s) ['lokback']",
        ),
        ({"colour": "blue"}, "colour: unknown field; allowed: ["),
        (
            {"walk_forward": {"n_fold": 3}},
            "walk_forward.n_fold: unknown field; allowed: ['embargo', 'n_folds'",
        ),
        ({"compare": True, "scheduler": "asha"}, "compare = true needs scheduler = 'fifo'"),
        ({"name": "bad name!"}, "name: Value error, must start with a letter or digit"),
        ({"max_epochs": 0}, "max_epochs: Input should be greater than or equal to 1"),
    ],
)
def test_invalid_spec_names_the_field(changes: dict[str, Any], expected: str) -> None:
    assert expected in _problems(**changes)


def test_all_problems_reported_at_once() -> None:
    problems = _problems(families=["nope"], samples=0, search="grid")
    assert "families" in problems and "samples" in problems and "search" in problems


def test_yaml_and_cli_overrides(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**VALID, "samples": 2}))
    spec = load_spec(path, {"name": "renamed", "storage": None})
    assert spec.name == "renamed" and spec.samples == 2 and spec.storage == "hpo-results"


def test_broken_toml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('name = "x"\nfamilies = [tft\n')
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(path)
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "missing.toml")


def _write_bars(path: Path, n_bars: int = 400) -> Path:
    synthetic_bars(n_assets=2, n_bars=n_bars, seed=1).to_frame().to_csv(path, index=False)
    return path


def test_data_path_resolved_beside_the_spec(tmp_path: Path) -> None:
    _write_bars(tmp_path / "bars.csv")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**VALID, "data": {"source": "bars.csv"}}))
    assert load_spec(path).data.source == str(tmp_path / "bars.csv")


def test_relative_data_source_is_absolute_when_run_from_the_spec_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hpo sweep spec.toml`` from the spec's folder: Ray workers run elsewhere, so the
    source they get must not depend on the driver's working directory."""
    (tmp_path / "data").mkdir()
    _write_bars(tmp_path / "data" / "bars.csv")
    (tmp_path / "spec.toml").write_text(
        'name = "ok"\nfamilies = ["tft"]\n[data]\nsource = "data"\n'
    )
    monkeypatch.chdir(tmp_path)
    source = Path(load_spec("spec.toml").data.source)
    assert source.is_absolute() and source == (tmp_path / "data").resolve()
    monkeypatch.chdir("/")  # a worker's working directory
    assert source.is_dir()


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        ({"walk_forward": {"test_fraction": 0.0}}, "walk_forward.test_fraction", "in (0, 1)"),
        (
            {"walk_forward": {"n_folds": 3, "val_fraction": 0.3, "test_fraction": 0.2}},
            "walk_forward.n_folds, walk_forward.val_fraction, walk_forward.test_fraction",
            "must be < 1",
        ),
        (
            {"data": {"n_bars": 200}, "trainer": {"lookback": 120}},
            "data.n_bars, trainer.lookback",
            "not enough data",
        ),
        (  # the searched end that needs the most bars decides
            {
                "data": {"n_bars": 300},
                "search_space": {"tft": {"lookback": {"low": 8, "high": 200}}},
            },
            "data.n_bars, search_space.tft.lookback",
            "not enough data",
        ),
    ],
)
def test_walk_forward_that_cannot_split_is_refused(
    changes: dict[str, Any], field: str, reason: str
) -> None:
    problems = _problems(**changes)
    assert f"{field}: " in problems and reason in problems
    assert problems.count("walk-forward") == 1  # said once, not once per family


def test_walk_forward_checked_against_the_file_bars(tmp_path: Path) -> None:
    _write_bars(tmp_path / "short.csv", n_bars=120)
    problems = _problems(data={"source": str(tmp_path / "short.csv")})
    assert "data.source, trainer.lookback: " in problems and "not enough data" in problems
    assert "got 120" in problems  # the file's own bar count, not data.n_bars


def test_splits_that_fit_pass() -> None:
    spec = parse_spec({**VALID, "data": {"n_bars": 300}, "trainer": {"lookback": 16}})
    assert spec.data.n_bars == 300


def test_compare_without_a_scheduler_runs_fifo() -> None:
    spec = parse_spec({**VALID, "compare": True})
    assert spec.scheduler == "fifo"
    assert parse_spec({**VALID}).scheduler == "asha"  # the default without compare
    assert parse_spec({**VALID, "compare": True, "scheduler": "fifo"}).scheduler == "fifo"


def test_invalid_spec_starts_nothing(tmp_path: Path) -> None:
    """The CLI stops on the spec error: no Ray, no MLflow store, no results folder."""
    from typer.testing import CliRunner

    from hpo.cli import app

    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **VALID,
                "families": ["nope"],
                "storage": str(tmp_path / "results"),
                "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
            }
        )
    )
    result = CliRunner().invoke(app, ["sweep", str(path)])
    assert result.exit_code != 0
    assert "unknown family(ies) ['nope']" in str(result.exception)
    assert not (tmp_path / "results").exists() and not (tmp_path / "mlflow.db").exists()


SEQUENTIAL: dict[str, Any] = {
    "families": ["kan", "liquid"],
    "compare": True,
    "samples": 6,
    "search": "random",
}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"comparison": {"sequential": True}},
            "comparison.max_configs: required with comparison.sequential = true",
        ),
        (
            {"comparison": {"sequential": True, "max_configs": 4}},
            "comparison.max_configs = 4 is below samples (6), the first look: it must be "
            ">= samples",
        ),
        (
            {"comparison": {"sequential": True, "max_configs": 8}},
            "comparison.max_configs = 8 can never reach a verdict: the sequential rule "
            "decides from 9 configurations",
        ),
        (
            {"comparison": {"max_configs": 20}},
            "comparison.max_configs: only for a sequential comparison",
        ),
        (
            {"comparison": {"look_every": 2}},
            "comparison.look_every: only for a sequential comparison",
        ),
        (
            {"comparison": {"sequential": True, "max_configs": 20, "look_every": 0}},
            "comparison.look_every: Input should be greater than or equal to 1",
        ),
        (
            {"compare": False, "comparison": {"sequential": True, "max_configs": 20}},
            "comparison.sequential = true needs compare = true",
        ),
        (
            {
                "precisions": ["f32", "bf16", "bf16-mixed"],
                "comparison": {"sequential": True, "max_configs": 20},
            },
            "comparison.sequential = true needs exactly two precisions",
        ),
        (
            {"search": "tpe", "comparison": {"sequential": True, "max_configs": 20}},
            "comparison.sequential = true needs search = 'random', got 'tpe'",
        ),
    ],
)
def test_a_bad_sequential_comparison_names_its_field(
    changes: dict[str, Any], expected: str
) -> None:
    assert expected in _problems(**{**SEQUENTIAL, **changes})


def test_a_sequential_comparison_records_its_looks() -> None:
    spec = parse_spec(
        {**VALID, **SEQUENTIAL, "comparison": {"sequential": True, "max_configs": 24}}
    )
    assert spec.sequential and spec.configs_per_family == 24 and spec.look_every == 1
    assert spec.n_trials == 2 * 24 * 2  # the most it may run
    recorded = spec.with_looks_recorded()
    assert recorded.comparison.look_every == 1 and recorded.with_looks_recorded() == recorded


# --------------------------------------------------------------------------------------
# population-based training: scheduler = "pbt" and its [pbt] table

PBT: dict[str, Any] = {"families": ["kan"], "scheduler": "pbt", "max_epochs": 4}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"compare": True},
            "scheduler = 'pbt' cannot run with compare = true: the paired unit of the "
            "comparison is a fixed configuration",
        ),
        ({"scheduler": "asha", "pbt": {}}, "pbt: the [pbt] table needs scheduler = 'pbt'"),
        ({"pbt": {"interval_epochs": 0}}, "pbt.interval_epochs: Input should be greater"),
        (
            {"pbt": {"interval_epochs": 4}},
            "pbt.interval_epochs = 4 leaves no interval boundary before the last epoch "
            "(max_epochs = 4)",
        ),
        ({"pbt": {"quantile": 0}}, "pbt.quantile: Input should be greater than 0"),
        ({"pbt": {"quantile": 0.6}}, "pbt.quantile: Input should be less than or equal to 0.5"),
        (
            {"pbt": {"resample_probability": -0.1}},
            "pbt.resample_probability: Input should be greater than or equal to 0",
        ),
        (
            {"pbt": {"intervals": 2}},
            "pbt.intervals: unknown field; allowed: ['early_stopping', 'interval_epochs',",
        ),
        (
            {"samples": 6, "pbt": {"population_size": 4}},
            "pbt.population_size = 4 does not divide samples = 6",
        ),
        (
            {"samples": 8, "pbt": {"population_size": 1}},
            "needs a population of at least 2 trials; population_size (default: samples) x "
            "seeds is 1",
        ),
        (
            {"samples": 1},
            "samples: population-based training needs a population of at least 2 trials; "
            "population_size (default: samples) x seeds is 1",
        ),
        (
            {"pbt": {"mutations": {"width": {"low": 2, "high": 8}}}},
            "pbt.mutations.width: not a setting a population of kan may change; allowed: "
            "['lr', 'weight_decay', 'grid_eps', 'position_scale', 'reg_entropy', 'reg_lambda']",
        ),
        (
            {"pbt": {"mutations": {"lr": 1e-3}}},
            "pbt.mutations.lr must be {low, high[, log]} or {choices = [...]}",
        ),
        (
            {"pbt": {"mutations": {"lr": {"low": 0.0, "high": 0.1, "log": True}}}},
            "pbt.mutations.lr: a log-scaled Float needs low > 0",
        ),
        (
            {"pbt": {"mutations": {"lr": {"choices": ["fast"]}}}},
            "pbt.mutations.lr.choices must be numbers, got ['fast']",
        ),
        ({"pbt": {"mutations": {}}}, "pbt.mutations: empty; name at least one setting"),
        (
            {
                "search_space": {
                    "kan": {k: 0.1 for k in ("lr", "weight_decay", "grid_eps")}
                    | {"reg_lambda": 1e-3, "reg_entropy": 0.0, "position_scale": 1.0}
                }
            },
            "pbt.mutations: the search space of kan searches none of the settings a "
            "population may change",
        ),
    ],
)
def test_a_bad_pbt_spec_names_its_field(changes: dict[str, Any], expected: str) -> None:
    assert expected in _problems(**{**PBT, **changes})


def test_pbt_defaults_mutate_the_searched_settings_a_population_may_change() -> None:
    from trainables.pbt import Range

    spec = parse_spec({**VALID, **PBT, "search_space": {"kan": {"reg_entropy": 0.5}}})
    table = spec.pbt_table
    assert (table.interval_epochs, table.quantile, table.resample_probability) == (2, 0.25, 0.25)
    mutations = spec.pbt_mutations("kan")
    # lr and weight decay on their log ranges; the family's float settings it searches
    # (reg_entropy is fixed by the spec, so it stays); shape settings never.
    assert mutations == {
        "lr": Range(1e-4, 1e-2, log=True),
        "weight_decay": Range(1e-6, 1e-2, log=True),
        "grid_eps": Range(0.0, 1.0),
        "position_scale": Range(0.5, 32.0, log=True),
        "reg_lambda": Range(1e-5, 1e-2, log=True),
    }
    # One population per family and precision, asked at once: one group trial each.
    assert spec.configs_per_ask("kan") == spec.samples == 4
    assert spec.n_tune_trials == 2 and spec.n_trials == 8 and not spec.asha_per_trial

    explicit = parse_spec(
        {
            **VALID,
            **PBT,
            "pbt": {
                "mutations": {
                    "lr": {"low": 1e-3, "high": 0.1, "log": True},
                    "grid_eps": {"choices": [0, 0.5]},
                }
            },
        }
    )
    assert explicit.pbt_mutations("kan") == {
        "lr": Range(1e-3, 0.1, log=True),
        "grid_eps": [0.0, 0.5],
    }


@pytest.mark.parametrize(
    ("changes", "family"),
    [
        ({"families": ["dqn"]}, "dqn"),  # a family that never groups
        ({"grouping": {"group_size": 1}}, "kan"),  # grouping turned off
        ({"grouping": {"group_size": 1}, "samples": 6, "seeds": [0, 1]}, "kan"),  # any size
    ],
)
def test_a_population_whose_trials_do_not_group_trains_across_processes(
    changes: dict[str, Any], family: str
) -> None:
    spec = parse_spec({**VALID, **PBT, **changes})
    population = spec.samples * len(spec.seeds)
    # One ask per stream (the population's shape held), each member a Tune trial.
    assert spec.configs_per_ask(family) == spec.samples
    assert not spec.groups(family) and spec.population_spans_trials(family)
    assert spec.n_tune_trials == spec.n_trials == population * len(spec.precisions)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"families": ["dqn"]},
            "pbt.early_stopping = 'asha' stops whole populations, each one group trial, but a "
            "population of families[0] = 'dqn' spans Tune trials: dqn trials never train in "
            "group trials; leave pbt.early_stopping out or sweep this family apart",
        ),
        (
            {"families": ["tft", "kan"], "grouping": {"group_size": 1}},
            "a population of families[1] = 'kan' spans Tune trials: grouping.group_size is 1; "
            "raise it to population_size x seeds or more",
        ),
        (
            {
                "samples": 6,
                "seeds": [0, 1, 2],
                "pbt": {"early_stopping": "asha", "population_size": 3},
            },
            "population of families[0] = 'kan' spans Tune trials: population_size x seeds = 9 "
            "> grouping.group_size = 8; raise grouping.group_size or lower pbt.population_size",
        ),
        (
            {"precisions": ["f32"], "pbt": {"early_stopping": "asha", "population_size": 4}},
            "pbt.early_stopping = 'asha' ranks populations against each other, and samples = 4 "
            "/ population_size = 4 makes one population in this sweep",
        ),
        (
            {"grace_epochs": 4},
            "pbt.early_stopping = 'asha' has no rung before the last epoch: grace_epochs = 4, "
            "max_epochs = 4; lower grace_epochs",
        ),
        (
            {"pbt": {"early_stopping": "hyperband"}},
            "pbt.early_stopping: Input should be 'none' or 'asha'",
        ),
    ],
)
def test_asha_across_populations_needs_populations_that_are_group_trials(
    changes: dict[str, Any], expected: str
) -> None:
    table = {**PBT, "samples": 4, "pbt": {"early_stopping": "asha", "population_size": 2}}
    assert expected in _problems(**{**table, **changes})


def test_asha_across_populations_asks_the_sweeps_rungs_not_tunes_scheduler() -> None:
    """With ``pbt.early_stopping = "asha"`` each population asks the sweep's rungs (a
    board saved with the searcher's state); Tune's ASHA runs only for an ungrouped ASHA
    sweep, and ASHA in a grouped sweep is per trial."""
    stopped = parse_spec(
        {**VALID, **PBT, "samples": 8, "pbt": {"population_size": 2, "early_stopping": "asha"}}
    )
    assert stopped.asha_per_population and stopped.rungs_on_board
    assert not stopped.asha_per_tune_trial and not stopped.asha_per_trial
    assert stopped.n_tune_trials == 4 * len(stopped.precisions)  # 4 populations of 2
    # One bracket for the sweep: one population per family and precision still ranks.
    for split in ({"families": ["kan", "tft"]}, {"precisions": ["f32", "bf16"]}):
        one_each = {**PBT, "precisions": ["f32"], "samples": 4, **split}
        assert parse_spec(
            {**VALID, **one_each, "pbt": {"early_stopping": "asha"}}
        ).asha_per_population
    plain = parse_spec({**VALID, **PBT, "samples": 8})
    assert not plain.asha_per_population and not plain.rungs_on_board
    grouped = parse_spec({**VALID, "families": ["kan"], "samples": 8, "scheduler": "asha"})
    assert grouped.asha_per_trial and grouped.rungs_on_board and not grouped.asha_per_tune_trial
    alone = parse_spec(
        {**VALID, "families": ["kan"], "scheduler": "asha", "grouping": {"group_size": 1}}
    )
    assert alone.asha_per_tune_trial and not alone.rungs_on_board


def test_a_population_larger_than_a_group_spans_several_group_trials() -> None:
    # 3 configurations x 3 seeds = 9 trials, groups of at most 8: two group trials (5 and
    # 4) per precision, one population meeting on the board.
    spec = parse_spec({**VALID, **PBT, "samples": 3, "seeds": [0, 1, 2]})
    assert spec.groups("kan") and spec.population_spans_trials("kan")
    assert spec.configs_per_ask("kan") == 3 and spec.trials_per_group("kan") == 5
    assert spec.n_tune_trials == 2 * len(spec.precisions)
    small = parse_spec({**VALID, **PBT, "samples": 2, "seeds": [0, 1]})
    assert not small.population_spans_trials("kan")  # 4 fit one group: in memory


@pytest.mark.parametrize("table", [{}, {"pbt": {"interval_epochs": 1}}])
def test_compare_on_the_command_line_refuses_a_pbt_spec(
    tmp_path: Path, table: dict[str, Any]
) -> None:
    """``hpo sweep --compare`` (compare = true and FIFO over the file's scheduler) on a pbt
    spec fails with the reason, rather than running FIFO or blaming the [pbt] table."""
    from hpo.cli._options import UserError, load_sweep_spec

    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump({**VALID, **PBT, "precisions": ["f32", "bf16"], **table}))
    with pytest.raises(UserError) as info:
        load_sweep_spec(path, None, None, None, compare=True)
    message = str(info.value)
    assert "scheduler = 'pbt' cannot run with compare = true: the paired unit of the " in message
    assert "needs scheduler = 'pbt'" not in message
    assert load_sweep_spec(path, None, None, None, compare=False).scheduler == "pbt"
