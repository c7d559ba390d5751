"""`hpo resume` unpickles Ray Tune's saved state, so it refuses a local sweep directory
that other users can write, and its help says to resume only trusted storage."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cluster.storage
from cluster.storage import SweepLocation
from hpo.cli import UserError, app
from hpo.record import SweepRecord
from tests.hpo.sweep_helpers import tiny_spec

runner = CliRunner()
STATE = "experiment_state-2026-01-01_00-00-00.json"


def _sweep_dir(tmp_path: Path) -> Path:
    spec = tiny_spec(tmp_path)
    where = SweepLocation.parse(tmp_path / "results").child(spec.name)
    SweepRecord(spec, where, parent_run_id="0" * 32, tracking_uri=spec.tracking_uri).write()
    # A state file beside it (not tuner.pkl: with that, Tune would find state to restore).
    (where.local_path / STATE).write_text("{}")
    return where.local_path


def _resume(sweep_dir: Path) -> str:
    """The error `hpo resume` stops with (printed by `main` with exit code 2)."""
    result = runner.invoke(app, ["resume", str(sweep_dir)])
    assert isinstance(result.exception, UserError), result.output
    return str(result.exception)


@pytest.mark.parametrize(
    ("mode", "who"), [(0o777, "writable by everyone"), (0o775, "writable by its group")]
)
def test_a_sweep_directory_others_can_write_is_refused(tmp_path: Path, mode: int, who: str) -> None:
    sweep_dir = _sweep_dir(tmp_path)
    sweep_dir.chmod(mode)
    output = _resume(sweep_dir)
    assert f"refusing to resume {sweep_dir}" in output and f"{sweep_dir} is {who}" in output
    assert "unpickles" in output and "chmod -R go-w" in output


def test_a_state_file_others_can_write_is_refused(tmp_path: Path) -> None:
    sweep_dir = _sweep_dir(tmp_path)
    (sweep_dir / STATE).chmod(0o666)
    output = _resume(sweep_dir)
    assert f"{sweep_dir / STATE} is writable by everyone" in output


def test_a_sweep_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep_dir = _sweep_dir(tmp_path)
    owner = sweep_dir.stat().st_uid
    monkeypatch.setattr(cluster.storage.os, "getuid", lambda: owner + 1)  # we are someone else
    output = _resume(sweep_dir)
    assert f"{sweep_dir} is owned by uid {owner}, not by this user ({owner + 1})" in output


def test_a_directory_only_its_owner_writes_passes_the_check(tmp_path: Path) -> None:
    sweep_dir = _sweep_dir(tmp_path)
    assert os.stat(sweep_dir).st_mode & 0o022 == 0
    output = _resume(sweep_dir)
    # Past the trust check: the next one finds no experiment state Tune could restore.
    assert "refusing" not in output and "has no Ray Tune experiment state" in output


def test_resume_help_says_to_resume_only_trusted_storage() -> None:
    result = runner.invoke(app, ["resume", "--help"])
    assert result.exit_code == 0
    assert "only resume storage you trust" in " ".join(result.output.split())
