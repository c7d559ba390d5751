"""A retried trial resumes from the checkpoint its last recorded result names; a sweep
whose first trials fail alike stops with that error."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cloudpickle
import pytest
from pyarrow import fs as pafs
from ray.exceptions import RayTaskError, WorkerCrashedError
from ray.tune import Checkpoint

from hpo.recovery import (
    AdoptReportedCheckpoint,
    StopOnRepeatedError,
    adopt_reported_checkpoint,
    error_signature,
)


@dataclass
class _Storage:
    trial_fs_path: str
    storage_filesystem: Any = field(default_factory=pafs.LocalFileSystem)


@dataclass
class _Trial:
    """The part of ``ray.tune.experiment.Trial`` the callback touches."""

    storage: _Storage
    last_result: dict[str, Any]
    checkpoint: Checkpoint | None
    registered: list[Any] = field(default_factory=list)
    trial_id: str = "t1"
    status: str = "PENDING"

    def on_checkpoint(self, result: Any) -> None:
        self.registered.append(result)
        self.checkpoint = result.checkpoint


def _trial(tmp_path: Path, reported: str | None, registered: str | None) -> _Trial:
    for name in ("checkpoint_000000", "checkpoint_000001", "checkpoint_000002"):
        (tmp_path / name).mkdir(exist_ok=True)
    return _Trial(
        storage=_Storage(str(tmp_path)),
        last_result={"epoch": 3, "checkpoint_dir_name": reported} if reported else {"epoch": 3},
        checkpoint=Checkpoint(str(tmp_path / registered)) if registered else None,
    )


def test_a_checkpoint_reported_but_not_registered_is_adopted(tmp_path: Path) -> None:
    trial = _trial(tmp_path, reported="checkpoint_000002", registered="checkpoint_000001")
    assert adopt_reported_checkpoint(trial)
    (result,) = trial.registered
    assert result.checkpoint.path == str(tmp_path / "checkpoint_000002")
    assert result.metrics["epoch"] == 3


def test_first_checkpoint_is_adopted_when_none_was_registered(tmp_path: Path) -> None:
    trial = _trial(tmp_path, reported="checkpoint_000000", registered=None)
    assert adopt_reported_checkpoint(trial)
    assert trial.checkpoint is not None and trial.checkpoint.path.endswith("checkpoint_000000")


def test_nothing_changes_when_tune_already_holds_it(tmp_path: Path) -> None:
    trial = _trial(tmp_path, reported="checkpoint_000002", registered="checkpoint_000002")
    assert not adopt_reported_checkpoint(trial)
    assert trial.registered == []


def test_a_result_without_a_checkpoint_or_a_missing_directory_is_ignored(tmp_path: Path) -> None:
    assert not adopt_reported_checkpoint(_trial(tmp_path, reported=None, registered=None))
    gone = _trial(tmp_path, reported="checkpoint_000007", registered="checkpoint_000001")
    assert not adopt_reported_checkpoint(gone)
    assert gone.registered == []


def test_a_resumed_sweep_adopts_for_unfinished_trials_once(tmp_path: Path) -> None:
    pending = _trial(tmp_path, reported="checkpoint_000002", registered="checkpoint_000001")
    finished = _trial(tmp_path, reported="checkpoint_000002", registered="checkpoint_000001")
    finished.status = "TERMINATED"
    callback = AdoptReportedCheckpoint()
    callback.on_step_begin(0, [pending, finished])
    assert len(pending.registered) == 1 and finished.registered == []
    pending.checkpoint = Checkpoint(str(tmp_path / "checkpoint_000001"))
    callback.on_step_begin(1, [pending, finished])  # later steps leave trials alone
    assert len(pending.registered) == 1


def _failed(trial_id: str, error: BaseException | None, root: Path) -> SimpleNamespace:
    """The part of a failed Tune trial StopOnRepeatedError reads: Tune pickles the error
    into the trial's driver-side directory before it calls the callbacks."""
    staging = root / "staging" / trial_id
    staging.mkdir(parents=True, exist_ok=True)
    if error is not None:
        (staging / "error.pkl").write_bytes(cloudpickle.dumps(error))
    return SimpleNamespace(
        trial_id=trial_id,
        path=f"/sweeps/x/{trial_id}",
        pickled_error_file=str(staging / "error.pkl"),
    )


def _raised_by_trial(cause: BaseException) -> RayTaskError:
    """How Ray hands over an exception a trial's own code raised."""
    return RayTaskError("run_trial", "Traceback: ...", cause, "ray::t", 1, "127.0.0.1")


MISSING = FileNotFoundError("data source '/data/bars' does not exist")


def test_the_sweep_stops_when_its_first_failures_are_one_error_in_two_trials(
    tmp_path: Path,
) -> None:
    stop = StopOnRepeatedError(repeats=3, trials=2)
    stop.on_trial_recover(0, [], _failed("a", _raised_by_trial(MISSING), tmp_path))
    stop.on_trial_recover(0, [], _failed("a", _raised_by_trial(MISSING), tmp_path))  # a retry
    assert not stop.stop_all() and stop(trial_id="a", result={}) is False
    stop.on_trial_error(0, [], _failed("b", _raised_by_trial(MISSING), tmp_path))
    assert stop.stop_all()
    assert stop.reason is not None
    assert "its first 3 failures, in 2 trials, were the same error" in stop.reason
    assert "FileNotFoundError: data source '/data/bars' does not exist" in stop.reason
    assert "/sweeps/x/b/error.txt" in stop.reason and "Fix what the error names" in stop.reason


def test_one_trial_at_a_time_its_retries_first_still_stops_at_the_second_trial(
    tmp_path: Path,
) -> None:
    # max_concurrent = 1: Tune retries trial a (max_failures = 2) before it starts b, so
    # the first three failures are all a's; the sweep stops at b's first failure.
    stop = StopOnRepeatedError(repeats=3, trials=2)
    for _ in range(3):
        stop.on_trial_recover(0, [], _failed("a", _raised_by_trial(MISSING), tmp_path))
    assert not stop.stop_all()
    stop.on_trial_error(0, [], _failed("b", _raised_by_trial(MISSING), tmp_path))
    assert stop.stop_all()
    assert stop.reason is not None and "its first 4 failures, in 2 trials" in stop.reason


def test_faults_finished_trials_mixed_errors_or_one_trial_leave_the_sweep_to_its_retries(
    tmp_path: Path,
) -> None:
    def missing(trial_id: str) -> SimpleNamespace:
        return _failed(trial_id, _raised_by_trial(MISSING), tmp_path)

    finished_first = StopOnRepeatedError(repeats=2)
    finished_first.on_trial_complete(0, [], _failed("a", None, tmp_path))
    fault_first = StopOnRepeatedError(repeats=2)
    fault_first.on_trial_recover(0, [], _failed("a", WorkerCrashedError(), tmp_path))
    mixed = StopOnRepeatedError(repeats=2)
    mixed.on_trial_error(0, [], _failed("x", _raised_by_trial(ValueError("lr=-1")), tmp_path))
    one_trial = StopOnRepeatedError(repeats=3, trials=2)
    for _ in range(3):
        one_trial.on_trial_recover(0, [], missing("a"))
    for stop in (finished_first, fault_first, mixed):
        for trial_id in "bcd":
            stop.on_trial_error(0, [], missing(trial_id))
    for stop in (finished_first, fault_first, mixed, one_trial):
        assert not stop.stop_all() and stop.reason is None


@pytest.mark.parametrize(
    ("error", "signature"),
    [
        (_raised_by_trial(ValueError("lr must be > 0")), "ValueError: lr must be > 0"),
        (_raised_by_trial(MISSING), f"FileNotFoundError: {MISSING}"),
        (_raised_by_trial(ConnectionResetError("peer reset")), None),  # the network
        (_raised_by_trial(TimeoutError("read timed out")), None),
        (_raised_by_trial(WorkerCrashedError()), None),  # Ray's own fault, as a cause
        (WorkerCrashedError(), None),  # a dead worker
        (None, None),  # no pickled error
    ],
)
def test_error_signature_counts_the_trials_own_errors_only(
    error: BaseException | None, signature: str | None
) -> None:
    assert error_signature(error) == signature


def test_an_old_checkpoint_already_gone_does_not_stop_the_adoption(tmp_path: Path) -> None:
    # Seen in CI on `hpo resume` after a killed driver: registering the reported
    # checkpoint made Tune delete one beyond num_to_keep that was already gone, and the
    # FileNotFoundError ended the resumed sweep. Tune updates its list before deleting.
    calls: list[str] = []

    class _Gone(_Trial):
        def on_checkpoint(self, result: Any) -> None:
            super().on_checkpoint(result)
            raise FileNotFoundError("Path not found: checkpoint_000000")

        def invalidate_json_state(self) -> None:
            calls.append("json")

    trial = _trial(tmp_path, reported="checkpoint_000002", registered="checkpoint_000001")
    gone = _Gone(trial.storage, trial.last_result, trial.checkpoint)
    gone.storage._update_checkpoint_index = lambda metrics: calls.append("index")  # type: ignore[attr-defined]
    gone.run_metadata = SimpleNamespace(invalidate_cache=lambda: calls.append("cache"))  # type: ignore[attr-defined]
    assert adopt_reported_checkpoint(gone)
    assert gone.checkpoint is not None and gone.checkpoint.path.endswith("checkpoint_000002")
    assert calls == ["index", "json", "cache"]
