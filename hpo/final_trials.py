"""The rows of a sweep's trials as its driver holds them when the experiment ends.

The sweep's summary (``hpo.sweep.finish_sweep``) needs every trial's row. Read back from
storage, that is Tune's whole experiment state parsed again, about 0.15 GB and two
seconds at a thousand trials, right after Tune held the same trials in memory. This
callback takes the rows from Tune's own trials at ``on_experiment_end`` instead; where it
has none (a driver that stopped before the end), the summary reads them from storage.
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

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles callbacks into its experiment state: the rows are this driver's.
        return {"sweep_dir": self.sweep_dir, "rows": None}

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.rows = rows_of_trials(trials, self.sweep_dir, retried=True)
