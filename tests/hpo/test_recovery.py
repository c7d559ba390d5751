"""A retried trial resumes from the checkpoint its last recorded result names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs
from ray.tune import Checkpoint

from hpo.recovery import AdoptReportedCheckpoint, adopt_reported_checkpoint


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
