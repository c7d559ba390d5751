"""ASHA that decides per trial: the rungs of a grouped sweep, shared by its Tune trials.

Ray Tune's ``ASHAScheduler`` decides per Tune trial, and a group trial holds several
trials (``trainables.group``), so a grouped sweep (``grouping.group_size`` > 1 with
``scheduler = "asha"``) runs Tune's FIFO scheduler and this instead. Every Tune trial, a
group trial or not, asks :class:`RungJudge` after each epoch whether each of its trials
goes on; a trial stopped at a rung leaves its group's fused step, and the group trial ends
with its last trial.

:class:`AshaRungs` is the algorithm of Tune's ``ASHAScheduler`` with one bracket (Li et
al. 2020, asynchronous successive halving): rungs at ``grace * rf**k`` epochs below
``max_t``; a trial reaching a rung is recorded there and stopped when its value is below
the rung's ``1 - 1/rf`` quantile of the values recorded before it (NaN values are
recorded and never stop). Each decision is remembered, so an epoch re-run after a resume
gets the decision it got the first time. The rungs live in one Ray actor per sweep
(the board, named after the sweep); the sweep's searcher saves them with its own state
in each of Tune's experiment snapshots and loads them back on ``hpo resume``. A decision
made after the snapshot is made again when its epoch is re-run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

ASHA_REDUCTION_FACTOR = 2  # every sweep's, per Tune trial (Tune's) or per trial (here)
_ACTOR_PREFIX = "hpo-asha-rungs-"
# The boards this driver started: a named actor that is not detached dies with its last
# handle, so the driver keeps one for the sweep's life (trials find it by name).
_BOARDS: dict[str, Any] = {}


class AshaRungs:
    """One ASHA bracket over trials named by their trial keys (see the module docstring)."""

    def __init__(self, grace: int, max_t: int, reduction_factor: float = 2.0) -> None:
        if not 1 <= grace <= max_t:
            raise ValueError(f"need 1 <= grace ({grace}) <= max_t ({max_t})")
        self.reduction_factor = float(reduction_factor)
        n_rungs = int(math.log(max_t / grace) / math.log(self.reduction_factor) + 1)
        # Ray's rungs: grace * rf**k for k < n_rungs (a rung at max_t stops nobody there:
        # the trial ends anyway).
        self.milestones = [int(grace * self.reduction_factor**k) for k in range(n_rungs)]
        self.max_t = max_t
        self.recorded: dict[int, dict[str, float]] = {m: {} for m in self.milestones}
        self.decisions: dict[int, dict[str, bool]] = {m: {} for m in self.milestones}

    def keep(self, trial: str, epoch: int, value: float) -> bool:
        """Whether ``trial``, at ``epoch`` with ``value`` (higher is better), goes on."""
        if epoch >= self.max_t:
            return False  # its last epoch
        reached = [m for m in self.milestones if m <= epoch]
        if not reached:
            return True
        rung = max(reached)  # Ray judges a result at the highest rung it has reached
        if trial in self.decisions[rung]:
            return self.decisions[rung][trial]
        values = [v for v in self.recorded[rung].values() if not math.isnan(v)]
        keep = True
        if values and not math.isnan(value):
            keep = value >= _percentile(values, (1 - 1 / self.reduction_factor) * 100)
        self.recorded[rung][trial] = float(value)
        self.decisions[rung][trial] = keep
        return keep

    def state(self) -> dict[str, Any]:
        return {
            "milestones": self.milestones,
            "recorded": {str(m): r for m, r in self.recorded.items()},
            "decisions": {str(m): d for m, d in self.decisions.items()},
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        if list(state["milestones"]) != self.milestones:
            raise ValueError(
                f"saved rungs at {state['milestones']}, this sweep's are at "
                f"{self.milestones} (max_epochs or grace_epochs changed?)"
            )
        self.recorded = {int(m): dict(r) for m, r in state["recorded"].items()}
        self.decisions = {int(m): dict(d) for m, d in state["decisions"].items()}


def _percentile(values: list[float], q: float) -> float:
    """Ray's cutoff (``np.nanpercentile``; ``values`` hold no NaN) computed by numpy as
    Ray does: equal values at a cutoff must get equal decisions, so the same rounding."""
    import numpy as np

    return float(np.percentile(values, q))


class RungJudge:
    """What a trial asks (``trainables.trial.EarlyStop``): the sweep's board (its
    :class:`AshaRungs` as a Ray actor), found by name from any node of the sweep's Ray
    job. Pickled into every trial."""

    def __init__(self, sweep_name: str, metric: str) -> None:
        self.actor_name = _ACTOR_PREFIX + sweep_name
        self.metric = metric
        self._actor: Any = None

    def keep(self, trial: str, result: Mapping[str, Any]) -> bool:
        import ray

        value = result.get(self.metric)
        number = float(value) if isinstance(value, int | float) else math.nan
        if self._actor is None:
            self._actor = ray.get_actor(self.actor_name)
        return bool(ray.get(self._actor.keep.remote(trial, int(result["epoch"]), number)))

    def __getstate__(self) -> dict[str, Any]:
        return {"actor_name": self.actor_name, "metric": self.metric, "_actor": None}


def start_rung_board(
    sweep_name: str, metric: str, grace: int, max_t: int, reduction_factor: float
) -> RungJudge:
    """Start the sweep's board, empty (a resumed sweep's searcher loads its rungs into
    it), in the connected Ray job, replacing one a sweep of that name left there (an
    in-process run and resume share a Ray session); the judge its trials ask."""
    import ray

    stale = _board(sweep_name)
    if stale is not None:
        ray.kill(stale)
    name = _ACTOR_PREFIX + sweep_name
    board = ray.remote(num_cpus=0)(AshaRungs).options(name=name)
    _BOARDS[name] = board.remote(grace, max_t, reduction_factor)
    return RungJudge(sweep_name, metric)


def _board(sweep_name: str) -> Any:
    """The sweep's board in this Ray job, or None (no Ray here, or no board started)."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        return ray.get_actor(_ACTOR_PREFIX + sweep_name)
    except ValueError:
        return None


def board_state(sweep_name: str) -> dict[str, Any] | None:
    """The rungs of the sweep's running board (None where there is none)."""
    import ray

    board = _board(sweep_name)
    return None if board is None else ray.get(board.state.remote())


def load_board(sweep_name: str, state: Mapping[str, Any]) -> bool:
    """Load saved rungs into the sweep's running board; False where there is none."""
    import ray

    board = _board(sweep_name)
    if board is None:
        return False
    ray.get(board.load_state.remote(dict(state)))
    return True
