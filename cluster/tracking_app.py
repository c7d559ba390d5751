"""The web app of an authenticated tracking server (``mlflow server --app-name foxhunt-auth``,
registered under MLflow's ``mlflow.app`` entry points in pyproject.toml).

MLflow's ``basic-auth`` app with one more rule. Without workspaces, MLflow lets every
authenticated user create experiments; here creating one also needs EDIT (or more) on
every experiment (a ``*`` grant, as the sweep user has) or an admin, so a read-only user
gets 403 and cannot add experiments either. Everything else is MLflow's: the rule runs
after its authentication and authorization, and only on experiment creation.
"""

from __future__ import annotations

from typing import Any

APP_NAME = "foxhunt-auth"
_CREATE_EXPERIMENT = "/mlflow/experiments/create"  # /api/2.0/... and /ajax-api/2.0/...


def create_app() -> Any:
    """The ASGI (uvicorn) or WSGI app ``mlflow server`` serves."""
    from flask import g, request
    from mlflow.server import app as flask_app
    from mlflow.server.auth import (
        _get_experiment_permission,
        make_forbidden_response,
        sender_is_admin,
    )
    from mlflow.server.auth import create_app as create_basic_auth_app

    served = create_basic_auth_app(flask_app)

    # Registered after basic-auth's own hook, so it runs only on requests that passed it
    # (unauthenticated ones already got 401).
    @flask_app.before_request
    def _only_writers_create_experiments() -> Any:
        if request.method != "POST" or not request.path.endswith(_CREATE_EXPERIMENT):
            return None
        # Set by basic-auth's hook once the credentials checked out.
        username = g.get("mlflow_authenticated_user")
        if not isinstance(username, str):
            return make_forbidden_response()
        if sender_is_admin():
            return None
        # The user's grant on every experiment, resolved as MLflow resolves any other.
        if _get_experiment_permission("*", username).can_update:
            return None
        return make_forbidden_response()

    return served
