"""An out-of-memory trial comes back as the same trial with a larger GPU share, and the
searcher only says FINISHED once every planned trial has reported; what the searcher emits
is the trial codec's dict form."""

from __future__ import annotations

from typing import Any

import pytest
from ray.tune.search import Searcher

from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import parse_spec
from trainables.config import (
    GROUP_KEY,
    RETRY_FLOOR_KEY,
    RETRY_GPU_TYPE_KEY,
    GroupTrialConfig,
    TrialConfig,
    is_group_trial,
)


def test_oom_requeues_the_same_trial_with_a_floor() -> None:
    spec = parse_spec(  # two trials alone (group trials of one shape would hold both)
        {
            "name": "oom",
            "families": ["kan"],
            "precisions": ["bf16"],
            "samples": 2,
            "search": "random",
            "grouping": {"group_size": 1},
        }
    )
    searcher = SweepSearcher(spec)
    first, second = searcher.suggest("t1"), searcher.suggest("t2")
    assert isinstance(first, dict) and isinstance(second, dict)
    assert searcher.suggest("t3") is None  # all groups out, none reported: wait, not FINISHED
    searcher.on_trial_complete(
        "t1", {"oom": 1, "oom_retry_gpu_fraction": 0.3, "val_sharpe": float("nan")}
    )
    retry = searcher.suggest("t4")
    assert isinstance(retry, dict)
    assert retry["params"] == first["params"]
    assert (retry["precision"], retry["seed"]) == (first["precision"], first["seed"])
    assert retry[RETRY_FLOOR_KEY] == 0.3
    searcher.on_trial_complete("t4", {"val_sharpe": 1.0})
    assert searcher.suggest("t5") is None  # t2 still running
    searcher.on_trial_complete("t2", {"val_sharpe": 0.5})
    assert searcher.suggest("t6") == Searcher.FINISHED
    assert searcher.searchers[0].n_told == 2  # the OOM itself was not told as a result


def test_an_oom_retry_names_the_gpu_type_it_ran_out_of_memory_on() -> None:
    """The floor is a share of that type's GPU, so the retry's config carries the type
    (the packer of a resumed sweep has placed nothing yet)."""
    spec = parse_spec(
        {
            "name": "oom",
            "families": ["kan"],
            "precisions": ["bf16"],
            "samples": 1,
            "search": "random",
        }
    )
    searcher = SweepSearcher(spec)
    first = searcher.suggest("t1")
    assert isinstance(first, dict) and RETRY_GPU_TYPE_KEY not in first
    searcher.on_trial_complete("t1", {"oom": 1, "oom_retry_gpu_fraction": 0.3, "gpu_type": "L4"})
    retry = searcher.suggest("t2")
    assert isinstance(retry, dict)
    assert retry[RETRY_GPU_TYPE_KEY] == "L4" and retry[RETRY_FLOOR_KEY] == 0.3
    assert TrialConfig.from_dict(retry).gpu_type == "L4"


def test_trial_dicts_round_trip_through_the_codec() -> None:
    """What the searcher emits is exactly ``TrialConfig.to_dict`` (first tries and OOM
    retries), and decodes to the TrainConfig the spec and the sampled params describe."""
    spec = parse_spec(
        {
            "name": "codec",
            "families": ["kan"],
            "precisions": ["bf16"],
            "samples": 1,
            "search": "random",
            "max_epochs": 3,
            "trainer": {"lookback": 12, "batch_size": 16},
            "walk_forward": {"n_folds": 1, "embargo": 2},
            "data": {"n_assets": 3, "n_bars": 800},
            "search_space": {"kan": {"width": 5}},
        }
    )
    searcher = SweepSearcher(spec)
    first = searcher.suggest("t1")
    assert isinstance(first, dict)
    searcher.on_trial_complete("t1", {"oom": 1, "oom_retry_gpu_fraction": 0.25})
    retry = searcher.suggest("t2")
    assert isinstance(retry, dict)
    for emitted in (first, retry):
        assert TrialConfig.from_dict(emitted).to_dict() == emitted
    decoded = TrialConfig.from_dict(retry)
    assert decoded.gpu_fraction_floor == 0.25 and RETRY_FLOOR_KEY not in first
    config = decoded.train_config()
    assert (config.family, config.precision, config.seed, config.epochs) == ("kan", "bf16", 0, 3)
    assert (config.lookback, config.batch_size, config.n_folds, config.embargo) == (12, 16, 1, 2)
    assert (config.data.n_assets, config.data.n_bars) == (3, 800)
    assert config.lr == first["params"]["lr"] and config.model_config["width"] == 5


def test_codec_names_missing_and_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"missing \['params', 'base'\], unknown \['paramz'\]"):
        TrialConfig.from_dict({"family": "kan", "precision": "f32", "seed": 0, "paramz": {}})


def _group_spec() -> Any:
    return parse_spec(
        {
            "name": "oom",
            "families": ["kan"],
            "precisions": ["bf16"],
            "samples": 1,
            "search": "random",
            "seeds": [0, 1, 2, 3, 4],
            "grouping": {"group_size": 8},
        }
    )


def test_a_group_oom_retries_its_training_trials_as_a_group_with_a_floor() -> None:
    """The trials that ran out of memory come back as one group trial, each with the
    larger share as its floor and the GPU type; a trial that had ended keeps its result."""
    searcher = SweepSearcher(_group_spec())
    group = searcher.suggest("t1")
    assert isinstance(group, dict) and len(group[GROUP_KEY]) == 5
    slugs = GroupTrialConfig.from_dict(group).slugs()
    oom = {"oom": 1, "oom_retry_gpu_fraction": 0.5, "gpu_type": "L4"}
    entries = {slug: dict(oom) for slug in slugs}
    entries[slugs[2]] = {"val_sharpe": 0.7, "stopped": 1, "epoch": 1}
    searcher.on_trial_complete("t1", {"oom": 1, **oom, "trials": entries})
    retry = searcher.suggest("t2")
    assert isinstance(retry, dict) and is_group_trial(retry)
    again = GroupTrialConfig.from_dict(retry).trials
    assert [m.seed for m in again] == [0, 1, 3, 4]
    assert {(m.gpu_fraction_floor, m.gpu_type) for m in again} == {(0.5, "L4")}
    assert searcher.suggest("t3") is None  # the retry has not reported
    retry_entries = {s: {"val_sharpe": 1.0} for s in GroupTrialConfig.from_dict(retry).slugs()}
    searcher.on_trial_complete("t2", {"val_sharpe": 1.0, "trials": retry_entries})
    assert searcher.suggest("t4") == Searcher.FINISHED
    # Told once, the mean of all five trials: the stopped one's 0.7 and the retries' 1.0.
    assert searcher.searchers[0].n_told == 1


def test_a_group_that_does_not_fit_a_whole_gpu_is_split_in_two() -> None:
    searcher = SweepSearcher(_group_spec())
    group = searcher.suggest("t1")
    assert isinstance(group, dict)
    slugs = GroupTrialConfig.from_dict(group).slugs()
    split = {"oom": 1, "oom_split": 1, "oom_retry_gpu_fraction": 0.5}
    searcher.on_trial_complete("t1", {**split, "trials": {s: dict(split) for s in slugs}})
    halves = []
    for trial_id in ("t2", "t3"):
        half = searcher.suggest(trial_id)
        assert isinstance(half, dict) and is_group_trial(half)
        halves.append(GroupTrialConfig.from_dict(half).trials)
    assert [[m.seed for m in half] for half in halves] == [[0, 1, 2], [3, 4]]
    assert {m.gpu_fraction_floor for half in halves for m in half} == {0.5}
    assert searcher.suggest("t4") is None


def test_the_newest_attempt_of_a_trial_counts_even_at_a_smaller_floor() -> None:
    """A group ran out of memory at 0.6, again at a whole GPU (its retry's floor 1.0), and
    was split: each half asks half a GPU (floor 0.5). The half's attempt replaces the
    failed ones in `hpo status` and the sweep's count, though its floor is smaller."""
    from hpo.trials import TrialRow, TrialStatus, latest_attempts

    def row(trial_id: str, attempt: int, floor: float, oom: float | None) -> TrialRow:
        return TrialRow(
            trial_id=trial_id, family="kan", precision="bf16", seed=0, pair_id="p",
            status=TrialStatus("TERMINATED"), epochs=2, val_sharpe=None if oom else 1.0,
            test_sharpe=None, fell_back_to_f32=False, diverged=False, params={},
            checkpoint=None, config_id="kan-c000", attempt=attempt,
            gpu_fraction_floor=floor, oom_retry_gpu_fraction=oom,
        )  # fmt: skip

    first, whole, half = row("t1", 0, 0.0, 1.0), row("t2", 1, 1.0, 0.5), row("t3", 2, 0.5, None)
    assert latest_attempts([half, whole, first]) == [half]
    assert half.done
    # The searcher numbers them: each retry one attempt after the one that ran out.
    config = TrialConfig.from_dict(_group_spec_trial())
    retry = config.with_floor(1.0).with_floor(0.5)
    assert retry.attempt == 2 and TrialConfig.from_dict(retry.to_dict()).attempt == 2
    assert "oom_attempt" not in config.to_dict()  # a first attempt's dict has no attempt key


def _group_spec_trial() -> dict[str, Any]:
    searcher = SweepSearcher(_group_spec())
    group = searcher.suggest("t1")
    assert isinstance(group, dict)
    return group[GROUP_KEY][0]


def _population_spec() -> Any:
    return parse_spec(
        {
            "name": "oom",
            "families": ["kan"],
            "precisions": ["bf16"],
            "samples": 2,
            "seeds": [0, 1],
            "search": "random",
            "scheduler": "pbt",
            "max_epochs": 3,
            "grouping": {"group_size": 4},
        }
    )


def test_a_population_that_does_not_fit_a_whole_gpu_is_not_split() -> None:
    """Halves would be two independent populations (or a one-trial half without PBT): the
    population's trials that ran out of memory end as failures, nothing is re-queued, and
    the stream is told its outcomes (the sweep finishes)."""
    searcher = SweepSearcher(_population_spec())
    population = searcher.suggest("t1")
    assert isinstance(population, dict) and GroupTrialConfig.from_dict(population).pbt
    slugs = GroupTrialConfig.from_dict(population).slugs()
    split = {"oom": 1, "oom_split": 1, "oom_retry_gpu_fraction": 0.5, "val_sharpe": float("nan")}
    searcher.on_trial_complete("t1", {**split, "trials": {s: dict(split) for s in slugs}})
    assert searcher.suggest("t2") == Searcher.FINISHED
    assert searcher.searchers[0].n_told == 2  # both configurations, without a value


def test_a_population_retried_at_a_larger_share_stays_one_population() -> None:
    searcher = SweepSearcher(_population_spec())
    population = searcher.suggest("t1")
    assert isinstance(population, dict)
    slugs = GroupTrialConfig.from_dict(population).slugs()
    oom = {"oom": 1, "oom_retry_gpu_fraction": 0.5}
    searcher.on_trial_complete("t1", {**oom, "trials": {s: dict(oom) for s in slugs}})
    retry = searcher.suggest("t2")
    assert isinstance(retry, dict)
    again = GroupTrialConfig.from_dict(retry)
    assert len(again.trials) == 4 and again.pbt == GroupTrialConfig.from_dict(population).pbt
