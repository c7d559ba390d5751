"""Live progress of a sweep as short lines: trials running / done / errored, best so far.

Lines rather than a redrawn screen, so the same output reads well in a terminal, in CI
logs and in ``hpo submit --follow``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback

from hpo.trials import TrialStatus
from trainables.trial_keys import GROUP_KEY, is_group_trial, member_slugs


class SweepProgress(Callback):
    def __init__(
        self, total: int, on_event: Callable[[str], None] | None = None, every_s: float = 10.0
    ) -> None:
        self.total = total
        self.on_event = on_event or (lambda line: print(line, flush=True))
        self.every_s = every_s
        # Each trial's latest validation Sharpe: "best" ranks trials the way `hpo best` and
        # the final table do (by their final value), not by a peak an overfitting trial lost.
        self.latest: dict[str, tuple[float, str]] = {}
        self._last_status = 0.0

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into its experiment state; the printer is re-attached on resume.
        state = dict(self.__dict__)
        state["on_event"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.on_event = lambda line: print(line, flush=True)

    def _counts(self, trials: list) -> str:
        # Counted in members: a group trial holds several.
        running = sum(_size(t) for t in trials if t.status == "RUNNING")
        # An OOM attempt ends as TERMINATED too, but its member runs again (a new trial).
        done = sum(
            _size(t)
            for t in trials
            if TrialStatus(t.status).terminated
            and not (t.last_result or {}).get("oom_retry_gpu_fraction")
        )
        errored = sum(_size(t) for t in trials if t.status == "ERROR")
        # Said in the line: this value can go down while a sweep runs (a leader overfits).
        best = (
            f"  best val Sharpe (latest epochs) {self.best[0]:+.2f} ({self.best[1]})"
            if self.best
            else ""
        )
        return f"[{done + errored}/{self.total}] running {running}, done {done}, errored {errored}{best}"

    @property
    def best(self) -> tuple[float, str] | None:
        return max(self.latest.values(), default=None)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        value = result.get("val_sharpe")
        if isinstance(value, int | float) and math.isfinite(value):
            config = trial.config
            label = f"{config['model']} {config['precision']} {trial.trial_id}"
            self.latest[trial.trial_id] = (float(value), label)
        else:  # a diverged trial's final NaN: it is no longer a candidate
            self.latest.pop(trial.trial_id, None)
        if time.monotonic() - self._last_status > self.every_s:
            self._last_status = time.monotonic()
            self.on_event(self._counts(trials))

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
            slugs = member_slugs(config[GROUP_KEY])
            entries = (result.get("members") or {}).values()
            stopped = sum(1 for entry in entries if entry.get("stopped"))
            who = f"group of {len(slugs)} ({', '.join(slugs)})" + (
                f", {stopped} stopped at a rung" if stopped else ""
            )
        self.on_event(
            f"trial {trial.trial_id} {config['model']} {config['precision']} {who}: "
            f"val Sharpe {shown} after {result.get('epoch', 0)} epoch(s){note}  "
            + self._counts(trials)
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.on_event(
            f"trial {trial.trial_id} errored: {getattr(trial, 'error_file', '')}  "
            + self._counts(trials)
        )


def _size(trial: Any) -> int:
    """Members a Tune trial holds (a group trial's, else 1)."""
    config = trial.config
    return len(config[GROUP_KEY]) if is_group_trial(config) else 1
