"""A completed trial's Tune state loses its last-n windows and keeps what is read later:
the windows were most of what each finished trial held in the sweep's driver (bench/
README.md, "A sweep's per-trial cost"), so the driver grew with the number of trials."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

from ray.tune.experiment import Trial

from hpo.ended_trials import DropCompletedTrialWindows

METRICS = 38  # numeric metrics in one of this project's trial results (Tune's analysed keys)


def _reported_trial(trial_id: str, epochs: int = 3) -> Trial:
    """A trial as Tune holds it after ``epochs`` results of ``METRICS`` numeric metrics."""
    trial = Trial("__fake", stub=True, trial_id=trial_id)
    for epoch in range(1, epochs + 1):
        result: dict[str, Any] = {f"metric_{i}": i + epoch / 10 for i in range(METRICS - 1)}
        result.update(training_iteration=epoch, config={"lr": 0.01})
        trial.update_last_result(result)
    return trial


def _complete(trials: list[Trial]) -> None:
    callback = DropCompletedTrialWindows()
    for trial in trials:
        callback.on_trial_complete(iteration=1, trials=trials, trial=trial)


def test_a_completed_trial_keeps_its_last_result_and_analysis_without_the_windows() -> None:
    trial = _reported_trial("a")
    analysis = json.loads(json.dumps(trial.metric_analysis))
    last = dict(trial.last_result)
    assert len(trial.metric_n_steps) == METRICS
    state_before = len(trial.run_metadata.get_json_state())
    _complete([trial])
    assert trial.metric_n_steps == {}
    assert trial.metric_analysis == analysis  # what ExperimentAnalysis.get_best_trial reads
    assert trial.metric_analysis["metric_3"]["max"] == 3.3
    assert trial.last_result == last
    # The cached snapshot JSON was dropped with them: the next snapshot writes the smaller
    # state (here 26 KiB before, 8 KiB after).
    state_after = len(trial.run_metadata.get_json_state())
    assert state_after < 0.5 * state_before
    assert json.loads(trial.run_metadata.get_json_state())["metric_n_steps"] == {}


def test_completed_trials_hold_under_forty_percent_of_the_memory() -> None:
    """What 20 completed trials keep in the driver's Python heap (objects and the cached
    snapshot JSON), with and without the windows: 123 and 36 KiB a trial (Python 3.11)."""

    def held(compact: bool) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            trials = [_reported_trial(f"t{i}") for i in range(20)]
            if compact:
                _complete(trials)
            for trial in trials:  # the experiment snapshot caches each trial's JSON
                trial.get_json_state()
            gc.collect()
            return tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()

    held(False)  # once for what the first trials allocate only once
    windows, without = held(False), held(True)
    assert without < 0.4 * windows, (windows / 20 / 1024, without / 20 / 1024)


def test_a_completed_trials_snapshot_restores_without_windows() -> None:
    """The experiment snapshot a resumed sweep reads: the trial comes back without its
    windows and with its analysis (a resumed sweep skips it: it does not report again)."""
    trial = _reported_trial("a")
    _complete([trial])
    _, metadata = trial.get_json_state()
    restored = Trial("__fake", stub=True, trial_id="a")
    restored.restore_run_metadata(metadata)  # as Tune's restore does with the snapshot
    assert restored.metric_n_steps == {}
    assert restored.metric_analysis == trial.metric_analysis
    assert restored.last_result["metric_5"] == trial.last_result["metric_5"]
