"""The live progress lines: the best trial is ranked by each trial's latest validation
Sharpe, as the final table and `hpo best` rank them."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hpo.progress import SweepProgress


def _trial(trial_id: str, model: str = "tft") -> SimpleNamespace:
    config = {"model": model, "precision": "bf16", "seed": 0}
    return SimpleNamespace(trial_id=trial_id, config=config, status="RUNNING", last_result={})


def test_best_follows_each_trials_latest_value_not_its_peak() -> None:
    lines: list[str] = []
    progress = SweepProgress(total=2, on_event=lines.append, every_s=0.0)
    a, b = _trial("a"), _trial("b", model="dqn")
    progress.on_trial_result(0, [a, b], a, {"val_sharpe": 1.4})  # a peaks early...
    progress.on_trial_result(0, [a, b], b, {"val_sharpe": 0.6})
    assert progress.best == (1.4, "tft bf16 a")
    progress.on_trial_result(0, [a, b], a, {"val_sharpe": 0.3})  # ...then overfits
    assert progress.best == (0.6, "dqn bf16 b")
    progress.on_trial_result(0, [a, b], b, {"val_sharpe": math.nan, "diverged": 1})
    assert progress.best == (0.3, "tft bf16 a")  # a diverged trial is no candidate
    # The line says what it ranks by: a value that may go down, as it just did (1.4 -> 0.3).
    assert lines[-1].endswith("best val Sharpe (latest epochs) +0.30 (tft bf16 a)")
