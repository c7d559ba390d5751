"""`grouping.group_size`: the searcher queues the seeds of a configuration, and further
configurations of the same shape, (per precision) as group trials of up to K trials, is
told each trial's own result, and rl families stay ungrouped; how large a model's
largest group is (what a measured share is profiled for)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from ray.tune.search import Searcher

from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import parse_spec
from models import get_family
from tests.hpo.sweep_helpers import tiny_spec
from trainables.config import GROUP_KEY, GroupTrialConfig, TrialConfig, is_group_trial
from trainables.trial_keys import (
    PER_TRIAL_SETTINGS,
    per_trial_settings,
    precision_seed,
    trial_slugs,
    trials_of,
)


def _spec(**overrides: Any) -> Any:
    payload = {
        "name": "groups",
        "families": ["kan", "dqn"],
        "precisions": ["f32", "bf16"],
        "compare": True,
        "samples": 1,
        "search": "random",
        "seeds": [0, 1, 2],
        "grouping": {"group_size": 2},
    }
    return parse_spec({**payload, **overrides})


def _pbt_spec(family: str, **overrides: Any) -> Any:
    """A search sweep of ``family`` in f32 with population-based training (interval 1,
    3 epochs, seed 0), ``overrides`` on top."""
    settings: dict[str, Any] = {
        "families": [family],
        "compare": False,
        "precisions": ["f32"],
        "scheduler": "pbt",
        "max_epochs": 3,
        "seeds": [0],
        "pbt": {"interval_epochs": 1},
    }
    return _spec(**{**settings, **overrides})


def test_seeds_of_a_configuration_are_queued_as_groups_per_precision() -> None:
    searcher = SweepSearcher(_spec())
    suggested = [searcher.suggest(f"t{i}") for i in range(10)]
    trials = [s for s in suggested if isinstance(s, dict)]
    kan = [t for t in trials if t["family"] == "kan"]
    dqn = [t for t in trials if t["family"] == "dqn"]
    # kan: per precision, seeds 0 and 1 in one group, seed 2 alone.
    groups = [[precision_seed(m) for m in t[GROUP_KEY]] for t in kan if is_group_trial(t)]
    assert sorted(groups) == [["bf16/0", "bf16/1"], ["f32/0", "f32/1"]]
    assert sorted(precision_seed(t) for t in kan if not is_group_trial(t)) == ["bf16/2", "f32/2"]
    # dqn, an rl family: six trials alone.
    assert len(dqn) == 6 and not any(is_group_trial(t) for t in dqn)
    assert searcher.spec.n_trials == 12 and searcher.spec.n_tune_trials == len(trials) == 10
    # Every group decodes, and its trials share the configuration's parameters.
    for t in kan:
        if is_group_trial(t):
            group = GroupTrialConfig.from_dict(t)
            assert {m.config_id for m in group.trials} == {t["config_id"]}
            assert all(m.params == group.trials[0].params for m in group.trials)


def test_the_searcher_is_told_each_trials_result() -> None:
    searcher = SweepSearcher(_spec(families=["kan"], precisions=["f32", "bf16"], seeds=[0, 1]))
    ids = {}
    while isinstance(suggestion := searcher.suggest(f"t{len(ids)}"), dict):
        ids[f"t{len(ids)}"] = suggestion
    assert len(ids) == 2 and all(is_group_trial(t) for t in ids.values())
    for trial_id, config in ids.items():
        precision = config["precision"]
        entries = {f"{precision}-s0": {"val_sharpe": 1.0}, f"{precision}-s1": {"val_sharpe": 3.0}}
        searcher.on_trial_complete(trial_id, {"val_sharpe": 3.0, "trials": entries})
    (configuration,) = searcher.configs.values()
    assert configuration.results == {"f32/0": 1.0, "f32/1": 3.0, "bf16/0": 1.0, "bf16/1": 3.0}
    assert searcher.searchers[0].n_told == 1  # the configuration's mean, once
    assert searcher.suggest("t9") == Searcher.FINISHED
    restored = SweepSearcher(searcher.spec)
    restored.set_state(searcher.get_state())
    assert restored.trial_group == searcher.trial_group


def _all_suggestions(searcher: SweepSearcher) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    while isinstance(suggestion := searcher.suggest(f"t{len(out)}"), dict):
        out[f"t{len(out)}"] = suggestion
    return out


@pytest.mark.parametrize("search", ["random", "tpe", "pso"])
def test_search_mode_groups_configurations_of_one_shape(search: str) -> None:
    # One seed, K = 4: each (model, precision) stream asks for four configurations at a
    # time, the first searched whole, the other three with its shape (kan's grid, width,
    # depth, ...) held: one group trial of four configurations per stream and batch.
    spec = _spec(
        families=["kan"],
        compare=False,
        scheduler="fifo",
        search=search,
        seeds=[0],
        samples=6,
        grouping={"group_size": 4},
    )
    searcher = SweepSearcher(spec)
    trials = _all_suggestions(searcher)
    sizes = sorted(len(t[GROUP_KEY]) if is_group_trial(t) else 1 for t in trials.values())
    assert sizes == [2, 2, 4, 4]  # per precision: 4 configurations, then the last 2
    assert spec.n_tune_trials == len(trials) == 4
    for config in trials.values():
        if not is_group_trial(config):
            continue
        held = GroupTrialConfig.from_dict(config).trials
        assert len({m.config_id for m in held}) == len(held)
        varying = per_trial_settings(get_family("kan"))
        shapes = [{k: v for k, v in m.params.items() if k not in varying} for m in held]
        assert all(shape == shapes[0] for shape in shapes)
        # Searched per trial: lr, and the position scale (the fused step never reads it).
        assert len({m.params["lr"] for m in held}) == len(held)
        assert len({m.params["position_scale"] for m in held}) == len(held)
        # Trial ids stay unique across the group's configurations.
        ids = [unit for unit, _, _ in trials_of("abc", config)]
        assert len(set(ids)) == len(ids) and ids[0].startswith("abc-c0")
    # Each configuration gets its own trial's result, told to the stream's searcher.
    for trial_id, config in trials.items():
        units = trials_of(trial_id, config)
        reported = {slug: {"val_sharpe": float(i)} for i, (_, _, slug) in enumerate(units)}
        searcher.on_trial_complete(trial_id, {"val_sharpe": 0.0, "trials": reported})
    assert [s.n_told for s in searcher.searchers] == [6, 6]
    assert searcher.suggest("t99") == Searcher.FINISHED


def test_compare_mode_groups_the_seeds_of_one_configuration_only() -> None:
    # Compare mode: each configuration stays an independent draw of the space (the
    # statistics' unit), so a group holds one configuration's seeds, never a batch.
    spec = _spec(families=["kan"], seeds=[0, 1, 2], samples=3, grouping={"group_size": 8})
    trials = _all_suggestions(SweepSearcher(spec))
    sizes = sorted(len(t[GROUP_KEY]) if is_group_trial(t) else 1 for t in trials.values())
    assert sizes == [3] * 6 and spec.n_tune_trials == 6
    assert all(len({m["config_id"] for m in t[GROUP_KEY]}) == 1 for t in trials.values())
    # Pairs stay pairs: each f32 trial has its bf16 twin with the same parameters.
    all_trials = [m for t in trials.values() for m in t.get(GROUP_KEY, [t])]
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for m in all_trials:
        by_pair.setdefault(m["pair_id"], []).append(m)
    assert len(by_pair) == 9
    assert all(len(p) == 2 and p[0]["params"] == p[1]["params"] for p in by_pair.values())
    # And the configurations were searched whole: their shapes differ.
    shapes = {json.dumps(t[GROUP_KEY][0]["params"], sort_keys=True) for t in trials.values()}
    assert len(shapes) == 3


def test_compare_mode_groups_configurations_where_only_lr_and_weight_decay_are_searched() -> None:
    # Every shape setting fixed by the spec: each configuration is still an independent
    # draw (nothing is held), and all share the shape, so a group holds several
    # configurations' seeds of one precision: 8 // 3 = 2 configurations, 6 trials.
    from hpo.search.space import trial_space
    from models.base import Choice

    fixed = {
        key: dim.options[0] if isinstance(dim, Choice) else dim.low  # type: ignore[attr-defined]
        for key, dim in trial_space("kan").dims.items()
        if key not in PER_TRIAL_SETTINGS
    }
    spec = _spec(
        families=["kan"],
        seeds=[0, 1, 2],
        samples=4,
        grouping={"group_size": 8},
        search_space={"kan": fixed},
    )
    assert spec.configs_per_ask("kan") == 2 and spec.trials_per_group("kan") == 6
    trials = _all_suggestions(SweepSearcher(spec))
    sizes = sorted(len(t[GROUP_KEY]) for t in trials.values())
    assert sizes == [6] * 4 and spec.n_tune_trials == 4
    assert all(len({m["config_id"] for m in t[GROUP_KEY]}) == 2 for t in trials.values())
    # Independent draws, the same as ungrouped: the random searcher's own sequence.
    alone = _all_suggestions(
        SweepSearcher(_spec(**{**spec.model_dump(), "grouping": {"group_size": 1}}))
    )
    drawn = lambda found: {  # noqa: E731
        m["config_id"]: m["params"] for t in found.values() for m in t.get(GROUP_KEY, [t])
    }
    assert drawn(trials) == drawn(alone) and len(drawn(trials)) == 4


def test_a_search_that_holds_every_per_trial_setting_asks_one_configuration_at_a_time() -> None:
    # Nothing a group's trials may differ in is searched (lr, weight decay, kan's own
    # per-trial settings): a batch of one shape would be K copies of one configuration. Each
    # configuration is asked alone (its seeds still group).
    default = get_family("kan").default_config()
    held = {
        key: getattr(default, key) if hasattr(default, key) else {"lr": 1e-3}.get(key, 0.0)
        for key in per_trial_settings(get_family("kan")) - {"seed"}
    }
    assert {"lr", "weight_decay", "position_scale", "reg_lambda"} <= set(held)
    spec = _spec(
        families=["kan"],
        compare=False,
        scheduler="fifo",
        seeds=[0],
        samples=3,
        precisions=["f32"],
        grouping={"group_size": 8},
        search_space={"kan": held},
    )
    assert spec.configs_per_ask("kan") == 1 and not spec.forms_groups
    trials = _all_suggestions(SweepSearcher(spec))
    assert len(trials) == 3 and not any(is_group_trial(t) for t in trials.values())


def test_pso_holds_a_groups_log_scale_shape_exactly() -> None:
    # A log-scale float decoded from its unit coordinate can come back an ulp off; the
    # group's trials must share it exactly (group_problems compares with ==).
    from hpo.search.pso import PSOParamSearcher
    from models.base import Float

    dims = {"scale": Float(1e-3, 10.0, log=True), "lr": Float(1e-4, 1e-2, log=True)}
    searcher = PSOParamSearcher(dims, seed=0)
    held = {"scale": 2.2073515969258355}
    for i in range(50):
        assert searcher.ask(f"t{i}", held)["scale"] == held["scale"]


def test_a_new_sweep_groups_and_records_its_group_size() -> None:
    from hpo.spec import DEFAULT_GROUP_SIZE

    payload = {"name": "grouped", "families": ["kan"], "precisions": ["f32"], "samples": 4}
    spec = parse_spec(payload)
    assert spec.group_size == DEFAULT_GROUP_SIZE  # a new sweep groups
    # The spec a new sweep records names its group size: a later default cannot change it.
    assert spec.model_dump()["grouping"]["group_size"] == DEFAULT_GROUP_SIZE
    # Measured shares are profiled for the fused group: a measured sweep groups too.
    assert parse_spec({**payload, "resources": {"gpu": "measured"}}).group_size == 8


def test_group_size_one_asks_what_the_streams_searcher_asks_alone() -> None:
    # The batch path must not change an ungrouped sweep's suggestions.
    grouped = _spec(
        families=["kan"],
        compare=False,
        scheduler="fifo",
        search="tpe",
        seeds=[0],
        samples=3,
        grouping={"group_size": 1},
    )
    from hpo.search import make_param_searcher
    from hpo.search.space import trial_space

    direct = make_param_searcher("tpe", trial_space("kan"), seed=grouped.search_seed * 7919)
    trials = _all_suggestions(SweepSearcher(grouped))
    f32 = [t for t in trials.values() if t["precision"] == "f32"]
    assert [t["params"] for t in f32] == [direct.ask(f"x{i}") for i in range(3)]


def test_trials_per_group_is_the_largest_group_the_searcher_forms() -> None:
    """What the plan profiles a model's group share for: a batch's trials of one
    precision, split evenly into groups of at most group_size."""
    search = {"compare": False, "scheduler": "fifo", "samples": 5, "grouping": {"group_size": 8}}
    spec = _spec(**search)  # batches of 8 // 3 seeds = 2 configurations: 6 trials
    assert spec.trials_per_group("kan") == 6
    trials = _all_suggestions(SweepSearcher(spec))
    kan = [t for t in trials.values() if t["family"] == "kan"]
    assert max(len(t[GROUP_KEY]) if is_group_trial(t) else 1 for t in kan) == 6
    assert _spec(**{**search, "grouping": {"group_size": 4}}).trials_per_group("kan") == 3
    assert _spec().trials_per_group("kan") == 2  # compare: 3 seeds by 2 -> 2 and 1
    assert _spec(**{**search, "samples": 1, "seeds": [0]}).trials_per_group("kan") == 1
    assert spec.trials_per_group("dqn") == 1  # rl: alone


def test_a_recorded_grouping_is_kept_whatever_this_version_would_decide() -> None:
    """A sweep records how it groups (``grouping.configs_per_ask``) when it starts; read back, the
    spec groups as recorded. A sweep started by a version that asked one configuration at
    a time does not start grouping configurations (and ASHA per trial) on resume because
    this version lets a group's trials differ in more settings."""
    search = {
        "families": ["kan"],
        "compare": False,
        "scheduler": "asha",
        "samples": 4,
        "seeds": [0],
        "precisions": ["f32"],
    }
    spec = _spec(**search, grouping={"group_size": 8})
    assert spec.configs_per_ask("kan") == 8 and spec.asha_per_trial  # this version batches
    assert spec.with_grouping_recorded().grouping.configs_per_ask == {"kan": 8}

    older = _spec(**search, grouping={"group_size": 8, "configs_per_ask": {"kan": 1}})
    assert older.configs_per_ask("kan") == 1 and not older.forms_groups
    assert not older.asha_per_trial  # the Tune ASHA scheduler it started with
    searcher = pickle.loads(pickle.dumps(SweepSearcher(older)))  # as Tune restores it
    assert searcher.per_ask == {"kan": 1}
    trials = _all_suggestions(searcher)
    assert len(trials) == 4 and not any(is_group_trial(t) for t in trials.values())
    assert not _spec(**search, grouping={"group_size": 8, "configs_per_ask": {}}).groups("kan")


def test_recorded_configs_per_ask_name_this_sweeps_families_and_fit_its_groups() -> None:
    from hpo.spec import SpecError

    with pytest.raises(
        SpecError, match=r"grouping.configs_per_ask.tft: not one of this sweep's families"
    ):
        _spec(grouping={"group_size": 8, "configs_per_ask": {"tft": 2}})
    with pytest.raises(
        SpecError, match=r"grouping.configs_per_ask.kan = 9 is over grouping.group_size"
    ):
        _spec(grouping={"group_size": 8, "configs_per_ask": {"kan": 9}})
    recorded = _spec(grouping={"group_size": 8, "configs_per_ask": {"kan": 2, "dqn": 2}})
    assert recorded.groups("kan") and not recorded.groups("dqn")  # rl never groups


def test_a_recorded_batch_is_never_more_than_this_version_can_hold_to_one_shape() -> None:
    # A compare sweep searching a shape setting asks one configuration at a time; a batch
    # of 4 written into its spec would group configurations of different widths.
    spec = _spec(
        families=["kan"],
        grouping={"group_size": 8, "configs_per_ask": {"kan": 4}},
        search_space={"kan": {"width": {"choices": [4, 8]}}},
    )
    assert spec.configs_per_ask("kan") == 1
    trials = _all_suggestions(SweepSearcher(spec))
    for trial in trials.values():
        if is_group_trial(trial):
            assert len({m["config_id"] for m in trial[GROUP_KEY]}) == 1  # seeds of one


def test_a_group_trials_result_as_tune_flattens_it_tells_each_trial_its_own_value() -> None:
    # Tune hands the searcher ``flatten_dict(trial.last_result)``: the trials' entries
    # arrive as "trials/<slug>/val_sharpe" keys, not under "trials".
    from ray.tune.utils import flatten_dict

    searcher = SweepSearcher(_spec(families=["kan"], precisions=["f32", "bf16"], seeds=[0, 1]))
    trials = _all_suggestions(searcher)
    for trial_id, config in trials.items():
        precision = config["precision"]
        entries = {f"{precision}-s0": {"val_sharpe": 1.0}, f"{precision}-s1": {"val_sharpe": 3.0}}
        result = {"val_sharpe": 3.0, "trials": entries}
        searcher.on_trial_complete(trial_id, flatten_dict(result))
    (configuration,) = searcher.configs.values()
    assert configuration.results == {"f32/0": 1.0, "f32/1": 3.0, "bf16/0": 1.0, "bf16/1": 3.0}
    assert searcher.searchers[0].best() is not None


def test_a_pbt_sweep_queues_one_population_per_family_and_precision() -> None:
    # scheduler = "pbt": each stream's samples x seeds trials are one group trial (the
    # population) that carries the family's population settings; a searched shape
    # setting (width) is drawn once per population, the settings it explores per trial.
    from trainables.pbt import Range

    spec = _spec(
        families=["kan"],
        compare=False,
        scheduler="pbt",
        max_epochs=3,
        samples=2,
        seeds=[0, 1],
        grouping={"group_size": 4},
        pbt={"interval_epochs": 1, "quantile": 0.5},
        search_space={"kan": {"width": {"choices": [4, 8, 16]}}},
    )
    searcher = SweepSearcher(spec)
    suggested = [searcher.suggest(f"t{i}") for i in range(4)]
    populations = [s for s in suggested if isinstance(s, dict)]
    assert suggested[2:] == [None, None]  # nothing more until the populations report
    assert [p["precision"] for p in populations] == ["f32", "bf16"]
    for population in populations:
        group = GroupTrialConfig.from_dict(population)
        assert [precision_seed(t.to_dict()) for t in group.trials] == [
            f"{population['precision']}/{s}" for c in range(2) for s in (0, 1)
        ]
        assert len({t.params["width"] for t in group.trials}) == 1
        assert len({t.params["lr"] for t in group.trials}) == 2  # two configurations
        assert group.pbt is not None and group.pbt.interval_epochs == 1
        assert group.pbt.quantile == 0.5 and group.pbt.mutations["lr"] == Range(1e-4, 1e-2, True)
        # The settings survive Tune's trip through JSON.
        assert GroupTrialConfig.from_dict(json.loads(json.dumps(population))) == group


def test_a_pbt_population_across_processes_is_queued_whole_and_never_withdrawn() -> None:
    # dqn does not group: its population is samples x seeds trials of one shape, each a
    # Tune trial carrying the population's settings and id. Trials finishing while others
    # are still queued (fewer slots than members) must not take the queued ones back: a
    # fixed budget that made all its configurations has not ended (a regression: they
    # were withdrawn and made again as new configurations, splitting the population).
    spec = _pbt_spec(
        "dqn",
        samples=4,
        pbt={"interval_epochs": 1, "quantile": 0.5},
        search_space={"dqn": {"hidden": {"choices": [32, 64]}}},
    )
    searcher = SweepSearcher(spec)
    first = [searcher.suggest(f"t{i}") for i in range(2)]  # two slots
    searcher.on_trial_complete("t0", {"val_sharpe": 1.0, "test_sharpe": 0.5})
    rest = [searcher.suggest(f"t{i}") for i in range(2, 5)]
    members = [s for s in first + rest if isinstance(s, dict)]
    assert rest[2] is None  # four members, no fifth
    assert [m["config_id"] for m in members] == [f"dqn-f32-c00{i}" for i in range(4)]
    assert {m["population"] for m in members} == {"dqn-f32-c000"}
    assert len({m["params"]["hidden"] for m in members}) == 1  # one shape
    assert all(
        TrialConfig.from_dict(m).pbt == TrialConfig.from_dict(members[0]).pbt for m in members
    )
    assert searcher.configs_made == [4]


@pytest.mark.parametrize("family", ["kan", "dqn"])
def test_several_populations_each_draw_their_own_shape(family: str) -> None:
    # samples 6 in populations of 2: three populations per precision, each one ask (its
    # shape drawn once and held within it), each its own population: a group trial
    # (kan) or members carrying their population's id (dqn).
    spec = _pbt_spec(
        family,
        samples=6,
        pbt={"interval_epochs": 1, "population_size": 2},
        search_space={family: {"hidden" if family == "dqn" else "width": {"low": 4, "high": 64}}},
    )
    shape = "hidden" if family == "dqn" else "width"
    searcher = SweepSearcher(spec)
    suggested = [searcher.suggest(f"t{i}") for i in range(8)]
    configs = [s for s in suggested if isinstance(s, dict)]
    if family == "kan":
        populations = [[t.to_dict() for t in GroupTrialConfig.from_dict(c).trials] for c in configs]
        assert all(GroupTrialConfig.from_dict(c).pbt is not None for c in configs)
    else:
        ids = sorted({c["population"] for c in configs})
        populations = [[c for c in configs if c["population"] == i] for i in ids]
    assert [len(p) for p in populations] == [2, 2, 2]
    for population in populations:
        assert len({t["params"][shape] for t in population}) == 1  # one shape within
    # Each population draws its own (random search over 4..64: three equal draws would
    # be a coincidence of about 1 in 3,600).
    assert len({p[0]["params"][shape] for p in populations}) > 1


def test_a_population_larger_than_a_group_is_queued_as_group_trials_of_one_population() -> None:
    spec = _pbt_spec(
        "kan",
        samples=3,
        seeds=[0, 1, 2],
        grouping={"group_size": 4},
        search_space={"kan": {"width": {"choices": [4, 8, 16]}}},
    )
    searcher = SweepSearcher(spec)
    suggested = [searcher.suggest(f"t{i}") for i in range(4)]
    groups = [GroupTrialConfig.from_dict(s) for s in suggested if isinstance(s, dict)]
    # 9 trials in groups of at most 4: 3 + 3 + 3, one population of one shape.
    assert [len(g.trials) for g in groups] == [3, 3, 3]
    assert {g.population for g in groups} == {"kan-f32-c000"}
    assert all(g.pbt is not None for g in groups)
    assert len({t.params["width"] for g in groups for t in g.trials}) == 1
    # Its groups split on a whole-GPU OOM (their halves meet on the board), unlike a
    # population that is one group trial.
    first = suggested[0]
    assert isinstance(first, dict)
    slugs = trial_slugs(first[GROUP_KEY])
    searcher.on_trial_complete(
        "t0",
        {
            "oom": 1,
            "oom_split": 1,
            "trials": {
                s: {"oom": 1, "oom_retry_gpu_fraction": 0.5, "gpu_type": "h200"} for s in slugs
            },
        },
    )
    spec_pbt = groups[0].pbt
    halves = [searcher.suggest(f"r{i}") for i in range(2)]
    assert all(isinstance(h, dict) for h in halves)
    held = [
        GroupTrialConfig.from_dict(h) if is_group_trial(h) else TrialConfig.from_dict(h)
        for h in halves
    ]  # type: ignore[arg-type]
    assert sorted(len(h.trials) if isinstance(h, GroupTrialConfig) else 1 for h in held) == [1, 2]
    assert {h.population for h in held} == {"kan-f32-c000"}
    assert all(h.pbt == spec_pbt for h in held)


def test_asha_across_populations_saves_the_rungs_with_the_searchers_state(tmp_path: Path) -> None:
    """With ``pbt.early_stopping = "asha"`` the rungs the populations ask are saved with the
    searcher's state (what ``hpo resume`` loads into the new board), as for ASHA per trial;
    a PBT sweep without it saves none."""
    rungs = {"milestones": [1, 2], "recorded": {}, "decisions": {"1": {"population x": False}}}
    for early_stopping, saved in (("asha", rungs), ("none", None)):
        spec = tiny_spec(
            tmp_path,
            families=["kan"],
            precisions=["f32"],
            samples=4,
            max_epochs=3,
            scheduler="pbt",
            pbt={"population_size": 2, "early_stopping": early_stopping},
            search_space={"kan": {"width": 4}},
        )
        searcher = SweepSearcher(spec)
        searcher.rungs = rungs  # as last saved (no board in this process)
        assert searcher.get_state()["rungs"] == saved
