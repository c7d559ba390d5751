"""One Ray Tune ``Searcher`` for a whole sweep: many families, precisions, seeds and pairs.

A sweep is a set of *streams*, each with its own parameter searcher (TPE, random or PSO)
over one family's space: one stream per (family, precision) normally, one per family in
compare mode. A stream's suggestion is a *configuration* (``config_id``) that fans out into
its trials, one per seed (and, in compare mode, per precision) with identical sampled
parameters; trials that differ only in precision share a ``pair_id``. When every trial
of a configuration has finished, the stream's searcher is told the mean of their finite
metric values.

Group trials (``grouping.group_size`` K > 1, a family that fuses): a search stream asks
for :meth:`~hpo.spec.SweepSpec.configs_per_ask` configurations of one shape at a time, the
first searched whole and the others with every setting but those its trials may differ in
(:func:`trainables.trial_keys.per_trial_settings`: seed, lr, weight decay, the family's own)
held at the first's; one ask's trials of one precision (configurations x seeds, at most
K, split evenly) train as one group trial. Compare mode holds nothing: it groups the
seeds of each configuration, and asks for several configurations at a time only where
nothing else is searched.

How many configurations a stream gets is its budget's (:mod:`hpo.search.budget`, "the
sweep asks for more work after a result"): ``samples`` each, or in a sequential comparison
configurations up to each family's next look until its verdict is decided. Streams that
may make a configuration are served round-robin so every family progresses at once (a
decided family's slots go to the others), a stream that ended has its configurations
still queued withdrawn, and the searcher says ``FINISHED`` once every stream is done and
every trial reported. What a budget reports (a sequential family's looks) goes to the
searcher's :attr:`~SweepSearcher.listeners`. Its whole state is JSON (``save`` /
``restore``), written by Tune into the experiment directory, so ``hpo resume`` continues
the same search, and the same looks, instead of restarting it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from hpo.rungs import board_state, load_board
from hpo.search import make_param_searcher
from hpo.search.budget import Outcome, PolicyEvent, StreamBudget, TrialOutcome, make_budgets
from hpo.search.param_searcher import ParamSearcher
from hpo.search.space import TrialSpace, trial_space
from hpo.spec import SweepSpec
from models import get_family
from trainables.config import GROUP_KEY, GroupTrialConfig, TrialConfig, is_group_trial
from trainables.pbt import PbtSettings
from trainables.trial_keys import per_trial_settings, precision_seed, trial_slugs


@dataclass
class _Configuration:
    stream: int
    trials: list[str]  # each trial's place in it, "precision/seed" (trial_keys.precision_seed)
    results: dict[str, float | None] = field(default_factory=dict)  # the searched metric
    tests: dict[str, float | None] = field(default_factory=dict)  # test Sharpe, for budgets


class SweepSearcher(Searcher):
    STATE_VERSION = 4
    CKPT_FILE_TMPL = "sweep-searcher-{}.json"  # JSON, not the base class's pickle name

    def __init__(self, spec: SweepSpec) -> None:
        super().__init__(metric=spec.metric, mode="max")
        self.spec = spec
        self.base = spec.trial_base()
        self.streams: list[tuple[str, str | None]] = []  # (family, precision or None)
        self.spaces: list[TrialSpace] = []
        self.searchers: list[ParamSearcher] = []
        for family in spec.families:
            space = trial_space(family, spec.search_space.get(family))
            precisions: list[str | None] = [None] if spec.compare else list(spec.precisions)
            for precision in precisions:
                index = len(self.streams)
                self.streams.append((family, precision))
                self.spaces.append(space)
                self.searchers.append(
                    make_param_searcher(spec.search, space, seed=spec.search_seed * 7919 + index)
                )
        # What the spec decides per family, once (it builds each family's space to know):
        # whether its trials group, and how many configurations of one shape to ask at once.
        self.grouped = {f: spec.groups(f) for f in spec.families}
        self.per_ask = {f: spec.configs_per_ask(f) for f in spec.families}
        self.varying = {f: per_trial_settings(get_family(f)) for f in spec.families}
        # Population-based training: each family's population settings (its group trials
        # carry them, or each trial where the population spans Tune trials; scheduler = "pbt"
        # makes one population per stream, one ask).
        self.pbt: dict[str, PbtSettings | None] = {
            f: _pbt_settings(spec, f) if spec.scheduler == "pbt" else None for f in spec.families
        }
        self.configs_made = [0] * len(self.streams)
        names = [m if p is None else f"{m}-{p}" for m, p in self.streams]
        self.budgets: list[StreamBudget] = make_budgets(spec, names)
        # Told what a budget reports (a sequential family's looks): the sweep's progress
        # lines and its MLflow parent run. Not saved: whoever runs the sweep attaches them.
        self.listeners: list[Callable[[PolicyEvent], None]] = []
        self.next_stream = 0
        self.queue: deque[dict[str, Any]] = deque()
        self.configs: dict[str, _Configuration] = {}
        # Tune trial id -> (config_id, "precision/seed") of its trial ("" for a group trial)
        self.trial_of: dict[str, tuple[str, str]] = {}
        self.trial_config: dict[str, dict[str, Any]] = {}  # trial_id -> the config it was given
        # group trial_id -> its trials, (config_id, "precision/seed") each
        self.trial_group: dict[str, list[tuple[str, str]]] = {}
        # ASHA per trial or per population (hpo.rungs): the rungs as last saved or
        # restored, for when no board is running (a searcher unpickled outside the sweep's
        # Ray job).
        self.rungs: dict[str, Any] | None = None

    # -- Tune's Searcher interface ---------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        return True  # everything comes from the sweep spec

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:  # type: ignore[override]
        if not self.queue and not self._new_config():
            # Nothing to make now. Finished only when every stream is done and every
            # configuration reported: until then a trial may come back for a retry (a CUDA
            # OOM re-queues it with a larger share), or a result may let a stream make more.
            return Searcher.FINISHED if self.complete else None
        config = self.queue.popleft()
        if is_group_trial(config):
            self.trial_group[trial_id] = [
                (t["config_id"], precision_seed(t)) for t in config[GROUP_KEY]
            ]
            self.trial_of[trial_id] = (config["config_id"], "")
        else:
            self.trial_of[trial_id] = (config["config_id"], precision_seed(config))
        self.trial_config[trial_id] = config
        return config

    def _all_reported(self) -> bool:
        return all(len(g.results) == len(g.trials) for g in self.configs.values())

    @property
    def complete(self) -> bool:
        """Every stream done and every configuration reported: the sweep is over."""
        return all(b.done for b in self.budgets) and self._all_reported()

    @property
    def planned_trials(self) -> int:
        """Trials of the configurations made, once the sweep is complete; until then the
        most it may run (:attr:`hpo.spec.SweepSpec.n_trials`)."""
        if not self.complete:
            return self.spec.n_trials
        return sum(len(c.trials) for c in self.configs.values())

    def records(self) -> dict[str, dict[str, Any]]:
        """What each stream's budget records (a sequential family's looks), by stream."""
        out = {}
        for budget in self.budgets:
            record = budget.record()
            if record is not None:
                out[budget.stream] = record
        return out

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        located = self.trial_of.get(trial_id)
        if located is None:
            return
        grouped = trial_id in self.trial_group
        if result and result.get("oom") and result.get("oom_retry_gpu_fraction") and not grouped:
            # Ran out of GPU memory: the same trial again, with at least the larger share
            # of the same type's GPU (the trial reports the type of the node it ran on).
            trial = TrialConfig.from_dict(self.trial_config[trial_id])
            ran_on = str(result.get("gpu_type") or "")
            retry = trial.with_floor(float(result["oom_retry_gpu_fraction"]), gpu_type=ran_on)
            self.queue.appendleft(retry.to_dict())
            return
        if grouped:  # a group trial: each trial's own result
            reported = _trial_entries(result or {})
            trials = self.trial_group[trial_id]
            dicts = self.trial_config[trial_id][GROUP_KEY]
            held = GroupTrialConfig.from_dict(self.trial_config[trial_id])
            pbt, population = held.pbt, held.population
            # A population that is one group trial and did not fit a whole GPU is not
            # split: the halves would be two independent populations (or a trial alone,
            # without PBT). Its trials that ran out of memory end as failures (the
            # trial's failure_reason names the fix). Part of a population that spans
            # several trials splits as any group does: its halves meet on the board.
            split = bool(result and result.get("oom_split"))
            retry_oom = not (split and pbt is not None and not population)
            retries: list[TrialConfig] = []
            for (config_id, place), slug, config in zip(
                trials, trial_slugs(dicts), dicts, strict=True
            ):
                entry = {} if error else reported.get(slug) or {}
                if retry_oom and entry.get("oom") and entry.get("oom_retry_gpu_fraction"):
                    floor = float(entry["oom_retry_gpu_fraction"])
                    ran_on = str(entry.get("gpu_type") or "")
                    retries.append(TrialConfig.from_dict(config).with_floor(floor, gpu_type=ran_on))
                else:
                    self._record(config_id, place, entry)
            if retries:
                # Those that ran out of memory, again as one group with a larger share, or
                # as two halves where the group did not fit a whole GPU.
                halves = (
                    _even_chunks(retries, -(-len(retries) // 2))
                    if split and len(retries) > 1
                    else [retries]
                )
                for half in reversed(halves):
                    self.queue.appendleft(_group_trial(half, pbt, population))
        else:
            config_id, place = located
            self._record(config_id, place, {} if error or not result else result)

    def _record(self, config_id: str, place: str, result: dict[str, Any]) -> None:
        """The result of the trial at ``place`` ("precision/seed") of configuration
        ``config_id``; once every trial of the configuration has one, their mean goes to its
        stream's searcher and the configuration's outcome to its budget."""
        configuration = self.configs[config_id]
        if len(configuration.results) == len(configuration.trials):
            # Its outcome went out already (a trial that errored, restarted by `hpo
            # resume`, reports again): the searcher and the budget were told, and the
            # budget made a replacement; a second outcome would count it twice.
            return
        value = _number(result.get(self.spec.metric))
        configuration.results[place] = value
        # A trial's test Sharpe counts only where its own metric does (a diverged trial
        # reports its last good epoch's, beside a NaN validation Sharpe).
        configuration.tests[place] = None if value is None else _number(result.get("test_sharpe"))
        if len(configuration.results) < len(configuration.trials):
            return
        finite = [v for v in configuration.results.values() if v is not None]
        self.searchers[configuration.stream].tell(
            config_id, sum(finite) / len(finite) if finite else None
        )
        self._after_outcome(config_id, configuration)

    def _after_outcome(self, config_id: str, configuration: _Configuration) -> None:
        """The configuration's outcome to its stream's budget: what it reports goes to the
        listeners, and a stream that ended (:attr:`StreamBudget.ended`: a sequential
        family decided) has its queued configurations withdrawn."""
        budget = self.budgets[configuration.stream]
        outcomes = []
        for place in configuration.trials:
            precision, _, seed = place.partition("/")
            metrics = {
                self.spec.metric: configuration.results[place],
                "test_sharpe": configuration.tests.get(place),
            }
            outcomes.append(TrialOutcome(precision, int(seed), metrics))
        events = budget.on_outcome(Outcome(config_id, tuple(outcomes)))
        if budget.ended:
            self._withdraw(configuration.stream)
        for event in events:
            for listener in self.listeners:
                listener(event)

    def _withdraw(self, stream: int) -> None:
        """Take back the queued configurations of ``stream`` none of whose trials has
        started: the stream ended (a sequential family decided) and needs none of them."""
        started = {config_id for config_id, _ in self.trial_of.values()}
        started.update(c for trials in self.trial_group.values() for c, _ in trials)
        withdrawn = {
            config_id
            for config_id, g in self.configs.items()
            if g.stream == stream and not g.results and config_id not in started
        }
        if not withdrawn:
            return
        self.queue = deque(c for c in self.queue if _config_ids(c).isdisjoint(withdrawn))
        for config_id in sorted(withdrawn):
            del self.configs[config_id]
            self.searchers[stream].tell(config_id, None)
            self.budgets[stream].withdrawn(config_id)

    # -- configurations --------------------------------------------------------------------
    def _new_config(self) -> bool:
        for _ in range(len(self.streams)):
            index = self.next_stream
            self.next_stream = (self.next_stream + 1) % len(self.streams)
            if self.budgets[index].allowance() > 0:
                self._emit(index)
                return True
        return False

    def _emit(self, index: int) -> None:
        """Queue the stream's next configurations: one, or one ask's of one shape."""
        family, precision = self.streams[index]
        n_configs = min(self.per_ask[family], self.budgets[index].allowance())
        tag = family if precision is None else f"{family}-{precision}"
        precisions = list(self.spec.precisions) if precision is None else [precision]
        shape: dict[str, Any] | None = None
        trials: list[TrialConfig] = []
        for _ in range(n_configs):
            config_id = f"{tag}-c{self.configs_made[index]:03d}"
            self.configs_made[index] += 1
            self.budgets[index].made(config_id)
            # Compare mode holds nothing: it asks for several only where no searched setting
            # changes the shape (SweepSpec.configs_per_ask), and its draws stay independent.
            held = None if self.spec.compare else shape
            asked = self.searchers[index].ask(config_id, held)
            params = {**self.spaces[index].fixed, **asked, **(held or {})}  # held exactly
            if shape is None:
                shape = {k: v for k, v in params.items() if k not in self.varying[family]}
            made = [
                TrialConfig(
                    family=family,
                    precision=p,
                    seed=seed,
                    params=params,
                    base=self.base,
                    config_id=config_id,
                    pair_id=f"{config_id}-s{seed}",
                )
                for seed in self.spec.seeds
                for p in precisions
            ]
            trials.extend(made)
            self.configs[config_id] = _Configuration(
                stream=index, trials=[precision_seed(t.to_dict()) for t in made]
            )
        if not self.grouped[family]:
            pbt = self.pbt[family]
            if pbt is not None:  # one population across processes: this ask's trials
                population = trials[0].config_id
                trials = [dataclasses.replace(t, pbt=pbt, population=population) for t in trials]
            self.queue.extend(t.to_dict() for t in trials)
            return
        # A population larger than one group trial spans several, which meet on the board.
        population = trials[0].config_id if self.spec.population_spans_trials(family) else ""
        for p in precisions:
            same = [t for t in trials if t.precision == p]
            for chunk in _even_chunks(same, self.spec.group_size):
                self.queue.append(_group_trial(chunk, self.pbt[family], population))

    # -- state -----------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "version": self.STATE_VERSION,
            "configs_made": self.configs_made,
            "next_stream": self.next_stream,
            "queue": list(self.queue),
            "configs": {
                k: {
                    "stream": g.stream,
                    "trials": g.trials,
                    "results": g.results,
                    "tests": g.tests,
                }
                for k, g in self.configs.items()
            },
            "budgets": [b.state() for b in self.budgets],
            "trial_of": self.trial_of,
            "trial_group": self.trial_group,
            "trial_config": self.trial_config,
            "searchers": [s.state() for s in self.searchers],
            "rungs": self._rungs_state(),
        }

    def _rungs_state(self) -> dict[str, Any] | None:
        """The rungs of a sweep where ASHA decides per trial or per population: the
        running board's (saved with each experiment snapshot), else the last known."""
        if not self.spec.rungs_on_board:
            return None
        live = board_state(self.spec.name)
        if live is not None:
            self.rungs = live
        return self.rungs

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
            k: _Configuration(
                stream=g["stream"], trials=g["trials"], results=g["results"], tests=g["tests"]
            )
            for k, g in state["configs"].items()
        }
        for budget, saved in zip(self.budgets, state["budgets"], strict=True):
            budget.load_state(saved)
        self.trial_of = {k: (v[0], v[1]) for k, v in state["trial_of"].items()}
        self.trial_config = dict(state["trial_config"])
        self.trial_group = {
            trial_id: [(t[0], t[1]) for t in trials]
            for trial_id, trials in state["trial_group"].items()
        }
        for searcher, saved in zip(self.searchers, state["searchers"], strict=True):
            searcher.load_state(saved)
        self.rungs = state["rungs"]
        if self.rungs is not None:
            load_board(self.spec.name, self.rungs)  # a resumed sweep's board (started first)

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
        for (family, precision), searcher in zip(self.streams, self.searchers, strict=True):
            best = searcher.best()
            rows.append({"family": family, "precision": precision, "best": best})
        return rows


def _number(value: Any) -> float | None:
    """A finite reported number, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _config_ids(trial: dict[str, Any]) -> set[str]:
    """The configurations a queued Tune trial dict trains."""
    if is_group_trial(trial):
        return {t["config_id"] for t in trial[GROUP_KEY]}
    return {trial["config_id"]}


def _trial_entries(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A group trial's result per trial, by slug: under ``"trials"``, or as Tune hands a
    searcher its result (``flatten_dict``: ``"trials/<slug>/<key>"``; slugs hold no '/')."""
    nested = result.get("trials")
    if isinstance(nested, dict):
        return nested
    entries: dict[str, dict[str, Any]] = {}
    for key, value in result.items():
        head, _, rest = key.partition("/")
        slug, _, metric = rest.partition("/")
        if head == "trials" and slug and metric:
            entries.setdefault(slug, {})[metric] = value
    return entries


def _group_trial(
    trials: list[TrialConfig], pbt: PbtSettings | None = None, population: str = ""
) -> dict[str, Any]:
    """The Tune trial dict of ``trials``: a group trial (a population where ``pbt`` is
    given, or part of ``population`` where that spans several), or the trial alone (a
    trial of ``population``, or a population of one trial's own)."""
    if len(trials) == 1:
        if pbt is not None and population:
            return dataclasses.replace(trials[0], pbt=pbt, population=population).to_dict()
        return trials[0].to_dict()
    return GroupTrialConfig(tuple(trials), pbt=pbt, population=population).to_dict()


def _pbt_settings(spec: SweepSpec, family: str) -> PbtSettings:
    """``family``'s population settings from the spec's ``[pbt]`` table."""
    table = spec.pbt_table
    return PbtSettings(
        interval_epochs=table.interval_epochs,
        quantile=table.quantile,
        resample_probability=table.resample_probability,
        mutations=spec.pbt_mutations(family),
    )


def _even_chunks(items: list[TrialConfig], size: int) -> list[list[TrialConfig]]:
    """``items`` in as few chunks of at most ``size`` as there can be, as even as they can
    be (9 by 8: 5 and 4, not 8 and 1)."""
    n = -(-len(items) // size)
    if n == 0:
        return []
    base, extra = divmod(len(items), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks
