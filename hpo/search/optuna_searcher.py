"""TPE and random search through Optuna's ask-and-tell interface, public API only.

Why not Ray's ``OptunaSearch``: one sweep holds several families with different
spaces, compare mode fans one suggestion out to every precision, and the searcher's state
must survive ``hpo resume`` as plain data. Ask-and-tell gives all three: each (family
[, precision]) gets its own study, and :meth:`OptunaParamSearcher.state` is JSON (every
told and every open trial's params and number, and each told trial's value), replayed
into a fresh study on restore, so a resumed sweep continues the same search with its
whole history (no pickle involved).

A sampler's random state is not public, so none is kept: each ask gets a sampler of its
own, seeded through its constructor from the searcher's seed and the number the trial
will have (:func:`trial_seed`). What a trial draws depends only on that seed and the
study's trials, which the state restores with their numbers: a restored searcher asks
exactly what one that never stopped asks.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
)

from hpo.search.param_searcher import ParamSearcher
from models.family import Dim, Float, Int

optuna.logging.set_verbosity(optuna.logging.WARNING)


def to_optuna(dim: Dim) -> BaseDistribution:
    if isinstance(dim, Float):
        return FloatDistribution(dim.low, dim.high, log=dim.log)
    if isinstance(dim, Int):
        return IntDistribution(dim.low, dim.high, log=dim.log)
    return CategoricalDistribution(list(dim.options))


class OptunaParamSearcher(ParamSearcher):
    """One Optuna study over one space; ``kind`` is ``tpe`` or ``random``."""

    def __init__(
        self, dims: dict[str, Dim], kind: str = "tpe", seed: int = 0, maximize: bool = True
    ) -> None:
        self.dims = dims
        self.kind = kind
        self.seed = seed
        self.maximize = maximize
        if kind not in ("tpe", "random"):
            raise ValueError(f"unknown Optuna sampler {kind!r}; expected 'tpe' or 'random'")
        self.distributions = {name: to_optuna(dim) for name, dim in dims.items()}
        self.study = optuna.create_study(
            direction="maximize" if maximize else "minimize", sampler=self._sampler(0)
        )
        self._open: dict[str, optuna.trial.Trial] = {}
        self._reopened: dict[str, int] = {}  # token -> trial number, asked before a restore
        self._params: dict[str, dict[str, Any]] = {}  # token -> params, while not told
        self._told: list[dict[str, Any]] = []

    def _sampler(self, number: int) -> optuna.samplers.BaseSampler:
        """The sampler that draws trial ``number``, seeded for it alone."""
        seed = trial_seed(self.seed, number)
        if self.kind == "tpe":
            # Fewer random start-up trials than Optuna's 10: sweeps here are tens of trials.
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, multivariate=True)
        return optuna.samplers.RandomSampler(seed=seed)

    def ask(self, token: str, fixed: Mapping[str, Any] | None = None) -> dict[str, Any]:
        sampler = self._sampler(len(self.study.get_trials(deepcopy=False)))
        pinned = {k: v for k, v in (fixed or {}).items() if k in self.distributions}
        if pinned:
            # Optuna's own way to search some parameters with others held: the pinned ones
            # leave the sampler's (relative) search space, and the trial records them with
            # their distributions, so TPE learns from them as from sampled ones.
            with warnings.catch_warnings():  # "experimental" since Optuna 2.4, and stable
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                sampler = optuna.samplers.PartialFixedSampler(pinned, sampler)
        self.study.sampler = sampler  # how Optuna's docs swap a study's sampler
        trial = self.study.ask(self.distributions)
        self._open[token] = trial
        self._params[token] = trial.params
        return {k: _plain(v) for k, v in trial.params.items()}

    def tell(self, token: str, value: float | None) -> None:
        ok = value is not None and bool(np.isfinite(value))
        result = float(value) if ok else None  # type: ignore[arg-type]
        if token in self._reopened:
            number = self._reopened.pop(token)
        elif token in self._open:
            number = self._open.pop(token).number
        else:
            return
        params = self._params.pop(token)
        if result is not None:
            self.study.tell(number, result)
        else:
            self.study.tell(number, state=optuna.trial.TrialState.FAIL)
        self._told.append({"params": params, "value": result, "number": number})

    def _add_frozen(self, params: dict[str, Any], value: float | None) -> None:
        state = (
            optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
        )
        self.study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={k: self.distributions[k] for k in params},
                value=value,
                state=state,
            )
        )

    @property
    def n_told(self) -> int:
        return len(self._told)

    def best(self) -> tuple[dict[str, Any], float] | None:
        done = [t for t in self._told if t["value"] is not None]
        if not done:
            return None
        pick = max if self.maximize else min
        top = pick(done, key=lambda t: t["value"])
        return top["params"], top["value"]

    # -- state as plain data -----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        open_trials = {**{t: tr.number for t, tr in self._open.items()}, **self._reopened}
        return {
            "kind": self.kind,
            "seed": self.seed,
            "distributions": {k: distribution_to_json(d) for k, d in self.distributions.items()},
            "told": self._told,
            # Trials asked but not told when the sweep stopped: their trials resume and
            # report later. Kept with their trial numbers, so that the restored study numbers
            # and orders its trials exactly as the original did (TPE's draws depend on it).
            "open": {t: {"number": n, "params": self._params[t]} for t, n in open_trials.items()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.seed = int(state["seed"])
        entries = [(t["number"], "told", t) for t in state["told"]]
        entries += [(o["number"], "open", (tok, o)) for tok, o in state["open"].items()]
        for number, kind, item in sorted(entries, key=lambda e: e[0]):
            if kind == "told":
                self._add_frozen(item["params"], item["value"])
            else:
                token, opened = item
                self.study.add_trial(
                    optuna.trial.create_trial(
                        params=opened["params"],
                        distributions={k: self.distributions[k] for k in opened["params"]},
                        state=optuna.trial.TrialState.RUNNING,
                    )
                )
                self._reopened[token] = number
                self._params[token] = dict(opened["params"])
        self._told = list(state["told"])


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def trial_seed(seed: int, number: int) -> int:
    """The seed of the sampler that draws trial ``number`` of a searcher seeded ``seed``:
    a hash of the two (numpy's ``SeedSequence``), so neighbouring trials and neighbouring
    searchers draw unrelated streams."""
    return int(np.random.SeedSequence([seed % 2**64, number]).generate_state(1)[0])


def dumps(state: dict[str, Any]) -> str:
    return json.dumps(state)
