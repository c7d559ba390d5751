"""Credentials for an authenticated MLflow tracking server (`hpo tracking-server`).

    from cluster.tracking_auth import apply_credentials, check_access
    apply_credentials("mlflow-server/auth/sweep.credentials")  # or MLflow's own variables
    check_access("http://127.0.0.1:5000")  # one request; a clear error on 401/403

A credentials file holds the two variables MLflow's client reads, one per line::

    MLFLOW_TRACKING_USERNAME=sweep
    MLFLOW_TRACKING_PASSWORD=...

so a shell can ``source`` it and ``kubectl create secret generic NAME --from-env-file=FILE``
turns it into a Secret with the same two keys. A directory that holds one file per key
(a Kubernetes Secret mounted as a volume) is read the same way. Files are written
atomically with mode 0600 set before any content, and a credentials file that others can
read is refused, as ssh refuses such a key.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import stat
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

USERNAME_VAR = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VAR = "MLFLOW_TRACKING_PASSWORD"

__all__ = [
    "PASSWORD_VAR",
    "USERNAME_VAR",
    "CredentialsError",
    "TrackingAccessError",
    "TrackingUnreachableError",
    "apply_credentials",
    "check_access",
    "is_server_uri",
    "load_credentials",
    "write_credentials",
]


class CredentialsError(ValueError):
    """A credentials file is missing, malformed or readable by others."""


class TrackingAccessError(RuntimeError):
    """The tracking server refused the credentials (401/403) or could not be reached."""


class TrackingUnreachableError(TrackingAccessError):
    """No answer from the tracking server (refused, unresolvable, timed out): nothing was
    learned about the credentials."""


def write_credentials(path: str | Path, username: str, password: str) -> Path:
    """Write ``username``/``password`` to ``path`` (mode 0600, atomically: a reader sees
    the old file or the whole new one, never a partial one or one with a wider mode)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # O_EXCL: never write through a file or link someone else planted at the temporary name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask can only narrow 0600; this makes it exact
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(f"{USERNAME_VAR}={username}\n{PASSWORD_VAR}={password}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def load_credentials(path: str | Path) -> tuple[str, str]:
    """``(username, password)`` from a credentials file or a Secret-volume directory."""
    path = Path(path).expanduser()
    try:
        if path.is_dir():
            values = {
                key: (path / key).read_text(encoding="utf-8").strip()
                for key in (USERNAME_VAR, PASSWORD_VAR)
                if (path / key).is_file()
            }
        else:
            mode = path.stat().st_mode
            if mode & 0o077:
                raise CredentialsError(
                    f"credentials file {path} can be read by others (mode "
                    f"{stat.S_IMODE(mode):04o}): run `chmod 600 {path}`"
                )
            values = _parse(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials file {path}: {exc.strerror}") from exc
    missing = [key for key in (USERNAME_VAR, PASSWORD_VAR) if not values.get(key)]
    if missing:
        raise CredentialsError(f"credentials file {path} lacks {' and '.join(missing)}")
    return values[USERNAME_VAR], values[PASSWORD_VAR]


def apply_credentials(path: str | Path) -> str:
    """Set MLflow's client variables from ``path``; returns the username."""
    username, password = load_credentials(path)
    os.environ[USERNAME_VAR] = username
    os.environ[PASSWORD_VAR] = password
    return username


def redact_uri(uri: str) -> str:
    """``uri`` without a user name or password (``http://u:p@host:5000`` ->
    ``http://host:5000``): what any message or report may show of a tracking URI."""
    parts = urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri
    host = parts.hostname or ""
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def is_server_uri(tracking_uri: str) -> bool:
    """An HTTP(S) tracking server (which may authenticate), not a local store."""
    return tracking_uri.startswith(("http://", "https://"))


def check_access(
    tracking_uri: str, credentials: str | Path | None = None, timeout_s: float = 10.0
) -> None:
    """Make one authenticated request (search one experiment) to an HTTP tracking server
    and raise :class:`TrackingAccessError` naming the variables or ``credentials`` file on
    401/403, so a command fails before it starts work instead of MLflow retrying later.
    Credentials come from ``credentials`` if given, else from MLflow's variables. A
    non-HTTP tracking URI (a local SQLite or file store) has no authentication: no-op."""
    if not is_server_uri(tracking_uri):
        return
    shown = redact_uri(tracking_uri)
    if credentials is not None:
        username, password = load_credentials(credentials)
        source = f"the credentials file {credentials}"
    else:
        username = os.environ.get(USERNAME_VAR, "")
        password = os.environ.get(PASSWORD_VAR, "")
        source = f"{USERNAME_VAR} / {PASSWORD_VAR}"
    request = urllib.request.Request(
        f"{tracking_uri.rstrip('/')}/api/2.0/mlflow/experiments/search",
        data=json.dumps({"max_results": 1}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    if username or password:
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingUnreachableError(
            f"cannot reach the tracking server {shown}: {reason}"
        ) from exc
    if status == 401 and not (username or password):
        raise TrackingAccessError(
            f"the tracking server {shown} requires authentication (401): set "
            f"{USERNAME_VAR} and {PASSWORD_VAR}, or pass --tracking-credentials FILE (the "
            "server writes its sweep user's file as STORE/auth/sweep.credentials)"
        )
    if status == 401:
        raise TrackingAccessError(
            f"the tracking server {shown} rejected user {username!r} from {source} "
            "(401: unknown user or wrong password)"
        )
    if status == 403:
        raise TrackingAccessError(
            f"the tracking server {shown} refused user {username!r} from {source} "
            "(403: no permission to read experiments)"
        )
    raise TrackingAccessError(
        f"the tracking server {shown} answered HTTP {status} to an experiment search"
    )


def _parse(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        values[key.strip()] = value.strip().strip("'\"")
    return values
