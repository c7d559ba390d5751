"""SweepSearcher driven by hand (no Ray): resumable state, compare-mode fan-out, adapters.

The searcher is called the way Tune calls it (``suggest(trial_id)`` then
``on_trial_complete(trial_id, result)``), with a deterministic objective of the sampled
parameters, several trials outstanding at once and completions out of order.

Resume: a searcher saved mid-sweep (with trials outstanding) and restored into a fresh
``SweepSearcher(spec)``, through ``save``/``restore`` (the JSON file Tune writes into the
experiment directory) or through ``pickle`` (Tune pickles the search algorithm with the
experiment state), must continue the same search: its next suggestions equal those of an
uninterrupted searcher fed the same completions, with trials outstanding and completions
out of order: PSO (the swarm and its PCG64 state are JSON), random search, and TPE (told
and open trials replayed into a fresh study in their original order; each ask's sampler is
seeded from the search seed and the trial's number, so no sampler state is saved).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest

import models
from hpo.search import KINDS, make_param_searcher
from hpo.search.param_searcher import ParamSearcher
from hpo.search.space import TRAINER_SPACE, trial_space
from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import SweepSpec, parse_spec
from models import family_names, get_family
from models.base import Choice, Float, Int
from trainables.config import is_group_trial, split_trial_config
from trainables.trial_keys import trials_of

SEARCHERS = ("tpe", "pso", "random")


def _spec(search: str, **overrides: Any) -> SweepSpec:
    payload: dict[str, Any] = {
        "name": "resume-unit",
        "families": ["tft", "kan"],
        "precisions": ["f32"],
        "samples": 14,
        "search": search,
        "scheduler": "fifo",
        "search_seed": 3,
        # One configuration per Tune trial unless a test groups them (the grouped resume
        # cases below): most tests here follow single configurations.
        "grouping": {"group_size": 1},
        "search_space": {
            "tft": {"n_heads": 1, "lstm_layers": {"low": 1, "high": 2}},
            "kan": {
                "n_layers": 1,
                "spline_order": 3,
                "lr": {"low": 1e-4, "high": 1e-1, "log": True},
            },
        },
    }
    payload.update(overrides)
    return parse_spec(payload)


def _objective(config: dict[str, Any]) -> float:
    """A deterministic, smooth-ish function of every parameter kind (float, log, int, choice);
    keys a spec fixed or removed are skipped."""
    p = config["params"]
    value = -((math.log10(p["lr"]) + 2.5) ** 2)
    if p.get("weight_decay", 0.0) > 0:
        value -= 0.3 * (math.log10(p["weight_decay"]) + 4.0) ** 2
    if config["family"] == "tft":
        value -= abs(math.log2(p.get("d_model", 64) / 64)) + (p.get("dropout", 0.1) - 0.1) ** 2
        value += 0.2 * p.get("static_embedding", False) - 0.1 * p.get("lstm_layers", 1)
    else:
        value -= 0.1 * abs(p.get("window", 3) - 3) + 0.2 * abs(math.log2(p.get("width", 8) / 8))
        value -= 0.05 * abs(p.get("grid_size", 8) - 8)
    return value + 0.01 * config["seed"]


def _result(config: dict[str, Any]) -> dict[str, Any]:
    """What the trial reports at its end: its objective, or each trial's for a group."""
    if not is_group_trial(config):
        return {"val_sharpe": _objective(config), "epoch": 1}
    entries = {slug: {"val_sharpe": _objective(dict(t))} for _, t, slug in trials_of("t", config)}
    best = max(e["val_sharpe"] for e in entries.values())
    return {"val_sharpe": best, "epoch": 1, "trials": entries}


class Driver:
    """Feeds a searcher the way Tune would: ``concurrency`` trials out, completions in a
    fixed, seed-free pseudo-random order (so two drivers in the same state act alike).

    ``suggest`` returning ``None`` means "not now" (every group is out, some trials have
    not reported): the driver stops filling slots and completes a trial. Only
    ``FINISHED`` ends the run."""

    def __init__(self, concurrency: int = 3) -> None:
        self.concurrency = concurrency
        self.outstanding: dict[str, dict[str, Any]] = {}
        self.next_id = 0
        self.log: list[tuple[str, str, Any]] = []

    def step(self, searcher: SweepSearcher) -> bool:
        """One scheduling step: fill the free slots, then complete one trial. False once
        the searcher has said FINISHED (which needs every trial to have reported)."""
        while len(self.outstanding) < self.concurrency:
            trial_id = f"t{self.next_id:04d}"
            config = searcher.suggest(trial_id)
            if config == SweepSearcher.FINISHED:
                assert not self.outstanding, "FINISHED with trials still outstanding"
                return False
            if config is None:  # not now: wait for a completion
                assert self.outstanding, "'not now' with nothing left to report"
                break
            assert isinstance(config, dict)
            self.next_id += 1
            self.outstanding[trial_id] = config
            self.log.append(("suggest", trial_id, json.dumps(config, sort_keys=True)))
        ids = sorted(self.outstanding)
        done = ids[(self.next_id * 7) % len(ids)]  # out of order, deterministic
        config = self.outstanding.pop(done)
        result = _result(config)
        searcher.on_trial_complete(done, result)
        self.log.append(("complete", done, result["val_sharpe"]))
        return True

    def run(self, searcher: SweepSearcher, steps: int) -> list[tuple[str, str, Any]]:
        start = len(self.log)
        for _ in range(steps):
            if not self.step(searcher):
                break
        return self.log[start:]

    def copy(self) -> Driver:
        other = Driver(self.concurrency)
        other.outstanding = json.loads(json.dumps(self.outstanding))
        other.next_id = self.next_id
        return other


def _run_to_finish(searcher: SweepSearcher) -> list[dict[str, Any]]:
    """Tune's loop with no concurrency limit: take suggestions until the searcher says
    "not now" (``None``), report every outstanding trial, repeat until ``FINISHED``.
    Returns every suggested config in suggestion order."""
    configs: list[dict[str, Any]] = []
    outstanding: dict[str, dict[str, Any]] = {}
    while (config := searcher.suggest(f"t{len(configs)}")) != SweepSearcher.FINISHED:
        if config is None:
            assert outstanding, "'not now' with nothing left to report"
            for trial_id, pending in outstanding.items():
                searcher.on_trial_complete(trial_id, _result(pending))
            outstanding.clear()
            continue
        assert isinstance(config, dict)
        outstanding[f"t{len(configs)}"] = config
        configs.append(config)
    assert not outstanding, "FINISHED with trials still outstanding"
    return configs


def _suggestions(log: list[tuple[str, str, Any]]) -> list[str]:
    return [entry[2] for entry in log if entry[0] == "suggest"]


def _plain(state: dict[str, Any]) -> Any:
    return json.loads(json.dumps(state))


def _told_trials(searcher: SweepSearcher) -> list[int]:
    return [s.n_told for s in searcher.searchers]


def _resume_cases(
    search: str, tmp_path: Path, how: str, concurrency: int, group_size: int = 1
) -> tuple[list[str], list[str], SweepSearcher, SweepSearcher]:
    # Group trials of two configurations: twice the samples for as many Tune trials.
    spec = _spec(search, samples=14 * group_size, grouping={"group_size": group_size})
    uninterrupted, interrupted = SweepSearcher(spec), SweepSearcher(spec)
    drive_u, drive_i = Driver(concurrency), Driver(concurrency)
    first_u = drive_u.run(uninterrupted, 12)
    first_i = drive_i.run(interrupted, 12)
    assert first_u == first_i  # same seed, same feed
    if concurrency > 1:
        assert drive_i.outstanding, "the save should happen with trials outstanding"

    if how == "file":
        path = tmp_path / "searcher.json"
        interrupted.save(str(path))
        restored = SweepSearcher(spec)
        restored.restore(str(path))
    else:
        restored = pickle.loads(pickle.dumps(interrupted))
    assert isinstance(restored, SweepSearcher)
    assert _plain(restored.get_state()) == _plain(interrupted.get_state())
    assert _told_trials(restored) == _told_trials(interrupted)

    drive_r = drive_i.copy()  # the trials outstanding at the save report after the resume
    rest_u = drive_u.run(uninterrupted, 16)
    rest_r = drive_r.run(restored, 16)
    return _suggestions(rest_u), _suggestions(rest_r), uninterrupted, restored


# TPE orders its Parzen mixture components by trial number: the restored study replays
# told and still-open trials in their original ask order (numbers kept in the state), so
# even after out-of-order completions its next samples equal the uninterrupted run's.
RESUME_CASES = [
    pytest.param("pso", 3, 1, id="pso-concurrent"),
    pytest.param("random", 3, 1, id="random-concurrent"),
    pytest.param("tpe", 1, 1, id="tpe-sequential"),
    pytest.param("tpe", 3, 1, id="tpe-concurrent"),
    # Group trials: configurations of one shape asked together (the shape held for all
    # but the first), each trial's result told to its own configuration.
    pytest.param("pso", 3, 2, id="pso-groups"),
    pytest.param("tpe", 3, 2, id="tpe-groups"),
]


@pytest.mark.parametrize("how", ["file", "pickle"])
@pytest.mark.parametrize(("search", "concurrency", "group_size"), RESUME_CASES)
def test_resume_continues_the_same_search(
    search: str, concurrency: int, group_size: int, how: str, tmp_path: Path
) -> None:
    after_u, after_r, uninterrupted, restored = _resume_cases(
        search, tmp_path, how, concurrency, group_size
    )
    assert len(after_u) >= 10, "the comparison should cover many suggestions after the resume"
    assert after_r == after_u
    assert _told_trials(restored) == _told_trials(uninterrupted)
    for a, b in zip(uninterrupted.searchers, restored.searchers, strict=True):
        assert a.best() == b.best()


@pytest.mark.parametrize("how", ["file", "pickle"])
def test_restored_tpe_study_holds_the_whole_history(how: str, tmp_path: Path) -> None:
    """The regression Ray once had (OptunaSearch state silently dropped on restore): the
    restored studies hold every told trial with its value, and TPE samples from them."""
    spec = _spec("tpe")
    searcher = SweepSearcher(spec)
    drive = Driver()
    drive.run(searcher, 12)
    told = _told_trials(searcher)
    assert min(told) >= 4  # past TPE's 4 random start-up trials in every stream
    if how == "file":
        path = tmp_path / "searcher.json"
        searcher.save(str(path))
        restored = SweepSearcher(spec)
        restored.restore(str(path))
    else:
        restored = pickle.loads(pickle.dumps(searcher))
    for before, after, n in zip(searcher.searchers, restored.searchers, told, strict=True):
        complete = after.study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(complete) == n
        values = sorted(t.value for t in complete)
        assert values == sorted(t["value"] for t in before.state()["told"])
        assert after.best() == before.best()

    # The history is what TPE samples from: the same seed without the told trials (what a
    # searcher that dropped its study would hold) suggests something else.
    state = restored.get_state()
    amnesiac_state = _plain(state)
    for saved in amnesiac_state["searchers"]:
        saved["told"] = []
    amnesiac = SweepSearcher(spec)
    amnesiac.set_state(amnesiac_state)
    with_history = [restored.suggest(f"n{i}") for i in range(4)]
    without = [amnesiac.suggest(f"n{i}") for i in range(4)]
    assert [c["params"] for c in with_history] != [c["params"] for c in without]  # type: ignore[index]


def test_pickle_keeps_state_of_a_fresh_and_a_finished_searcher() -> None:
    spec = _spec("pso", samples=3)
    fresh = SweepSearcher(spec)
    assert _plain(pickle.loads(pickle.dumps(fresh)).get_state()) == _plain(fresh.get_state())
    drive = Driver()
    while drive.step(fresh):
        pass
    assert fresh.suggest("late") == SweepSearcher.FINISHED
    clone = pickle.loads(pickle.dumps(fresh))
    assert _plain(clone.get_state()) == _plain(fresh.get_state())
    assert clone.suggest("late-2") == SweepSearcher.FINISHED


def test_restore_rejects_another_version(tmp_path: Path) -> None:
    searcher = SweepSearcher(_spec("pso"))
    state = searcher.get_state()
    state["version"] = 99
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="version"):
        SweepSearcher(_spec("pso")).restore(str(path))


@pytest.mark.parametrize("kind", KINDS)
def test_every_param_searcher_keeps_the_protocol(kind: str) -> None:
    """The ParamSearcher contract, the same for every kind: a failed tell counts but is
    never best, a second tell of a token is ignored, best is the best told value, and a
    fresh searcher loaded from ``state()`` (JSON) asks exactly what the original asks."""
    space = trial_space("kan", {"n_layers": 1, "spline_order": 3})
    searcher = make_param_searcher(kind, space, seed=5)
    assert isinstance(searcher, ParamSearcher)
    asked = {f"g{i}": searcher.ask(f"g{i}") for i in range(6)}
    assert all(set(p) == set(space.dims) for p in asked.values())
    assert searcher.best() is None
    searcher.tell("g0", None)
    searcher.tell("g1", math.nan)
    assert searcher.n_told == 2 and searcher.best() is None
    values = {"g2": 0.5, "g3": 2.0, "g4": -1.0}
    for token, value in values.items():
        searcher.tell(token, value)
    searcher.tell("g3", 9.0)  # already told: ignored
    assert searcher.n_told == 5
    assert searcher.best() == (asked["g3"], 2.0)
    clone = make_param_searcher(kind, space, seed=999)  # everything must come from the state
    clone.load_state(json.loads(json.dumps(searcher.state())))
    assert clone.n_told == 5 and clone.best() == searcher.best()
    clone.tell("g5", 1.0)  # the outstanding token survived the round trip
    searcher.tell("g5", 1.0)
    assert [clone.ask(f"n{i}") for i in range(4)] == [searcher.ask(f"n{i}") for i in range(4)]


def test_unknown_search_kind_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown search algorithm 'grid'; allowed: \['tpe'"):
        make_param_searcher("grid", trial_space("kan"), seed=0)


# -- compare mode ------------------------------------------------------------------------------


@pytest.mark.parametrize("search", SEARCHERS)
def test_compare_mode_fans_out_pairs_and_finishes(search: str) -> None:
    spec = _spec(
        search, compare=True, precisions=["f32", "bf16"], seeds=[0, 1], samples=3, scheduler="fifo"
    )
    searcher = SweepSearcher(spec)
    assert searcher.streams == [("tft", None), ("kan", None)]  # one stream per family
    configs: dict[str, dict[str, Any]] = {}
    for i in range(spec.n_trials):
        config = searcher.suggest(f"t{i}")
        assert isinstance(config, dict), f"FINISHED early, after {i} of {spec.n_trials}"
        configs[f"t{i}"] = config
    # Every group is out but none has reported: "not now", not FINISHED (a trial may
    # still come back for a retry).
    assert searcher.suggest("one-too-many") is None
    assert spec.n_trials == 2 * 3 * 2 * 2

    groups: dict[str, list[dict[str, Any]]] = {}
    for config in configs.values():
        groups.setdefault(config["config_id"], []).append(config)
    assert len(groups) == 2 * 3  # samples groups per stream
    per_model = {m: sum(1 for g in groups.values() if g[0]["family"] == m) for m in ("tft", "kan")}
    assert per_model == {"tft": 3, "kan": 3}
    for trials in groups.values():
        assert len(trials) == 4  # precisions x seeds
        assert {(c["precision"], c["seed"]) for c in trials} == {
            ("f32", 0),
            ("bf16", 0),
            ("f32", 1),
            ("bf16", 1),
        }
        assert all(c["params"] == trials[0]["params"] for c in trials)
        assert len({c["family"] for c in trials}) == 1
        for seed in (0, 1):
            pair = [c for c in trials if c["seed"] == seed]
            assert len(pair) == 2 and pair[0]["pair_id"] == pair[1]["pair_id"]
        assert len({c["pair_id"] for c in trials}) == 2  # seeds are separate pairs
    # Streams are served round-robin, so both families progress at once.
    order = [configs[f"t{i}"]["family"] for i in range(0, spec.n_trials, 4)]
    assert order == ["tft", "kan"] * 3

    # The stream's searcher is told once per group, after its last trial, with the mean
    # of the trials' finite values (a failed trial does not count).
    first = configs["t0"]["config_id"]
    ids = [t for t, c in configs.items() if c["config_id"] == first]
    stream = searcher.searchers[0]
    values = [1.0, 2.0, None, 4.0]
    for trial_id, value in zip(ids, values, strict=True):
        assert stream.n_told == 0
        result = None if value is None else {"val_sharpe": value}
        searcher.on_trial_complete(trial_id, result, error=value is None)
    assert stream.n_told == 1
    best = stream.best()
    assert best is not None
    assert best[1] == pytest.approx((1.0 + 2.0 + 4.0) / 3)
    assert best[0] == {k: v for k, v in configs["t0"]["params"].items() if k in stream.dims}

    # FINISHED only once every trial of every group has reported.
    rest = [t for t in configs if t not in ids]
    for trial_id in rest[:-1]:
        searcher.on_trial_complete(trial_id, {"val_sharpe": _objective(configs[trial_id])})
    assert searcher.suggest("still-one-out") is None
    searcher.on_trial_complete(rest[-1], {"val_sharpe": _objective(configs[rest[-1]])})
    assert searcher.suggest("after-all-reported") == SweepSearcher.FINISHED
    assert _told_trials(searcher) == [3, 3]  # samples groups per stream, each told once


def test_per_precision_streams_without_compare() -> None:
    spec = _spec("random", precisions=["f32", "bf16"], seeds=[0, 1], samples=2)
    searcher = SweepSearcher(spec)
    assert searcher.streams == [("tft", "f32"), ("tft", "bf16"), ("kan", "f32"), ("kan", "bf16")]
    configs = _run_to_finish(searcher)
    assert len(configs) == spec.n_trials == 2 * 2 * 2 * 2
    assert _told_trials(searcher) == [2, 2, 2, 2]
    for config in configs:  # each group: one precision, one trial per seed
        group = [c for c in configs if c["config_id"] == config["config_id"]]
        assert {c["precision"] for c in group} == {config["precision"]}
        assert sorted(c["seed"] for c in group) == [0, 1]


# -- adapters ----------------------------------------------------------------------------------


def _assert_in(dims: dict[str, Any], params: dict[str, Any]) -> None:
    for name, dim in dims.items():
        assert dim.contains(params[name]), (name, params[name], dim)


@pytest.mark.parametrize("search", SEARCHERS)
def test_every_family_space_comes_from_the_registry(search: str) -> None:
    names = list(family_names())
    spec = _spec(search, families=names, samples=2, search_space={})
    searcher = SweepSearcher(spec)
    assert [m for m, _ in searcher.streams] == names
    for (model, _), space, param_searcher in zip(
        searcher.streams, searcher.spaces, searcher.searchers, strict=True
    ):
        family = get_family(model)
        assert space.dims == {**TRAINER_SPACE, **family.search_space}
        assert space.fixed == {}
        assert param_searcher.dims == space.dims
    seen = set()
    for config in _run_to_finish(searcher):
        seen.add(config["config_id"])
        family = get_family(config["family"])
        params = config["params"]
        assert set(params) == set(TRAINER_SPACE) | set(family.search_space)
        _assert_in({**TRAINER_SPACE, **family.search_space}, params)
        split_trial_config(config["family"], params)  # every key is a real setting
    assert len(seen) == 2 * len(names)


def test_searcher_reads_the_registry_not_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing a family's adapter in the registry changes what every searcher samples."""
    kan_module = __import__(models.FAMILY_MODULES["kan"], fromlist=["FAMILY"])
    narrowed = dataclasses.replace(
        kan_module.FAMILY, search_space={"width": Choice((5, 7)), "grid_size": Int(4, 4)}
    )
    monkeypatch.setattr(kan_module, "FAMILY", narrowed)
    for search in SEARCHERS:
        spec = _spec(search, families=["kan"], search_space={}, samples=4)
        searcher = SweepSearcher(spec)
        assert searcher.spaces[0].dims == {**TRAINER_SPACE, **narrowed.search_space}
        for i in range(4):
            config = searcher.suggest(f"t{i}")
            assert isinstance(config, dict)
            assert set(config["params"]) == {"lr", "weight_decay", "width", "grid_size"}
            assert config["params"]["width"] in (5, 7) and config["params"]["grid_size"] == 4


@pytest.mark.parametrize("search", SEARCHERS)
def test_spec_overrides_fixed_keys_and_added_settings(search: str) -> None:
    overrides = {
        "tft": {
            "d_model": {"choices": [16, 32]},  # narrowed categorical
            "dropout": 0.05,  # searched by the adapter, fixed here
            "lr": {"low": 1e-3, "high": 2e-3},  # trainer dimension, linear now
            "weight_decay": 0.0,  # trainer dimension, fixed
            "batch_size": {"choices": [32, 64]},  # not searched by default: added
            "lookback": 24,  # not searched: added as a fixed key
        },
        "kan": {
            "grid_range": {"low": 1.0, "high": 3.0},  # a model setting the adapter omits
            "width": {"low": 4, "high": 8},  # Int stays Int
            "n_layers": 2,
            "data.signal": 0.2,  # data settings may be fixed per family too
        },
    }
    spec = _spec(search, search_space=overrides, samples=6)
    searcher = SweepSearcher(spec)
    tft_space, kan_space = searcher.spaces
    assert tft_space.fixed == {"dropout": 0.05, "weight_decay": 0.0, "lookback": 24}
    assert kan_space.fixed == {"n_layers": 2, "data.signal": 0.2}
    assert tft_space.dims["d_model"] == Choice((16, 32))
    assert tft_space.dims["lr"] == Float(1e-3, 2e-3, log=False)
    assert tft_space.dims["batch_size"] == Choice((32, 64))
    assert "dropout" not in tft_space.dims and "weight_decay" not in tft_space.dims
    assert kan_space.dims["grid_range"] == Float(1.0, 3.0)
    assert kan_space.dims["width"] == Int(4, 8)
    assert kan_space.dims["window"] == get_family("kan").search_space["window"]  # untouched

    drive = Driver(concurrency=2)
    while drive.step(searcher):
        pass
    configs = [json.loads(entry[2]) for entry in drive.log if entry[0] == "suggest"]
    assert len(configs) == spec.n_trials
    for config in configs:
        space = tft_space if config["family"] == "tft" else kan_space
        params = config["params"]
        assert {k: params[k] for k in space.fixed} == space.fixed  # fixed keys pass through
        assert set(params) == set(space.dims) | set(space.fixed)
        _assert_in(space.dims, params)
        train, model_values, data_values = split_trial_config(config["family"], params)
        if config["family"] == "kan":
            assert data_values == {"signal": 0.2} and model_values["n_layers"] == 2
        else:
            assert train["lookback"] == 24 and train["batch_size"] in (32, 64)


def test_unknown_override_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"search_space\.kan\.not_a_setting"):
        trial_space("kan", {"not_a_setting": 1})
    with pytest.raises(ValueError, match=r"choices"):
        trial_space("kan", {"width": {"choices": []}})
