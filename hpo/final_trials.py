"""The rows of a sweep's trials as its driver holds them when the experiment ends.

The sweep's summary (``hpo.sweep.finish_sweep``) needs every trial's row. Read back from
storage, that is Tune's whole experiment state parsed again (its cost at a thousand
trials: bench/README.md, "A sweep's per-trial cost"), right after Tune held the same
trials in memory. This
callback takes the rows from Tune's own trials at ``on_experiment_end`` instead, when
every trial had ended by then. An interrupted experiment (SIGINT, SIGTERM) also ends with
``on_experiment_end``, after Tune marked its running trials TERMINATED without completing
them: then this callback has no rows, and the summary reads the experiment state Tune saved
before that, where they are still running (and the sweep exits resumable).
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from cluster.storage import SweepLocation
from hpo.trials import TrialRow, rows_of_trials


class FinalTrials(Callback):
    """Every attempt's row (``trial_rows(..., retried=True)``) when the experiment ends."""

    def __init__(self, sweep_dir: SweepLocation) -> None:
        self.sweep_dir = sweep_dir
        self.rows: list[TrialRow] | None = None
        # Ids of the trials that ended (completed or errored for good) as Tune reported it,
        # or had ended before a resume; None until the first step has seen the trials.
        self._ended: set[str] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into its experiment state: the rows are this driver's.
        return {"sweep_dir": self.sweep_dir, "rows": None, "_ended": None}

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if self._ended is None:  # once: trials a resumed experiment restored as ended
            self._ended = {t.trial_id for t in trials if t.is_finished()}

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended_now(trial)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._ended_now(trial)

    def _ended_now(self, trial: Any) -> None:
        if self._ended is None:
            self._ended = set()
        self._ended.add(trial.trial_id)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        ended = self._ended or set()
        if all(t.trial_id in ended for t in trials):
            self.rows = rows_of_trials(trials, self.sweep_dir, retried=True)
