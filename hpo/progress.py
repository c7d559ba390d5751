"""Live progress of a sweep as short lines: trials running / done / errored, best so far.

Lines rather than a redrawn screen, so the same output reads well in a terminal, in CI
logs and in ``hpo submit --follow``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback

from hpo.trials import TrialStatus
from trainables.trial_keys import GROUP_KEY, is_group_trial, trial_slugs


class SweepProgress(Callback):
    """Prints the sweep's progress. Its counts and its best trial are kept up to date as
    trials change (each event costs the same at the 10th trial as at the 10,000th), from
    Tune's statuses as they stood at the sweep's first step (all of them, on a resume)."""

    def __init__(
        self,
        total: int,
        on_event: Callable[[str], None] | None = None,
        every_s: float = 10.0,
        up_to: bool = False,
    ) -> None:
        self.total = total
        self.up_to = up_to  # total is a most (a sequential comparison's)
        self.on_event = on_event or (lambda line: print(line, flush=True))
        self.every_s = every_s
        # Each trial's latest validation Sharpe: "best" ranks trials the way `hpo best` and
        # the final table do (by their final value), not by a peak an overfitting trial lost.
        self.latest: dict[str, tuple[float, str]] = {}
        # The same values in a heap, for the best in O(log n): entries a newer value
        # replaced are dropped when they reach the top.
        self._ranked: list[tuple[float, str, str]] = []
        # Each Tune trial's state ("running", "done", "errored"; none while pending or
        # between an OOM attempt and its retry) and the trials it holds, and their sums.
        self.states: dict[str, tuple[str, int]] = {}
        self.counts: dict[str, int] = {"running": 0, "done": 0, "errored": 0}
        self._seen_first_step = False
        self._last_status = 0.0

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into its experiment state; the printer is re-attached on resume.
        state = dict(self.__dict__)
        state["on_event"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__ = {"up_to": False, **state}
        self.on_event = lambda line: print(line, flush=True)
        self._seen_first_step = False  # a resumed driver counts from Tune's statuses again

    def _set_state(self, trial: Any, state: str | None) -> None:
        old, size = self.states.pop(trial.trial_id, (None, _size(trial)))
        if old is not None:
            self.counts[old] -= size
        if state is not None:
            self.states[trial.trial_id] = (state, size)
            self.counts[state] += size

    def _counts(self) -> str:
        running, done, errored = (self.counts[k] for k in ("running", "done", "errored"))
        # Said in the line: this value can go down while a sweep runs (a leader overfits).
        best = (
            f"  best val Sharpe (latest epochs) {self.best[0]:+.2f} ({self.best[1]})"
            if self.best
            else ""
        )
        total = f"up to {self.total}" if self.up_to else str(self.total)
        return f"[{done + errored}/{total}] running {running}, done {done}, errored {errored}{best}"

    @property
    def best(self) -> tuple[float, str] | None:
        while self._ranked:
            value, label, trial_id = self._ranked[0]
            if self.latest.get(trial_id) == (-value, label):
                return -value, label
            heapq.heappop(self._ranked)  # replaced by a newer value, or no longer a candidate
        return None

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        if self._seen_first_step:
            return
        # Once: the trials Tune knows at the first step (restored ones, on a resume).
        self._seen_first_step = True
        self.states, self.counts = {}, {"running": 0, "done": 0, "errored": 0}
        for trial in trials:
            self._set_state(trial, _state_of(trial))

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._set_state(trial, "running")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._set_state(trial, None)  # failed, to be retried: pending again

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        value = result.get("val_sharpe")
        if isinstance(value, int | float) and math.isfinite(value):
            config = trial.config
            label = f"{config['family']} {config['precision']} {trial.trial_id}"
            self.latest[trial.trial_id] = (float(value), label)
            heapq.heappush(self._ranked, (-float(value), label, trial.trial_id))
            if len(self._ranked) > 2 * len(self.latest) + 64:  # mostly replaced values
                self._ranked = [(-v, lab, t) for t, (v, lab) in self.latest.items()]
                heapq.heapify(self._ranked)
        else:  # a diverged trial's final NaN: it is no longer a candidate
            self.latest.pop(trial.trial_id, None)
        if time.monotonic() - self._last_status > self.every_s:
            self._last_status = time.monotonic()
            self.on_event(self._counts())

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        config = trial.config
        value = result.get("val_sharpe")
        shown = (
            f"{value:+.2f}" if isinstance(value, int | float) and math.isfinite(value) else "n/a"
        )
        retry = result.get("oom_retry_gpu_fraction")
        note = (
            f" (out of GPU memory: retrying at a {retry:g} share)"
            if isinstance(retry, int | float) and result.get("oom")
            else " (diverged)"
            if result.get("diverged")
            else " (fell back to f32)"
            if result.get("fell_back_to_f32")
            else ""
        )
        if not is_group_trial(config):
            who = f"seed {config['seed']}"
        else:
            slugs = trial_slugs(config[GROUP_KEY])
            entries = (result.get("trials") or {}).values()
            stopped = sum(1 for entry in entries if entry.get("stopped"))
            who = f"group of {len(slugs)} ({', '.join(slugs)})" + (
                f", {stopped} stopped at a rung" if stopped else ""
            )
        # An OOM attempt ends too, but its trials run again (a new Tune trial).
        self._set_state(trial, None if retry is not None else "done")
        self.on_event(
            f"trial {trial.trial_id} {config['family']} {config['precision']} {who}: "
            f"val Sharpe {shown} after {result.get('epoch', 0)} epoch(s){note}  " + self._counts()
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._set_state(trial, "errored")
        self.on_event(
            f"trial {trial.trial_id} errored: {getattr(trial, 'error_file', '')}  " + self._counts()
        )


def _state_of(trial: Any) -> str | None:
    """A Tune trial's state from its status (a restored sweep's first step)."""
    if trial.status == "RUNNING":
        return "running"
    if trial.status == "ERROR":
        return "errored"
    if TrialStatus(trial.status).terminated:
        # An OOM attempt ends as TERMINATED too, but its trials run again (a new trial).
        return None if (trial.last_result or {}).get("oom_retry_gpu_fraction") else "done"
    return None


def _size(trial: Any) -> int:
    """Trials a Tune trial holds (a group trial's, else 1)."""
    config = trial.config
    return len(config[GROUP_KEY]) if is_group_trial(config) else 1
