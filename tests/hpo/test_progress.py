"""The live progress lines: the best trial is ranked by each trial's latest validation
Sharpe, as the final table and `hpo best` rank them."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hpo.progress import SweepProgress


def _trial(trial_id: str, family: str = "tft") -> SimpleNamespace:
    config = {"family": family, "precision": "bf16", "seed": 0}
    return SimpleNamespace(trial_id=trial_id, config=config, status="RUNNING", last_result={})


def test_best_follows_each_trials_latest_value_not_its_peak() -> None:
    lines: list[str] = []
    progress = SweepProgress(total=2, on_event=lines.append, every_s=0.0)
    a, b = _trial("a"), _trial("b", family="dqn")
    progress.on_trial_result(0, [a, b], a, {"val_sharpe": 1.4})  # a peaks early...
    progress.on_trial_result(0, [a, b], b, {"val_sharpe": 0.6})
    assert progress.best == (1.4, "tft bf16 a")
    progress.on_trial_result(0, [a, b], a, {"val_sharpe": 0.3})  # ...then overfits
    assert progress.best == (0.6, "dqn bf16 b")
    progress.on_trial_result(0, [a, b], b, {"val_sharpe": math.nan, "diverged": 1})
    assert progress.best == (0.3, "tft bf16 a")  # a diverged trial is no candidate
    # The line says what it ranks by: a value that may go down, as it just did (1.4 -> 0.3).
    assert lines[-1].endswith("best val Sharpe (latest epochs) +0.30 (tft bf16 a)")


def test_counts_follow_the_trials_events_from_the_statuses_tune_restored() -> None:
    lines: list[str] = []
    progress = SweepProgress(total=6, on_event=lines.append, every_s=1e9)
    done, running = _trial("done"), _trial("running")
    done.status = "TERMINATED"
    oom = _trial("oom")  # an OOM attempt: it ended, and its trial runs again
    oom.status, oom.last_result = "TERMINATED", {"oom": 1, "oom_retry_gpu_fraction": 0.5}
    progress.on_step_begin(0, [done, running, oom])  # a resumed sweep's first step
    assert progress.counts == {"running": 1, "done": 1, "errored": 0}
    fresh, failing = _trial("fresh"), _trial("failing")
    for trial in (fresh, failing):
        progress.on_trial_start(0, [], trial)
    assert progress.counts == {"running": 3, "done": 1, "errored": 0}
    progress.on_trial_recover(0, [], failing)  # retried from its checkpoint: pending
    progress.on_trial_start(0, [], failing)
    progress.on_trial_error(0, [], failing)
    running.last_result = {"val_sharpe": 0.5, "epoch": 2}
    progress.on_trial_complete(0, [], running)
    fresh.last_result = {"oom": 1, "oom_retry_gpu_fraction": 0.25, "epoch": 1}
    progress.on_trial_complete(0, [], fresh)  # its retry is a new Tune trial
    assert progress.counts == {"running": 0, "done": 2, "errored": 1}
    assert lines[-1].endswith("[3/6] running 0, done 2, errored 1")


def test_the_best_stays_right_as_values_are_replaced_many_times() -> None:
    progress = SweepProgress(total=3, on_event=lambda line: None, every_s=1e9)
    trials = [_trial(name) for name in "abc"]
    for step in range(500):  # values rise; at the end c falls below the others
        for k, trial in enumerate(trials):
            value = step + k if not (trial.trial_id == "c" and step == 499) else -1.0
            progress.on_trial_result(0, trials, trial, {"val_sharpe": float(value)})
    assert progress.best == (500.0, "tft bf16 b")
    assert len(progress._ranked) <= 2 * 3 + 64 + 1  # replaced values do not pile up
