"""`hpo tracking-server` with authentication (the default), on loopback with the real
server: 401 without or with wrong credentials (REST and the artifact proxy), the sweep
user logs a run with a metric and an artifact, a reader only reads (403 on writes), the
credentials files are private and no password is printed; plus the client helpers of
cluster/tracking_auth.py.

    .venv/bin/python -m pytest -q -n 0 tests/cluster/test_tracking_auth.py
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from cluster.tracking_auth import (
    PASSWORD_VAR,
    USERNAME_VAR,
    CredentialsError,
    TrackingAccessError,
    apply_credentials,
    check_access,
    load_credentials,
    write_credentials,
)
from cluster.tracking_server import TrackingServerError, exposure, start_tracking_server
from hpo.cli import UserError, app
from tests.cluster.local_cluster import free_port, start_tracking_server_process
from tests.hpo.sweep_helpers import write_tiny_spec
from tests.processes import wait_for

HPO = [sys.executable, "-m", "hpo.cli"]
runner = CliRunner()


@dataclass
class Served:
    uri: str
    store: Path
    output: Path  # what `hpo tracking-server` printed (stdout and stderr)
    sweep: tuple[str, str]
    reader: tuple[str, str]


def _request(
    served: Served,
    path: str,
    *,
    auth: tuple[str, str] | None = None,
    body: dict[str, object] | None = None,
    method: str = "POST",
    data: bytes | None = None,
) -> tuple[int, bytes, str | None]:
    """(status, body, WWW-Authenticate) of one request, without MLflow's client."""
    payload = json.dumps(body).encode() if body is not None else data
    request = urllib.request.Request(f"{served.uri}{path}", data=payload, method=method)
    if body is not None:
        request.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), response.headers.get("WWW-Authenticate")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("WWW-Authenticate")


def _client(monkeypatch: pytest.MonkeyPatch, served: Served, user: tuple[str, str]) -> MlflowClient:
    monkeypatch.setenv(USERNAME_VAR, user[0])
    monkeypatch.setenv(PASSWORD_VAR, user[1])
    return MlflowClient(served.uri)


# -- One authenticated server for the module -------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, _mlflow_template: Path) -> Iterator[Served]:
    store = tmp_path_factory.mktemp("auth-store")
    shutil.copyfile(_mlflow_template, store / "mlflow.db")  # schema migrated once per session
    port = free_port()
    output = store.parent / "tracking-server.out"
    process = start_tracking_server_process(store, port, output)
    try:
        wait_for(
            lambda: "tracking URI:" in output.read_text(),
            timeout=300,
            what="the tracking server's 'tracking URI:' line",
            proc=process,
            interval=0.5,
            detail=output.read_text,
        )
        added = runner.invoke(
            app, ["tracking-server", "--store", str(store), "--add-reader", "viewer"]
        )
        assert added.exit_code == 0, added.output
        reader_file = store / "auth" / "reader-viewer.credentials"
        assert str(reader_file) in added.output.replace("\n", "")
        yield Served(
            uri=f"http://127.0.0.1:{port}",
            store=store,
            output=output,
            sweep=load_credentials(store / "auth" / "sweep.credentials"),
            reader=load_credentials(reader_file),
        )
    finally:
        process.send_signal(signal.SIGTERM)  # the command stops its mlflow server, then exits
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.xdist_group("tracking-auth")
class TestAuthenticatedServer:
    def test_prints_the_uri_and_the_credentials_path_never_a_password(self, served: Served) -> None:
        printed = served.output.read_text()
        assert f"tracking URI: {served.uri}" in printed
        assert str(served.store / "auth" / "sweep.credentials") in printed.replace("\n", "")
        auth = served.store / "auth"
        passwords = [load_credentials(p)[1] for p in auth.glob("*.credentials")]
        assert len(passwords) == 3  # admin, sweep, viewer
        for password in passwords:
            assert len(password) >= 40  # token_urlsafe(32)
            assert password not in printed
            assert password not in (served.store / "server.log").read_text()
            assert password not in (auth / "basic_auth.ini").read_text()

    def test_credentials_files_are_owner_only(self, served: Served) -> None:
        auth = served.store / "auth"
        assert stat.S_IMODE(auth.stat().st_mode) == 0o700
        for name in ("admin", "sweep", "reader-viewer"):
            assert stat.S_IMODE((auth / f"{name}.credentials").stat().st_mode) == 0o600, name
        assert not list(auth.glob(".*.tmp"))  # atomic writes leave no temporary file
        assert "default_permission = NO_PERMISSIONS" in (auth / "basic_auth.ini").read_text()

    def test_unauthenticated_requests_get_401(self, served: Served) -> None:
        search = _request(served, "/api/2.0/mlflow/experiments/search", body={"max_results": 1})
        assert search[0] == 401 and search[2] == 'Basic realm="mlflow"'
        get = _request(served, "/api/2.0/mlflow/experiments/get?experiment_id=0", method="GET")
        assert get[0] == 401
        proxy = "/api/2.0/mlflow-artifacts/artifacts/0/abc/artifacts/notes.txt"
        assert _request(served, proxy, method="GET")[0] == 401
        assert _request(served, proxy, method="PUT", data=b"x")[0] == 401
        assert _request(served, "/health", method="GET")[0] == 200  # probes stay open

    def test_wrong_credentials_get_401(self, served: Served) -> None:
        search = "/api/2.0/mlflow/experiments/search"
        wrong_password = (served.sweep[0], served.sweep[1][:-1] + "x")
        for auth in (wrong_password, ("nobody", served.sweep[1])):
            assert _request(served, search, auth=auth, body={"max_results": 1})[0] == 401

    def test_sweep_user_logs_a_run_with_a_metric_and_an_artifact(
        self, served: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        client = _client(monkeypatch, served, served.sweep)
        experiment_id = client.create_experiment("auth-sweep")
        run = client.create_run(experiment_id, run_name="trial-0")
        client.log_metric(run.info.run_id, "val_sharpe", 1.25, step=3)
        client.set_tag(run.info.run_id, "trial_id", "t0")
        notes = tmp_path / "notes.txt"
        notes.write_text("fold 0: sharpe 1.25\n")
        client.log_artifact(run.info.run_id, str(notes))
        client.set_terminated(run.info.run_id)

        (history,) = client.get_metric_history(run.info.run_id, "val_sharpe")
        assert (history.value, history.step) == (1.25, 3)
        down = Path(client.download_artifacts(run.info.run_id, "notes.txt", str(tmp_path / "d")))
        assert down.read_text() == "fold 0: sharpe 1.25\n"
        # Through the proxy into the store's artifacts/ directory.
        stored = served.store / "artifacts" / experiment_id / run.info.run_id / "artifacts"
        assert (stored / "notes.txt").read_text() == "fold 0: sharpe 1.25\n"
        # The creator manages its experiment: a resumed sweep may delete an orphaned run.
        orphan = client.create_run(experiment_id, run_name="orphan")
        client.delete_run(orphan.info.run_id)
        assert client.get_run(orphan.info.run_id).info.lifecycle_stage == "deleted"

    def test_reader_searches_runs_but_gets_403_on_writes(
        self, served: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        writer = _client(monkeypatch, served, served.sweep)
        experiment_id = writer.create_experiment("auth-read")
        run = writer.create_run(experiment_id, tags={"trial_id": "t1"})
        writer.log_metric(run.info.run_id, "val_sharpe", 0.5)
        notes = tmp_path / "notes.txt"
        notes.write_text("read me\n")
        writer.log_artifact(run.info.run_id, str(notes))

        reader = _client(monkeypatch, served, served.reader)
        (found,) = reader.search_runs([experiment_id], filter_string="tags.trial_id = 't1'")
        assert found.data.metrics == {"val_sharpe": 0.5}
        down = Path(reader.download_artifacts(run.info.run_id, "notes.txt", str(tmp_path / "d")))
        assert down.read_text() == "read me\n"
        writes = {
            "create experiment": lambda: reader.create_experiment("reader-made"),
            "create run": lambda: reader.create_run(experiment_id),
            "log metric": lambda: reader.log_metric(run.info.run_id, "val_sharpe", 9.0),
            "delete run": lambda: reader.delete_run(run.info.run_id),
            "delete experiment": lambda: reader.delete_experiment(experiment_id),
        }
        for what, write in writes.items():
            with pytest.raises(MlflowException, match="403") as caught:
                write()
            assert "403" in str(caught.value), what
        proxy = f"/api/2.0/mlflow-artifacts/artifacts/{experiment_id}/{run.info.run_id}/artifacts/x"
        assert _request(served, proxy, auth=served.reader, method="PUT", data=b"x")[0] == 403
        # Nothing changed.
        assert writer.get_run(run.info.run_id).data.metrics == {"val_sharpe": 0.5}
        assert writer.get_run(run.info.run_id).info.lifecycle_stage == "active"
        assert writer.get_experiment_by_name("reader-made") is None

    def test_check_access_names_the_variables_or_the_file(
        self, served: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        monkeypatch.delenv(USERNAME_VAR, raising=False)
        monkeypatch.delenv(PASSWORD_VAR, raising=False)
        with pytest.raises(
            TrackingAccessError, match=f"401.*set {USERNAME_VAR} and {PASSWORD_VAR}"
        ):
            check_access(served.uri)
        wrong = write_credentials(tmp_path / "wrong.credentials", served.sweep[0], "x" * 43)
        with pytest.raises(
            TrackingAccessError, match=f"rejected user 'sweep' from the credentials file {wrong}"
        ):
            check_access(served.uri, wrong)
        monkeypatch.setenv(USERNAME_VAR, served.sweep[0])
        monkeypatch.setenv(PASSWORD_VAR, "y" * 43)
        with pytest.raises(
            TrackingAccessError, match=f"from {USERNAME_VAR} / {PASSWORD_VAR} \\(401"
        ):
            check_access(served.uri)
        # Right credentials, from the file or the variables it sets: no error.
        sweep_file = served.store / "auth" / "sweep.credentials"
        check_access(served.uri, sweep_file)
        assert apply_credentials(sweep_file) == "sweep"
        assert os.environ[PASSWORD_VAR] == served.sweep[1]
        check_access(served.uri)
        with pytest.raises(TrackingAccessError, match="cannot reach the tracking server"):
            check_access(f"http://127.0.0.1:{free_port()}", sweep_file, timeout_s=5)

    def test_sweep_with_wrong_credentials_fails_before_launching_trials(
        self, served: Served, tmp_path: Path
    ) -> None:
        """`hpo sweep` as a user runs it: refused credentials stop it with a message
        naming the file or MLflow's variables, before Ray starts or a trial folder exists."""
        spec = write_tiny_spec(tmp_path, "refused", served.uri)
        env = {k: v for k, v in os.environ.items() if k not in (USERNAME_VAR, PASSWORD_VAR)}
        wrong = write_credentials(tmp_path / "wrong.credentials", served.sweep[0], "x" * 43)

        def sweep(*args: str, **extra: str) -> str:
            done = subprocess.run(
                [*HPO, "sweep", str(spec), *args],
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=300,
            )
            text = " ".join((done.stdout + done.stderr).split())  # rich wraps long lines
            assert done.returncode == 2, text[-4000:]
            assert "Traceback" not in text
            return text

        by_file = sweep("--tracking-credentials", str(wrong))
        assert f"rejected user 'sweep' from the credentials file {wrong} (401" in by_file
        by_vars = sweep(**{USERNAME_VAR: served.sweep[0], PASSWORD_VAR: "y" * 43})
        assert f"from {USERNAME_VAR} / {PASSWORD_VAR} (401" in by_vars
        none = sweep()
        assert f"requires authentication (401): set {USERNAME_VAR} and {PASSWORD_VAR}" in none
        for text in (by_file, by_vars, none):
            assert served.sweep[1] not in text
        # Nothing was launched: no sweep folder, no trial folder, no MLflow experiment.
        assert not (tmp_path / "results").exists()
        check_access(served.uri, served.store / "auth" / "sweep.credentials")
        status, body, _ = _request(
            served,
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name=refused",
            auth=served.sweep,
            method="GET",
        )
        assert status == 404, body

    def test_restart_keeps_credentials_and_a_lost_file_gets_a_new_password(
        self, served: Served
    ) -> None:
        from cluster.tracking_users import AUTH_CACHE_S, add_reader, prepare

        sweep_file = served.store / "auth" / "sweep.credentials"
        before = sweep_file.read_text()
        prepare(served.store)  # what a restart does before the server starts
        assert sweep_file.read_text() == before
        check_access(served.uri, sweep_file)

        old = served.store / "auth" / "reader-viewer.credentials"
        old_password = load_credentials(old)[1]
        old.unlink()
        renewed = add_reader(served.store, "viewer")
        assert load_credentials(renewed)[1] != old_password
        check_access(served.uri, renewed)
        search = "/api/2.0/mlflow/experiments/search"
        stale = ("viewer", old_password)
        # Refused once the server's password cache (AUTH_CACHE_S) lets the old one go.
        wait_for(
            lambda: _request(served, search, auth=stale, body={"max_results": 1})[0] == 401,
            timeout=AUTH_CACHE_S + 20,
            what="the stale password to be refused",
        )


# -- No server needed ---------------------------------------------------------------------------------
def test_no_auth_off_loopback_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = runner.invoke(
        app, ["tracking-server", "--no-auth", "--host", "0.0.0.0", "--store", str(store)]
    )
    assert isinstance(result.exception, UserError)
    assert "--no-auth with --host 0.0.0.0" in str(result.exception)
    assert "loopback" in str(result.exception)
    assert not store.exists()  # refused before anything started or was written
    with pytest.raises(TrackingServerError, match=r"refusing to serve 10\.0\.0\.5 without auth"):
        start_tracking_server(store, host="10.0.0.5", port=0, auth=False)
    assert not store.exists()


def test_one_rule_says_who_may_reach_the_server() -> None:
    """`exposure` is the loopback-only rule of a server without authentication (for the
    CLI and start_tracking_server alike) and what it says to whoever starts one."""
    assert exposure("127.0.0.1", auth=True) is None
    assert exposure("::1", auth=False) == (
        "warning",
        "authentication is off (--no-auth): allowed because ::1 is loopback; anyone on "
        "this machine can read and write the store",
    )
    assert exposure("0.0.0.0", auth=True) == (
        "note",
        "binding to 0.0.0.0: clients need the sweep user's credentials; pass "
        "--allowed-hosts for the names clients use",
    )
    for host in ("0.0.0.0", "::", "10.0.0.5", "mlflow.internal"):
        with pytest.raises(TrackingServerError, match=f"--no-auth with --host {host}"):
            exposure(host, auth=False)


def test_write_credentials_is_0600_and_load_refuses_a_readable_file(tmp_path: Path) -> None:
    path = write_credentials(tmp_path / "auth" / "u.credentials", "alice", "p" * 20)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"{USERNAME_VAR}=alice\n{PASSWORD_VAR}={'p' * 20}\n"
    assert load_credentials(path) == ("alice", "p" * 20)
    write_credentials(path, "alice", "q" * 20)  # replaced whole, mode kept
    assert load_credentials(path) == ("alice", "q" * 20)
    assert sorted(p.name for p in path.parent.iterdir()) == ["u.credentials"]
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="can be read by others \\(mode 0644\\)"):
        load_credentials(path)
    with pytest.raises(CredentialsError, match="cannot read credentials file"):
        load_credentials(tmp_path / "missing")
    partial = tmp_path / "partial"
    partial.write_text(f"{USERNAME_VAR}=alice\n")
    partial.chmod(0o600)
    with pytest.raises(CredentialsError, match=f"lacks {PASSWORD_VAR}"):
        load_credentials(partial)


def test_load_credentials_reads_a_kubernetes_secret_volume(tmp_path: Path) -> None:
    (tmp_path / USERNAME_VAR).write_text("sweep")
    (tmp_path / PASSWORD_VAR).write_text("s3cret-from-the-secret\n")
    assert load_credentials(tmp_path) == ("sweep", "s3cret-from-the-secret")


def test_check_access_skips_local_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []

    class _Answered:  # urlopen's context manager for a 200
        def __enter__(self) -> _Answered:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    def counting_urlopen(request: urllib.request.Request, timeout: float) -> _Answered:
        sent.append(request.full_url)
        return _Answered()

    monkeypatch.setattr(urllib.request, "urlopen", counting_urlopen)
    check_access("sqlite:///nowhere/mlflow.db")  # no server, no authentication: no request
    check_access("file:///nowhere/mlruns")
    check_access("/nowhere/mlruns")
    assert sent == []
    # The counter sees a server's request: the check above could have failed.
    check_access("http://127.0.0.1:5000")
    assert sent == ["http://127.0.0.1:5000/api/2.0/mlflow/experiments/search"]


def test_sweep_user_from_a_secret_volume_and_owner_only_files_after_restart(tmp_path: Path) -> None:
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    from cluster.tracking_server import server_command
    from cluster.tracking_users import AuthFiles, prepare

    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / USERNAME_VAR).write_text("hpo")
    (secret / PASSWORD_VAR).write_text("from-the-secret-0123456789")
    files = prepare(tmp_path / "store", sweep_credentials=secret)
    assert files == AuthFiles.of(tmp_path / "store")
    assert not files.sweep_credentials.exists()  # the Secret is the only copy
    (files.admin_credentials).chmod(0o660)  # as a Kubernetes fsGroup leaves it
    prepare(tmp_path / "store", sweep_credentials=secret)  # a restart
    assert stat.S_IMODE(files.admin_credentials.stat().st_mode) == 0o600
    auth_store = SqlAlchemyStore()
    auth_store.init_db(files.database_uri)
    assert auth_store.authenticate_user("hpo", "from-the-secret-0123456789")
    assert auth_store.authenticate_user(*load_credentials(files.admin_credentials))
    assert auth_store.get_user("admin").is_admin and not auth_store.get_user("hpo").is_admin
    assert "--app-name" not in server_command(tmp_path, "127.0.0.1", 5000)
    command = server_command(tmp_path, "127.0.0.1", 5000, auth=True)
    assert command[command.index("--app-name") + 1] == "foxhunt-auth"


def test_adding_a_reader_keeps_a_sweep_user_from_a_secret(tmp_path: Path) -> None:
    """On KubeRay the sweep user's password lives in a Secret only: adding a reader must
    leave it working, and add no user named `sweep` beside it."""
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    from cluster.tracking_users import TrackingAuthSetupError, add_reader, prepare

    with pytest.raises(TrackingAuthSetupError, match="start `hpo tracking-server"):
        add_reader(tmp_path / "store", "alice")  # no server has prepared the store yet
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / USERNAME_VAR).write_text("hpo")
    (secret / PASSWORD_VAR).write_text("from-the-secret-0123456789")
    files = prepare(tmp_path / "store", sweep_credentials=secret)
    reader = add_reader(tmp_path / "store", "alice")
    auth_store = SqlAlchemyStore()
    auth_store.init_db(files.database_uri)
    assert auth_store.authenticate_user("hpo", "from-the-secret-0123456789")
    assert auth_store.authenticate_user(*load_credentials(reader))
    assert not auth_store.has_user("sweep")
    assert not files.sweep_credentials.exists()


def test_messages_never_show_a_password_in_the_tracking_uri() -> None:
    from cluster.tracking_auth import redact_uri

    assert redact_uri("http://u:pw@127.0.0.1:5000/x") == "http://127.0.0.1:5000/x"
    assert redact_uri("http://u:pw@[::1]:5000") == "http://[::1]:5000"
    assert redact_uri("sqlite:///mlflow.db") == "sqlite:///mlflow.db"
