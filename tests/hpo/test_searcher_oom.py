"""An out-of-memory trial comes back as the same member with a larger GPU share, and the
searcher only says FINISHED once every planned trial has reported; what the searcher emits
is the trial codec's dict form."""

from __future__ import annotations

import pytest
from ray.tune.search import Searcher

from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import parse_spec
from trainables.config import RETRY_FLOOR_KEY, RETRY_GPU_TYPE_KEY, TrialConfig


def test_oom_requeues_the_same_member_with_a_floor() -> None:
    spec = parse_spec(  # two trials alone (group trials of one shape would hold both)
        {
            "name": "oom",
            "models": ["kan"],
            "precisions": ["bf16"],
            "samples": 2,
            "search": "random",
            "fusion": {"group_size": 1},
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
    assert retry["params"] == first["params"] and retry["member"] == first["member"]
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
        {"name": "oom", "models": ["kan"], "precisions": ["bf16"], "samples": 1, "search": "random"}
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
            "models": ["kan"],
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
        TrialConfig.from_dict({"model": "kan", "precision": "f32", "seed": 0, "paramz": {}})
