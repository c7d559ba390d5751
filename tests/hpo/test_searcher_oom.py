"""An out-of-memory trial comes back as the same member with a larger GPU share, and the
searcher only says FINISHED once every planned trial has reported."""

from __future__ import annotations

from ray.tune.search import Searcher

from cluster.packing import RETRY_FLOOR_KEY
from hpo.search.sweep_searcher import SweepSearcher
from hpo.spec import parse_spec


def test_oom_requeues_the_same_member_with_a_floor() -> None:
    spec = parse_spec(
        {"name": "oom", "models": ["kan"], "precisions": ["bf16"], "samples": 2, "search": "random"}
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
