"""`fusion.group_size`: the searcher queues the seeds of a configuration (per precision) as
group trials of up to K members, is told each member's own result, and rl families stay
ungrouped; the spec refuses what groups cannot do yet."""

from __future__ import annotations

from typing import Any

import pytest
from ray.tune.search import Searcher

from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import SpecError, parse_spec
from trainables.config import GROUP_KEY, GroupTrialConfig, is_group_trial


def _spec(**overrides: Any) -> Any:
    payload = {
        "name": "groups",
        "models": ["kan", "dqn"],
        "precisions": ["f32", "bf16"],
        "compare": True,
        "samples": 1,
        "search": "random",
        "seeds": [0, 1, 2],
        "fusion": {"group_size": 2},
    }
    return parse_spec({**payload, **overrides})


def test_seeds_of_a_configuration_are_queued_as_groups_per_precision() -> None:
    searcher = SweepSearcher(_spec())
    suggested = [searcher.suggest(f"t{i}") for i in range(10)]
    trials = [s for s in suggested if isinstance(s, dict)]
    kan = [t for t in trials if t["model"] == "kan"]
    dqn = [t for t in trials if t["model"] == "dqn"]
    # kan: per precision, seeds 0 and 1 in one group, seed 2 alone.
    groups = [[m["member"] for m in t[GROUP_KEY]] for t in kan if is_group_trial(t)]
    assert sorted(groups) == [["bf16/0", "bf16/1"], ["f32/0", "f32/1"]]
    assert sorted(t["member"] for t in kan if not is_group_trial(t)) == ["bf16/2", "f32/2"]
    # dqn, an rl family: six trials alone.
    assert len(dqn) == 6 and not any(is_group_trial(t) for t in dqn)
    assert searcher.spec.n_trials == 12 and searcher.spec.n_tune_trials == len(trials) == 10
    # Every group decodes, and its members share the configuration's parameters.
    for t in kan:
        if is_group_trial(t):
            group = GroupTrialConfig.from_dict(t)
            assert {m.config_id for m in group.members} == {t["config_id"]}
            assert all(m.params == group.members[0].params for m in group.members)


def test_the_searcher_is_told_each_members_result() -> None:
    searcher = SweepSearcher(_spec(models=["kan"], precisions=["f32", "bf16"], seeds=[0, 1]))
    ids = {}
    while isinstance(suggestion := searcher.suggest(f"t{len(ids)}"), dict):
        ids[f"t{len(ids)}"] = suggestion
    assert len(ids) == 2 and all(is_group_trial(t) for t in ids.values())
    for trial_id, config in ids.items():
        precision = config["precision"]
        members = {f"{precision}-s0": {"val_sharpe": 1.0}, f"{precision}-s1": {"val_sharpe": 3.0}}
        searcher.on_trial_complete(trial_id, {"val_sharpe": 3.0, "members": members})
    (configuration,) = searcher.configs.values()
    assert configuration.results == {"f32/0": 1.0, "f32/1": 3.0, "bf16/0": 1.0, "bf16/1": 3.0}
    assert searcher.searchers[0].n_told == 1  # the configuration's mean, once
    assert searcher.suggest("t9") == Searcher.FINISHED
    restored = SweepSearcher(searcher.spec)
    restored.set_state(searcher.get_state())
    assert restored.trial_group == searcher.trial_group


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"compare": False, "scheduler": "asha"}, "fusion.group_size > 1 needs scheduler = 'fifo'"),
        ({"resources": {"gpu": "measured"}}, "fusion.group_size > 1 needs a fixed resources.gpu"),
    ],
)
def test_what_groups_cannot_do_yet_is_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _spec(**overrides)
