"""``hpo`` commands for a Ray cluster and its tracking server: submit a sweep through
the Jobs API (``hpo submit``), list the cluster's jobs (``hpo jobs``) and run the MLflow
tracking server sweeps log to (``hpo tracking-server``).

    hpo tracking-server --store ~/mlflow-store                  MLflow server on 127.0.0.1:5000
    hpo submit spec.toml --address http://HEAD:8265 --storage /shared/hpo \
        --tracking-uri http://127.0.0.1:5000 --follow            sweep on a Ray cluster (Jobs API)
    hpo jobs --address http://HEAD:8265                         the cluster's jobs

The commands parse flags and print; what they enforce is decided in ``cluster``: which
MLflow credentials a submitted job uses and the client checks with
(:func:`cluster.submit.job_login`), and that a server without authentication listens on
loopback only (:func:`cluster.tracking_server.exposure`). Ray and MLflow are imported
inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hpo.cli._options import (
    CompareFlag,
    JobsAddress,
    JsonFlag,
    NameOption,
    SpecArg,
    TrackingCredentials,
    check_tracking_access,
    console,
    err_console,
    fail,
    load_sweep_spec,
    titled_table,
)


def submit_cmd(
    spec_path: SpecArg,
    address: JobsAddress = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Stream the job's logs; exit with its status.")
    ] = False,
    name: NameOption = None,
    tracking_uri: Annotated[
        str | None,
        typer.Option(help="MLflow tracking URI, as seen from the head (e.g. http://mlflow:5000)."),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="Results and checkpoints root every node sees (overrides the spec)."),
    ] = None,
    shared_storage: Annotated[
        bool,
        typer.Option(
            "--shared-storage",
            help="Declare --storage shared by every node when its mount does not show it "
            "(sets HPO_SHARED_STORAGE=1 for the job).",
        ),
    ] = False,
    compare: CompareFlag = False,
    working_dir: Annotated[
        Path, typer.Option(help="Project directory uploaded with the job.")
    ] = Path("."),
    python: Annotated[
        str, typer.Option(help="Python on the cluster that runs `-m hpo.cli sweep`.")
    ] = "python",
    check_resources: Annotated[
        bool,
        typer.Option(
            "--check-resources/--no-check-resources",
            help="Refuse a spec no current node can run (turn off for autoscaling clusters "
            "whose GPU workers are scaled to zero; the sweep still checks on the cluster).",
        ),
    ] = True,
    tracking_credentials: TrackingCredentials = None,
    head_credentials: Annotated[
        str | None,
        typer.Option(
            "--head-credentials",
            metavar="PATH",
            help="MLflow credentials file on the head (absolute, or '~/...' quoted so this "
            "shell leaves it to the head) for the job's sweep; the path travels, never the "
            "password (default: the head's MLFLOW_TRACKING_* variables).",
        ),
    ] = None,
) -> None:
    """Submit a sweep to a Ray cluster through the Jobs API (the working directory and
    the spec travel with it); prints the job id, with --follow streams its logs."""
    from cluster.connect import ClusterError
    from cluster.submit import (
        follow_job,
        job_client,
        job_login,
        jobs_address,
        resolve_token,
        submit_sweep,
    )

    spec = load_sweep_spec(spec_path, storage, tracking_uri, name, compare)
    login = job_login(spec.tracking_uri, head_credentials, tracking_credentials)
    if not check_tracking_access(spec.tracking_uri, login.check_with, timeout_s=3.0):
        err_console.print(
            f"note: {spec.tracking_uri} does not answer from here; the job checks it on the head",
            highlight=False,
            soft_wrap=True,
        )
    if login.note is not None:
        err_console.print(f"note: {login.note}", highlight=False, soft_wrap=True)
    import logging

    # Ray logs every file it skips while packaging the snapshot; keep the upload line only.
    logging.getLogger("ray._private.runtime_env.packaging").setLevel(logging.WARNING)
    token = resolve_token()
    try:
        url = jobs_address(address)
        client = job_client(url, token)
        submission = submit_sweep(
            spec,
            url,
            working_dir=working_dir,
            shared_storage=shared_storage,
            python=python,
            check_resources=check_resources,
            token=token,
            client=client,
            head_credentials=login.head_credentials,
        )
    except ClusterError as exc:
        fail(str(exc))
    console.print(f"submitted job: {submission.job_id}", soft_wrap=True, highlight=False)
    console.print(
        f"sweep [bold]{spec.name}[/]: {spec.n_trials} trials -> {submission.sweep_dir}; "
        f"MLflow at {submission.tracking_uri}",
        soft_wrap=True,
    )
    if not follow:
        console.print(
            f"follow: ray job logs -f {submission.job_id} --address {url}   "
            f"list: hpo jobs --address {url}   stop: ray job stop {submission.job_id} --address {url}",
            soft_wrap=True,
            highlight=False,
        )
        return
    try:
        status = follow_job(
            client,
            submission.job_id,
            lambda text: print(text, end="", flush=True),
            [token or "", *login.secrets],
        )
    except KeyboardInterrupt:
        err_console.print(
            f"stopped following; job {submission.job_id} keeps running "
            f"(ray job stop {submission.job_id} --address {url} ends it)"
        )
        raise typer.Exit(130) from None
    console.print(f"job {submission.job_id}: {status}", highlight=False)
    raise typer.Exit(0 if status == "SUCCEEDED" else 1)


def jobs_cmd(address: JobsAddress = None, as_json: JsonFlag = False) -> None:
    """List the cluster's jobs (newest first): id, status, sweep, entrypoint, start/end."""
    from cluster.connect import ClusterError
    from cluster.submit import job_client, list_jobs

    try:
        rows = list_jobs(job_client(address))
    except ClusterError as exc:
        fail(str(exc))
    if as_json:
        console.print_json(json.dumps([r.to_dict() for r in rows]))
        return
    columns = ("job", "status", "sweep", "entrypoint", "start", "end", "message")
    table = titled_table(f"{len(rows)} job(s)", *columns, overflow="fold")
    for r in rows:
        table.add_row(r.job_id, r.status, r.sweep, r.entrypoint, r.start, r.end, r.message)
    console.print(table)


def tracking_server_cmd(
    host: Annotated[
        str, typer.Option(help="Interface to bind (loopback unless you say otherwise).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 5000,
    store: Annotated[
        Path,
        typer.Option(
            help="Directory of the SQLite store (mlflow.db), artifacts/ and auth/ (users)."
        ),
    ] = Path("mlflow-server"),
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host headers clients send, as comma-separated patterns on host:port "
            "(e.g. 'mlflow:*,mlflow.*'); MLflow refuses others. Default: localhost and "
            "private IPs; loopback stays allowed either way."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Server worker processes.")] = 1,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            help="No authentication: anyone who reaches the port reads and rewrites every "
            "run. Allowed only with a loopback --host.",
        ),
    ] = False,
    add_reader: Annotated[
        str | None,
        typer.Option(
            "--add-reader",
            metavar="NAME",
            help="Add a read-only user NAME (search and view runs; no writes), write its "
            "credentials file under STORE/auth/ (mode 0600), print its path and exit. Works "
            "while the server runs.",
        ),
    ] = None,
    sweep_credentials: Annotated[
        Path | None,
        typer.Option(
            "--sweep-credentials",
            help="Take the sweep user's name and password from this credentials file (or "
            "Kubernetes Secret directory) instead of generating them.",
        ),
    ] = None,
) -> None:
    """Run an MLflow tracking server (SQLite + served artifacts, MLflow's authentication
    on) until Ctrl+C."""
    import signal
    import time

    from cluster.tracking_server import TrackingServerError, exposure, start_tracking_server

    if add_reader is not None:
        if no_auth:
            fail("--add-reader adds a user of the authenticated server: drop --no-auth")
        from cluster.tracking_users import TrackingAuthSetupError
        from cluster.tracking_users import add_reader as add_reader_user

        try:
            path = add_reader_user(store, add_reader)
        except (TrackingAuthSetupError, ValueError) as exc:
            fail(str(exc))
        console.print(
            f"read-only user {add_reader!r}: credentials in {path} (mode 0600). Hand them over "
            "privately; the browser asks for them when the UI opens.",
            highlight=False,
            soft_wrap=True,
        )
        return
    try:
        said = exposure(host, auth=not no_auth)
    except TrackingServerError as exc:
        fail(str(exc))
    if said is not None:
        level, message = said
        err_console.print(f"[yellow]{level}:[/] {message}")
    try:
        server = start_tracking_server(
            store,
            host=host,
            port=port,
            workers=workers,
            allowed_hosts=allowed_hosts,
            auth=not no_auth,
            sweep_credentials=sweep_credentials,
        )
    except TrackingServerError as exc:
        fail(str(exc))
    console.print(f"tracking URI: {server.uri}", highlight=False, soft_wrap=True)
    if server.credentials_path is not None:
        console.print(
            f"authentication: on; sweep user's credentials in {server.credentials_path} "
            "(mode 0600): `--tracking-credentials FILE`, or MLFLOW_TRACKING_USERNAME / "
            "MLFLOW_TRACKING_PASSWORD from it; read-only users: --add-reader NAME",
            highlight=False,
            soft_wrap=True,
        )
    console.print(
        f"store {server.backend_store_uri}, artifacts {server.artifacts_dir}; UI at {server.uri}; "
        f"sweeps: --tracking-uri {server.uri}. Ctrl+C stops it.",
        highlight=False,
        soft_wrap=True,
    )

    def _stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    try:
        while server.process.poll() is None:
            time.sleep(0.5)
        err_console.print(f"mlflow server exited with code {server.process.returncode}")
        raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    console.print("tracking server stopped")
