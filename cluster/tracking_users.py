"""The users of an authenticated tracking server (MLflow's ``basic-auth`` app), kept in
``STORE/auth/`` (mode 0700):

    basic_auth.ini          MLflow's auth config (MLFLOW_AUTH_CONFIG_PATH); no secret in it
    basic_auth.db           users, password hashes and grants (SQLite)
    flask-secret-key        the app's CSRF key, stable across restarts and workers
    admin.credentials       the admin (manages users through MLflow's REST API)
    sweep.credentials       the sweep user, for the sweep driver and `hpo` commands
    reader-NAME.credentials read-only users (`hpo tracking-server --add-reader NAME`)

Every password is generated (``secrets.token_urlsafe``) and each ``*.credentials`` file is
mode 0600 (format: :mod:`cluster.tracking_auth`). Users are created in the database
before the server first starts, so the admin's password never sits in the config file
or the server's environment. Permissions (MLflow's model: a user's grants, else the
config's ``default_permission``):

- ``default_permission = NO_PERMISSIONS``: a user without a grant sees nothing; a request
  without valid credentials gets 401.
- sweep: EDIT on every experiment (``*``: write runs, also in experiments that predate
  authentication); MLflow gives the creator MANAGE on each experiment it creates, which
  lets a resumed sweep delete its orphaned runs.
- readers: READ on every experiment: search and view runs and artifacts; creating or
  deleting anything gets 403.

Restarts reuse the database and the files; a user whose file is gone (or no longer
matches) gets a new password and a new file.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.tracking_auth import load_credentials, write_credentials

ADMIN_USER = "admin"
SWEEP_USER = "sweep"
_READER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

__all__ = ["ADMIN_USER", "SWEEP_USER", "AuthFiles", "TrackingAuthSetupError", "add_reader"]


class TrackingAuthSetupError(RuntimeError):
    """The auth store could not be prepared (the message says why)."""


@dataclass(frozen=True)
class AuthFiles:
    """Where a store keeps its authentication state."""

    root: Path

    @classmethod
    def of(cls, store: str | Path) -> AuthFiles:
        return cls(Path(store).expanduser().resolve() / "auth")

    @property
    def config(self) -> Path:
        return self.root / "basic_auth.ini"

    @property
    def database(self) -> Path:
        return self.root / "basic_auth.db"

    @property
    def database_uri(self) -> str:
        return f"sqlite:///{self.database}"

    @property
    def secret_key(self) -> Path:
        return self.root / "flask-secret-key"

    @property
    def admin_credentials(self) -> Path:
        return self.root / f"{ADMIN_USER}.credentials"

    @property
    def sweep_credentials(self) -> Path:
        return self.root / f"{SWEEP_USER}.credentials"

    def reader_credentials(self, name: str) -> Path:
        return self.root / f"reader-{name}.credentials"

    def server_env(self) -> dict[str, str]:
        """What the ``mlflow server --app-name basic-auth`` process needs in its environment."""
        return {
            "MLFLOW_AUTH_CONFIG_PATH": str(self.config),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": self.secret_key.read_text().strip(),
        }


AUTH_CACHE_S = 10
"""How long the server trusts a checked password (MLflow's ``auth_cache_ttl_seconds``)."""


def prepare(store: str | Path, sweep_credentials: str | Path | None = None) -> AuthFiles:
    """Create (first start) or check (restart) the auth config, database, admin and sweep
    user of ``store``. ``sweep_credentials``: take the sweep user's name and password from
    that file (e.g. a Kubernetes Secret) instead of generating them."""
    files = AuthFiles.of(store)
    files.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Owner-only again, whatever widened it since (e.g. a Kubernetes fsGroup on the volume).
    for path in (files.root, *files.root.glob("*.credentials"), *files.root.glob("*-key")):
        os.chmod(path, 0o700 if path.is_dir() else 0o600)
    _write_config(files)
    if not files.secret_key.exists():
        _write_private(files.secret_key, secrets.token_hex(32) + "\n")
    auth_store = _open(files)
    _ensure_user(auth_store, ADMIN_USER, files.admin_credentials, is_admin=True)
    if sweep_credentials is None:
        sweep = _ensure_user(auth_store, SWEEP_USER, files.sweep_credentials)
    else:
        sweep, password = load_credentials(sweep_credentials)
        _set_password(auth_store, sweep, password)
    auth_store.grant_user_permission(sweep, "experiment", "*", "EDIT")
    return files


def add_reader(store: str | Path, name: str) -> Path:
    """Add (or keep) a read-only user ``name``; returns its credentials file (mode 0600)."""
    if not _READER_NAME.fullmatch(name) or name in (ADMIN_USER, SWEEP_USER):
        raise TrackingAuthSetupError(
            f"reader name {name!r}: use letters, digits, '.', '_' or '-' (at most 64, not "
            f"{ADMIN_USER!r} or {SWEEP_USER!r})"
        )
    # The server's users as they are: preparing the store again would give the sweep user
    # a new password wherever its file is not in the store (a Kubernetes Secret).
    files = AuthFiles.of(store)
    if not files.database.is_file():
        raise TrackingAuthSetupError(
            f"no authenticated tracking server has started on {store} yet: start "
            f"`hpo tracking-server --store {store}` first, then add readers"
        )
    auth_store = _open(files)
    path = files.reader_credentials(name)
    _ensure_user(auth_store, name, path)
    auth_store.grant_user_permission(name, "experiment", "*", "READ")
    return path


def _write_config(files: AuthFiles) -> None:
    # MLflow reads it with configparser's interpolation: a literal '%' is written '%%'.
    database_uri = files.database_uri.replace("%", "%%")
    text = (
        "# Written by `hpo tracking-server` (cluster/tracking_users.py); rewritten each start.\n"
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = {database_uri}\n"
        f"admin_username = {ADMIN_USER}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "grant_default_workspace_access = false\n"
        # Every request carries the password, and checking its hash costs tens of ms by
        # design: without the cache a sweep's logging queues behind the checks. A password
        # changed out of band (a lost credentials file) is refused AUTH_CACHE_S later at most.
        f"auth_cache_ttl_seconds = {AUTH_CACHE_S}\n"
    )
    _write_private(files.config, text)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)


def _open(files: AuthFiles) -> Any:
    # MLflow's own auth store, so its schema migrations and password hashing apply; the
    # import is heavy (the auth app) and needs the `mlflow[auth]` extra.
    try:
        from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore
    except ImportError as exc:
        raise TrackingAuthSetupError(
            f"the tracking server's authentication needs MLflow's auth extra ({exc}): "
            "pip install 'mlflow[auth]'"
        ) from exc
    auth_store = SqlAlchemyStore()
    auth_store.init_db(files.database_uri)
    return auth_store


def _ensure_user(auth_store: Any, username: str, path: Path, *, is_admin: bool = False) -> str:
    """Keep ``username`` if ``path`` holds its working password; otherwise (a new user, or
    a lost or stale file) give it a new password and write ``path``."""
    if auth_store.has_user(username, use_primary=True) and path.is_file():
        stored_user, password = load_credentials(path)
        if stored_user == username and auth_store.authenticate_user(
            username, password, use_primary=True
        ):
            return username
    password = secrets.token_urlsafe(32)
    _set_password(auth_store, username, password, is_admin=is_admin)
    write_credentials(path, username, password)
    return username


def _set_password(auth_store: Any, username: str, password: str, *, is_admin: bool = False) -> None:
    if not auth_store.has_user(username, use_primary=True):
        auth_store.create_user(username, password, is_admin=is_admin)
    elif not auth_store.authenticate_user(username, password, use_primary=True):
        auth_store.update_user(username, password=password)
