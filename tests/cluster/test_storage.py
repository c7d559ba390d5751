"""SweepLocation: local paths and object-store URIs named, joined and read the same way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.storage import SweepLocation, local_copy


def test_local_paths_are_absolute_and_uris_keep_their_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    local = SweepLocation.parse("results")
    assert local.uri == str(tmp_path / "results") and local.is_local
    assert SweepLocation.parse(f"file://{tmp_path}/x").uri == str(tmp_path / "x")
    remote = SweepLocation.parse("s3://bucket/hpo/")
    assert remote.uri == "s3://bucket/hpo" and not remote.is_local
    assert remote.child("sweep-a").uri == "s3://bucket/hpo/sweep-a"
    assert remote.child("sweep-a").parent == remote and remote.child("sweep-a").name == "sweep-a"
    # Tune and pyarrow report paths inside the store without the scheme.
    assert remote.uri_of("bucket/hpo/sweep-a/checkpoint_000001") == (
        "s3://bucket/hpo/sweep-a/checkpoint_000001"
    )
    assert local.uri_of("/abs/path") == "/abs/path"
    with pytest.raises(ValueError, match="not a local path"):
        _ = remote.local_path


def test_files_are_written_whole_and_read_back(tmp_path: Path) -> None:
    where = SweepLocation.parse(tmp_path / "sweeps" / "a")
    assert not where.exists("hpo-sweep.json")
    where.write_text("hpo-sweep.json", '{"v": 1}')
    where.write_text("hpo-sweep.json", '{"v": 2}')
    assert where.read_text("hpo-sweep.json") == '{"v": 2}'
    assert sorted(p.name for p in where.local_path.iterdir()) == ["hpo-sweep.json"]  # no tmp


def test_a_local_checkpoint_is_used_in_place(tmp_path: Path) -> None:
    with local_copy(str(tmp_path)) as local:
        assert local == tmp_path
    assert tmp_path.is_dir()  # nothing removed


def test_an_unreachable_store_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # nothing listens on the discard port
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_REGION": "us-east-1",
        "COLUMNS": "200",
    }
    done = subprocess.run(
        [sys.executable, "-m", "hpo.cli", "status", "s3://no-bucket/sweeps/x"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join(done.stderr.split())
    assert done.returncode == 2, text
    assert "cannot read s3://no-bucket/sweeps/x/hpo-sweep.json" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("store", ["local", "object store"])
def test_tune_state_is_there_once_the_first_experiment_snapshot_is(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpo status` before Tune's first snapshot has no trials to show, not Ray's error.
    The object store is pyarrow's in-memory mock filesystem behind an s3:// location."""
    from pyarrow import fs as pafs

    if store == "local":
        where = SweepLocation.parse(tmp_path / "sweep")
        (tmp_path / "sweep").mkdir()

        def put(name: str) -> None:
            (tmp_path / "sweep" / name).write_text("{}")
    else:
        mock = pafs._MockFileSystem()
        mock.create_dir("bucket/hpo/sweep")
        where = SweepLocation.parse("s3://bucket/hpo/sweep")
        monkeypatch.setattr(SweepLocation, "filesystem", lambda self: (mock, "bucket/hpo/sweep"))

        def put(name: str) -> None:
            with mock.open_output_stream(f"bucket/hpo/sweep/{name}") as out:
                out.write(b"{}")

    put("hpo-sweep.json")
    put("experiment_state-2026-12-01.json.tmp")  # not a snapshot yet
    assert not where.has_tune_state()
    put("experiment_state-2026-12-01_22-00-00.json")
    assert where.has_tune_state()
