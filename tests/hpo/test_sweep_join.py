"""Starting or joining Ray for a sweep (hpo.sweep._join_cluster): a local Ray's trials start
on the workers it prestarted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from ray.tune.execution import class_cache

import cluster.connect
import cluster.preflight
from cluster.connect import ClusterInfo
from hpo import sweep
from tests.hpo.sweep_helpers import tiny_spec


class _Trainable:
    pass


def _trial_runtime_env() -> Any:
    """The runtime_env Tune gives a trial's actor (a worker serves only its own)."""
    return class_cache._ActorClassCache().get(_Trainable)._default_options["runtime_env"]


@pytest.fixture
def join(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """_join_cluster with Ray replaced: a local Ray started here, or a cluster joined."""
    monkeypatch.setattr(class_cache, "DEFAULT_ENV_VARS", {"PL_DISABLE_FORK": "1"})
    monkeypatch.delenv("PL_DISABLE_FORK", raising=False)
    monkeypatch.setattr(cluster.preflight, "preflight", lambda spec, info, storage: None)

    def join(address: str | None) -> None:
        info = ClusterInfo(address, {"CPU": 2.0}, 1, started_here=address is None)
        monkeypatch.setattr(cluster.connect, "ensure_ray", lambda address, **kw: info)
        sweep._join_cluster(tiny_spec(tmp_path), str(tmp_path), address)

    return join


def test_a_local_rays_trials_get_no_runtime_env_of_their_own(join: Any) -> None:
    join(None)
    assert _trial_runtime_env() == {}  # none: a prestarted worker serves it
    assert os.environ["PL_DISABLE_FORK"] == "1"  # inherited by the workers instead


def test_joined_to_a_cluster_trials_keep_tunes_runtime_env(join: Any) -> None:
    join("10.0.0.5:6379")
    assert _trial_runtime_env() == {"env_vars": {"PL_DISABLE_FORK": "1"}}


def test_a_value_the_user_set_keeps_tunes_runtime_env(
    join: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PL_DISABLE_FORK", "0")
    join(None)
    assert _trial_runtime_env() == {"env_vars": {"PL_DISABLE_FORK": "1"}}  # as Tune sets it
