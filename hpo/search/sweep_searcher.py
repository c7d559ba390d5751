"""One Ray Tune ``Searcher`` for a whole sweep: many models, precisions, seeds and pairs.

A sweep is a set of *streams*, each with its own parameter searcher (TPE, random or PSO)
over one model's space: one stream per (model, precision) normally, one per model in
compare mode. A stream's suggestion is a *configuration* (``config_id``) that fans out into
member trials, one per seed (and, in compare mode, per precision) with identical sampled
parameters; members that differ only in precision share a ``pair_id``. When every member
of a configuration has finished, the stream's searcher is told the mean of their finite
metric values.

Streams are served round-robin so every model progresses at once, and the searcher says
``FINISHED`` after ``samples`` configurations per stream. Its whole state is JSON (``save`` /
``restore``), written by Tune into the experiment directory, so ``hpo resume`` continues
the same search instead of restarting it.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from hpo.search import make_param_searcher
from hpo.search.param_searcher import ParamSearcher
from hpo.search.space import TrialSpace, trial_space
from hpo.spec import SweepSpec
from models import get_family
from trainables.config import GROUP_KEY, GroupTrialConfig, TrialConfig, is_group_trial, member_slug


@dataclass
class _Configuration:
    stream: int
    members: list[str]  # member keys "precision/seed"
    results: dict[str, float | None] = field(default_factory=dict)


class SweepSearcher(Searcher):
    STATE_VERSION = 2  # 2: configurations (config_id), where 1 called them groups
    CKPT_FILE_TMPL = "sweep-searcher-{}.json"  # JSON, not the base class's pickle name

    def __init__(self, spec: SweepSpec) -> None:
        super().__init__(metric=spec.metric, mode="max")
        self.spec = spec
        self.base = spec.trial_base()
        self.streams: list[tuple[str, str | None]] = []  # (model, precision or None)
        self.spaces: list[TrialSpace] = []
        self.searchers: list[ParamSearcher] = []
        for model in spec.models:
            space = trial_space(model, spec.search_space.get(model))
            precisions: list[str | None] = [None] if spec.compare else list(spec.precisions)
            for precision in precisions:
                index = len(self.streams)
                self.streams.append((model, precision))
                self.spaces.append(space)
                self.searchers.append(
                    make_param_searcher(spec.search, space, seed=spec.search_seed * 7919 + index)
                )
        self.configs_made = [0] * len(self.streams)
        self.next_stream = 0
        self.queue: deque[dict[str, Any]] = deque()
        self.configs: dict[str, _Configuration] = {}
        self.trial_member: dict[str, tuple[str, str]] = {}  # trial_id -> (config_id, member key)
        self.trial_config: dict[str, dict[str, Any]] = {}  # trial_id -> the config it was given
        self.trial_group: dict[str, list[str]] = {}  # group trial_id -> its members' keys

    # -- Tune's Searcher interface ---------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        return True  # everything comes from the sweep spec

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if not self.queue and not self._new_config():
            # Every configuration is out. Finished only when all have reported: until then a trial
            # may still come back for a retry (a CUDA OOM re-queues it with a larger share).
            return Searcher.FINISHED if self._all_reported() else None
        config = self.queue.popleft()
        if is_group_trial(config):
            self.trial_group[trial_id] = [m["member"] for m in config[GROUP_KEY]]
            self.trial_member[trial_id] = (config["config_id"], "")
        else:
            self.trial_member[trial_id] = (config["config_id"], config["member"])
        self.trial_config[trial_id] = config
        return config

    def _all_reported(self) -> bool:
        return all(len(g.results) == len(g.members) for g in self.configs.values())

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        located = self.trial_member.get(trial_id)
        if located is None:
            return
        if result and result.get("oom") and result.get("oom_retry_gpu_fraction"):
            # Ran out of GPU memory: the same member again, with at least the larger share
            # of the same type's GPU (the trial reports the type of the node it ran on).
            trial = TrialConfig.from_dict(self.trial_config[trial_id])
            ran_on = str(result.get("gpu_type") or "")
            retry = trial.with_floor(float(result["oom_retry_gpu_fraction"]), gpu_type=ran_on)
            self.queue.appendleft(retry.to_dict())
            return
        config_id, member = located
        group = self.configs[config_id]
        if trial_id in self.trial_group:  # a group trial: each member's own result
            reported = (result or {}).get("members") or {}
            for name in self.trial_group[trial_id]:
                entry = {} if error else reported.get(member_slug(name)) or {}
                value = entry.get(self.spec.metric)
                group.results[name] = float(value) if isinstance(value, int | float) else None
        else:
            value = None if (error or not result) else result.get(self.spec.metric)
            group.results[member] = float(value) if isinstance(value, int | float) else None
        if len(group.results) == len(group.members):
            finite = [v for v in group.results.values() if v is not None and math.isfinite(v)]
            self.searchers[group.stream].tell(
                config_id, sum(finite) / len(finite) if finite else None
            )

    # -- configurations --------------------------------------------------------------------
    def _new_config(self) -> bool:
        for _ in range(len(self.streams)):
            index = self.next_stream
            self.next_stream = (self.next_stream + 1) % len(self.streams)
            if self.configs_made[index] < self.spec.samples:
                self._emit(index)
                return True
        return False

    def _emit(self, index: int) -> None:
        model, precision = self.streams[index]
        number = self.configs_made[index]
        self.configs_made[index] += 1
        tag = model if precision is None else f"{model}-{precision}"
        config_id = f"{tag}-g{number:03d}"
        params = {**self.spaces[index].fixed, **self.searchers[index].ask(config_id)}
        precisions = list(self.spec.precisions) if precision is None else [precision]
        members = []
        trials: list[TrialConfig] = []
        for seed in self.spec.seeds:
            for p in precisions:
                member = f"{p}/{seed}"
                members.append(member)
                trials.append(
                    TrialConfig(
                        family=model,
                        precision=p,
                        seed=seed,
                        params=params,
                        base=self.base,
                        config_id=config_id,
                        pair_id=f"{config_id}-s{seed}",
                        member=member,
                    )
                )
        for queued in self._grouped(model, trials):
            self.queue.append(queued)
        self.configs[config_id] = _Configuration(stream=index, members=members)

    def _grouped(self, model: str, trials: list[TrialConfig]) -> list[dict[str, Any]]:
        """The trial dicts to queue: with ``fusion.group_size`` K > 1, the seeds of each
        precision in group trials of up to K (a lone member stays a plain trial); rl
        families always alone."""
        size = self.spec.fusion.group_size
        family = get_family(model)
        if size == 1 or family.kind == "rl" or not family.fuses:
            return [t.to_dict() for t in trials]
        out = []
        for p in dict.fromkeys(t.precision for t in trials):
            same = [t for t in trials if t.precision == p]
            for start in range(0, len(same), size):
                chunk = same[start : start + size]
                out.append(
                    chunk[0].to_dict()
                    if len(chunk) == 1
                    else GroupTrialConfig(tuple(chunk)).to_dict()
                )
        return out

    # -- state -----------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "version": self.STATE_VERSION,
            "configs_made": self.configs_made,
            "next_stream": self.next_stream,
            "queue": list(self.queue),
            "configs": {
                k: {"stream": g.stream, "members": g.members, "results": g.results}
                for k, g in self.configs.items()
            },
            "trial_member": self.trial_member,
            "trial_group": self.trial_group,
            "trial_config": self.trial_config,
            "searchers": [s.state() for s in self.searchers],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("version") != self.STATE_VERSION:
            raise ValueError(
                f"searcher state version {state.get('version')!r}, expected {self.STATE_VERSION}: "
                "the sweep was started by another version of foxhunt-hpo; resume it with that one"
            )
        self.configs_made = list(state["configs_made"])
        self.next_stream = int(state["next_stream"])
        self.queue = deque(state["queue"])
        self.configs = {
            k: _Configuration(stream=g["stream"], members=g["members"], results=g["results"])
            for k, g in state["configs"].items()
        }
        self.trial_member = {k: (v[0], v[1]) for k, v in state["trial_member"].items()}
        self.trial_config = dict(state.get("trial_config", {}))
        self.trial_group = {k: list(v) for k, v in state.get("trial_group", {}).items()}
        for searcher, saved in zip(self.searchers, state["searchers"], strict=True):
            searcher.load_state(saved)

    def save(self, checkpoint_path: str) -> None:
        Path(checkpoint_path).write_text(json.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        self.set_state(json.loads(Path(checkpoint_path).read_text()))

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the searcher with the experiment: carry the spec and the JSON state.
        return {"spec": self.spec.model_dump(), "state": self.get_state()}

    def __setstate__(self, payload: dict[str, Any]) -> None:
        self.__init__(SweepSpec.model_validate(payload["spec"]))  # type: ignore[misc]
        self.set_state(payload["state"])

    # -- reporting -------------------------------------------------------------------------
    def best_per_stream(self) -> list[dict[str, Any]]:
        rows = []
        for (model, precision), searcher in zip(self.streams, self.searchers, strict=True):
            best = searcher.best()
            rows.append({"model": model, "precision": precision, "best": best})
        return rows
