"""Submit a sweep to a Ray cluster through the Ray Jobs API, follow it, list jobs.

    hpo submit spec.toml --address http://HEAD:8265 --storage /shared/hpo \\
        --tracking-uri http://mlflow:5000 --follow
    hpo jobs --address http://HEAD:8265

What travels: a snapshot of the working directory (the project: ``hpo``, ``trainables``,
``models``, ``cluster``, ... without virtualenvs, caches, results, MLflow stores or
``.git``) plus the validated spec, written into that snapshot, as the job's
``runtime_env`` working_dir. The job runs ``python -m hpo.cli sweep SPEC --address auto``
on the head in the cluster's own Python environment (which must have the project's
dependencies: the image or the launcher's setup_commands install them); every trial
process gets the same snapshot. The sweep driver then checks the cluster (resources,
shared storage) before launching anything; ``hpo submit`` checks resources against the
Jobs API's node list first, so a spec no node can run is refused before it is uploaded.

Authentication: Ray 2.60 clusters use token authentication. The client sends the
cluster's token as ``Authorization: Bearer`` — found the way Ray finds it:
``RAY_AUTH_TOKEN``, else the file named by ``RAY_AUTH_TOKEN_PATH``, else
``~/.ray/auth_token`` (none when ``RAY_AUTH_MODE=disabled``). The token is never put in
the job's runtime_env, entrypoint or metadata (all visible in the dashboard), never
printed, and masked in followed logs; the job's driver inherits the cluster's own token
from the node it runs on.

MLflow credentials never travel through Ray (Ray logs a job's runtime_env on every node):
the job's sweep logs in with the head's own variables or the file on the head that
``hpo submit --head-credentials PATH`` names (the path goes in the entrypoint).
:func:`job_login` decides which, and what the client checks the server with before it
submits. Details: cluster/README.md, "Tracking server authentication".
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shlex
import shutil
import socket
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.connect import ClusterError
from cluster.storage import SHARED_ENV, is_uri
from cluster.tracking_auth import PASSWORD_VAR, USERNAME_VAR, is_server_uri

DEFAULT_JOBS_ADDRESS = "http://127.0.0.1:8265"
SPEC_DIR = "_hpo_submit"  # inside the uploaded snapshot
# Never uploaded: environments, caches, version control, results and tracking stores.
EXCLUDES = (
    ".venv",
    "venv",
    ".git",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "*.egg-info",
    "build",
    "dist",
    "mlflow.db",
    "*.db",
    "mlruns",
    "mlartifacts",
    "hpo-results",
    "runs",
    "test-artifacts",
    ".ray",
    ".env",
)
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Submission:
    job_id: str
    address: str
    entrypoint: str
    sweep_dir: str
    tracking_uri: str


# -- addresses and authentication ------------------------------------------------------------
def jobs_address(address: str | None = None) -> str:
    """The Jobs API (dashboard) URL: ``--address``, else ``RAY_API_SERVER_ADDRESS``, else
    ``RAY_ADDRESS`` when it is an http(s) URL, else http://127.0.0.1:8265."""
    if not address:
        address = os.environ.get("RAY_API_SERVER_ADDRESS", "")
    if not address:
        ray_address = os.environ.get("RAY_ADDRESS", "")
        address = ray_address if ray_address.startswith(("http://", "https://")) else ""
    address = (address or DEFAULT_JOBS_ADDRESS).rstrip("/")
    if address.startswith("ray://") or address == "auto":
        raise ClusterError(
            f"hpo submit talks to the Ray Jobs API on the head's dashboard port, not {address}: "
            "use --address http://HEAD:8265"
        )
    if "://" not in address:
        address = f"http://{address}"
    return address


def resolve_token(env: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """The cluster token the way Ray resolves it; None if there is none or auth is disabled."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    token = env.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    if env.get("RAY_AUTH_TOKEN_PATH"):
        path = Path(env["RAY_AUTH_TOKEN_PATH"]).expanduser()
    else:
        path = (home or Path.home()) / ".ray" / "auth_token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _probe_http(address: str, timeout_s: float = 3.0) -> None:
    parsed = urllib.parse.urlparse(address)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
        raise ClusterError(
            f"cannot reach the Ray Jobs API at {address} ({reason}): start the head with "
            "its dashboard (`ray start --head --dashboard-host 127.0.0.1 --dashboard-port "
            "8265`; KubeRay: port-forward svc/HEAD-SERVICE 8265) or fix --address"
        ) from None


def _auth_error(address: str, exc: BaseException) -> ClusterError:
    return ClusterError(
        f"the Ray Jobs API at {address} refused the request ({str(exc).splitlines()[0]}): the "
        "cluster uses token authentication; give this client the cluster's token as "
        "RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token "
        "(`ray get-auth-token` on the head prints it; KubeRay: the Secret the manifest names)"
    )


def job_client(address: str | None = None, token: str | None = None) -> Any:
    """A ``JobSubmissionClient`` that authenticates with the cluster token."""
    address = jobs_address(address)
    _probe_http(address)  # before importing Ray: an unreachable head fails in seconds
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    token = resolve_token() if token is None else token
    try:
        return JobSubmissionClient(address, headers=auth_headers(token))
    except AuthenticationError as exc:
        raise _auth_error(address, exc) from None
    except ConnectionError as exc:
        raise ClusterError(f"cannot use the Ray Jobs API at {address}: {exc}") from None


def cluster_nodes(address: str | None = None, token: str | None = None) -> list[dict[str, Any]]:
    """Alive nodes with their total resources, from the dashboard's state API."""
    import json
    import urllib.error
    import urllib.request

    address = jobs_address(address)
    token = resolve_token() if token is None else token
    request = urllib.request.Request(
        f"{address}/api/v0/nodes?detail=1&limit=10000", headers=auth_headers(token)
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise _auth_error(address, exc) from None
        raise ClusterError(f"cannot list the nodes of {address}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ClusterError(f"cannot list the nodes of {address}: {exc}") from None
    rows = payload["data"]["result"]["result"]
    return [r for r in rows if r.get("state") == "ALIVE"]


# -- what a submitted sweep needs -------------------------------------------------------------
def submission_problems(spec: Any) -> list[str]:
    """Settings that work for a local sweep but not for one that runs on the cluster."""
    problems = []
    storage = spec.storage
    if not is_uri(storage) and not Path(storage.removeprefix("file://")).expanduser().is_absolute():
        problems.append(
            f"storage: {storage!r} is relative: the job runs in a temporary copy of the working "
            "directory on the head, deleted with the cluster; pass --storage with an absolute "
            "path every node mounts (NFS, EFS, a shared volume)"
        )
    uri = spec.tracking_uri
    local = None
    if uri.startswith("sqlite:///"):
        local = uri.removeprefix("sqlite:///")
    elif uri.startswith("file:"):
        local = urllib.parse.urlparse(uri).path or uri.removeprefix("file:")
    elif "://" not in uri:
        local = uri
    if local is not None and not local.startswith(("/", "~")):
        problems.append(
            f"tracking_uri: {uri!r} is relative: it would be created inside the job's temporary "
            "working directory on the head and lost; start `hpo tracking-server` and pass "
            "--tracking-uri http://HOST:5000 (or an absolute sqlite:////path on the head)"
        )
    return problems


def stage_snapshot(spec: Any, working_dir: Path, dest: Path) -> str:
    """Copy ``working_dir`` (minus :data:`EXCLUDES`) into ``dest`` and write the spec there;
    returns the spec's path relative to ``dest`` (the job's working directory)."""
    import yaml

    working_dir = working_dir.resolve()
    storage = Path(spec.storage).expanduser() if not is_uri(spec.storage) else None
    skip = shutil.ignore_patterns(*EXCLUDES)

    def ignore(directory: str, names: list[str]) -> set[str]:
        ignored = set(skip(directory, names))
        if storage is not None:  # never upload the sweep's own results
            ignored |= {n for n in names if Path(directory, n).resolve() == storage.resolve()}
        return ignored

    shutil.copytree(working_dir, dest, ignore=ignore, symlinks=True, dirs_exist_ok=True)
    # grouping.configs_per_ask is what a started sweep records: a spec to submit has none.
    unrecorded = spec.grouping.configs_per_ask is None
    payload = spec.model_dump(exclude={"grouping": {"configs_per_ask"}} if unrecorded else None)
    source = payload["data"]["source"]
    if source != "synthetic":
        path = Path(source).resolve()
        # Data inside the snapshot travels with it; anything else must exist on the cluster.
        if path.is_relative_to(working_dir):
            payload["data"]["source"] = str(path.relative_to(working_dir))
    spec_rel = f"{SPEC_DIR}/{spec.name}.yaml"
    (dest / SPEC_DIR).mkdir(parents=True, exist_ok=True)
    (dest / spec_rel).write_text(
        "# Written by `hpo submit`: the validated spec, CLI overrides applied.\n"
        + yaml.safe_dump(payload, sort_keys=False)
    )
    return spec_rel


def entrypoint(spec_rel: str, python: str = "python", head_credentials: str | None = None) -> str:
    """The job's command line. ``head_credentials`` is a path on the head (``~`` is the
    job's user's home there); the path travels, never the file's content."""
    command = f"{python} -m hpo.cli sweep {shlex.quote(spec_rel)} --address auto"
    if head_credentials:
        command += f" --tracking-credentials {shlex.quote(head_credentials)}"
    return command


def head_credentials_problem(path: str) -> str | None:
    """Why ``path`` cannot name a credentials file for the job, or None. The job runs in
    a temporary copy of the working directory, so a relative path would not mean the
    same file there."""
    if not (path.startswith("/") or path.startswith("~")):
        return f"--head-credentials {path!r}: give an absolute path (or ~/...) on the head"
    return None


@dataclass(frozen=True)
class JobLogin:
    """How a submitted sweep logs in to MLflow, and what this client checks first."""

    head_credentials: str | None
    """The credentials file on the head the job's sweep reads (its path goes in the
    entrypoint); None: the head's MLFLOW_TRACKING_* variables."""
    check_with: Path | None
    """The credentials file this client checks the server with before submitting; None:
    MLflow's variables here (which ``--tracking-credentials`` sets)."""
    note: str | None
    """What whoever submits should know about the choice; None: nothing."""
    secrets: tuple[str, ...]
    """What a followed job's logs mask besides the cluster token: this client's password."""


def job_login(
    tracking_uri: str,
    head_credentials: str | None = None,
    client_credentials: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> JobLogin:
    """Which MLflow credentials the job's sweep uses and the client checks with, decided
    once for ``hpo submit``. The URI is the head's view; where this client sees the same
    server, a refused login fails before submitting, and the job's sweep checks again on
    the head before launching trials. A client without credentials of its own (neither
    ``client_credentials`` nor MLflow's variables in ``env``) checks with the head's file
    where it can read it (submitting on the head itself); elsewhere it leaves the check
    to the job."""
    env = os.environ if env is None else env
    check_with = client_credentials
    if check_with is None and head_credentials and not env.get(USERNAME_VAR):
        on_head = Path(head_credentials).expanduser()
        check_with = on_head if on_head.is_file() else None
    note = None
    if env.get(USERNAME_VAR) and not head_credentials and is_server_uri(tracking_uri):
        note = (
            "the job's sweep logs in to MLflow with the head's MLFLOW_TRACKING_* variables "
            "(credentials are never sent); --head-credentials PATH names a file on the head "
            "instead"
        )
    password = env.get(PASSWORD_VAR, "")
    return JobLogin(head_credentials, check_with, note, (password,) if password else ())


def new_job_id(sweep_name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"hpo-{re.sub(r'[^A-Za-z0-9_.-]', '-', sweep_name)}-{stamp}-{secrets.token_hex(2)}"


def submit_sweep(
    spec: Any,
    address: str | None = None,
    *,
    working_dir: Path | None = None,
    shared_storage: bool = False,
    python: str = "python",
    job_id: str | None = None,
    check_resources: bool = True,
    token: str | None = None,
    client: Any = None,
    head_credentials: str | None = None,
) -> Submission:
    """Validate, upload and submit ``spec`` as a Ray job; returns its id at once.
    ``head_credentials`` names an MLflow credentials file on the head for the job's sweep
    (its path goes in the entrypoint; no secret goes in the runtime_env)."""
    from cluster.preflight import resource_problems

    problems = submission_problems(spec)
    address = jobs_address(address)
    token = resolve_token() if token is None else token
    client = client or job_client(address, token)
    if check_resources:
        nodes = [
            {k: float(v) for k, v in n.get("resources_total", {}).items()}
            for n in cluster_nodes(address, token)
        ]
        problems += resource_problems(float(spec.resources.cpu), spec.resources.gpu, nodes)
    if head_credentials and (problem := head_credentials_problem(head_credentials)):
        problems.append(problem)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ClusterError(f"sweep {spec.name!r} was not submitted:\n{lines}")
    # The sweep driver re-checks storage on the cluster; a declaration made here travels.
    env_vars = {"PYTHONUNBUFFERED": "1"}
    if shared_storage:
        env_vars[SHARED_ENV] = "1"
    elif os.environ.get(SHARED_ENV):
        env_vars[SHARED_ENV] = os.environ[SHARED_ENV]
    job_id = job_id or new_job_id(spec.name)
    with tempfile.TemporaryDirectory(prefix="hpo-submit-") as tmp:
        snapshot = Path(tmp) / "snapshot"
        spec_rel = stage_snapshot(spec, working_dir or Path.cwd(), snapshot)
        command = entrypoint(spec_rel, python, head_credentials)
        client.submit_job(
            entrypoint=command,
            submission_id=job_id,
            runtime_env={
                "working_dir": str(snapshot),
                "excludes": list(EXCLUDES),
                "env_vars": env_vars,
            },
            metadata={"hpo.sweep": spec.name, "hpo.storage": spec.storage},
        )
    sweep_dir = spec.storage.rstrip("/") + "/" + spec.name
    return Submission(
        job_id=job_id,
        address=address,
        entrypoint=command,
        sweep_dir=sweep_dir,
        tracking_uri=spec.tracking_uri,
    )


# -- following and listing -------------------------------------------------------------------
def redact(text: str, secrets_: Iterable[str]) -> str:
    for secret in secrets_:
        if secret:
            text = text.replace(secret, REDACTED)
    return text


def follow_job(
    client: Any,
    job_id: str,
    write: Callable[[str], None],
    secrets_: Iterable[str] = (),
    poll_s: float = 1.0,
) -> str:
    """Stream the job's logs until it ends; returns its final status (``SUCCEEDED``, ...)."""
    hidden = [s for s in secrets_ if s]

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(redact(chunk, hidden))

    asyncio.run(tail())
    while True:  # the log stream closes as the job ends; its status follows shortly
        status = client.get_job_status(job_id)
        if status.is_terminal():
            return str(status.value)
        time.sleep(poll_s)


@dataclass(frozen=True)
class JobRow:
    job_id: str
    status: str
    sweep: str
    entrypoint: str
    start: str
    end: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return dict(self.__dict__)


def list_jobs(client: Any) -> list[JobRow]:
    """Every job the cluster knows, newest first."""
    rows = []
    for job in sorted(client.list_jobs(), key=lambda j: j.start_time or 0, reverse=True):
        rows.append(
            JobRow(
                job_id=job.submission_id or job.job_id or "?",
                status=str(job.status.value if hasattr(job.status, "value") else job.status),
                sweep=(job.metadata or {}).get("hpo.sweep", ""),
                entrypoint=job.entrypoint,
                start=_time(job.start_time),
                end=_time(job.end_time),
                message=(job.message or "").splitlines()[0] if job.message else "",
            )
        )
    return rows


def _time(ms: int | None) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
