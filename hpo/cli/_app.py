"""The ``hpo`` Typer app: every command, registered in the order ``hpo --help`` lists
them, and :func:`main`, what the console script runs."""

from __future__ import annotations

import os
from collections.abc import Callable

import typer

from hpo.cli._cluster import jobs_cmd, submit_cmd, tracking_server_cmd
from hpo.cli._comparison import compare_cmd, ensemble_cmd
from hpo.cli._local import check_family_cmd, models_cmd, predict_cmd, profile_cmd, train_cmd
from hpo.cli._options import exit_on_user_error
from hpo.cli._sweeps import best_cmd, resume_cmd, status_cmd, sweep_cmd

app = typer.Typer(
    name="hpo",
    help="foxhunt-hpo: hyperparameter sweeps of trading models in f32 and bf16.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
COMMANDS: dict[str, Callable[..., None]] = {
    "models": models_cmd,
    "train": train_cmd,
    "predict": predict_cmd,
    "sweep": sweep_cmd,
    "resume": resume_cmd,
    "status": status_cmd,
    "best": best_cmd,
    "ensemble": ensemble_cmd,
    "compare": compare_cmd,
    "check-family": check_family_cmd,
    "profile": profile_cmd,
    "submit": submit_cmd,
    "jobs": jobs_cmd,
    "tracking-server": tracking_server_cmd,
}
for _name, _command in COMMANDS.items():
    app.command(_name)(_command)


def main() -> None:
    # MLflow draws a progress bar per artifact it downloads (hpo compare: one per trial
    # on a remote store) into hpo's own output; an explicit value is kept.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    exit_on_user_error(app)
