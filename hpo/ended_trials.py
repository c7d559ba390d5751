"""Tune's state of a completed trial, cut to what is read once it has completed.

Tune keeps every trial of an experiment in the driver until the experiment ends (the
result grid and the experiment snapshot need them). With each trial it keeps, per
reported metric, two windows of the metric's last 5 and last 10 values
(``run_metadata.metric_n_steps``, deques behind the running ``last-5-avg`` and
``last-10-avg``). The windows serve only results still to come. A trial's result reports
about 40 metrics, so they were most of what a completed trial held in the driver: about
108 KiB of its objects, and their JSON again in the cached experiment snapshot (bench/
README.md, "A sweep's per-trial cost"). That was the driver's growth with the number of
trials.

:class:`DropCompletedTrialWindows` empties them when a trial completes. What stays is
what anything reads later: the last result, and each metric's min, max, average and last
averages (``metric_analysis``, which ``ExperimentAnalysis.get_best_trial`` reads).

Only completed trials are cut. Those never report again: a resumed sweep skips finished
trials (Tune's ``ResumeConfig.finished`` is ``SKIP``, ``hpo.sweep.resume_sweep``). A trial
that errored for good is resumed (``resume_errored=True``) and goes on reporting, and
Tune's ``update_metric`` needs the windows of every metric it already analysed, so those
keep theirs. Errored trials are few.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback


class DropCompletedTrialWindows(Callback):
    """Empties a trial's last-n windows when it completes (for a running trial, Tune calls
    this before it marks the trial TERMINATED and queues its state for the next experiment
    snapshot, so the snapshot holds the smaller state too)."""

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        # Assigning invalidates the run metadata's cached JSON (its __setattr__ does).
        trial.run_metadata.metric_n_steps = {}
