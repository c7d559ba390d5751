"""A sweep kept in an object store: results, checkpoints and hpo's own files go to S3 (a
local moto server on 127.0.0.1), and `hpo status`, `hpo best` and `hpo resume` work from
the URI alone."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.sweep_process import HPO, write_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]
BUCKET = "hpo-test"
EPOCHS = 3


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def _s3(env: dict[str, str]) -> Any:
    from pyarrow import fs as pafs

    return pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
        endpoint_override=env["AWS_ENDPOINT_URL"],
    )


def _s3_files(env: dict[str, str], prefix: str) -> dict[str, int]:
    """Every object under ``prefix`` (bucket/key...) with its size."""
    from pyarrow import fs as pafs

    filesystem = _s3(env)
    infos = filesystem.get_file_info(pafs.FileSelector(prefix, recursive=True))
    return {i.path: i.size for i in infos if i.type == pafs.FileType.File}


def _hpo(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPO, *args],
        cwd=cwd,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_sweep_runs_and_resumes_from_an_s3_uri(tmp_path: Path, s3_env: dict[str, str]) -> None:
    storage = f"s3://{BUCKET}/sweeps"
    # A few steps an epoch: the test is about where the sweep's files go, not training.
    trainer = {"lookback": 16, "batch_size": 32, "max_steps_per_epoch": 3}
    spec = write_spec(tmp_path, "in-s3", max_epochs=EPOCHS, storage=storage, trainer=trainer)
    swept = _hpo(["sweep", str(spec)], tmp_path, s3_env)
    assert swept.returncode == 0, swept.stdout[-3000:] + swept.stderr[-3000:]
    assert "2/2 trials finished" in swept.stdout

    files = _s3_files(s3_env, f"{BUCKET}/sweeps/in-s3")
    names = {path.rsplit("/", 1)[-1] for path in files}
    assert {"hpo-sweep.json", "hpo-summary.json", "result.json"} <= names
    assert any(n.startswith("experiment_state") for n in names)
    # The two configurations train as one group trial: a checkpoint folder each in its
    # checkpoints' state/.
    weights = [p for p in files if "/state/c00" in p and p.endswith("/model.safetensors")]
    assert len(weights) >= 2 and all(files[p] > 0 for p in weights)
    trial_results = sorted(p for p in files if p.endswith("/result.json"))
    assert len(trial_results) == 1
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "s3:").exists()

    sweep_uri = f"{storage}/in-s3"
    status = _hpo(["status", sweep_uri, "--json"], tmp_path, s3_env)
    assert status.returncode == 0, status.stderr[-3000:]
    trials = json.loads(status.stdout)["trials"]
    assert [t["status"] for t in trials] == ["TERMINATED", "TERMINATED"]
    assert all(t["epochs"] == EPOCHS for t in trials)
    assert all(t["checkpoint"].startswith(f"{sweep_uri}/") for t in trials)

    best = _hpo(["best", sweep_uri, "--json"], tmp_path, s3_env)
    assert best.returncode == 0, best.stderr[-3000:]
    best_checkpoint = json.loads(best.stdout)[0]["checkpoint"]
    assert best_checkpoint.startswith(f"{sweep_uri}/")

    # The best trial continues locally from its checkpoint in S3 (fetched first).
    cont = tmp_path / "continued"
    args = ["train", "--resume", best_checkpoint, "--out", str(cont), "--epochs", str(EPOCHS + 1)]
    trained = _hpo(args, tmp_path, s3_env)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert f"fetched {best_checkpoint}" in " ".join(trained.stderr.split())
    metrics = json.loads((cont / "metrics.json").read_text())
    assert metrics["epochs"] == EPOCHS + 1 and metrics["history"][-1]["epoch"] == EPOCHS + 1
    fetched = trained.stderr.split(" to ", 1)[1].split()[0]
    trial = best_checkpoint.rsplit("/", 1)[-1]  # the trial's folder in its group's state/
    assert "hpo-fetch-" in fetched and fetched.endswith(f"/{trial}")
    assert not Path(fetched).exists()  # the temporary copy is gone with the command

    # Resuming reads the spec, the searcher and Tune's state back from S3; the finished
    # trials are not trained again.
    before = _result_lines(s3_env, trial_results)
    resumed = _hpo(["resume", sweep_uri], tmp_path, s3_env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "2/2 trials finished" in resumed.stdout
    assert _result_lines(s3_env, trial_results) == before == [EPOCHS]  # the group's rows


def _result_lines(env: dict[str, str], paths: list[str]) -> list[int]:
    filesystem = _s3(env)
    counts = []
    for path in paths:
        with filesystem.open_input_stream(path) as stream:
            counts.append(sum(1 for line in bytes(stream.read()).splitlines() if line.strip()))
    return counts
