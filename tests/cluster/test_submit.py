"""`hpo submit` without a cluster: what is uploaded, what the job runs, how the client
authenticates, and what never leaves the client (the token). The real submission to a
multi-node cluster is in test_multinode.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import cluster.submit as submit
from cluster.connect import ClusterError
from cluster.submit import (
    EXCLUDES,
    REDACTED,
    entrypoint,
    follow_job,
    job_login,
    jobs_address,
    list_jobs,
    resolve_token,
    stage_snapshot,
    submission_problems,
    submit_sweep,
)
from hpo.cli import app
from hpo.spec import load_spec
from tests.cluster.local_cluster import free_port
from tests.hpo.sweep_helpers import tiny_spec
from trainables.data import synthetic_bars

TOKEN = "0123456789abcdef" * 4


def shared_spec(tmp_path: Path, **overrides: Any) -> Any:
    return tiny_spec(
        tmp_path,
        tracking_uri="http://127.0.0.1:5000",
        storage=str(tmp_path / "shared"),
        **overrides,
    )


class FakeJobs:
    """Records submit_job calls; checks the snapshot while it still exists."""

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []
        self.snapshot_files: set[str] = set()
        self.spec_text = ""

    def submit_job(self, **kwargs: Any) -> str:
        self.submitted.append(kwargs)
        root = Path(kwargs["runtime_env"]["working_dir"])
        self.snapshot_files = {str(p.relative_to(root)) for p in root.rglob("*")}
        spec_rel = kwargs["entrypoint"].split()[4]
        self.spec_text = (root / spec_rel).read_text()
        return kwargs["submission_id"]


# -- addresses and tokens ----------------------------------------------------------------------
def test_jobs_address(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    assert jobs_address(None) == "http://127.0.0.1:8265"
    assert jobs_address("10.0.0.5:8265") == "http://10.0.0.5:8265"
    assert jobs_address("https://ray.internal/") == "https://ray.internal"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # a GCS address is not the Jobs API
    assert jobs_address(None) == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://head:8265")
    assert jobs_address(None) == "http://head:8265"
    with pytest.raises(ClusterError, match="not ray://head:10001: use --address http://HEAD:8265"):
        jobs_address("ray://head:10001")


def test_token_is_found_where_ray_looks(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert resolve_token({}, home) is None
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    assert resolve_token({}, home) == "from-home"
    named = tmp_path / "token"
    named.write_text("from-path")
    assert resolve_token({"RAY_AUTH_TOKEN_PATH": str(named)}, home) == "from-path"
    assert (
        resolve_token({"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(named)}, home)
        == "from-env"
    )
    assert resolve_token({"RAY_AUTH_TOKEN": "x", "RAY_AUTH_MODE": "disabled"}, home) is None


def test_unreachable_jobs_api_fails_fast_without_a_traceback() -> None:
    result = CliRunner().invoke(app, ["jobs", "--address", f"http://127.0.0.1:{free_port()}"])
    assert result.exit_code != 0
    assert "cannot reach the Ray Jobs API" in str(result.exception)
    assert "connection refused" in str(result.exception)


# -- what a submitted sweep needs -----------------------------------------------------------------
def test_relative_storage_and_tracking_store_are_refused(tmp_path: Path) -> None:
    spec = tiny_spec(tmp_path, storage="hpo-results", tracking_uri="sqlite:///mlflow.db")
    problems = submission_problems(spec)
    assert len(problems) == 2
    assert problems[0].startswith("storage: 'hpo-results' is relative")
    assert problems[1].startswith("tracking_uri: 'sqlite:///mlflow.db' is relative")
    assert submission_problems(shared_spec(tmp_path)) == []
    absolute = tiny_spec(tmp_path, tracking_uri=f"sqlite:///{tmp_path / 'head.db'}")
    assert submission_problems(absolute) == []


def test_snapshot_holds_the_project_and_the_spec_but_no_clutter(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "hpo").mkdir(parents=True)
    (project / "hpo" / "cli.py").write_text("# code\n")
    (project / "data").mkdir()
    # real bars: the spec builds its walk-forward splits on them when it is parsed
    synthetic_bars(n_assets=2, n_bars=600, seed=1).to_frame().to_csv(
        project / "data" / "bars.csv", index=False
    )
    for clutter in (
        ".venv/bin/python",
        ".git/HEAD",
        "hpo/__pycache__/cli.pyc",
        "mlflow.db",
        "mlruns/0/meta.yaml",
        ".mypy_cache/x.json",
        ".env",
        "shared/e2e/old.json",
    ):
        (project / clutter).parent.mkdir(parents=True, exist_ok=True)
        (project / clutter).write_text("x")
    spec = tiny_spec(
        tmp_path,
        tracking_uri="http://127.0.0.1:5000",
        storage=str(project / "shared"),  # results inside the project are never uploaded
        data={"source": str(project / "data" / "bars.csv")},
    )
    dest = tmp_path / "snapshot"
    spec_rel = stage_snapshot(spec, project, dest)
    files = {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}
    assert files == {"hpo/cli.py", "data/bars.csv", spec_rel}
    assert spec_rel == "_hpo_submit/e2e.yaml"
    payload = yaml.safe_load((dest / spec_rel).read_text())
    assert payload["data"]["source"] == "data/bars.csv"  # travels with the snapshot
    assert payload["storage"] == str(project / "shared")
    # The spec as validated, less what only a started sweep records (grouping.configs_per_ask).
    assert payload["grouping"] == {"group_size": spec.grouping.group_size}
    assert {k: v for k, v in payload.items() if k != "data"} == {
        k: v
        for k, v in spec.model_dump(exclude={"grouping": {"configs_per_ask"}}).items()
        if k != "data"
    }


def test_written_spec_loads_back_identically(tmp_path: Path) -> None:
    spec = shared_spec(tmp_path, resources={"cpu": 1, "gpu": "measured"})
    (tmp_path / "project").mkdir()
    spec_rel = stage_snapshot(spec, tmp_path / "project", tmp_path / "snapshot")
    assert load_spec(tmp_path / "snapshot" / spec_rel) == spec


def test_entrypoint_runs_the_sweep_in_the_cluster() -> None:
    assert entrypoint("_hpo_submit/my sweep.yaml") == (
        "python -m hpo.cli sweep '_hpo_submit/my sweep.yaml' --address auto"
    )
    assert entrypoint("s.yaml", python="/opt/venv/bin/python").startswith("/opt/venv/bin/python -m")
    assert entrypoint("s.yaml", head_credentials="~/mlflow store/auth/sweep.credentials") == (
        "python -m hpo.cli sweep s.yaml --address auto "
        "--tracking-credentials '~/mlflow store/auth/sweep.credentials'"
    )


# -- submission ------------------------------------------------------------------------------------
def test_submit_uploads_the_snapshot_and_never_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [{"state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": 1.0}}]
    monkeypatch.setattr(submit, "cluster_nodes", lambda address, token: nodes)
    monkeypatch.delenv("HPO_SHARED_STORAGE", raising=False)
    jobs = FakeJobs()
    (tmp_path / "project" / "hpo").mkdir(parents=True)
    (tmp_path / "project" / "hpo" / "cli.py").write_text("# code\n")
    spec = shared_spec(tmp_path, resources={"cpu": 1, "gpu": 0.5})
    done = submit_sweep(
        spec,
        "http://127.0.0.1:8265",
        working_dir=tmp_path / "project",
        shared_storage=True,
        token=TOKEN,
        client=jobs,
    )
    (call,) = jobs.submitted
    assert call["submission_id"] == done.job_id and done.job_id.startswith("hpo-e2e-")
    assert call["entrypoint"] == "python -m hpo.cli sweep _hpo_submit/e2e.yaml --address auto"
    assert call["runtime_env"]["env_vars"] == {"PYTHONUNBUFFERED": "1", "HPO_SHARED_STORAGE": "1"}
    assert set(EXCLUDES) <= set(call["runtime_env"]["excludes"])
    assert call["metadata"] == {"hpo.sweep": "e2e", "hpo.storage": str(tmp_path / "shared")}
    assert jobs.snapshot_files == {"hpo", "hpo/cli.py", "_hpo_submit", "_hpo_submit/e2e.yaml"}
    assert "tracking_uri: http://127.0.0.1:5000" in jobs.spec_text
    assert TOKEN not in json.dumps(call, default=str) and TOKEN not in jobs.spec_text
    assert done.sweep_dir == f"{tmp_path / 'shared'}/e2e"
    assert not Path(call["runtime_env"]["working_dir"]).exists()  # the staging copy is gone


def test_a_spec_no_node_can_run_is_not_submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [{"state": "ALIVE", "resources_total": {"CPU": 4.0}}] * 3
    monkeypatch.setattr(submit, "cluster_nodes", lambda address, token: nodes)
    jobs = FakeJobs()
    project = tmp_path / "project"
    project.mkdir()
    spec = shared_spec(tmp_path, resources={"cpu": 1, "gpu": "measured"})
    with pytest.raises(ClusterError) as caught:
        submit_sweep(spec, "http://127.0.0.1:8265", working_dir=project, token=TOKEN, client=jobs)
    assert str(caught.value).startswith("sweep 'e2e' was not submitted:")
    assert "the cluster has no GPUs (3 node(s): 3 x 4 CPU/0 GPU)" in str(caught.value)
    assert jobs.submitted == []
    # An autoscaling cluster with its GPU group at zero: skip the client-side check.
    submit_sweep(
        spec,
        "http://127.0.0.1:8265",
        working_dir=project,
        token=TOKEN,
        client=jobs,
        check_resources=False,
    )
    assert len(jobs.submitted) == 1


def test_submit_sends_no_mlflow_secret_through_ray_only_the_heads_file_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray writes a job's runtime_env to the head's and workers' logs, so the client's
    MLflow password must not be in it: the job reads a file on the head, named by path."""
    nodes = [{"state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": 1.0}}]
    monkeypatch.setattr(submit, "cluster_nodes", lambda address, token: nodes)
    jobs = FakeJobs()
    monkeypatch.setattr(submit, "job_client", lambda address, token=None: jobs)
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "sweep")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-password")
    project = tmp_path / "project"
    project.mkdir()
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(shared_spec(tmp_path).model_dump()))
    base = ["submit", str(spec_path), "--address", "http://127.0.0.1:8265"]
    base += ["--working-dir", str(project)]

    by_env = CliRunner().invoke(app, base)
    assert by_env.exit_code == 0, by_env.output
    assert "logs in to MLflow with the head's MLFLOW_TRACKING_* variables" in by_env.output
    by_path = CliRunner().invoke(app, [*base, "--head-credentials", "/etc/hpo/sweep.credentials"])
    assert by_path.exit_code == 0, by_path.output
    assert len(jobs.submitted) == 2
    for call in jobs.submitted:
        sent = json.dumps(call, default=str)
        assert "s3cret-password" not in sent and "MLFLOW_TRACKING" not in sent
    assert jobs.submitted[1]["entrypoint"].endswith(
        "--address auto --tracking-credentials /etc/hpo/sweep.credentials"
    )

    relative = CliRunner().invoke(app, [*base, "--head-credentials", "auth/sweep.credentials"])
    assert relative.exit_code != 0 and len(jobs.submitted) == 2
    problem = "--head-credentials 'auth/sweep.credentials': give an absolute path"
    assert problem in str(relative.exception)  # a UserError: `hpo` prints it, exit 2


def test_submitting_on_the_head_checks_the_server_with_the_heads_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without credentials of its own, the client checks the server with the file the
    job will read, where it can read it (on the head); elsewhere it leaves the check to
    the job."""
    import cluster.tracking_auth as tracking_auth

    nodes = [{"state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": 1.0}}]
    monkeypatch.setattr(submit, "cluster_nodes", lambda address, token: nodes)
    monkeypatch.setattr(submit, "job_client", lambda address, token=None: FakeJobs())
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    checked: list[Path | None] = []
    monkeypatch.setattr(
        tracking_auth, "check_access", lambda uri, creds, timeout_s=10.0: checked.append(creds)
    )
    heads_file = tmp_path / "sweep.credentials"
    heads_file.write_text("MLFLOW_TRACKING_USERNAME=sweep\nMLFLOW_TRACKING_PASSWORD=x\n")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(shared_spec(tmp_path).model_dump()))
    (tmp_path / "project").mkdir()
    base = ["submit", str(spec_path), "--address", "http://127.0.0.1:8265"]
    base += ["--working-dir", str(tmp_path / "project"), "--head-credentials"]
    for path in (heads_file, tmp_path / "elsewhere" / "sweep.credentials"):
        result = CliRunner().invoke(app, [*base, str(path)])
        assert result.exit_code == 0, result.output
    assert checked == [heads_file, None]


def test_job_login_decides_the_credentials_the_job_uses_and_the_client_checks(
    tmp_path: Path,
) -> None:
    """One place decides: the client's own file or variables where it has them, else the
    head's file where this client can read it; the note and the masked password follow."""
    uri = "http://mlflow:5000"
    heads_file = tmp_path / "sweep.credentials"
    heads_file.write_text("x")
    mine = tmp_path / "mine.credentials"
    variables = {"MLFLOW_TRACKING_USERNAME": "sweep", "MLFLOW_TRACKING_PASSWORD": "pw"}

    by_variables = job_login(uri, None, None, env=variables)
    assert (by_variables.head_credentials, by_variables.check_with) == (None, None)
    assert (
        by_variables.note is not None and "head's MLFLOW_TRACKING_* variables" in by_variables.note
    )
    assert by_variables.secrets == ("pw",)
    assert job_login("sqlite:////srv/mlflow.db", None, None, env=variables).note is None

    on_head = job_login(uri, str(heads_file), None, env={})
    assert (on_head.head_credentials, on_head.check_with) == (str(heads_file), heads_file)
    assert on_head.note is None and on_head.secrets == ()
    elsewhere = job_login(uri, str(tmp_path / "nowhere"), None, env={})
    assert elsewhere.check_with is None
    # The client's own credentials win, also over the head's readable file.
    assert job_login(uri, str(heads_file), mine, env={}).check_with == mine
    assert job_login(uri, str(heads_file), None, env=variables).check_with is None


# -- following and listing ---------------------------------------------------------------------------
class FakeStatus(SimpleNamespace):
    def is_terminal(self) -> bool:
        return self.value in ("SUCCEEDED", "FAILED", "STOPPED")


def test_follow_streams_masked_logs_and_returns_the_status() -> None:
    statuses = iter(["RUNNING", "SUCCEEDED"])

    class Client:
        async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
            yield "starting\n"
            yield f"env RAY_AUTH_TOKEN={TOKEN}\n"  # a careless print in user code
            yield "4/4 trials finished\n"

        def get_job_status(self, job_id: str) -> FakeStatus:
            return FakeStatus(value=next(statuses))

    seen: list[str] = []
    status = follow_job(Client(), "job-1", seen.append, [TOKEN], poll_s=0.01)
    assert status == "SUCCEEDED"
    assert "".join(seen) == f"starting\nenv RAY_AUTH_TOKEN={REDACTED}\n4/4 trials finished\n"


def test_jobs_are_listed_newest_first() -> None:
    def job(job_id: str, start: int, status: str) -> SimpleNamespace:
        return SimpleNamespace(
            submission_id=job_id,
            job_id=None,
            status=SimpleNamespace(value=status),
            metadata={"hpo.sweep": job_id.split("-")[1]},
            entrypoint="python -m hpo.cli sweep _hpo_submit/x.yaml --address auto",
            start_time=start,
            end_time=start + 60_000 if status != "RUNNING" else None,
            message="Job finished successfully.\nmore",
        )

    client = SimpleNamespace(
        list_jobs=lambda: [
            job("hpo-a-1", 1_700_000_000_000, "SUCCEEDED"),
            job("hpo-b-2", 1_700_000_100_000, "RUNNING"),
        ]
    )
    rows = list_jobs(client)
    assert [r.job_id for r in rows] == ["hpo-b-2", "hpo-a-1"]
    assert [r.status for r in rows] == ["RUNNING", "SUCCEEDED"]
    assert (
        rows[0].end == "" and rows[1].end != "" and rows[1].message == "Job finished successfully."
    )
    assert rows[1].sweep == "a"
